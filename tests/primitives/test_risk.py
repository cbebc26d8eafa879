"""VaR, EVaR, TiVaR, the inverse superquantile and hierarchical tilting against NumPy/SciPy references."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import slow_after
from scipy.optimize import minimize_scalar
from scipy.special import logsumexp

from jaxfl.primitives import superquantile, tail_threshold, tilted_risk, tilted_risk_weights
from jaxfl.primitives.risk import (
    evar,
    hierarchical_tilted_risk,
    hierarchical_tilted_weights,
    inverse_superquantile,
    tivar,
    value_at_risk,
)

THETAS = [1.0, 0.7, 0.3, 0.1, 0.02]


def _tilted64(a, w, t):
    return float(np.sum(w * a)) if t == 0 else float(logsumexp(t * a, b=w) / t)


def _evar_reference(a, theta, w):
    """min_{t > 0} R_t - log(theta) / t in float64: SciPy's bounded search on log t, and the limits."""
    a, w = np.asarray(a, np.float64), np.asarray(w, np.float64) / np.sum(w)
    if theta == 1:
        return float(np.sum(w * a))
    spread = max(a.max() - a.min(), 1e-12)
    objective = lambda u: _tilted64(a, w, math.exp(u) / spread) - math.log(theta) / (math.exp(u) / spread)  # noqa: E731
    grid = np.linspace(-12, 16, 300)
    best = grid[np.argmin([objective(u) for u in grid])]
    found = minimize_scalar(
        objective, bounds=(best - 0.1, best + 0.1), method="bounded", options={"xatol": 1e-9}
    )
    return min(found.fun, a.max())


def _tivar_reference(a, theta, w):
    """F + min_t (1/t) log([(E e^{t (a - F)} - (1 - theta)) / theta]_+), F = min a, in float64."""
    a, w = np.asarray(a, np.float64), np.asarray(w, np.float64) / np.sum(w)
    floor = a.min()
    y = a - floor
    spread = max(y.max(), 1e-12)

    def objective(t):
        log_moment = logsumexp(t * y, b=w)
        excess = math.exp(log_moment) - (1 - theta) if log_moment < 600 else math.inf
        if excess <= 0:
            return math.inf
        log_excess = (
            log_moment + math.log1p(-(1 - theta) * math.exp(-log_moment)) if excess < math.inf else log_moment
        )
        return (log_excess - math.log(theta)) / t

    candidates = [float(np.sum(w * y)) / theta]  # The t -> 0 limit.
    for sign in (1.0, -1.0):
        grid = np.linspace(-12, 16, 600)
        values = [objective(sign * math.exp(u) / spread) for u in grid]
        best = grid[int(np.argmin(values))]
        found = minimize_scalar(
            lambda u, sign=sign: objective(sign * math.exp(u) / spread),
            bounds=(best - 0.02, best + 0.02),
            method="bounded",
            options={"xatol": 1e-10},
        )
        candidates += [min(values), found.fun]
    return floor + min(candidates)


def _draws(seed, n=40):
    rng = np.random.default_rng(seed)
    losses = [rng.exponential(size=n), rng.normal(size=n) * 3, rng.lognormal(size=n), rng.uniform(size=n)]
    weights = [np.ones(n), rng.uniform(0.1, 2.0, size=n)]
    return [(a.astype(np.float32), w.astype(np.float32)) for a in losses for w in weights]


# Compiled once for every draw of the same shapes (an eager call traces the tilt search each time).
EVAR, TIVAR, INVERSE = jax.jit(evar), jax.jit(tivar), jax.jit(inverse_superquantile)
VAR = jax.jit(value_at_risk)
H = jax.jit(hierarchical_tilted_risk, static_argnums=2)
HW = jax.jit(hierarchical_tilted_weights, static_argnums=2)
H_GRAD = jax.jit(jax.grad(hierarchical_tilted_risk), static_argnums=2)


@pytest.mark.parametrize("theta", slow_after(THETAS, keep=1))
def test_evar_and_tivar_equal_the_references(theta):
    for a, w in _draws(0):
        np.testing.assert_allclose(
            float(EVAR(a, theta, w)), _evar_reference(a, theta, w), rtol=2e-4, atol=2e-5
        )
        np.testing.assert_allclose(
            float(TIVAR(a, theta, w)), _tivar_reference(a, theta, w), rtol=2e-4, atol=2e-5
        )


