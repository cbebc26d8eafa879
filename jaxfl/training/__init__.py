"""The compiled round's machinery: sampling, local training, client batching."""

from jaxfl.training.cohort import (
    CohortResults,
    round_keys,
    sample_cohort,
    train_cohort,
    weighted_mean,
)
from jaxfl.training.local import (
    ExampleStats,
    LocalHParams,
    LocalResult,
    LocalTraining,
    Task,
    client_loss_and_error,
    local_sgd,
    target_stats,
)
from jaxfl.training.sampling import sample_without_replacement
from jaxfl.training.strategies import (
    ClientStrategy,
    default_strategy,
    map_clients,
    parse_strategy,
)

__all__ = [
    "ClientStrategy",
    "CohortResults",
    "LocalHParams",
    "LocalResult",
    "LocalTraining",
    "ExampleStats",
    "Task",
    "target_stats",
    "client_loss_and_error",
    "default_strategy",
    "local_sgd",
    "map_clients",
    "parse_strategy",
    "round_keys",
    "sample_cohort",
    "sample_without_replacement",
    "train_cohort",
    "weighted_mean",
]
