"""FedNova (Wang et al. 2020): each client's update normalized by its number of local steps.

Clients that run more local steps (more data, more epochs) move further, and
FedAvg's weighted mean of their updates then minimizes a surrogate objective
skewed toward them. FedNova (Wang et al. 2020, eq. 6, with plain local SGD:
the normalizing vector a_i has ||a_i||_1 = tau_i) averages the normalized
updates and rescales by an effective number of steps:

    Delta = tau_eff sum_i p_i Delta_i / tau_i,    tau_eff = sum_i p_i tau_i,

with Delta_i = w_i - w_t, tau_i client i's real local steps this round and p_i
the run's data weights alpha_i normalized over the clients that trained (the
paper's p_i = n_i / n with `client_weighting='num_examples'`). When every
tau_i is equal this is FedAvg. Weight decay (the l2 term) is part of each
step's gradient, as in the authors' implementation, and leaves a_i as it is.
Stragglers (`stragglers` > 0) keep their partial work, for their drawn
epochs (like FedProx's): the heterogeneity FedNova corrects.

The update goes through the server optimizer as -Delta. FedNova computes its
own server update, so robust aggregators do not apply (update attacks do).

References:
  [Wang et al. 2020] Tackling the Objective Inconsistency Problem in Heterogeneous Federated Optimization.
"""

from __future__ import annotations

from typing import Unpack

import jax
import jax.numpy as jnp

from jaxfl.algorithms import stages
from jaxfl.algorithms.base import FederatedAlgorithm, ServerState
from jaxfl.algorithms.fedavg import straggler_select
from jaxfl.training.cohort import CohortResults
from jaxfl.training.local import LocalTraining, Task
from jaxfl.types import Key


def normalized_averaging(
    results: CohortResults, cohort: stages.Cohort, plan: stages.ClientPlan, state: ServerState, key: Key
) -> stages.Aggregation:
    """FedNova's update tau_eff sum_i p_i Delta_i / tau_i (see the module docstring).

    Clients without a step or without weight take no part; none at all gives
    a zero update.
    """
    del key  # Unused.
    steps = results.num_steps.astype(jnp.float32)
    weights = jnp.where(steps > 0, stages.default_weights(cohort, plan), 0.0)
    total = jnp.sum(weights)
    p = jnp.where(total > 0, weights / jnp.where(total > 0, total, 1.0), 0.0)
    tau_eff = jnp.sum(p * steps)
    coefficients = tau_eff * p / jnp.maximum(steps, 1.0)
    mean_delta = jax.tree.map(
        lambda x: jnp.tensordot(coefficients, x, axes=(0, 0)).astype(x.dtype), results.deltas
    )
    return stages.Aggregation(mean_delta, weights, state.extra, {"tau_eff": tau_eff})


def fednova(
    task: Task,
    local: LocalTraining,
    clients_per_round: int,
    *,
    stragglers: float = 0.0,
    **options: Unpack[stages.RoundOptions],
) -> FederatedAlgorithm:
    """FedNova (see the module docstring).

    Args:
      task, local, clients_per_round, **options: as `jaxfl.algorithms.stages.compose_round` takes them
        (an update attack applies; the aggregator must be the mean).
      stragglers: fraction of each cohort that runs fewer epochs, drawn from
        1 to num_epochs - 1, and keeps its work (static; needs num_epochs >= 2).

    Returns:
      The `FederatedAlgorithm`.
    """
    return stages.compose_round(
        "fednova",
        task,
        clients_per_round,
        select=straggler_select(clients_per_round, stragglers, local, keep=True),
        client_update=stages.ClientUpdateStage(local=local),
        aggregate=stages.AggregateStage(aggregate=normalized_averaging),
        **options,
    )
