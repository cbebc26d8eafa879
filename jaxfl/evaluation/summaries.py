"""Summaries of a distribution of per-client metrics (004 Appendix C.3).

For values a_1..a_n with optional weights w_i (normalized to wbar_i):

* `mean` = sum_i wbar_i a_i and `std` = sqrt(sum_i wbar_i (a_i - mean)^2);
* `pP` (P in 10, 20, 50, 60, 80, 90, 95): the weighted P-th percentile
  inf { eta : sum_{i: a_i <= eta} wbar_i >= P/100 }, i.e.
  `tail_threshold(a, 1 - P/100, w)` (the lower, "inverted CDF" percentile:
  always one of the values, as in `numpy.percentile(method='inverted_cdf')`);
* `superquantile_90`, `superquantile_95`: the superquantile at theta = 0.1
  and 0.05, the (weighted) mean of the worst 10% and 5%, with the boundary
  client counted fractionally;
* `best_10`: the mean of the best 10%, i.e. -superquantile(-a, 0.1).

Training clients are weighted by alpha_i (their number of examples); test
clients are not (004 Appendix C.3).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxfl.primitives import superquantile, tail_threshold

PERCENTILES = (10, 20, 50, 60, 80, 90, 95)
SUMMARY_KEYS = (
    "mean",
    "std",
    *(f"p{p}" for p in PERCENTILES),
    "superquantile_90",
    "superquantile_95",
    "best_10",
)


def summarize(values: jax.Array, weights: jax.Array | None = None) -> dict[str, jax.Array]:
    """The summaries above of `[N]` values, as float32 scalars (jittable)."""
    values = jnp.asarray(values, jnp.float32)
    w = jnp.ones_like(values) if weights is None else jnp.asarray(weights, jnp.float32)
    w = w / jnp.sum(w)
    mean = jnp.sum(w * values)
    out = {
        "mean": mean,
        "std": jnp.sqrt(jnp.sum(w * (values - mean) ** 2)),
    }
    for p in PERCENTILES:
        out[f"p{p}"] = tail_threshold(values, 1.0 - p / 100.0, weights)
    out["superquantile_90"] = superquantile(values, 0.1, weights)
    out["superquantile_95"] = superquantile(values, 0.05, weights)
    # 0 - x, not -x: the best 10% of all-zero errors is 0, never -0.0.
    out["best_10"] = 0.0 - superquantile(-values, 0.1, weights)
    return out


def within_range(stats: dict[str, jax.Array], low: float, high: float | None = None) -> dict[str, jax.Array]:
    """Summaries clipped to the quantity's range (errors: [0, 1]; losses: >= 0).

    Float rounding in the weighted sums can step just outside (a
    superquantile of 1.0000001 for all-wrong clients); a reported error above
    100% or a loss of -0.0 would be read as a bug. The standard deviation is
    only floored at 0.
    """
    return {
        name: jnp.maximum(value, 0.0) + 0.0 if name == "std" or high is None
        else jnp.clip(value, low, high) + 0.0
        for name, value in stats.items()
    }
