"""The numeric settings and static options of a built algorithm, read from a run's config.

A leaf of `jaxfl.experiment`: the run (`runner`), the checks of a sweep's
grid (`checks`) and tuning read the same values through it.
"""

from __future__ import annotations

from typing import Any

from jaxfl.algorithms.base import FederatedAlgorithm
from jaxfl.algorithms.registry import algorithm_spec, hparam_fields
from jaxfl.experiment.config import RunConfig


def local_hparams(config: RunConfig) -> dict[str, float]:
    return {
        "lr": config.local.lr,
        "lr_decay": config.local.lr_decay,
        "lr_decay_period": float(config.local.lr_decay_period),
        "l2": config.local.l2,
    }


def algorithm_options(config: RunConfig, name: str) -> dict[str, Any]:
    """The static options of algorithm `name`, read from the run's settings."""
    return {option: config.setting(option) for option in algorithm_spec(name).options}


def algorithm_hparams(
    config: RunConfig, name: str, algorithm: FederatedAlgorithm
) -> dict[str, float]:
    """The initial `state.hparams` of a built algorithm, from the run's settings.

    The local ones, and those of its registry entry that it takes; a setting
    left unset (None, e.g. q) keeps the algorithm's own default.
    """
    values = {**local_hparams(config)}
    for field in hparam_fields(name, algorithm):
        value = config.setting(field)
        if value is not None and field not in values:
            values[field] = float(value)
    return values
