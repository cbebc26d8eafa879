"""Server aggregation rules, robust ones included, as pure optax-shaped transforms (public API).

`Aggregator(name, init, aggregate, uses_losses)`: `init(params) -> state`;
`aggregate(updates, weights, state, losses=None) -> (update, state,
metrics)` over per-client updates with the client axis first. Build one by
name with `aggregator(name, **options)`; `AGGREGATORS` lists the names and
`aggregator_options(name)` the options with their defaults. Conventions
(weights, non-finite updates, ties, metrics) are in `jaxfl.aggregators.base`
and docs/aggregators.md.
"""

from jaxfl.aggregators.base import Aggregator
from jaxfl.aggregators.clipping import centered_clipping, norm_clipping
from jaxfl.aggregators.coordinate import mean, median, trimmed_mean
from jaxfl.aggregators.registry import AGGREGATORS, aggregator, aggregator_options
from jaxfl.aggregators.selection import k_loss, k_norm, krum, multi_krum
from jaxfl.aggregators.weiszfeld import geometric_median

__all__ = [
    "AGGREGATORS",
    "Aggregator",
    "aggregator",
    "aggregator_options",
    "centered_clipping",
    "geometric_median",
    "k_loss",
    "k_norm",
    "krum",
    "mean",
    "median",
    "multi_krum",
    "norm_clipping",
    "trimmed_mean",
]
