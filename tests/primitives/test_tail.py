"""Tests of jaxfl.primitives.tail against independent float64 references.

The superquantile is checked against its linear program (scipy linprog), the
weights against a greedy NumPy loop, the threshold against its definition
evaluated by brute force, the smoothed superquantile against SLSQP on its
concave program, and the tilted risk against scipy's logsumexp.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from scipy.optimize import linprog, minimize
from scipy.special import logsumexp, rel_entr

from jaxfl.primitives import (
    smoothed_superquantile,
    smoothed_superquantile_weights,
    superquantile,
    superquantile_weights,
    tail_threshold,
    tilted_risk,
    tilted_risk_weights,
)

# Compile time dominates the run time of these tests: every family is
# evaluated through one jitted function of all its outputs, on inputs padded
# to a few shapes with zero-weight NaN entries (which must change nothing).
SMALL, LARGE = 12, 128


# ---------------------------------------------------------------------------
# float64 references


def lp_superquantile(losses, theta, weights):
    """Max pi.a over {pi in simplex, 0 <= pi_i <= wbar_i/theta}, by linprog."""
    a = np.asarray(losses, np.float64)
    wbar = np.asarray(weights, np.float64) / np.sum(weights)
    result = linprog(
        -a,
        A_eq=np.ones((1, a.size)),
        b_eq=[1.0],
        bounds=[(0.0, u / theta) for u in wbar],
        method="highs",
    )
    assert result.status == 0
    return -result.fun


def greedy_weights(losses, theta, weights):
    """Fill wbar_i / theta in decreasing order of the losses; ties share."""
    a = np.asarray(losses, np.float64)
    wbar = np.asarray(weights, np.float64) / np.sum(weights)
    pi = np.zeros_like(a)
    left = 1.0
    for value in sorted(set(a[wbar > 0].tolist()), reverse=True):
        group = (a == value) & (wbar > 0)
        cap = wbar[group].sum() / theta
        take = min(cap, left)
        pi[group] = wbar[group] / wbar[group].sum() * take
        left -= take
    return pi


def brute_threshold(losses, theta, weights):
    """Min { a_i : w_i > 0, sum_{a_j > a_i} wbar_j <= theta } in float64."""
    a = np.asarray(losses, np.float64)
    wbar = np.asarray(weights, np.float64) / np.sum(weights)
    support = a[wbar > 0]
    feasible = [v for v in support if wbar[a > v].sum() <= theta + 1e-12]
    return min(feasible)


def slsqp_smoothed(losses, theta, nu, weights):
    a = np.asarray(losses, np.float64)
    wbar = np.asarray(weights, np.float64) / np.sum(weights)

    def negative(pi):
        pi = np.maximum(pi, 1e-300)
        return -(pi @ a - nu * np.sum(pi * np.log(pi / wbar)))

    result = minimize(
        negative,
        wbar,
        method="SLSQP",
        bounds=[(1e-15, u / theta) for u in wbar],
        constraints=[{"type": "eq", "fun": lambda pi: pi.sum() - 1}],
        options={"ftol": 1e-15, "maxiter": 2000},
    )
    return -result.fun, result.x


# ---------------------------------------------------------------------------
# The edge grid of the issue.

rng = np.random.default_rng(20261125)
EDGE_CASES = {
    "n=1": ([1.5], None, 0.3),
    "n=1,theta=1": ([-2.0], None, 1.0),
    "ties": ([1.0, 3.0, 3.0, 3.0, 0.0, 2.0], None, 0.25),
    "all_tied": ([2.0, 2.0, 2.0, 2.0], None, 0.3),
    "theta=1": ([0.3, -1.0, 4.0, 2.5], [1.0, 2.0, 0.5, 1.5], 1.0),
    "tiny_theta": (rng.normal(size=9).tolist(), None, 1e-4),
    "theta_n_integer": (rng.normal(size=10).tolist(), None, 0.3),
    "theta_n_fractional": (rng.normal(size=10).tolist(), None, 0.25),
    "zero_weights": ([5.0, 1.0, 9.0, 2.0, 3.0], [1.0, 1.0, 0.0, 2.0, 0.0], 0.4),
    "random_weights": (
        rng.normal(size=12).tolist(),
        rng.uniform(0.1, 2.0, size=12).tolist(),
        0.37,
    ),
    "integer_weights": ([4.0, 2.0, 8.0, 6.0, 1.0], [3.0, 1.0, 2.0, 2.0, 2.0], 0.2),
}


def _arrays(losses, weights):
    losses = np.asarray(losses, np.float32)
    weights = (
        np.ones_like(losses) if weights is None else np.asarray(weights, np.float32)
    )
    return losses, weights


def _pad(losses, weights=None):
    """Zero-weight NaN padding to SMALL or LARGE entries (n = 1 is kept)."""
    losses, weights = _arrays(losses, weights)
    if losses.size == 1:
        return losses, weights
    size = SMALL if losses.size <= SMALL else LARGE
    pad = size - losses.size
    return (
        np.concatenate([losses, np.full(pad, np.nan, np.float32)]),
        np.concatenate([weights, np.zeros(pad, np.float32)]),
    )


@jax.jit
def _tail_outputs(losses, theta, weights):
    return (
        superquantile(losses, theta, weights),
        superquantile_weights(losses, theta, weights),
        tail_threshold(losses, theta, weights),
        jax.grad(superquantile)(losses, theta, weights),
    )


def tail(losses, theta, weights=None):
    """(value, weights, threshold, gradient) as NumPy, unpadded."""
    n = np.size(losses)
    padded_losses, padded_weights = _pad(losses, weights)
    value, pi, q, grad = _tail_outputs(padded_losses, theta, padded_weights)
    return float(value), np.asarray(pi)[:n], float(q), np.asarray(grad)[:n]


@jax.jit
def _tail_outputs_uniform(losses, theta):
    return (
        superquantile(losses, theta),
        superquantile_weights(losses, theta),
        tail_threshold(losses, theta),
    )


@pytest.mark.parametrize("name", sorted(EDGE_CASES))
def test_tail_functionals_on_edge_grid(name):
    losses, weights, theta = EDGE_CASES[name]
    losses, weights = _arrays(losses, weights)
    value, pi, q, grad = tail(losses, theta, weights)
    pi = pi.astype(np.float64)
    # The value against the linear program.
    expected = lp_superquantile(losses, theta, weights)
    np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-5)
    # The weights against the greedy loop, feasible, optimal, and = gradient.
    np.testing.assert_allclose(pi, greedy_weights(losses, theta, weights), atol=2e-6)
    wbar = weights / weights.sum()
    assert np.all(pi >= 0)
    assert np.all(pi <= wbar / theta * (1 + 1e-5) + 1e-7)
    np.testing.assert_allclose(pi.sum(), 1.0, rtol=1e-5)
    np.testing.assert_allclose(pi @ losses, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grad, pi, atol=1e-7)
    # The threshold against its definition.
    assert q == brute_threshold(losses, theta, weights)


def test_uniform_weights_default():
    losses = np.random.default_rng(9).normal(size=SMALL).astype(np.float32)
    ones = np.ones(SMALL, np.float32)
    for theta in (0.3, 0.25, 1.0):
        value, pi, q = _tail_outputs_uniform(losses, theta)
        np.testing.assert_allclose(
            value, lp_superquantile(losses, theta, ones), rtol=1e-5
        )
        np.testing.assert_array_equal(pi, tail(losses, theta, ones)[1])
        assert float(q) == brute_threshold(losses, theta, ones)


def test_percentiles_are_exact_inverted_cdf():
    # How the engine computes percentile p: tail_threshold(x, 1 - p / 100).
    # The exact answer is the k-th smallest value, k = ceil(p n / 100) (>= 1),
    # in integer arithmetic. (np.percentile(method="inverted_cdf") itself
    # rounds: at n = 100, p = 55 it computes 0.55 * 100 = 55.000000000000007
    # and returns the 56th value.)
    for n in (100, 37, 10):
        x = np.random.default_rng(n).normal(size=n).astype(np.float32)
        ordered = np.sort(x)
        for p in range(0, 101, 5):
            k = max(-(-p * n // 100), 1)
            theta = 1 - p / 100 if p < 100 else 1e-7
            assert tail(x, theta)[2] == ordered[k - 1], (n, p)
    x = np.random.default_rng(3).normal(size=SMALL).astype(np.float32)
    assert float(_tail_outputs_uniform(x, 1 - 25 / 100)[2]) == np.sort(x)[2]


def test_integer_theta_n_puts_zero_weight_on_boundary():
    # theta = 0.1 is not exact in float32, yet theta * n = 10 is treated as an
    # integer: exactly 10 clients get 1/10 (004 Proposition 3(c), Remark 1).
    losses = np.random.default_rng(0).permutation(100).astype(np.float32)
    value, pi, q, _ = tail(losses, 0.1)
    assert np.count_nonzero(pi) == 10
    np.testing.assert_allclose(pi[losses >= 90], 0.1, rtol=1e-6)
    assert q == 89.0
    np.testing.assert_allclose(value, np.mean(np.arange(90, 100)), rtol=1e-6)


def test_fractional_boundary_client():
    # theta n = 2.5: two clients get 1/(theta n) = 0.4, the boundary gets 0.2.
    losses = np.arange(10, dtype=np.float32)
    value, pi, q, _ = tail(losses, 0.25)
    np.testing.assert_allclose(pi[[9, 8, 7]], [0.4, 0.4, 0.2], rtol=1e-5)
    assert np.all(pi[:7] == 0)
    assert q == 7.0
    np.testing.assert_allclose(value, 0.4 * 9 + 0.4 * 8 + 0.2 * 7, rtol=1e-6)


def test_limits_in_theta():
    losses = np.array([0.5, -1.0, 3.0, 2.0], np.float32)
    weights = np.array([1.0, 3.0, 2.0, 2.0], np.float32)
    value, _, q, _ = tail(losses, 1.0, weights)
    np.testing.assert_allclose(value, np.average(losses, weights=weights), rtol=1e-6)
    assert q == -1.0
    value, _, q, _ = tail(losses, 1e-6, weights)
    np.testing.assert_allclose(value, 3.0, rtol=1e-6)
    assert q == 3.0


def test_tied_losses_share_the_boundary_and_permutation_equivariance():
    losses = np.array([1.0, 3.0, 2.0, 2.0, 2.0, 0.0], np.float32)
    # theta n = 3: 3.0 gets 1/3, the three 2.0 share the remaining 2/3; the
    # gradient at the ties is this same symmetric subgradient.
    _, pi, _, grad = tail(losses, 0.5)
    np.testing.assert_allclose(pi, [0, 1 / 3, 2 / 9, 2 / 9, 2 / 9, 0], atol=1e-6)
    np.testing.assert_allclose(grad, pi, atol=1e-7)
    perm = np.random.default_rng(1).permutation(losses.size)
    np.testing.assert_allclose(tail(losses[perm], 0.5)[1], pi[perm], atol=1e-7)


def test_weighted_ties_share_in_proportion_to_weights():
    losses = np.array([5.0, 1.0, 1.0], np.float32)
    weights = np.array([1.0, 1.0, 3.0], np.float32)
    # theta = 0.6: the 5.0 gets (1/5)/0.6 = 1/3; the ties share 2/3 as 1:3.
    np.testing.assert_allclose(
        tail(losses, 0.6, weights)[1], [1 / 3, 1 / 6, 1 / 2], atol=1e-6
    )


# ---------------------------------------------------------------------------
# jit / vmap / gradients


def test_vmap_over_losses_and_theta_matches_loop():
    rng = np.random.default_rng(2)
    batch = rng.normal(size=(5, SMALL)).astype(np.float32)
    weights = rng.uniform(size=(5, SMALL)).astype(np.float32)
    thetas = np.array([0.1, 0.25, 0.5, 0.9, 1.0], np.float32)
    batched = jax.jit(jax.vmap(_tail_outputs))(batch, thetas, weights)
    for i in range(5):
        looped = _tail_outputs(batch[i], thetas[i], weights[i])
        for got, expected in zip(batched, looped, strict=True):
            np.testing.assert_allclose(got[i], expected, rtol=1e-6, atol=1e-7)
    # A sweep: one loss vector, many theta.
    sweep = jax.jit(jax.vmap(superquantile, in_axes=(None, 0)))(batch[0], thetas)
    expected = [lp_superquantile(batch[0], float(t), np.ones(SMALL)) for t in thetas]
    np.testing.assert_allclose(sweep, expected, rtol=1e-5)


def test_gradient_equals_superquantile_weights():
    rng = np.random.default_rng(4)
    losses = rng.normal(size=11).astype(np.float32)
    weights = rng.uniform(size=11).astype(np.float32)
    for theta in (0.05, 0.3, 0.5, 1.0):
        _, pi, _, grad = tail(losses, theta, weights)
        np.testing.assert_allclose(grad, pi, atol=1e-7)
        assert np.count_nonzero(pi) >= 1


def test_check_grads_away_from_ties():
    # Distinct losses and theta * n = 2.25 away from an integer: smooth there;
    # derivatives in losses, theta and weights (envelope theorem).
    losses = jnp.array([0.1, 1.3, -0.7, 2.2, 0.9], jnp.float32)
    weights = jnp.array([1.0, 0.5, 2.0, 1.5, 1.0], jnp.float32)
    check_grads(
        jax.jit(superquantile),
        (losses, jnp.float32(0.45), weights),
        order=1,
        modes=("fwd", "rev"),
        eps=1e-3,
    )


def test_second_derivative_in_losses_is_zero():
    losses = jnp.array([0.1, 1.3, -0.7, 2.2, 0.9], jnp.float32)
    hessian = jax.jit(jax.hessian(superquantile))(losses, 0.4)
    np.testing.assert_array_equal(hessian, np.zeros((5, 5)))


# ---------------------------------------------------------------------------
# NaN / inf / bad arguments


def test_nan_loss_propagates():
    value, pi, q, grad = tail([1.0, np.nan, 2.0], 0.5)
    assert np.isnan(value) and np.isnan(q)
    assert np.all(np.isnan(pi)) and np.all(np.isnan(grad))


def test_nan_loss_with_zero_weight_is_ignored():
    value, pi, q, grad = tail([1.0, np.nan, 2.0, np.inf], 0.5, [1.0, 0.0, 1.0, 0.0])
    assert value == 2.0 and q == 1.0
    np.testing.assert_array_equal(pi, [0.0, 0.0, 1.0, 0.0])
    np.testing.assert_array_equal(grad, [0.0, 0.0, 1.0, 0.0])


def test_infinite_losses():
    losses = [1.0, np.inf, 2.0, 0.0]
    value, pi, q, _ = tail(losses, 0.5)
    assert value == np.inf and q == 1.0
    np.testing.assert_allclose(pi, [0.0, 0.5, 0.5, 0.0])
    # The +inf entry carries 1/4 > theta: the threshold is +inf.
    _, pi, q, _ = tail(losses, 0.2)
    assert q == np.inf
    np.testing.assert_allclose(pi, [0.0, 1.0, 0.0, 0.0])
    # -inf losses: ignored unless the tail reaches them.
    value, _, _, _ = tail([1.0, -np.inf, 2.0], 0.5)
    np.testing.assert_allclose(value, 5 / 3, rtol=1e-6)
    value, _, q, _ = tail([1.0, -np.inf, 2.0], 1.0)
    assert value == -np.inf and q == -np.inf


def test_all_zero_weights():
    value, pi, q, _ = tail([1.0, 2.0], 0.5, [0.0, 0.0])
    assert np.isnan(value) and np.isnan(q)
    np.testing.assert_array_equal(pi, [0.0, 0.0])


@pytest.mark.parametrize("bad", [-1.0, np.nan, np.inf])
def test_bad_weights_give_nan(bad):
    value, pi, q, _ = tail([1.0, 2.0, 3.0], 0.5, [1.0, bad, 1.0])
    assert np.isnan(value) and np.isnan(q) and np.all(np.isnan(pi))


@pytest.mark.parametrize("theta", [0.0, -0.5, 1.5, np.nan])
def test_bad_theta(theta):
    losses = np.array([1.0, 2.0, 3.0], np.float32)
    with pytest.raises(ValueError, match="theta"):
        superquantile(losses, theta)
    with pytest.raises(ValueError, match="theta"):
        tail_threshold(losses, np.float32(theta))
    with pytest.raises(ValueError, match="theta"):
        smoothed_superquantile(losses, theta, 0.1)
    # Traced: NaN.
    value, pi, q, _ = tail(losses, theta)
    assert np.isnan(value) and np.isnan(q) and np.all(np.isnan(pi))


def test_shape_errors():
    with pytest.raises(ValueError, match="1-D"):
        superquantile(np.ones((2, 3)), 0.5)
    with pytest.raises(ValueError, match="shape"):
        superquantile(np.ones(3), 0.5, np.ones(4))
    with pytest.raises(ValueError, match="at least one"):
        superquantile(np.ones(0), 0.5)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_low_precision_inputs_keep_their_dtype(dtype):
    losses = jnp.asarray([0.5, 2.0, 1.0, 3.0], dtype)
    value, pi, q = _tail_outputs_uniform(losses, 0.5)
    assert value.dtype == pi.dtype == q.dtype == dtype
    np.testing.assert_allclose(float(value), 2.5, rtol=1e-2)


# ---------------------------------------------------------------------------
# Smoothed superquantile (004 eq. 14-15)


@jax.jit
def _smoothed_outputs(losses, theta, nu, weights):
    return (
        smoothed_superquantile(losses, theta, nu, weights),
        smoothed_superquantile_weights(losses, theta, nu, weights),
        jax.grad(smoothed_superquantile)(losses, theta, nu, weights),
    )


def smoothed(losses, theta, nu, weights=None):
    n = np.size(losses)
    padded_losses, padded_weights = _pad(losses, weights)
    value, pi, grad = _smoothed_outputs(padded_losses, theta, nu, padded_weights)
    return float(value), np.asarray(pi)[:n], np.asarray(grad)[:n]


SMOOTHED_CASES = [
    ([0.3, -1.0, 4.0, 2.5, 1.0], [1.0, 2.0, 0.5, 1.5, 1.0], 0.3, 0.5),
    ([0.3, -1.0, 4.0, 2.5, 1.0], None, 0.5, 0.05),
    ([1.0, 3.0, 3.0, 0.0], None, 0.25, 0.2),  # ties
    ([2.0, 1.0, 0.5], [1.0, 0.0, 1.0], 0.6, 1.0),  # a zero weight
    ([0.2, 0.1], None, 1.0, 0.3),  # theta = 1: the mean
]


@pytest.mark.parametrize("case", range(len(SMOOTHED_CASES)))
def test_smoothed_superquantile_matches_slsqp(case):
    losses, weights, theta, nu = SMOOTHED_CASES[case]
    losses, weights = _arrays(losses, weights)
    positive = weights > 0
    expected, pi_ref = slsqp_smoothed(losses[positive], theta, nu, weights[positive])
    value, pi, grad = smoothed(losses, theta, nu, weights)
    np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(pi[positive], pi_ref, atol=2e-4)
    assert np.all(pi[~positive] == 0)
    np.testing.assert_allclose(pi.sum(), 1.0, rtol=1e-5)
    np.testing.assert_allclose(grad, pi, atol=1e-6)


def test_smoothed_limits():
    losses = np.random.default_rng(6).normal(size=9).astype(np.float32)
    exact, exact_pi, _, _ = tail(losses, 0.3)
    # 0 <= S - S^nu <= nu log(1/theta), and nu = 0 is the superquantile.
    for nu in (1e-3, 1e-2, 1e-1, 1.0):
        gap = exact - smoothed(losses, 0.3, nu)[0]
        assert -1e-5 <= gap <= nu * np.log(1 / 0.3) + 1e-5
    value, pi, _ = smoothed(losses, 0.3, 0.0)
    assert value == exact
    np.testing.assert_array_equal(pi, exact_pi)
    np.testing.assert_allclose(smoothed(losses, 1.0, 0.7)[0], losses.mean(), rtol=1e-5)
    assert np.isnan(smoothed(losses, 0.3, -1.0)[0])  # traced negative nu
    with pytest.raises(ValueError, match="nu"):
        smoothed_superquantile(losses, 0.3, -1.0)
    # n = 1.
    assert smoothed([5.0], 0.2, 0.3)[0] == 5.0


def test_smoothed_check_grads():
    losses = jnp.array([0.1, 1.3, -0.7, 2.2, 0.9], jnp.float32)
    weights = jnp.array([1.0, 0.5, 2.0, 1.5, 1.0], jnp.float32)
    check_grads(
        jax.jit(smoothed_superquantile),
        (losses, jnp.float32(0.45), jnp.float32(0.3), weights),
        order=1,
        modes=("fwd", "rev"),
        eps=1e-3,
    )


def test_smoothed_vmap_nan_and_inf():
    batch = np.random.default_rng(7).normal(size=(3, SMALL)).astype(np.float32)
    ones = np.ones(SMALL, np.float32)
    nus = np.array([0.0, 0.1, 1.0], np.float32)
    batched = jax.jit(jax.vmap(_smoothed_outputs, in_axes=(0, None, 0, None)))(
        batch, 0.4, nus, ones
    )
    for i in range(3):
        looped = _smoothed_outputs(batch[i], 0.4, nus[i], ones)
        for got, expected in zip(batched, looped, strict=True):
            np.testing.assert_allclose(got[i], expected, rtol=1e-6, atol=1e-7)
    value, pi, _ = smoothed([1.0, np.nan], 0.5, 0.1)
    assert np.isnan(value) and np.all(np.isnan(pi))
    value, pi, _ = smoothed([1.0, np.inf, 0.0], 0.5, 0.1)
    assert value == np.inf
    np.testing.assert_allclose(pi[1], 2 / 3, rtol=1e-6)  # its cap wbar / theta
    np.testing.assert_allclose(pi.sum(), 1.0, rtol=1e-6)


# ---------------------------------------------------------------------------
# Tilted risk (TERM)


@jax.jit
def _tilted_outputs(losses, t, weights):
    return (
        tilted_risk(losses, t, weights),
        tilted_risk_weights(losses, t, weights),
        jax.grad(tilted_risk)(losses, t, weights),
        jax.grad(tilted_risk, argnums=1)(losses, t, weights),
    )


def tilted(losses, t, weights=None):
    n = np.size(losses)
    padded_losses, padded_weights = _pad(losses, weights)
    value, pi, grad, grad_t = _tilted_outputs(padded_losses, t, padded_weights)
    return float(value), np.asarray(pi)[:n], np.asarray(grad)[:n], float(grad_t)


TILTED_LOSSES = [1.0, 2.0, 3.5, -0.5]
TILTED_WEIGHTS = [1.0, 2.0, 1.0, 0.5]


@pytest.mark.parametrize("t", [0.0, 1e-7, 1e-3, 0.5, 5.0, -5.0, 200.0, -200.0])
def test_tilted_risk_matches_logsumexp(t):
    wbar = np.asarray(TILTED_WEIGHTS) / np.sum(TILTED_WEIGHTS)
    a = np.asarray(TILTED_LOSSES, np.float64)
    if t == 0:
        expected, expected_pi = wbar @ a, wbar
    else:
        expected = logsumexp(t * a, b=wbar) / t
        expected_pi = np.exp(t * a - logsumexp(t * a, b=wbar)) * wbar
    value, pi, grad, grad_t = tilted(TILTED_LOSSES, t, TILTED_WEIGHTS)
    np.testing.assert_allclose(value, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(pi, expected_pi, atol=1e-6)
    np.testing.assert_allclose(grad, pi, atol=1e-6)
    # dR/dt = KL(pi || wbar) / t^2 in float64, and half the variance at t = 0
    # (the float32 result must not lose digits to cancellation as t -> 0).
    centred = a - wbar @ a
    mu2, mu3, mu4 = (wbar @ centred**k for k in (2, 3, 4))
    if abs(t) < 1e-3:  # cumulant series: float64 KL / t^2 itself cancels here
        expected_grad_t = mu2 / 2 + mu3 * t / 3 + (mu4 - 3 * mu2**2) * t**2 / 8
    else:
        expected_grad_t = np.sum(rel_entr(expected_pi, wbar)) / t**2
    np.testing.assert_allclose(grad_t, expected_grad_t, rtol=2e-5)


def test_tilted_check_grads():
    losses = jnp.asarray(TILTED_LOSSES, jnp.float32)
    weights = jnp.asarray(TILTED_WEIGHTS, jnp.float32)
    for t in (0.7, -2.0):
        check_grads(
            jax.jit(tilted_risk),
            (losses, jnp.float32(t), weights),
            order=1,
            modes=("fwd", "rev"),
            eps=1e-3,
        )


def test_tilted_edge_cases():
    value, pi, _, _ = tilted([1.0, np.inf, 2.0, np.inf], 1.0, [1.0, 1.0, 1.0, 3.0])
    assert value == np.inf
    np.testing.assert_allclose(pi, [0, 0.25, 0, 0.75])
    assert np.isnan(tilted([1.0, np.nan], 1.0)[0])
    assert tilted([1.0, np.nan], 1.0, [1.0, 0.0])[0] == 1.0
    assert np.isnan(tilted([1.0, 1.0], 1.0, [0.0, 0.0])[0])
    with pytest.raises(ValueError, match="t must be finite"):
        tilted_risk(np.ones(2), np.inf)
    # Large |t| tends to the max / min.
    np.testing.assert_allclose(tilted([0.1, 0.4, 0.3], 1e4)[0], 0.4, atol=1e-3)
    np.testing.assert_allclose(tilted([0.1, 0.4, 0.3], -1e4)[0], 0.1, atol=1e-3)


def test_tilted_vmap_over_t():
    losses, weights = _pad(np.random.default_rng(8).normal(size=7))
    ts = np.array([-3.0, 0.0, 1e-6, 2.0], np.float32)
    batched = jax.jit(jax.vmap(_tilted_outputs, in_axes=(None, 0, None)))(
        losses, ts, weights
    )
    for i, t in enumerate(ts):
        looped = _tilted_outputs(losses, t, weights)
        for got, expected in zip(batched, looped, strict=True):
            np.testing.assert_allclose(got[i], expected, rtol=1e-6, atol=1e-7)
