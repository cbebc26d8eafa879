"""Agnostic federated learning, AFL (Mohri, Sivek, Suresh, ICML 2019).

Objective: min_w max_{lambda in simplex} sum_k lambda_k F_k(w), the worst
mixture of the N training clients (Delta-FL's objective as theta -> 0,
Pillutla et al. 2023, Section 7.2; q-FFL's as q -> infinity, Li 2023
(thesis), Section 4.3.3).

Stochastic gradient descent-ascent, as in Mohri et al.'s Stochastic-AFL and
the authors' implementation used by the thesis (litian96/fair_flearn,
`flearn/trainers/afl.py`; the thesis, Section 4.3.3 and Appendix 4.6.2, does
not write the rule out: w <- w - gamma_w sum_k lambda_k g_k, lambda <-
Proj(lambda + gamma_lambda F)), on the engine's uniformly sampled cohort S of
m clients:

* w step: each client of S runs the usual local training from w_t and the
  server averages the updates with the mixture weights,
  Delta = sum_{k in S} lambda_k (w_k - w_t) / sum_{k in S} lambda_k
  (with one local full-batch step, as in the thesis's runs, w_k - w_t =
  -gamma_w grad F_k(w_t): gamma_w is the local learning rate);
* lambda step: projected gradient ascent with the unbiased estimate of the
  loss vector from the cohort, g_k = (N / m) F_k(w_t) for k in S and 0
  elsewhere (F_k on all of client k's data at w_t, before training):
  lambda <- Proj_simplex(lambda + gamma_lambda g), the Euclidean projection
  (`optax.projections.projection_simplex`).

Both steps use (w_t, lambda_t). lambda (all N clients) starts uniform and
lives in `state.extra['lambda']`. With m = N both are exactly the full
deterministic version the thesis ran; with lambda uniform and gamma_lambda
= 0, AFL is FedAvg with uniform weights. The data weights alpha (client
weighting) are not used: the mixture weights replace them. If every client
of a cohort has lambda_k = 0 the round makes no w update (a zero weighted
mean; `clients_with_weight` = 0 records it). The model evaluated is the last
iterate, as for every algorithm here (Mohri et al. and the thesis's code
report the average of the iterates).

The papers' practical stand-in, "AFL as q-FFL with large q" (q = 10;
Pillutla et al. 2023, Section 7.2 and Appendix C.2), is
`jaxfl.algorithms.qffl` under the registry name 'afl-qffl'.

References:
  [Mohri et al. 2019] Agnostic Federated Learning. ICML 2019.
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Unpack

import jax.numpy as jnp
from optax.projections import projection_simplex

from jaxfl.algorithms import stages
from jaxfl.algorithms.base import FederatedAlgorithm, ServerState
from jaxfl.algorithms.registry import Engine
from jaxfl.training.cohort import CohortResults, weighted_mean
from jaxfl.training.local import LocalTraining, Task
from jaxfl.types import Key


def lambda_ascent(
    mixture: jnp.ndarray,
    client_ids: jnp.ndarray,
    losses: jnp.ndarray,
    step_size,
) -> jnp.ndarray:
    """One projected stochastic gradient ascent step on the mixture weights.

    Args:
      mixture: `[N]` lambda in the simplex.
      client_ids: `[M]` the cohort (distinct).
      losses: `[M]` their F_k(w_t).
      step_size: gamma_lambda.

    Returns:
      `[N]` Proj_simplex(lambda + gamma_lambda g), g = (N / M) F on the
      cohort and 0 elsewhere.
    """
    scale = mixture.shape[0] / client_ids.shape[0]
    gradient = jnp.zeros_like(mixture).at[client_ids].add(scale * losses)
    return projection_simplex(mixture + step_size * gradient)


def afl(
    task: Task,
    local: LocalTraining,
    clients_per_round: int,
    num_clients: int,
    **options: Unpack[stages.RoundOptions],
) -> FederatedAlgorithm:
    """AFL by stochastic gradient descent-ascent (see the module docstring).

    Numeric hyperparameters: the local ones ('lr' is gamma_w) and
    'afl_lambda_lr' (gamma_lambda > 0, default 0.01).

    Args:
      task, local, clients_per_round: as `jaxfl.algorithms.stages.compose_round` takes them.
      num_clients: N, the training clients the mixture is over; the round
        must be given a population of that size.

    Returns:
      The `FederatedAlgorithm`.

    Raises:
      ValueError: num_clients < clients_per_round (at build time), or a
        population of another size (in the round).
    """
    def uniform_mixture(params) -> dict:
        del params  # Unused: lambda starts uniform over the N clients.
        return {"lambda": jnp.full((num_clients,), 1.0 / num_clients, jnp.float32)}

    if num_clients < clients_per_round:
        raise ValueError(
            f"afl: num_clients={num_clients} is below "
            f"clients_per_round={clients_per_round}"
        )

    def aggregate(
        results: CohortResults,
        cohort: stages.Cohort,
        plan: stages.ClientPlan,
        state: ServerState,
        key: Key,
    ) -> stages.Aggregation:
        del plan, key  # Unused.
        mixture = state.extra["lambda"]
        if mixture.shape[0] != num_clients:  # Static: shapes are known.
            raise ValueError(
                f"afl was built for {num_clients} clients, its state holds "
                f"{mixture.shape[0]} mixture weights"
            )
        weights = mixture[cohort.client_ids]
        new_mixture = lambda_ascent(
            mixture,
            cohort.client_ids,
            cohort.initial_loss,
            state.hparams["afl_lambda_lr"],
        )
        metrics = {"lambda_max": jnp.max(new_mixture)}
        return stages.Aggregation(
            weighted_mean(results.deltas, weights),
            weights,
            {"lambda": new_mixture},
            metrics,
        )

    return stages.compose_round(
        "afl",
        task,
        clients_per_round,
        client_update=stages.ClientUpdateStage(local=local, reports_initial_loss=True),
        aggregate=stages.AggregateStage(
            aggregate=aggregate, hparam_defaults={"afl_lambda_lr": 0.01}, init=uniform_mixture
        ),
        num_clients=num_clients,
        **stages.uniform_weights("afl", options),
    )


def from_engine(engine: Engine, options: Mapping[str, Any]) -> FederatedAlgorithm:
    """AFL as the registry builds it for a run (its weights are lambda: no client weighting)."""
    del options  # None.
    return afl(
        engine.task, engine.local, engine.clients_per_round, engine.training_clients("afl"),
        strategy=engine.strategy, server_tx=engine.server_tx, robustness=engine.robustness,
        compression=engine.compression, clock=engine.clock,
    )
