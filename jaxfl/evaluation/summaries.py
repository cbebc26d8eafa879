"""Summaries of a distribution of per-client metrics (Pillutla et al. 2023, Appendix C.3).

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
clients are not (Pillutla et al. 2023, Appendix C.3).

References:
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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


def summarize_each(
    values: Sequence[jax.Array], weights: Sequence[jax.Array | None]
) -> list[dict[str, jax.Array]]:
    """`summarize(values[r], weights[r])` for each r, computed as one vmapped `summarize`.

    The `[N_r]` vectors are padded to the longest with value 0 and weight 0,
    which changes no summary (a zero-weight entry is ignored: the conventions
    of `jaxfl.primitives.tail`); None weights become ones. Equal to
    `summarize` of each up to float rounding in the weighted sums. Why: the
    program holds one copy of the summaries' operations instead of R, which
    compiles in a fraction of the time (a run's evaluation: benchmarks/
    RESULTS.md, "A run's evaluation compiles its summaries once").
    """
    if len(values) != len(weights):
        raise ValueError(f"{len(values)} value vectors but {len(weights)} weight vectors")
    if not values:
        return []
    length = max(jnp.shape(v)[0] for v in values)

    def padded(x, fill):
        x = jnp.asarray(x, jnp.float32)
        return jnp.pad(x, (0, length - x.shape[0]), constant_values=fill)

    stacked_values = jnp.stack([padded(v, 0.0) for v in values])
    stacked_weights = jnp.stack([
        padded(jnp.ones(jnp.shape(v)[0]) if w is None else w, 0.0)
        for v, w in zip(values, weights, strict=True)
    ])
    stats = jax.vmap(summarize)(stacked_values, stacked_weights)
    return [{name: value[r] for name, value in stats.items()} for r in range(len(values))]


def loss_and_error_summaries(
    metrics: Mapping[str, tuple[jax.Array, jax.Array, jax.Array | None]], prefix: str = ""
) -> dict[str, dict[str, jax.Array]]:
    """A run's summaries of per-client losses and errors: `{prefix}{name}_loss` and `{prefix}{name}_error`
    for each population `name -> (loss, error, weights)`, in that order, each `within_range`
    (losses >= 0, errors in [0, 1]); all of them one `summarize_each`.
    """
    values, weights = [], []
    for loss, error, population_weights in metrics.values():
        values += [loss, error]
        weights += [population_weights, population_weights]
    stats = iter(summarize_each(values, weights))
    out = {}
    for name in metrics:
        out[f"{prefix}{name}_loss"] = within_range(next(stats), 0.0)
        out[f"{prefix}{name}_error"] = within_range(next(stats), 0.0, 1.0)
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
