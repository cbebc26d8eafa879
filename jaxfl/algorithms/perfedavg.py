"""Per-FedAvg (HF) (Fallah, Mokhtari and Ozdaglar 2020), a personalization baseline of Li 2023, App. 5.6.2.

Personalized FedAvg trains the global model w for the MAML objective

    min_w (1/N) sum_k F_k(w - alpha grad F_k(w)),

so that one gradient step of size alpha on a client's own data gives a good
personal model (Li 2023 (thesis), Appendix 5.6.2: it "applies MAML to
personalize federated models with an Hessian-product approximation";
Section 5.3.4: unlike the other baselines it "requires additional tuning"
of the learning rate "to prevent divergence"). Each local step of the
Hessian-free variant (their Algorithm 1 with the update of their eq. (10))
reads three disjoint minibatches D, D', D'' of the client:

    w_tilde = w - alpha grad F(w; D)
    g       = grad F(w_tilde; D')
    h       = (grad F(w + delta g; D'') - grad F(w - delta g; D'')) / (2 delta)
    w      <- (1 - beta l2) w - beta (g - alpha h),

h being the finite-difference approximation of the Hessian-vector product
grad^2 F(w; D'') g, beta the local learning rate (`--lr`). In jaxfl a local
step's minibatch of B examples is dealt into D, D', D'' by position (0, 3,
6, ... into D; 1, 4, ... into D'; 2, 5, ... into D''), so a step reads the
examples a FedAvg step reads (choose B three times the per-batch size
wanted); a part left empty by a short last batch contributes a zero
gradient. The server averages the local models as FedAvg does (the round
template: any aggregator, update attack and server optimizer apply).

Personal models, computed once after training (like fine-tuning) from the
final w: v_k = w - alpha grad F_k(w), one step of gradient descent on all of
client k's training examples (the adaptation the objective trains for).

Hyperparameters (traced, so sweeps vary them): 'perfedavg_alpha' (alpha)
and 'perfedavg_delta' (delta).

References:
  [Fallah et al. 2020] A. Fallah, A. Mokhtari, A. Ozdaglar. Personalized
    Federated Learning with Theoretical Guarantees: A Model-Agnostic
    Meta-Learning Approach. NeurIPS 2020.
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Unpack

import jax
import jax.numpy as jnp

from jaxfl.algorithms import stages
from jaxfl.algorithms.base import FederatedAlgorithm, ServerState
from jaxfl.algorithms.registry import Engine
from jaxfl.data.population import ClientPopulation
from jaxfl.training.local import (
    LocalHParams,
    LocalStep,
    LocalTraining,
    Task,
    client_loss_gradient,
    minibatch_loss,
    sgd_update,
)
from jaxfl.training.strategies import ClientStrategy, map_clients
from jaxfl.types import Params

PERFEDAVG_HPARAM_DEFAULTS = {"perfedavg_alpha": 0.01, "perfedavg_delta": 1e-3}


def hessian_free_step(task: Task, hparams: LocalHParams, alpha: jax.Array, delta: jax.Array) -> LocalStep:
    """Per-FedAvg (HF)'s local step (module docstring), as a `local_sgd` step."""

    def gradient(params, batch, part, key):
        return jax.grad(minibatch_loss, argnums=1)(task, params, batch, part, key)

    def step(params: Params, batch, valid, key):
        position = jnp.arange(valid.shape[0])
        inner, outer, curvature = (valid & (position % 3 == part) for part in range(3))
        adapted = jax.tree.map(lambda w, g: w - alpha * g, params, gradient(params, batch, inner, key))
        loss, meta_gradient = jax.value_and_grad(minibatch_loss, argnums=1)(task, adapted, batch, outer, key)
        ahead = jax.tree.map(lambda w, g: w + delta * g, params, meta_gradient)
        behind = jax.tree.map(lambda w, g: w - delta * g, params, meta_gradient)
        hessian_times_gradient = jax.tree.map(
            lambda plus, minus: (plus - minus) / (2.0 * delta),
            gradient(ahead, batch, curvature, key),
            gradient(behind, batch, curvature, key),
        )
        direction = jax.tree.map(lambda g, h: g - alpha * h, meta_gradient, hessian_times_gradient)
        return sgd_update(params, direction, hparams), loss

    return step


def perfedavg(
    task: Task,
    local: LocalTraining,
    clients_per_round: int,
    **options: Unpack[stages.RoundOptions],
) -> FederatedAlgorithm:
    """Per-FedAvg (HF) (module docstring); its `personalize` makes the personal models."""

    def local_step(hparams: LocalHParams, state_hparams: Mapping[str, jax.Array]) -> LocalStep:
        return hessian_free_step(
            task, hparams, state_hparams["perfedavg_alpha"], state_hparams["perfedavg_delta"]
        )

    algorithm = stages.compose_round(
        "perfedavg",
        task,
        clients_per_round,
        client_update=stages.ClientUpdateStage(
            local=local, step=local_step, hparam_defaults=PERFEDAVG_HPARAM_DEFAULTS
        ),
        **options,
    )

    def personalize(state: ServerState, population: ClientPopulation) -> Params:
        alpha = state.hparams["perfedavg_alpha"]
        return adapted_models(task, options["strategy"], state.params, population, alpha)

    return algorithm._replace(personalize=personalize)


def adapted_models(
    task: Task, strategy: ClientStrategy, params: Params, population: ClientPopulation, alpha: jax.Array
) -> Params:
    """v_k = w - alpha grad F_k(w) for every client k of `population` (leaves `[N, ...]`)."""
    num_clients = population.num_clients

    def client_fn(shared, client):
        params, population, alpha = shared
        gradient = client_loss_gradient(task, params, population, client["id"])
        return jax.tree.map(lambda w, g: w - alpha * g, params, gradient)

    per_client = {"id": jnp.arange(num_clients, dtype=jnp.int32), "active": jnp.ones(num_clients, bool)}
    return map_clients(client_fn, (params, population, alpha), per_client, strategy)


def from_engine(engine: Engine, options: Mapping[str, Any]) -> FederatedAlgorithm:
    """Per-FedAvg as the registry builds it for a run."""
    del options  # None.
    if engine.local.batch_size < 3:
        raise ValueError(
            f"perfedavg deals each minibatch into three parts (D, D', D''): batch_size must be >= 3, "
            f"got {engine.local.batch_size}"
        )
    return perfedavg(engine.task, engine.local, engine.clients_per_round, **engine.round_options())
