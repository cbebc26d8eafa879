"""Aggregators by name, with their options and defaults (for the CLI)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from jaxfl.aggregators.base import Aggregator
from jaxfl.aggregators.clipping import centered_clipping, norm_clipping
from jaxfl.aggregators.coordinate import mean, median, trimmed_mean
from jaxfl.aggregators.selection import k_loss, k_norm, krum, multi_krum
from jaxfl.aggregators.weiszfeld import geometric_median

_FACTORIES: dict[str, Callable[..., Aggregator]] = {
    "mean": mean,
    "median": median,
    "trimmed-mean": trimmed_mean,
    "krum": krum,
    "multi-krum": multi_krum,
    "norm-clipping": norm_clipping,
    "k-norm": k_norm,
    "k-loss": k_loss,
    "centered-clipping": centered_clipping,
    "geometric-median": geometric_median,
}

AGGREGATORS: tuple[str, ...] = tuple(_FACTORIES)


def _factory(name: str) -> Callable[..., Aggregator]:
    if name not in _FACTORIES:
        raise ValueError(f"unknown aggregator {name!r}; choose one of {', '.join(AGGREGATORS)}")
    return _FACTORIES[name]


def aggregator_options(name: str) -> dict[str, Any]:
    """The options aggregator `name` takes, mapped to their defaults.

    Raises:
      ValueError: unknown name (the message lists the valid ones).
    """
    parameters = inspect.signature(_factory(name)).parameters.values()
    return {p.name: p.default for p in parameters}


def aggregator(name: str, **options: Any) -> Aggregator:
    """The aggregator called `name`, built with `options` (the others default).

    Example: `aggregator("trimmed-mean", beta=0.2)`,
    `aggregator("krum", byzantine=2)`.

    Raises:
      ValueError: unknown name, unknown option or bad option value; the
        one-line message lists the valid names or options.
    """
    factory = _factory(name)
    valid = aggregator_options(name)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        takes = f"its options are {', '.join(valid)}" if valid else "it takes no options"
        raise ValueError(f"aggregator {name!r} has no option {', '.join(unknown)}; {takes}")
    return factory(**options)
