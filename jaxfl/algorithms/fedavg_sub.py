"""FedAvg-Sub: FedAvg on a random fraction theta of each cohort (Pillutla et al. 2023, Section 7.2).

Delta-FL's weights are sparse: about theta m of the m sampled clients get a
nonzero weight (Pillutla et al. 2023, Theorem 3, Remark 1). FedAvg-Sub is the
baseline with the same number of effective clients: of the m sampled clients,
a uniformly random subset of k = max(1, round(theta m)) trains and is averaged
with weights alpha_i (Pillutla et al. 2023, Section 7.2; "FedAvg, theta" of
its Appendix C.2); the other m - k are inactive and run no local step.
Rounding is half to even (Python's and NumPy's `round`). The subset is chosen
from the round's keys (`jaxfl.algorithms.plans.random_subset_mask`), and theta
is a traced hyperparameter, so sweeps over theta share one compiled round.

In distribution this is FedAvg with k clients per round (a uniform subset of
a uniform subset is uniform).

References:
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
"""

from __future__ import annotations

from typing import Unpack

import jax.numpy as jnp

from jaxfl.algorithms import stages
from jaxfl.algorithms.base import FederatedAlgorithm, ServerState
from jaxfl.algorithms.plans import random_subset_mask
from jaxfl.training.local import LocalTraining, Task
from jaxfl.types import Key


def subcohort_size(theta, clients_per_round: int):
    """The sub-cohort size k = max(1, round(theta m)), traced if theta is."""
    return jnp.maximum(jnp.round(theta * clients_per_round), 1).astype(jnp.int32)


def fedavg_sub(
    task: Task,
    local: LocalTraining,
    clients_per_round: int,
    **options: Unpack[stages.RoundOptions],
) -> FederatedAlgorithm:
    """FedAvg-Sub (see the module docstring).

    Numeric hyperparameters: the local ones and 'theta' in (0, 1] (default
    0.5), the fraction of the cohort that trains.

    Args:
      task, local, clients_per_round, **options: as `jaxfl.algorithms.stages.compose_round` takes them.

    Returns:
      The `FederatedAlgorithm`.
    """

    def plan(cohort: stages.Cohort, state: ServerState, key: Key) -> stages.ClientPlan:
        size = subcohort_size(state.hparams["theta"], clients_per_round)
        return stages.ClientPlan(active=random_subset_mask(key, cohort.client_ids, size))

    return stages.compose_round(
        "fedavg-sub",
        task,
        clients_per_round,
        select=stages.SelectStage(plan=plan, hparam_defaults={"theta": 0.5}),
        client_update=stages.ClientUpdateStage(local=local),
        **options,
    )
