"""Federated algorithms as pure init/round pairs over a `ServerState`."""

from jaxfl.algorithms.afl import afl
from jaxfl.algorithms.base import (
    FederatedAlgorithm,
    ServerState,
    server_optimizer,
)
from jaxfl.algorithms.deltafl import deltafl
from jaxfl.algorithms.dp_deltafl import dp_deltafl
from jaxfl.algorithms.dp_fedavg import dp_fedavg
from jaxfl.algorithms.fedavg import fedavg
from jaxfl.algorithms.fedavg_sub import fedavg_sub
from jaxfl.algorithms.fedprox import fedprox
from jaxfl.algorithms.fedsgd import fedsgd
from jaxfl.algorithms.qffl import qffl
from jaxfl.algorithms.registry import (
    ALGORITHMS,
    SPECS,
    AlgorithmSpec,
    Engine,
    algorithm_names,
    algorithm_spec,
    build_algorithm,
    hparam_fields,
)
from jaxfl.algorithms.stages import (
    AggregateStage,
    Aggregation,
    ClientPlan,
    ClientUpdateStage,
    Cohort,
    PersonalStage,
    RoundOptions,
    SelectStage,
    compose_round,
)
from jaxfl.algorithms.term import term

__all__ = [
    "AggregateStage",
    "ClientUpdateStage",
    "PersonalStage",
    "RoundOptions",
    "SelectStage",
    "compose_round",
    "ALGORITHMS",
    "SPECS",
    "Aggregation",
    "AlgorithmSpec",
    "ClientPlan",
    "Cohort",
    "Engine",
    "FederatedAlgorithm",
    "ServerState",
    "afl",
    "algorithm_names",
    "algorithm_spec",
    "build_algorithm",
    "deltafl",
    "dp_deltafl",
    "dp_fedavg",
    "fedavg",
    "fedavg_sub",
    "fedprox",
    "fedsgd",
    "hparam_fields",
    "qffl",
    "server_optimizer",
    "term",
]
