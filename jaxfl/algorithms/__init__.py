"""Federated algorithms as pure init/round pairs over a `ServerState`."""

from jaxfl.algorithms.base import (
    FederatedAlgorithm,
    ServerState,
    server_optimizer,
)
from jaxfl.algorithms.fedavg import fedavg, weighted_averaging_algorithm
from jaxfl.algorithms.registry import (
    ALGORITHMS,
    Engine,
    algorithm_names,
    build_algorithm,
)

__all__ = [
    "ALGORITHMS",
    "Engine",
    "FederatedAlgorithm",
    "ServerState",
    "algorithm_names",
    "build_algorithm",
    "fedavg",
    "server_optimizer",
    "weighted_averaging_algorithm",
]
