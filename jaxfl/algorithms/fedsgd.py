"""FedSGD: federated (full-batch) gradient descent (Li 2023 (thesis), Section 4.2.2).

Every sampled client computes one gradient of F_k on all its local data at
w_t, and the server steps with the alpha-weighted mean gradient and the
local learning rate:

    w_{t+1} = w_t - lr * sum_k alpha_k grad F_k(w_t) / sum_k alpha_k

(plus the l2 term, w_t (1 - lr l2), when l2 > 0). With alpha = number of
examples this is gradient descent on the pooled data of the cohort.

Implemented as FedAvg whose local training is a single step with a batch as
large as the largest client (`population.max_count`): one epoch of that
batch size is exactly one full-batch step for every client, so its update
is -lr grad F_k(w_t). The run's batch size and local epochs are therefore
not used. q-FedSGD (`jaxfl.algorithms.qffl`) uses the same local step.

References:
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks.
"""

from __future__ import annotations

from typing import Unpack

from jaxfl.algorithms import stages
from jaxfl.algorithms.base import FederatedAlgorithm
from jaxfl.data.population import ClientPopulation
from jaxfl.training.local import LocalTraining, Task


def full_batch_step(population: ClientPopulation) -> LocalTraining:
    """One local step on all of a client's data, for every client."""
    return LocalTraining(batch_size=population.max_count, num_epochs=1, max_steps=1)


def fedsgd(
    task: Task,
    clients_per_round: int,
    **options: Unpack[stages.RoundOptions],
) -> FederatedAlgorithm:
    """FedSGD (see the module docstring).

    Args:
      task: model and loss.
      clients_per_round: M, clients sampled per round.
      **options: the run's `RoundOptions`: client strategy (required),
        robustness, server optimizer, client weighting.

    Returns:
      The `FederatedAlgorithm`.
    """
    return stages.compose_round(
        "fedsgd",
        task,
        clients_per_round,
        client_update=stages.ClientUpdateStage(local=full_batch_step),
        **options,
    )
