"""Hierarchical histograms, their dyadic CDF and the histogram quantile.

The tree over b = 2^L bins of [0, upper] (Pillutla et al. 2023, Section 4.2,
Algorithm 2): level r = 0, ..., L - 1 has b / 2^r nodes, node j of level r
counting the values in bins j 2^r, ..., (j + 1) 2^r - 1. The root (level L),
whose count is the public number of values, is left out, so a tree has
2b - 2 nodes.

Indices here are 0-based; the paper's are 1-based (its l_j is our edge j,
its H(j) our `H[j - 1]`).

Reference:
  [Pillutla et al. 2023] K. Pillutla, Y. Laguel, J. Malick, Z. Harchaoui.
    Federated Learning with Superquantile Aggregation for Heterogeneous
    Data. Machine Learning, 2023.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxfl.primitives import _validation


def num_levels(num_bins: int) -> int:
    """log2(num_bins), the number of stored levels (the root is left out)."""
    num_bins = _validation.check_power_of_two(num_bins, "num_bins")
    return num_bins.bit_length() - 1


def bin_index(values, num_bins: int, upper) -> jax.Array:
    r"""The level-0 bin of each value: bin j = [j upper / b, (j + 1) upper / b).

    Values are clipped to [0, upper]; the last bin is closed (upper -> b - 1).
    The edges are the float numbers j * upper / b of the values' dtype, and a
    value is placed against those exact edges (a floor of v b / upper alone
    can put a value that equals an edge in the bin below).

    Args:
      values: [...] floats.
      num_bins: b, a power of two >= 2 (static).
      upper: upper end of the range, > 0 (Python or traced scalar).

    Returns:
      [...] int32 bin indices in [0, b - 1]; NaN values get -1 (no bin).
    """
    num_bins = _validation.check_power_of_two(num_bins, "num_bins")
    _validation.check_positive_finite(upper, "upper")
    values = jnp.asarray(values)
    if not jnp.issubdtype(values.dtype, jnp.floating):
        values = values.astype(jnp.float32)
    upper = jnp.asarray(upper, values.dtype)
    clipped = jnp.clip(values, 0, upper)
    guess = jnp.floor(clipped * (num_bins / upper))
    guess = jnp.clip(guess, 0, num_bins - 1).astype(jnp.int32)
    lower_edge = guess.astype(values.dtype) * upper / num_bins
    upper_edge = (guess + 1).astype(values.dtype) * upper / num_bins
    index = jnp.where(clipped < lower_edge, guess - 1, guess)
    index = jnp.where(
        (clipped >= upper_edge) & (guess < num_bins - 1), guess + 1, index
    )
    return jnp.where(jnp.isnan(values), -1, index).astype(jnp.int32)


def levels_from_bins(bins, num_bins: int, weights=None) -> tuple[jax.Array, ...]:
    """Hierarchical counts from level-0 bin indices (see `hierarchical_histogram`).

    Args:
      bins: [..., n] int bin indices in [0, b); other indices (e.g. -1) are
        not counted.
      num_bins: b (static power of two).
      weights: optional [..., n] per-value weights (e.g. a 0/1 mask); counts
        are int32 without weights, else the weights' dtype.

    Returns:
      Tuple of log2(b) arrays [..., b / 2^r].
    """
    num_bins = _validation.check_power_of_two(num_bins, "num_bins")
    bins = jnp.asarray(bins)
    batch_shape = bins.shape[:-1]
    n = bins.shape[-1]
    if weights is None:
        weights = jnp.ones(bins.shape, jnp.int32)
    else:
        weights = jnp.broadcast_to(jnp.asarray(weights), bins.shape)
    valid = (bins >= 0) & (bins < num_bins)
    num_rows = 1
    for size in batch_shape:
        num_rows *= size
    rows = jnp.arange(num_rows, dtype=jnp.int32)[:, None]
    # One segment per (row, bin): a single segment_sum over the flattened batch.
    segment = rows * num_bins + jnp.reshape(jnp.where(valid, bins, 0), (num_rows, n))
    data = jnp.reshape(jnp.where(valid, weights, 0), (num_rows, n))
    counts = jax.ops.segment_sum(
        data.reshape(-1), segment.reshape(-1), num_segments=num_rows * num_bins
    )
    level = counts.reshape(*batch_shape, num_bins)
    levels = [level]
    for _ in range(num_levels(num_bins) - 1):
        level = level.reshape(*level.shape[:-1], level.shape[-1] // 2, 2).sum(-1)
        levels.append(level)
    return tuple(levels)


def hierarchical_histogram(values, num_bins: int, upper) -> tuple[jax.Array, ...]:
    r"""Counts of a hierarchical histogram of values in [0, upper].

    levels[r][..., j] = #{ i : value_i in bins j 2^r, ..., (j + 1) 2^r - 1 },

    r = 0, ..., log2(b) - 1, with bin j = [j upper / b, (j + 1) upper / b) and
    the last bin closed (Pillutla et al. 2023, Algorithm 2 line 1, summed over
    clients). Values are clipped to [0, upper] (so -inf counts in bin 0 and
    +inf in bin b - 1); NaN values are not counted anywhere. The root count
    (the number of values) is public and left out. Built with one segment sum
    for level 0 and pairwise sums above it; batched over the leading axes of
    `values`.

    Args:
      values: [..., n] floats (the last axis is summarized).
      num_bins: b, a power of two >= 2 (static).
      upper: > 0; the range is [0, upper].

    Returns:
      Tuple of log2(b) int32 arrays; levels[r] has shape [..., b / 2^r].

    Raises:
      ValueError: `num_bins` is not a power of two >= 2, a static `upper` is
        not finite and > 0, or `values` is a scalar.
    """
    values = jnp.asarray(values)
    if values.ndim == 0:
        raise ValueError("values must have at least one axis")
    return levels_from_bins(bin_index(values, num_bins, upper), num_bins)


def _check_levels(levels) -> tuple[list[jax.Array], int]:
    levels = [jnp.asarray(level) for level in levels]
    if not levels:
        raise ValueError("levels must hold at least one level (num_bins >= 2)")
    num_bins = levels[0].shape[-1]
    _validation.check_power_of_two(num_bins, "levels[0].shape[-1]")
    if len(levels) != num_levels(num_bins):
        raise ValueError(
            f"{num_bins} bins need {num_levels(num_bins)} levels, got {len(levels)}"
        )
    for r, level in enumerate(levels):
        if level.shape[-1] != num_bins >> r:
            raise ValueError(
                f"levels[{r}] must have {num_bins >> r} nodes, got {level.shape}"
            )
    return levels, num_bins


def dyadic_cdf(levels) -> jax.Array:
    r"""Cumulative counts from a hierarchical histogram by dyadic partitions.

    H[j - 1] = sum_{(r, o) in P_j} levels[r][o] for j = 1, ..., b,

    where P_j is the maximal dyadic partition of bins 1..j (Pillutla et al.
    2023, Algorithm 2 line 4): one node per set bit r of j, the node of level
    r covering the 2^r bins that follow the higher bits, i.e.
    levels[r][(j >> r) - 1]. For j < b at most log2(b) - 1 nodes are summed.
    The partition of the full range j = b is the root, which is not stored;
    H[b - 1] is the sum of the two top-level nodes instead.

    On a consistent histogram (every node the sum of its children) this is
    the cumulative sum of level 0. On a noisy, inconsistent one it uses the
    higher nodes, whose noise adds up over log2(b) terms instead of j: that
    is the point of the hierarchy. Batched over leading axes.

    Args:
      levels: sequence of log2(b) arrays, levels[r] of shape [..., b / 2^r]
        (the output of `hierarchical_histogram`, possibly noisy floats).

    Returns:
      [..., b] cumulative counts in the levels' (promoted) dtype.

    Raises:
      ValueError: the level shapes are not those of a b-bin tree.
    """
    levels, num_bins = _check_levels(levels)
    dtype = jnp.result_type(*levels)
    batch_shape = jnp.broadcast_shapes(*(level.shape[:-1] for level in levels))
    levels = [
        jnp.broadcast_to(level, (*batch_shape, level.shape[-1])) for level in levels
    ]
    j = np.arange(1, num_bins + 1)  # the paper's 1-based j; static
    cdf = jnp.zeros((*batch_shape, num_bins), dtype)
    for r, level in enumerate(levels):
        uses_node = ((j >> r) & 1) == 1
        node = np.clip((j >> r) - 1, 0, (num_bins >> r) - 1)
        # Static gather and mask, shaped to full rank (rank promotion is an
        # error in the test suite).
        mask = np.reshape(uses_node, (1,) * len(batch_shape) + (num_bins,))
        terms = jnp.take(level.astype(dtype), node, axis=-1)
        cdf = cdf + jnp.where(mask, terms, jnp.zeros((), dtype))
    top = levels[-1].astype(dtype)
    total = top[..., 0] + top[..., 1]
    return cdf.at[..., num_bins - 1].set(total)


def histogram_quantile(levels, theta, num_values, upper) -> jax.Array:
    r"""The (1 - theta)-quantile estimate of a (noisy) hierarchical histogram.

    l_{j*} = j* upper / b,   j* = argmin_{j in 1..b} |H(j) - (1 - theta) m|

    with H the `dyadic_cdf` and m = `num_values` (Pillutla et al. 2023,
    eq. 8; the first index on ties). The result is the right edge of bin j*,
    so it lies in {upper / b, 2 upper / b, ..., upper}. On an exact histogram
    its error in the sense of Pillutla et al. 2023, eq. 19, is the best
    achievable R*_theta(H) (eq. 18).

    Args:
      levels: log2(b) arrays levels[r] of shape [..., b / 2^r] (counts or
        noisy floats).
      theta: scalar or [...] tail fraction in (0, 1]; may be traced.
      num_values: m, the (public) number of values; scalar or [...].
      upper: > 0; the range is [0, upper].

    Returns:
      [...] float32 (or wider) quantile estimates.

    Raises:
      ValueError: bad level shapes, or a static `theta` not in (0, 1] or
        `upper` not finite and > 0.

    Edge cases: a traced theta outside (0, 1] gives NaN; NaN levels give NaN.
    """
    _validation.check_open_closed_unit(theta, "theta")
    _validation.check_positive_finite(upper, "upper")
    levels, num_bins = _check_levels(levels)
    cdf = dyadic_cdf(levels)
    dtype = jnp.promote_types(jnp.result_type(cdf.dtype, jnp.float32), jnp.float32)
    if not jnp.issubdtype(dtype, jnp.floating):
        dtype = jnp.dtype(jnp.float32)
    cdf = cdf.astype(dtype)
    batch_shape = cdf.shape[:-1]
    theta = jnp.broadcast_to(jnp.asarray(theta, dtype), batch_shape)
    num_values = jnp.broadcast_to(jnp.asarray(num_values, dtype), batch_shape)
    target = (1 - theta) * num_values
    distance = jnp.abs(cdf - target[..., None])
    index = jnp.argmin(distance, axis=-1)  # first index on ties
    estimate = (index + 1).astype(dtype) * (jnp.asarray(upper, dtype) / num_bins)
    bad = (
        ~((theta > 0) & (theta <= 1))
        | jnp.any(jnp.isnan(cdf), axis=-1)
        | jnp.isnan(target)
    )
    return jnp.where(bad, jnp.nan, estimate)