@pytest.mark.slow
def test_the_orderings_of_li_2023_theorem_28_on_random_losses():
    # VaR <= TiVaR <= EVaR and VaR <= superquantile <= EVaR, for every theta, under vmap.
    thetas = jnp.asarray([1.0, 0.9, 0.5, 0.25, 0.1, 0.05, 0.01])
    functions = {
        name: jax.jit(jax.vmap(f, in_axes=(None, 0, None)))
        for name, f in [("var", value_at_risk), ("tivar", tivar), ("cvar", superquantile), ("evar", evar)]
    }
    for seed in range(3):
        for a, w in _draws(seed, n=25):
            measures = {name: f(a, thetas, w) for name, f in functions.items()}
            slack = 1e-5 * (1 + np.abs(a).max())
            for low, high in [("var", "tivar"), ("tivar", "evar"), ("var", "cvar"), ("cvar", "evar")]:
                assert np.all(measures[low] <= measures[high] + slack), (low, high, seed)


def test_limits_in_theta():
    a = np.asarray([0.5, 2.0, -1.0, 3.5, 0.0], np.float32)
    w = np.asarray([1.0, 2.0, 1.0, 0.5, 1.0], np.float32)
    mean = float(np.sum(a * w) / np.sum(w))
    assert float(EVAR(a, 1.0, w)) == pytest.approx(mean, abs=1e-6)
    assert float(TIVAR(a, 1.0, w)) == pytest.approx(-1.0, abs=1e-5)
    assert float(INVERSE(a, 1.0, w)) == pytest.approx(mean, abs=1e-6)
    tiny = 1e-7
    assert float(EVAR(a, tiny, w)) == pytest.approx(3.5, abs=1e-3)
    assert float(TIVAR(a, tiny, w)) == pytest.approx(3.5, abs=1e-3)
    assert float(INVERSE(a, tiny, w)) == pytest.approx(-1.0, abs=1e-6)
    # Equal losses: every measure is that loss.
    same = np.full(5, 2.5, np.float32)
    for f in (EVAR, TIVAR, VAR, INVERSE):
        assert float(f(same, 0.3, w)) == pytest.approx(2.5, abs=1e-6)


def test_inverse_superquantile_and_var_against_numpy():
    rng = np.random.default_rng(3)
    a = rng.normal(size=20).astype(np.float32)
    threshold = jax.jit(tail_threshold)
    for k in (1, 5, 20):
        assert float(INVERSE(a, k / 20)) == pytest.approx(np.sort(a)[:k].mean(), rel=1e-5)
        assert float(VAR(a, k / 20)) == float(threshold(a, k / 20))
        # The (theta n + 1)-th largest loss where theta n is an integer (the smallest at theta = 1).
        assert float(VAR(a, k / 20)) == np.sort(a)[max(19 - k, 0)]


def test_gradients_are_the_tilted_weights_at_the_optimal_tilt():
    a = jnp.asarray(np.random.default_rng(4).exponential(size=12), jnp.float32)
    floor = float(jnp.min(a)) - 0.5  # TiVaR's floor, held fixed as the finite differences need.
    tivar_floored = jax.jit(lambda x, theta: tivar(x, theta, floor=floor))
    eps, top = 1e-2, int(jnp.argmax(a))
    bump = jnp.zeros_like(a).at[top].set(eps)
    for f in (EVAR, tivar_floored):
        grad = jax.jit(jax.grad(f))(a, 0.2)
        assert bool(jnp.all(grad >= -1e-6))
        numeric = (f(a + bump, 0.2) - f(a - bump, 0.2)) / (2 * eps)
        assert float(grad[top]) == pytest.approx(float(numeric), abs=5e-3)
    # EVaR's are softmax(t* a): they sum to 1 (translation equivariance) and are ordered as the losses.
    grad = jax.jit(jax.grad(EVAR))(a, 0.2)
    assert float(jnp.sum(grad)) == pytest.approx(1.0, abs=1e-4)
    order = jnp.argsort(a)
    assert bool(jnp.all(jnp.diff(grad[order]) >= -1e-6))


def test_zero_weights_nan_and_traced_theta():
    a = np.asarray([1.0, np.nan, 2.0, 4.0], np.float32)
    w = np.asarray([1.0, 0.0, 1.0, 1.0], np.float32)
    finite_there = np.asarray([1.0, 7.0, 2.0, 4.0], np.float32)
    for f in (EVAR, TIVAR, VAR, INVERSE):
        # The zero-weight NaN changes nothing (as a finite loss there would not); a weighted NaN is NaN.
        assert float(f(a, 0.5, w)) == pytest.approx(float(f(finite_there, 0.5, w)), abs=1e-5)
        assert math.isnan(float(f(a, 0.5, np.ones(4, np.float32))))
        assert math.isnan(float(f(a, jnp.float32(1.5), w)))  # A traced theta outside (0, 1].
    for f in (evar, tivar, value_at_risk, inverse_superquantile):
        with pytest.raises(ValueError, match="theta"):
            f(a, 0.0)


