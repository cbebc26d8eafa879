"""The shape every federated algorithm has: pure `init` and `round` functions.

`init(params, hparams) -> ServerState` and
`round(state, population, key) -> (state, metrics)`. The round is a pure
function meant to be jitted once for a whole run with the state donated; its
randomness is `fold_in(key, state.round)`, so the run key is the same every
round and runs resume deterministically.

Numeric hyperparameters (learning rates, l2, theta, mu, ...) live in the
state as scalar arrays, so a sweep is the same round vmapped over a stacked
state; shape-setting ones (clients per round, batch size, epochs) are fixed
when the algorithm is built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxfl.data.population import ClientPopulation
from jaxfl.types import Key, Metrics, Params, PyTree


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerState:
    """State of the server between rounds.

    Attributes:
      round: int32 [], rounds completed.
      params: the global model.
      opt_state: the server optimizer's state.
      hparams: name -> float32 [] numeric hyperparameters.
      extra: algorithm-specific state (e.g. AFL's mixture weights), or ().
    """

    round: jax.Array
    params: Params
    opt_state: optax.OptState
    hparams: Mapping[str, jax.Array]
    extra: PyTree = ()


class FederatedAlgorithm(NamedTuple):
    """A federated algorithm as pure functions (see the module docstring).

    Attributes:
      name: registry name.
      init: `(params, hparams: Mapping[str, float]) -> ServerState`.
      round: `(state, population, key) -> (state, metrics)`.
      hparam_defaults: the numeric hyperparameters and their defaults.
    """

    name: str
    init: Callable[[Params, Mapping[str, float]], ServerState]
    round: Callable[[ServerState, ClientPopulation, Key], tuple[ServerState, Metrics]]
    hparam_defaults: Mapping[str, float]


def resolve_hparams(
    defaults: Mapping[str, float], given: Mapping[str, float] | None
) -> dict[str, jax.Array]:
    """Fills in defaults; unknown names are an error (a typo would be silent)."""
    given = dict(given or {})
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ValueError(
            f"unknown hyperparameters {unknown}; this algorithm takes {sorted(defaults)}"
        )
    merged = {**defaults, **given}
    return {k: jnp.asarray(v, jnp.float32) for k, v in merged.items()}


def server_optimizer(
    name: str, learning_rate: float = 1.0, *, momentum: float = 0.0
) -> optax.GradientTransformation:
    """Server optimizers by name, applied to the pseudo-gradient -mean(delta).

    * 'sgd': w <- w + lr * mean(delta) (lr 1: plain FedAvg), with optional
      momentum (FedAvgM).
    * 'adam' (FedAdam) and 'yogi' (FedYogi): Reddi et al., Adaptive
      Federated Optimization, ICLR 2021, with their beta1 = 0.9,
      beta2 = 0.99 and adaptivity tau = 1e-3 as epsilon.

    The learning rate is an injected hyperparameter (in the optimizer state),
    so sweeps can vary it without recompiling.
    """
    if learning_rate <= 0:
        raise ValueError(f"server learning rate must be > 0, got {learning_rate}")
    if name == "sgd":
        return optax.inject_hyperparams(optax.sgd)(
            learning_rate=learning_rate, momentum=momentum or None
        )
    if name == "adam":
        return optax.inject_hyperparams(optax.adam)(
            learning_rate=learning_rate, b1=0.9, b2=0.99, eps=1e-3
        )
    if name == "yogi":
        return optax.inject_hyperparams(optax.yogi)(
            learning_rate=learning_rate, b1=0.9, b2=0.99, eps=1e-3
        )
    raise ValueError(f"unknown server optimizer {name!r}; choose sgd, adam or yogi")


def apply_server_update(
    tx: optax.GradientTransformation, state: ServerState, mean_delta: Params
) -> tuple[Params, optax.OptState]:
    """Feeds the pseudo-gradient -mean_delta to the server optimizer."""
    pseudo_gradient = jax.tree.map(jnp.negative, mean_delta)
    updates, opt_state = tx.update(pseudo_gradient, state.opt_state, state.params)
    return optax.apply_updates(state.params, updates), opt_state


def local_learning_rate(hparams: Mapping[str, jax.Array], round_index: jax.Array):
    """Step decay lr0 * c ** floor(t / t0) of 004 Appendix C.2 (constant: c = 1)."""
    exponent = jnp.floor(round_index / hparams["lr_decay_period"])
    return hparams["lr"] * hparams["lr_decay"] ** exponent


def tree_norm(tree: Params) -> jax.Array:
    return optax.tree.norm(tree)
