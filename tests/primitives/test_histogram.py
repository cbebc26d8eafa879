"""Tests of hierarchical histograms, the dyadic CDF and the histogram quantile.

The references are NumPy loops that follow the definitions of 004 Algorithm 2
and eq. 8 (the maximal dyadic partition is built greedily, independently).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfl.primitives import dyadic_cdf, hierarchical_histogram, histogram_quantile
from jaxfl.primitives.histogram import bin_index

NUM_BINS = 16
UPPER = 10.0


def reference_bins(values, num_bins, upper):
    """Place values against the float32 edges j * upper / b by searchsorted."""
    values = np.asarray(values, np.float32)
    j = np.arange(1, num_bins, dtype=np.float32)
    edges = j * np.float32(upper) / np.float32(num_bins)
    clipped = np.clip(values, np.float32(0), np.float32(upper))
    index = np.searchsorted(edges, clipped, side="right")
    return np.where(np.isnan(values), -1, index)


def reference_levels(values, num_bins, upper):
    """levels[r][j] = #{values in bins j 2^r .. (j+1) 2^r - 1}, by a loop."""
    bins = reference_bins(values, num_bins, upper)
    levels = []
    r = 0
    while (1 << r) < num_bins:
        width = 1 << r
        levels.append(
            np.array(
                [
                    np.sum((bins >= j * width) & (bins < (j + 1) * width))
                    for j in range(num_bins // width)
                ]
            )
        )
        r += 1
    return levels


def maximal_dyadic_partition(j, num_bins):
    """The nodes (r, o) of the maximal dyadic partition of bins 1..j (1-based).

    Greedy from the left: the largest aligned block that fits. For j = b the
    root is not stored and the two top-level nodes are used.
    """
    if j == num_bins:
        top = num_bins.bit_length() - 2
        return [(top, 0), (top, 1)]
    nodes, start = [], 0
    while start < j:
        r = 0
        while start % (1 << (r + 1)) == 0 and start + (1 << (r + 1)) <= j:
            r += 1
        nodes.append((r, start >> r))
        start += 1 << r
    return nodes


def reference_cdf(levels, num_bins):
    return np.array(
        [
            sum(levels[r][o] for r, o in maximal_dyadic_partition(j, num_bins))
            for j in range(1, num_bins + 1)
        ]
    )


cdf_jit = jax.jit(dyadic_cdf)
quantile_jit = jax.jit(histogram_quantile)


def test_bin_index_against_float32_edges():
    j = np.arange(NUM_BINS + 1, dtype=np.float32)
    edges = j * np.float32(UPPER) / np.float32(NUM_BINS)
    below = np.nextafter(edges, np.float32(-np.inf))
    above = np.nextafter(edges, np.float32(np.inf))
    rng = np.random.default_rng(0)
    values = np.concatenate(
        [
            edges,
            below,
            above,
            rng.uniform(-1, 11, size=200).astype(np.float32),
            np.array([np.inf, -np.inf, np.nan, 1e30, -1e30], np.float32),
        ]
    )
    got = np.asarray(jax.jit(bin_index, static_argnums=1)(values, NUM_BINS, UPPER))
    np.testing.assert_array_equal(got, reference_bins(values, NUM_BINS, UPPER))
    # The last bin is closed, the first one takes clipped negatives.
    assert got[NUM_BINS] == NUM_BINS - 1
    assert got[0] == 0


def test_hierarchical_histogram_matches_loop_and_batches():
    rng = np.random.default_rng(1)
    values = rng.uniform(-1, 11, size=(2, 3, 40)).astype(np.float32)
    values[0, 1, :5] = np.nan
    levels = jax.jit(hierarchical_histogram, static_argnums=1)(values, NUM_BINS, UPPER)
    assert len(levels) == 4
    for r, level in enumerate(levels):
        assert level.shape == (2, 3, NUM_BINS >> r)
        assert level.dtype == jnp.int32
    for a in range(2):
        for b in range(3):
            expected = reference_levels(values[a, b], NUM_BINS, UPPER)
            for r in range(4):
                np.testing.assert_array_equal(levels[r][a, b], expected[r])
    # NaN values are not counted.
    assert int(levels[0][0, 1].sum()) == 35


def test_hierarchical_histogram_two_bins_and_errors():
    levels = hierarchical_histogram(np.array([0.0, 6.0, 10.0], np.float32), 2, 10.0)
    assert len(levels) == 1
    np.testing.assert_array_equal(levels[0], [1, 2])
    with pytest.raises(ValueError, match="power of two"):
        hierarchical_histogram(np.ones(3), 12, 10.0)
    with pytest.raises(ValueError, match="power of two"):
        hierarchical_histogram(np.ones(3), 1, 10.0)
    with pytest.raises(ValueError, match="upper"):
        hierarchical_histogram(np.ones(3), 4, 0.0)


def test_dyadic_partition_reference_is_the_paper_example():
    # 004 Section 4.2: P_15 = [1, 8] u [9, 12] u [13, 14] u [15].
    assert maximal_dyadic_partition(15, 16) == [(3, 0), (2, 2), (1, 6), (0, 14)]


def test_dyadic_cdf_is_cumsum_on_consistent_histograms():
    rng = np.random.default_rng(2)
    values = rng.uniform(0, UPPER, size=(4, 50)).astype(np.float32)
    levels = hierarchical_histogram(values, NUM_BINS, UPPER)
    cdf = cdf_jit(levels)
    np.testing.assert_array_equal(cdf, np.cumsum(np.asarray(levels[0]), axis=-1))
    assert cdf.dtype == jnp.int32


def test_dyadic_cdf_uses_higher_nodes_on_inconsistent_histograms():
    rng = np.random.default_rng(3)
    levels = [rng.normal(size=NUM_BINS >> r).astype(np.float32) for r in range(4)]
    expected = reference_cdf(levels, NUM_BINS)
    np.testing.assert_allclose(cdf_jit(levels), expected, rtol=1e-5, atol=1e-5)
    assert not np.allclose(expected, np.cumsum(levels[0]))
    # A single higher node moves H exactly at the j whose partition uses it.
    bumped = [level.copy() for level in levels]
    bumped[2][2] += 100.0  # node covering bins 9..12 (1-based)
    delta = np.asarray(cdf_jit(bumped)) - np.asarray(cdf_jit(levels))
    uses = [
        (2, 2) in maximal_dyadic_partition(j, NUM_BINS) for j in range(1, NUM_BINS + 1)
    ]
    assert np.flatnonzero(uses).tolist() == [11, 12, 13, 14]  # j = 12..15
    np.testing.assert_allclose(delta, np.where(uses, 100.0, 0.0), atol=1e-3)
    # Right children are never part of a prefix partition (but the top-level
    # right child is, for j = b, since the root is not stored).
    bumped = [level.copy() for level in levels]
    bumped[1][3] += 100.0
    bumped[3][1] += 100.0
    delta = np.asarray(cdf_jit(bumped)) - np.asarray(cdf_jit(levels))
    np.testing.assert_allclose(delta, np.r_[np.zeros(NUM_BINS - 1), 100.0], atol=1e-3)


def test_dyadic_cdf_batched_levels():
    rng = np.random.default_rng(4)
    levels = [rng.normal(size=(3, NUM_BINS >> r)).astype(np.float32) for r in range(4)]
    got = cdf_jit(levels)
    for row in range(3):
        expected = reference_cdf([level[row] for level in levels], NUM_BINS)
        np.testing.assert_allclose(got[row], expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="levels"):
        dyadic_cdf(levels[:3])


def reference_quantile(levels, theta, num_values, upper, num_bins):
    cdf = reference_cdf(levels, num_bins).astype(np.float64)
    distance = np.abs(cdf - (1 - theta) * num_values)
    j_star = int(np.argmin(distance)) + 1  # first on ties
    return j_star * upper / num_bins


def test_histogram_quantile_matches_reference_and_is_best_on_exact_histograms():
    rng = np.random.default_rng(5)
    values = rng.chisquare(4, size=64).astype(np.float32)
    levels = hierarchical_histogram(values, NUM_BINS, UPPER)
    levels_np = [np.asarray(level) for level in levels]
    cdf = np.cumsum(levels_np[0])
    thetas = np.linspace(0.05, 1.0, 20).astype(np.float32)
    got = jax.jit(jax.vmap(histogram_quantile, in_axes=(None, 0, None, None)))(
        levels, thetas, 64, UPPER
    )
    for theta, estimate in zip(thetas, np.asarray(got), strict=True):
        expected = reference_quantile(levels_np, float(theta), 64, UPPER, NUM_BINS)
        np.testing.assert_allclose(estimate, expected, rtol=1e-6)
        # On an exact histogram the error of eq. 19 is the best achievable (eq. 18).
        j_star = int(round(estimate * NUM_BINS / UPPER))
        error = abs(cdf[j_star - 1] / 64 - (1 - theta))
        assert error <= np.min(np.abs(cdf / 64 - (1 - theta))) + 1e-7


def test_histogram_quantile_noisy_ties_and_bad_theta():
    # Noisy levels with a tie in |H - target|: the first index wins.
    levels = [np.zeros(4, np.float32), np.zeros(2, np.float32)]
    levels[0][:] = [1.0, 1.0, 1.0, 1.0]
    levels[1][:] = [2.0, 2.0]  # H = [1, 2, 3, 4]
    # target (1 - 0.625) * 4 = 1.5: j = 1 and j = 2 tie; j* = 1.
    assert float(quantile_jit(levels, 0.625, 4, 8.0)) == 2.0
    assert np.isnan(quantile_jit(levels, 1.5, 4, 8.0))
    with pytest.raises(ValueError, match="theta"):
        histogram_quantile(levels, 0.0, 4, 8.0)
