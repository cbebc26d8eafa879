"""APFL (Deng, Kamani and Mahdavi 2020), a personalization baseline of Li 2023 (thesis), App. 5.6.2.

Adaptive Personalized Federated Learning, as the thesis compares it
(Appendix 5.6.2: APFL "proposes to interpolate between local and global
models"; alpha = 0.5 by default in the authors' code). Client k keeps a
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
(local models).

Adaptive alpha (APFL's section 3.1, `alpha_lr` > 0): each client keeps its
own alpha_k (stateful like v_k, all alpha_k^0 = 'apfl_alpha') and steps it
with the same minibatch at every local step, from the step's (v, w):

    alpha <- clip(alpha - alpha_lr <v - w, grad F_k(alpha v + (1 - alpha) w; xi)>, 0, 1),

<v - w, grad F_k(v_bar)> being d/d alpha of F_k(v_bar). The personal model
is then alpha_k v_k + (1 - alpha_k) w; the state's `clients` holds
{'local': v_k, 'alpha': alpha_k}, and the round reports the cohort's mean
alpha_k ('apfl_alpha_mean'). The thesis's comparison uses a fixed alpha (0.5,
the code's default): `alpha_lr` = 0, the default.

References:
  [Deng et al. 2020] Adaptive Personalized Federated Learning. arXiv preprint, 2020.
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jaxfl.algorithms.base import FederatedAlgorithm, ServerState
from jaxfl.algorithms.registry import Engine, algorithm_spec
from jaxfl.algorithms.stages import PersonalStage
from jaxfl.training.cohort import client_rows, train_client_rows
from jaxfl.training.local import LocalHParams, LocalTraining, Task, local_sgd, minibatch_loss, sgd_update
from jaxfl.types import Params

APFL_HPARAM_DEFAULTS = {"apfl_alpha": 0.5}


def mixture(alpha: jax.Array, local_model: Params, global_model: Params) -> Params:
    """Alpha v + (1 - alpha) w, APFL's personal model (leaves of equal rank)."""
    return jax.tree.map(lambda v, w: alpha * v + (1.0 - alpha) * w, local_model, global_model)


def client_mixtures(alphas: jax.Array, local_models: Params, global_model: Params) -> Params:
    """Every client's alpha_k v_k + (1 - alpha_k) w: `alphas` `[N]`, `local_models` leaves `[N, ...]`."""
    return jax.tree.map(
        lambda v, w: mixture(alphas.reshape(alphas.shape + (1,) * (v.ndim - 1)), v, w[None]),
        local_models,
        global_model,
    )


def apfl_joint_objective(task: Task, params: Params, batch, valid, key) -> tuple[jax.Array, jax.Array]:
    """F(w) + F(alpha v + (1 - alpha) w) on a minibatch, and the mixture's loss (reported).

    Differentiated with respect to params = {'global': w, 'local': v, 'alpha'}:
    d/dv is alpha grad F at the mixture, d/d alpha is <v - w, grad F> there;
    w gets only its own gradient (the mixture's w is held fixed).
    """
    own = minibatch_loss(task, params["global"], batch, valid, key)
    mixed = mixture(params["alpha"], params["local"], jax.lax.stop_gradient(params["global"]))
    mixed_loss = minibatch_loss(task, mixed, batch, valid, key)
    return own + mixed_loss, mixed_loss