# ---------------------------------------------------------------------------
# Hierarchical tilting.


def _hierarchical_reference(a, groups, num_groups, t, tau, w):
    a, w = np.asarray(a, np.float64), np.asarray(w, np.float64)
    risks, masses = [], []
    for g in range(num_groups):
        member = (groups == g) & (w > 0)
        if not member.any():
            continue
        risks.append(_tilted64(a[member], w[member] / w[member].sum(), tau))
        masses.append(w[member].sum())
    masses = np.asarray(masses) / np.sum(masses)
    return _tilted64(np.asarray(risks), masses, t)


HIERARCHY = [
    (1.0, 1.0),
    (2.0, 0.0),
    (0.0, 3.0),
    (-2.0, 0.5),
    (5.0, -1.0),
    (1e-5, 1e-5),
    (50.0, 2.0),
    (-50.0, 0.0),
]


@pytest.mark.parametrize("t, tau", HIERARCHY)
def test_hierarchical_tilted_risk_equals_a_loop_over_groups(t, tau):
    rng = np.random.default_rng(5)
    a = rng.normal(size=30).astype(np.float32)
    groups = rng.integers(0, 6, 30).astype(np.int32)
    groups[groups == 4] = 3  # Group 4 is empty.
    for w in (np.ones(30, np.float32), rng.uniform(0.1, 3, 30).astype(np.float32)):
        got = float(H(a, groups, 6, t, tau, w))
        assert got == pytest.approx(_hierarchical_reference(a, groups, 6, t, tau, w), rel=1e-5, abs=1e-6)
        weights = HW(a, groups, 6, t, tau, w)
        gradient = H_GRAD(a, groups, 6, t, tau, w)
        np.testing.assert_allclose(weights, gradient, atol=1e-6)
        assert float(jnp.sum(weights)) == pytest.approx(1.0, abs=1e-5)


def test_hierarchical_special_cases():
    # Shapes as the loop test's (30 losses, 6 groups): the compiled functions are reused.
    rng = np.random.default_rng(6)
    a = rng.normal(size=30).astype(np.float32)
    groups = np.repeat(np.arange(6), 5).astype(np.int32)
    ones = np.ones(30, np.float32)
    # tau = t: the sample-level tilted risk (Li 2023, Lemma 32).
    sample_level = float(jax.jit(tilted_risk)(a, 1.7))
    assert float(H(a, groups, 6, 1.7, 1.7, ones)) == pytest.approx(sample_level, rel=1e-5)
    sample_weights = jax.jit(tilted_risk_weights)(a, 1.7)
    np.testing.assert_allclose(HW(a, groups, 6, 1.7, 1.7, ones), sample_weights, atol=1e-6)
    means = a.reshape(6, 5).mean(axis=1)
    # Large t: the worst group's risk; large negative t: the best's (tau = 0: their means).
    assert float(H(a, groups, 6, 1e4, 0.0, ones)) == pytest.approx(means.max(), abs=1e-3)
    assert float(H(a, groups, 6, -1e4, 0.0, ones)) == pytest.approx(means.min(), abs=1e-3)
    # Ids outside [0, G) belong to no group (as zero weights); NaN of positive weight is NaN.
    outside = groups.copy()
    outside[:5] = 7
    with_nan = a.copy()
    with_nan[0] = np.nan
    without_first = np.where(np.arange(30) < 5, 0.0, 1.0).astype(np.float32)
    assert float(H(with_nan, outside, 6, 1.0, 0.5, ones)) == pytest.approx(
        float(H(a, groups, 6, 1.0, 0.5, without_first)), rel=1e-6
    )
    assert math.isnan(float(H(with_nan, groups, 6, 1.0, 0.5, ones)))
    ts = jnp.asarray([-1.0, 0.0, 2.0])  # vmap over the tilt: each point as alone.
    batched = jax.jit(jax.vmap(lambda t: hierarchical_tilted_risk(a, groups, 6, t, 0.5, ones)))(ts)
    np.testing.assert_allclose(batched, [float(H(a, groups, 6, t, 0.5, ones)) for t in ts], rtol=1e-6)
    with pytest.raises(ValueError, match="groups"):
        hierarchical_tilted_risk(a, groups[:5], 6, 1.0, 1.0)
