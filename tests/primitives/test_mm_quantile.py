"""Tests of the majorization-minimization quantile (000 Appendix B.1, eq. 17).

The reference is the exact weighted quantile; since a quantile can be an
interval, the MM estimate is judged by its pinball loss, which must reach the
minimum, and by its distance to the set of minimizers.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxfl.primitives import mm_quantile

N = 40
mm = jax.jit(mm_quantile)


def pinball(values, mu, tau, weights):
    alpha = np.asarray(weights, np.float64) / np.sum(weights)
    r = np.asarray(values, np.float64) - mu
    return float(np.sum(alpha * np.where(r >= 0, tau * r, (tau - 1) * r)))


def quantile_interval(values, tau, weights):
    """All minimizers of the pinball loss: [lower, upper] (float64 brute force)."""
    values = np.asarray(values, np.float64)
    alpha = np.asarray(weights, np.float64) / np.sum(weights)
    support = np.unique(values[alpha > 0])
    losses = np.array(
        [pinball(values[alpha > 0], v, tau, alpha[alpha > 0]) for v in support]
    )
    best = support[np.isclose(losses, losses.min(), rtol=0, atol=1e-12)]
    return best.min(), best.max()


@pytest.mark.parametrize("tau", [0.1, 0.37, 0.5, 0.9])
@pytest.mark.parametrize("weighted", [False, True])
def test_mm_reaches_the_minimal_pinball_loss(tau, weighted):
    rng = np.random.default_rng(int(tau * 100) + weighted)
    values = rng.normal(size=N).astype(np.float32)
    weights = (
        rng.uniform(0.2, 3.0, size=N).astype(np.float32)
        if weighted
        else np.ones(N, np.float32)
    )
    got = float(mm(values, tau, weights))
    lower, _ = quantile_interval(values, tau, weights)
    spread = float(np.std(values))
    best = pinball(values, lower, tau, weights)
    # MM moves in proportion to the slope of H_tau, so where H_tau is nearly
    # flat 100 steps leave a small objective gap (1e-3 spread at worst over
    # random problems, see docs/primitives.md), not necessarily a small
    # distance to the quantile.
    assert 0 <= pinball(values, got, tau, weights) - best + 1e-7 <= 1e-3 * spread


def test_mm_converges_to_the_quantile_when_it_is_well_separated():
    # tau n = 12.4 is far from an integer: H_tau has slope >= 0.4/n on both
    # sides of the quantile, and MM converges to it.
    rng = np.random.default_rng(3)
    values = rng.normal(size=N).astype(np.float32)
    got = float(jax.jit(mm_quantile, static_argnums=(3,))(values, 0.31, None, 300))
    lower, upper = quantile_interval(values, 0.31, np.ones(N))
    assert lower == upper
    np.testing.assert_allclose(got, lower, atol=1e-5 * np.std(values))


def test_mm_on_an_interval_quantile_and_small_cases():
    # tau = 0.5 of 4 equal-weight values: any point of [a_(2), a_(3)] is a
    # median; MM lands inside.
    values = np.array([3.0, 1.0, 4.0, 2.0] + [0.0] * (N - 4), np.float32)
    weights = np.array([1.0] * 4 + [0.0] * (N - 4), np.float32)
    got = float(mm(values, 0.5, weights))
    assert 2.0 - 1e-5 <= got <= 3.0 + 1e-5
    # n = 1 and all-equal values return that value.
    assert float(mm_quantile(np.array([2.5], np.float32), 0.3)) == 2.5
    np.testing.assert_allclose(
        mm(np.full(N, 7.0, np.float32), 0.3, np.ones(N, np.float32)), 7.0, rtol=1e-6
    )


def test_mm_zero_weights_nan_and_errors():
    rng = np.random.default_rng(1)
    values = rng.normal(size=N).astype(np.float32)
    weights = np.ones(N, np.float32)
    weights[:10] = 0.0
    values_with_nan = values.copy()
    values_with_nan[:10] = np.nan  # zero weight: ignored
    np.testing.assert_allclose(
        mm(values_with_nan, 0.3, weights),
        mm(values[10:], 0.3, np.ones(N - 10, np.float32)),
        rtol=1e-5,
    )
    values_with_nan[20] = np.nan  # positive weight: NaN
    assert np.isnan(mm(values_with_nan, 0.3, weights))
    assert np.isnan(mm(values, 0.3, np.zeros(N, np.float32)))
    assert np.isnan(mm(values, 1.0, weights))  # traced level outside (0, 1)
    with pytest.raises(ValueError, match="level"):
        mm_quantile(values, 1.0)
    with pytest.raises(ValueError, match="num_iters"):
        mm_quantile(values, 0.5, num_iters=-1)
    with pytest.raises(ValueError, match="1-D"):
        mm_quantile(values.reshape(4, 10), 0.5)


def test_mm_vmap_over_level_matches_loop():
    values = np.random.default_rng(2).exponential(size=N).astype(np.float32)
    weights = np.ones(N, np.float32)
    levels = np.array([0.2, 0.5, 0.8], np.float32)
    batched = jax.jit(jax.vmap(mm_quantile, in_axes=(None, 0, None)))(
        values, levels, weights
    )
    looped = [mm(values, level, weights) for level in levels]
    np.testing.assert_allclose(batched, looped, rtol=1e-6)