def apfl(
    global_algorithm: FederatedAlgorithm,
    local: LocalTraining,
    num_clients: int,
    *,
    alpha_lr: float = 0.0,
    name: str = "apfl",
) -> FederatedAlgorithm:
    """APFL with a fixed or adaptive mixing weight (module docstring).

    Args:
      global_algorithm: the server side, FedAvg's composed round (with the
        run's aggregator, attack and stragglers: dropped stragglers step
        neither model): its local steps must be plain local SGD, which the
        joint steps repeat; the local models train on its cohort, with its
        task and client strategy.
      local: FedAvg's local training.
      num_clients: N, the training clients (rows of the local models).
      alpha_lr: > 0: each client's alpha_k adapts with this step size
        (module docstring); 0: one fixed alpha, 'apfl_alpha'.
      name: registry name.

    Returns:
      The `FederatedAlgorithm`; its state's `clients` holds the v_k, leaves
      `[N, ...]` (with `alpha_lr`: {'local': v_k, 'alpha': `[N]` alpha_k}),
      and `personal_models(state)` the mixtures.

    Raises:
      ValueError: num_clients < 1, alpha_lr < 0 or G already takes 'apfl_alpha'.
    """
    if num_clients < 1:
        raise ValueError(f"apfl needs num_clients >= 1, got {num_clients}")
    if not alpha_lr >= 0:
        raise ValueError(f"apfl's alpha_lr must be >= 0, got {alpha_lr}")
    adaptive = alpha_lr > 0
    composition = global_algorithm.composition
    if composition is None:
        raise ValueError(
            f"apfl builds on a composed round's stages; {global_algorithm.name} writes its own round"
        )
    task, strategy = composition.task, composition.strategy
    if "apfl_alpha" in global_algorithm.hparam_defaults:
        raise ValueError(f"{global_algorithm.name} already has a hyperparameter 'apfl_alpha'")

    def init_row(params: Params, hparams) -> Params:
        # v_k^0 = w^0; with adaptation, alpha_k^0 = the hyperparameter alpha.
        return {"local": params, "alpha": hparams["apfl_alpha"]} if adaptive else params

    joint_objective = functools.partial(apfl_joint_objective, task)

    def adaptive_step(hparams):
        def step(params, batch, valid, key):
            (_, loss), grads = jax.value_and_grad(joint_objective, has_aux=True)(params, batch, valid, key)
            models = sgd_update(
                {"global": params["global"], "local": params["local"]},
                {"global": grads["global"], "local": grads["local"]},
                hparams,
            )
            new_alpha = jnp.clip(params["alpha"] - alpha_lr * grads["alpha"], 0.0, 1.0)
            return {**models, "alpha": new_alpha}, loss

        return step

    def client_fn(shared, client):
        server_params, population, hparams, alpha = shared
        start = client["start"]
        if adaptive:
            params = {"global": server_params, "local": start["local"], "alpha": start["alpha"]}
            hooks = {"step": adaptive_step(hparams)}
        else:
            params = {"global": server_params, "local": start}
            hooks = {"objective": lambda p, *args: joint_objective({**p, "alpha": alpha}, *args)}
        result = local_sgd(
            task, params, population, client["id"], client["key"], hparams, local,
            active=client["active"], **hooks,
        )
        if adaptive:
            row = {"local": result.params["local"], "alpha": result.params["alpha"]}
        else:
            row = result.params["local"]
        return {"params": row, "loss": result.mean_batch_loss}

    def personal_update(state, cohort, clients_key, lr, population, active):
        # The round's cohort and plan (G's dropped stragglers step neither model), and each client's
        # key of its global training: the same minibatches as its FedAvg steps.
        del population  # Unused.
        hparams = LocalHParams(lr=lr, l2=state.hparams["l2"])
        if active is None:
            active = jnp.ones(cohort.client_ids.shape[0], bool)
        shared = (state.params, cohort.population, hparams, state.hparams["apfl_alpha"])
        local_models, trained = train_client_rows(
            client_fn, shared, state.clients, cohort, clients_key, local, strategy, active=active
        )
        # Over the clients that stepped (dropped stragglers report no loss).
        personal_loss = jnp.sum(jnp.where(active, trained["loss"], 0.0)) / jnp.maximum(jnp.sum(active), 1)
        metrics = {"personal_train_loss": personal_loss}
        if adaptive:
            metrics["apfl_alpha_mean"] = jnp.mean(client_rows(local_models, cohort.client_ids)["alpha"])
        return local_models, metrics

    def personal_models(state: ServerState) -> Params:
        global_model = jax.tree.map(lambda leaf: leaf[None], state.params)
        if not adaptive:
            return mixture(state.hparams["apfl_alpha"], state.clients, global_model)
        return client_mixtures(state.clients["alpha"], state.clients["local"], state.params)

    personal = PersonalStage(personal_update, init_row=init_row, hparam_defaults=APFL_HPARAM_DEFAULTS)
    algorithm = composition.rebuilt(
        name=name, num_clients=num_clients, rows_are_models=True, personal=personal
    )
    return algorithm._replace(personal_models=personal_models)


def from_engine(engine: Engine, options: Mapping[str, Any]) -> FederatedAlgorithm:
    """APFL beside FedAvg, as the registry builds it for a run."""
    return apfl(
        algorithm_spec("fedavg").build(engine, options), engine.local, engine.training_clients("apfl"),
        alpha_lr=options["apfl_alpha_lr"],
    )
