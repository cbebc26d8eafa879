"""L2SGD (Hanzely and Richtarik 2020), a personalization baseline of Li 2023 (thesis), App. 5.6.2.

The objective of "Federated learning of a mixture of global and local
models", as the thesis uses it (Appendix 5.6.2):

    min over w_1..w_N of  sum_k F_k(w_k) + lambda/2 sum_k ||w_k - w_bar||^2,
    w_bar = (1/N) sum_k w_k.

Its gradient in w_k is grad F_k(w_k) + lambda (w_k - w_bar) (the terms
through w_bar sum to lambda/N sum_j (w_j - w_bar) = 0), so with partial
participation each sampled client runs local SGD on its own block,

    w_k <- (1 - lr l2) w_k - lr (grad F_k(w_k; batch) + lambda (w_k - w_bar_t))

(l2 is the run's local weight decay, 0 by default, as in every algorithm's
local steps), with w_bar_t fixed during the round, from its current w_k (all w_k^0 = w^0),
and the server then recomputes w_bar_{t+1} as the plain mean of all N
personal models (the clients not sampled keep theirs). These are Ditto's
personal steps (`jaxfl.algorithms.ditto`) with the mean of the personal
models in place of a separately trained global model: lambda = 0 trains
local models, large lambda pulls every w_k to one shared model.

State: `params` is w_bar (what the global evaluation reports), `clients`
the personal models, leaves `[N, ...]` (evaluated as personal models, like
Ditto's). Client k's key is `fold_in(keys.clients, k)`, so at the same seed
it visits the minibatches of its FedAvg and Ditto training.

References:
  [Hanzely and Richtarik 2020] Federated Learning of a Mixture of Global and Local Models.
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jaxfl.algorithms.base import (
    FederatedAlgorithm,
    ServerState,
    local_learning_rate,
    resolve_hparams,
    tree_norm,
)
from jaxfl.algorithms.registry import Engine
from jaxfl.algorithms.stages import LOCAL_HPARAM_DEFAULTS
from jaxfl.data.population import ClientPopulation, GatheredCohort
from jaxfl.training.client_state import GatheredClientRows
from jaxfl.training.cohort import initial_client_models, round_keys, select_cohort, update_personal_models
from jaxfl.training.local import LocalHParams, LocalTraining, Task
from jaxfl.training.strategies import ClientStrategy
from jaxfl.types import Key, Metrics, Params

L2SGD_HPARAM_DEFAULTS = {**LOCAL_HPARAM_DEFAULTS, "lam": 1.0}


def l2sgd(
    task: Task,
    local: LocalTraining,
    clients_per_round: int,
    num_clients: int,
    *,
    strategy: ClientStrategy,
    name: str = "l2sgd",
) -> FederatedAlgorithm:
    """L2SGD with partial participation (module docstring).

    Args:
      task, local, clients_per_round, strategy: as `jaxfl.algorithms.stages.compose_round` takes them
        (local: the shape of both passes).
      num_clients: N, the training clients (rows of the personal models).
      name: registry name.

    Returns:
      The `FederatedAlgorithm`; hyperparameters: the local ones and 'lam'.

    Raises:
      ValueError: num_clients < 1.
    """
    if num_clients < 1:
        raise ValueError(f"l2sgd needs num_clients >= 1, got {num_clients}")

    def init(params: Params, hparams: Mapping[str, float] | None = None) -> ServerState:
        personal = initial_client_models(params, num_clients, strategy)
        return ServerState(
            round=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=(),
            hparams=resolve_hparams(L2SGD_HPARAM_DEFAULTS, hparams),
            clients=personal,
        )

    def round_fn(
        state: ServerState, population: ClientPopulation | GatheredCohort, key: Key
    ) -> tuple[ServerState, Metrics]:
        if isinstance(state.clients, GatheredClientRows):
            raise ValueError("l2sgd averages all N personal models: they cannot be host-resident")
        keys = round_keys(key, state.round)
        cohort = select_cohort(keys.sampling, population, clients_per_round)
        hparams = LocalHParams(
            lr=local_learning_rate(state.hparams, state.round),
            l2=state.hparams["l2"],
            prox_mu=state.hparams["lam"],
        )
        clients, trained = update_personal_models(
            task, local, strategy, state.params, state.clients, cohort, keys.clients, hparams
        )
        # The mean of all N (not the padding rows of a split state), recomputed
        # (not updated by the cohort's change, whose rounding would drift over
        # thousands of rounds).
        mean = jax.tree.map(lambda rows: jnp.mean(rows[:num_clients], axis=0), clients)
        metrics = {
            "train_loss": jnp.mean(trained.mean_batch_loss),
            "update_norm": tree_norm(jax.tree.map(jnp.subtract, mean, state.params)),
            "clients_with_weight": jnp.asarray(clients_per_round, jnp.int32),
            "local_steps": jnp.mean(trained.num_steps.astype(jnp.float32)),
        }
        new_state = ServerState(
            round=state.round + 1,
            params=mean,
            opt_state=state.opt_state,
            hparams=state.hparams,
            extra=state.extra,
            clients=clients,
            aggregator=state.aggregator,
        )
        return new_state, metrics

    return FederatedAlgorithm(name=name, init=init, round=round_fn, hparam_defaults=L2SGD_HPARAM_DEFAULTS)


def from_engine(engine: Engine, options: Mapping[str, Any]) -> FederatedAlgorithm:
    """L2SGD as the registry builds it for a run: no updates are sent, so nothing robust applies."""
    del options  # None.
    robustness = engine.robustness
    if robustness is not None and (
        (robustness.aggregator is not None and robustness.aggregator.name != "mean")
        or robustness.attack is not None
    ):
        raise ValueError(
            "l2sgd sends no updates to aggregate: robust aggregators and update attacks do not apply "
            "(data attacks do)"
        )
    return l2sgd(
        engine.task, engine.local, engine.clients_per_round, engine.training_clients("l2sgd"),
        strategy=engine.strategy,
    )
