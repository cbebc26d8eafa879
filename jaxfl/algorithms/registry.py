"""Algorithms by name, built from a run configuration.

Each entry turns the shared pieces (task, local-training shape, cohort size,
client strategy, server optimizer, client weighting) and the run's numeric
hyperparameters into a `FederatedAlgorithm` and its initial hyperparameters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import optax

from jaxfl.algorithms.base import FederatedAlgorithm
from jaxfl.algorithms.fedavg import fedavg
from jaxfl.training.local import LocalTraining, Task
from jaxfl.training.strategies import ClientStrategy


@dataclasses.dataclass(frozen=True)
class Engine:
    """What every algorithm is built on (fixed for a run)."""

    task: Task
    local: LocalTraining
    clients_per_round: int
    strategy: ClientStrategy
    server_tx: optax.GradientTransformation
    client_weighting: str


# name -> (builder(engine, options) -> algorithm, one-line description)
Builder = Callable[[Engine, Mapping[str, Any]], FederatedAlgorithm]
ALGORITHMS: dict[str, tuple[Builder, str]] = {
    "fedavg": (
        lambda engine, options: fedavg(
            engine.task,
            engine.local,
            engine.clients_per_round,
            strategy=engine.strategy,
            server_tx=engine.server_tx,
            client_weighting=engine.client_weighting,
        ),
        "FedAvg (McMahan et al. 2017): average of local SGD updates",
    ),
}


def algorithm_names() -> list[str]:
    return list(ALGORITHMS)


def build_algorithm(
    name: str, engine: Engine, options: Mapping[str, Any] | None = None
) -> FederatedAlgorithm:
    """The algorithm registered as `name`; ValueError lists valid names."""
    if name not in ALGORITHMS:
        raise ValueError(
            f"unknown algorithm {name!r}; choose one of {', '.join(algorithm_names())}"
        )
    builder, _ = ALGORITHMS[name]
    return builder(engine, options or {})
