"""Ditto (thesis chapter 5): personal models next to any global algorithm.

Each client k keeps a personal model v_k that solves (thesis eq. 5.1,
`shared/notes/thesis-spec.md` section 5.1)

    min_v F_k(v) + lambda/2 ||v - w*||^2,

w* being what the global algorithm G trains. One round (thesis Algorithm 6;
Algorithm 7 for G = FedAvg):

1. G's round runs unchanged: it samples S_t, trains and aggregates (its own
   aggregation rule, robust or not) and yields w_{t+1};
2. every client k of S_t also runs the same number of personal steps from
   its v_k on the same minibatches as its global steps,
   v_k <- v_k - lr (grad F_k(v_k) + lambda (v_k - w_t)),
   and keeps v_k (stateful clients: v_k persists across the rounds in which k
   is sampled; all v_k^0 = w^0, as the authors' code).

The global trajectory does not depend on the v_k (only Delta is sent), so
G's state, metrics and model are bit for bit those of G alone. The personal
models live in `ServerState.clients` as leaves `[N, ...]` (one model per
training client: N times the model's bytes; docs/personalization.md gives
the N this allows); the round gathers the cohort's rows and scatters them
back inside the one compiled round. lambda is the hyperparameter 'lam' (a
traced scalar, so sweeps vary it without recompiling). lambda = 0 trains
purely local models; large lambda keeps v_k near w_t.

Keys: the cohort is G's (`round_keys(key, round).sampling`, the same draw),
and client k's personal steps use `fold_in(keys.clients, k)`, the key of its
global local training, hence its minibatches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax
import jax.numpy as jnp

from jaxfl.algorithms.base import FederatedAlgorithm, ServerState, local_learning_rate
from jaxfl.data.population import ClientPopulation, GatheredCohort
from jaxfl.training.cohort import round_keys, select_cohort, update_personal_models
from jaxfl.training.local import LocalHParams, LocalTraining, Task
from jaxfl.training.strategies import ClientStrategy
from jaxfl.types import Key, Metrics, Params

DITTO_HPARAM_DEFAULTS = {"lam": 1.0}


def ditto(
    global_algorithm: FederatedAlgorithm,
    task: Task,
    local: LocalTraining,
    clients_per_round: int,
    num_clients: int,
    *,
    strategy: ClientStrategy,
    name: str = "ditto",
) -> FederatedAlgorithm:
    """Ditto with `global_algorithm` as its global solver G (module docstring).

    Args:
      global_algorithm: G, any algorithm of the round template (FedAvg,
        FedProx, Delta-FL, q-FFL, ..., with any aggregator).
      task: model and loss.
      local: the static local-training shape (G's: r = s local iterations).
      clients_per_round: M (G's).
      num_clients: N, the training clients (rows of the personal models).
      strategy: how the cohort's clients are laid out.
      name: registry name.

    Returns:
      The `FederatedAlgorithm`; its state's `clients` holds the personal
      models, leaves `[N, ...]`.

    Raises:
      ValueError: num_clients < 1 or G already takes a 'lam'.
    """
    if num_clients < 1:
        raise ValueError(f"ditto needs num_clients >= 1, got {num_clients}")
    if "lam" in global_algorithm.hparam_defaults:
        raise ValueError(f"{global_algorithm.name} already has a hyperparameter 'lam'")
    defaults = {**global_algorithm.hparam_defaults, **DITTO_HPARAM_DEFAULTS}

    def init(params: Params, hparams: Mapping[str, float] | None = None) -> ServerState:
        hparams = dict(hparams or {})
        lam = hparams.pop("lam", DITTO_HPARAM_DEFAULTS["lam"])
        state = global_algorithm.init(params, hparams)
        personal = jax.tree.map(
            lambda leaf: jnp.broadcast_to(leaf, (num_clients, *leaf.shape)).copy(), params
        )
        return dataclasses.replace(
            state,
            hparams={**state.hparams, "lam": jnp.asarray(lam, jnp.float32)},
            clients=personal,
        )

    def round_fn(
        state: ServerState, population: ClientPopulation | GatheredCohort, key: Key
    ) -> tuple[ServerState, Metrics]:
        keys = round_keys(key, state.round)
        cohort = select_cohort(keys.sampling, population, clients_per_round)
        hparams = LocalHParams(
            lr=local_learning_rate(state.hparams, state.round), prox_mu=state.hparams["lam"]
        )
        clients, trained = update_personal_models(
            task, local, strategy, state.params, state.clients, cohort, keys.clients, hparams
        )
        new_state, metrics = global_algorithm.round(state, population, key)
        metrics = {
            **metrics,
            "personal_train_loss": jnp.mean(trained.mean_batch_loss),
        }
        return dataclasses.replace(new_state, clients=clients), metrics

    return FederatedAlgorithm(name=name, init=init, round=round_fn, hparam_defaults=defaults)
