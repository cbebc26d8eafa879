"""APFL (Deng, Kamani and Mahdavi 2020), a personalization baseline of thesis section 5.5.

Adaptive Personalized Federated Learning, as the thesis compares it
(`shared/notes/thesis-spec.md` section 5.5: "interpolate local and global
models", alpha = 0.5 by default in the authors' code). Client k keeps a
local model v_k (stateful, like Ditto's personal models; all v_k^0 = w^0),
and its personal model is the mixture

    v_bar_k = alpha v_k + (1 - alpha) w.

One round (APFL's Algorithm 1 with a fixed alpha): every sampled client,
starting from the server model w_t and its own v_k, runs local SGD on both
at once, each step on one minibatch xi:

    w <- (1 - lr l2) w - lr grad F_k(w; xi)
    v <- (1 - lr l2) v - lr alpha grad F_k(alpha v + (1 - alpha) w; xi),

the mixture taken at the step's w before its update, alpha grad F_k being
the gradient in v of F_k at the mixture. The w steps are FedAvg's local
steps (same key, so the same minibatches), and the server model is FedAvg's
(any aggregator, update attack and server optimizer of the run apply): its
trajectory does not depend on the v_k. The round therefore runs FedAvg's
round unchanged and, beside it, the joint steps above for the cohort (which
recompute the w iterates the v steps read: three gradients a step, against
FedAvg's one and Ditto's two).

With stragglers (`stragglers` > 0), FedAvg drops the cohort's stragglers
(they do not train, `jaxfl.algorithms.fedavg.straggler_plan`); the same
clients, drawn from the same key, leave their v_k untouched.

Evaluated and saved personal models: alpha v_k + (1 - alpha) w_T, with the
final server model (`FederatedAlgorithm.personal_models`). alpha is the
traced hyperparameter 'apfl_alpha' (a sweep varies it without recompiling);
alpha = 0 is FedAvg's model for everyone, alpha = 1 trains v_k on its own
(local models). APFL's adaptive alpha (a gradient step on alpha per client)
is not implemented.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxfl.algorithms.base import (
    FederatedAlgorithm,
    ServerState,
    init_with_client_models,
    local_learning_rate,
)
from jaxfl.algorithms.fedavg import straggler_plan
from jaxfl.algorithms.round_template import Cohort
from jaxfl.data.population import ClientPopulation, GatheredCohort
from jaxfl.training.cohort import (
    round_keys,
    select_cohort,
    train_client_rows,
)
from jaxfl.training.local import LocalHParams, LocalTraining, Task, local_sgd, minibatch_loss
from jaxfl.training.strategies import ClientStrategy
from jaxfl.types import Key, Metrics, Params

APFL_HPARAM_DEFAULTS = {"apfl_alpha": 0.5}


def mixture(alpha: jax.Array, local_model: Params, global_model: Params) -> Params:
    """Alpha v + (1 - alpha) w, APFL's personal model (leaves of equal rank)."""
    return jax.tree.map(lambda v, w: alpha * v + (1.0 - alpha) * w, local_model, global_model)


def apfl(
    global_algorithm: FederatedAlgorithm,
    task: Task,
    local: LocalTraining,
    clients_per_round: int,
    num_clients: int,
    *,
    strategy: ClientStrategy,
    stragglers: float = 0.0,
    name: str = "apfl",
) -> FederatedAlgorithm:
    """APFL with a fixed mixing weight (module docstring).

    Args:
      global_algorithm: the server side, FedAvg's round (with the run's
        aggregator and attack): its local steps must be plain local SGD,
        which the joint steps repeat.
      task: model and loss.
      local: the static local-training shape (FedAvg's).
      clients_per_round: M (FedAvg's).
      num_clients: N, the training clients (rows of the local models).
      strategy: how the cohort's clients are laid out.
      stragglers: G's fraction of dropped stragglers (FedAvg's option): they
        do not step their v_k either.
      name: registry name.

    Returns:
      The `FederatedAlgorithm`; its state's `clients` holds the v_k, leaves
      `[N, ...]`, and `personal_models(state)` the mixtures.

    Raises:
      ValueError: num_clients < 1 or G already takes 'apfl_alpha'.
    """
    if num_clients < 1:
        raise ValueError(f"apfl needs num_clients >= 1, got {num_clients}")
    alpha = APFL_HPARAM_DEFAULTS["apfl_alpha"]
    init = init_with_client_models(global_algorithm, "apfl_alpha", alpha, num_clients, strategy)
    defaults = {**global_algorithm.hparam_defaults, **APFL_HPARAM_DEFAULTS}
    dropped = straggler_plan(clients_per_round, stragglers, local.num_epochs, keep=False)

    def client_fn(shared, client):
        server_params, population, hparams, alpha = shared

        def joint_objective(params, batch, valid, key):
            # d/dv of F(alpha v + (1 - alpha) w) is alpha grad F at the mixture; w gets only its own
            # gradient (the mixture's w is held fixed).
            own = minibatch_loss(task, params["global"], batch, valid, key)
            mixed = mixture(alpha, params["local"], jax.lax.stop_gradient(params["global"]))
            mixed_loss = minibatch_loss(task, mixed, batch, valid, key)
            return own + mixed_loss, mixed_loss

        result = local_sgd(
            task,
            {"global": server_params, "local": client["start"]},
            population,
            client["id"],
            client["key"],
            hparams,
            local,
            active=client["active"],
            objective=joint_objective,
        )
        return {"params": result.params["local"], "loss": result.mean_batch_loss}

    def round_fn(
        state: ServerState, population: ClientPopulation | GatheredCohort, key: Key
    ) -> tuple[ServerState, Metrics]:
        keys = round_keys(key, state.round)
        cohort = select_cohort(keys.sampling, population, clients_per_round)
        hparams = LocalHParams(lr=local_learning_rate(state.hparams, state.round), l2=state.hparams["l2"])
        active = jnp.ones(clients_per_round, bool)
        if dropped is not None:
            # FedAvg's plan, with the key the round template gives it: the same stragglers.
            plan_key = jax.random.split(keys.server)[0]
            active = dropped(Cohort(cohort.client_ids, alpha=active), state, plan_key).active
        shared = (state.params, cohort.population, hparams, state.hparams["apfl_alpha"])
        local_models, trained = train_client_rows(
            client_fn, shared, state.clients, cohort, keys.clients, local, strategy, active=active
        )
        new_state, metrics = global_algorithm.round(state, population, key)
        # Over the clients that stepped (dropped stragglers report no loss).
        personal_loss = jnp.sum(jnp.where(active, trained["loss"], 0.0)) / jnp.maximum(jnp.sum(active), 1)
        metrics = {**metrics, "personal_train_loss": personal_loss}
        return dataclasses.replace(new_state, clients=local_models), metrics

    def personal_models(state: ServerState) -> Params:
        global_model = jax.tree.map(lambda leaf: leaf[None], state.params)
        return mixture(state.hparams["apfl_alpha"], state.clients, global_model)

    return FederatedAlgorithm(
        name=name, init=init, round=round_fn, hparam_defaults=defaults, personal_models=personal_models
    )
