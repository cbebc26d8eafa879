"""FedDyn (Acar et al. 2021): federated learning with dynamic regularization.

Each client k keeps g_k, the gradient of its local loss at its last local
model (g_k = 0 before it first trains); the server keeps h (0 at the start).
One round with server model w_t and alpha > 0 (Acar et al. 2021, Algorithm 1):

1. sample M of the N training clients;
2. each sampled client approximately solves, by the run's local SGD from w_t,

       min_w F_k(w) - <g_k, w> + alpha/2 ||w - w_t||^2

   (every step's gradient corrected by -g_k and pulled toward w_t), then
   g_k <- g_k - alpha (w_k - w_t);
3. the server sets h <- h - (alpha / N) sum_{k sampled} (w_k - w_t) and
   Delta = mean_k (w_k - w_t) - h / alpha, so that with server SGD of
   learning rate 1, w_{t+1} = mean_k w_k - h / alpha, the paper's rule.

The mean is weighted by the run's data weights (the paper's uniform mean
with `client_weighting='uniform'`); FedDyn computes its own server update,
so robust aggregators do not apply (update attacks do, to w_k - w_t). A
client that runs no step keeps its g_k. The g_k are per-client rows
(`jaxfl.algorithms.stages.ClientUpdateStage`): on device, split over
devices or in host memory, and checkpointed. Hyperparameters: the local ones
and 'feddyn_alpha'.

References:
  [Acar et al. 2021] Federated Learning Based on Dynamic Regularization. ICLR 2021.
"""

from __future__ import annotations

from typing import Unpack

import jax
import jax.numpy as jnp

from jaxfl.aggregators.base import per_client
from jaxfl.algorithms import stages
from jaxfl.algorithms.base import FederatedAlgorithm, ServerState
from jaxfl.training.cohort import CohortData, CohortResults, weighted_mean
from jaxfl.training.local import LocalTraining, Task
from jaxfl.types import Key, Params

FEDDYN_HPARAM_DEFAULTS = {"feddyn_alpha": 0.01}




def feddyn(
    task: Task,
    local: LocalTraining,
    clients_per_round: int,
    num_clients: int,
    **options: Unpack[stages.RoundOptions],
) -> FederatedAlgorithm:
    """FedDyn (see the module docstring); its state's `extra` is h and `clients` the g_k."""

    def correction(state: ServerState, rows: Params, cohort: stages.Cohort, data: CohortData) -> Params:
        del cohort, data  # Unused.
        return jax.tree.map(jnp.negative, rows)

    def finalize(state, rows: Params, results: CohortResults, lr, data) -> tuple[Params, None]:
        del lr, data  # Unused.
        trained = results.num_steps > 0
        alpha = state.hparams["feddyn_alpha"]
        new_rows = jax.tree.map(
            lambda g, delta: jnp.where(per_client(trained, g), g - alpha * delta, g), rows, results.deltas
        )
        return new_rows, None

    def aggregate(
        results: CohortResults, cohort: stages.Cohort, plan: stages.ClientPlan, state: ServerState, key: Key
    ) -> stages.Aggregation:
        del key  # Unused.
        alpha = state.hparams["feddyn_alpha"]
        weights = jnp.where(results.num_steps > 0, stages.default_weights(cohort, plan), 0.0)
        h = jax.tree.map(
            lambda h, delta: h - alpha * jnp.sum(delta, axis=0) / num_clients, state.extra, results.deltas
        )
        mean_delta = jax.tree.map(lambda mean, h: mean - h / alpha, weighted_mean(results.deltas, weights), h)
        return stages.Aggregation(mean_delta, weights, h, {})

    return stages.compose_round(
        "feddyn",
        task,
        clients_per_round,
        client_update=stages.ClientUpdateStage(
            local=local,
            proximal="feddyn_alpha",
            init_row=stages.zeros_row,
            correction=correction,
            finalize=finalize,
            hparam_defaults=FEDDYN_HPARAM_DEFAULTS,
        ),
        aggregate=stages.AggregateStage(aggregate=aggregate, init=stages.zeros_row),
        num_clients=num_clients,
        **options,
    )
