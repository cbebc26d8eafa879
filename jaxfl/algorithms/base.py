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

References:
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxfl.data.population import ClientPopulation
from jaxfl.training.strategies import ClientStrategy
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
      clients: per-client state, leaves `[R, ...]` indexed by client id
        (Ditto's personal models), or (); R is N or, where the rows are
        split over devices, N rounded up to a multiple of them
        (`ClientStrategy.client_state_rows`). The round gathers the cohort's
        rows and scatters them back.
      aggregator: the server aggregator's state (centered clipping's last
        aggregate), or ().
      error_feedback: the clients' residual rows of compressed updates,
        `[R, d]` like `clients` (`jaxfl.communication.compression`), or ().
      clock: float32 [] simulated seconds since the run started
        (`jaxfl.clock`), or () without a clock.
    """

    round: jax.Array
    params: Params
    opt_state: optax.OptState
    hparams: Mapping[str, jax.Array]
    extra: PyTree = ()
    clients: PyTree = ()
    aggregator: PyTree = ()
    error_feedback: PyTree = ()
    clock: PyTree = ()


def own_models(state: ServerState) -> PyTree:
    """The per-client state as the clients' own models (Ditto's, L2SGD's).

    `FederatedAlgorithm.personal_models`' default.
    """
    return state.clients


def no_personal_models(state: ServerState) -> PyTree:
    """No personal models: the per-client state, if any, is not models (SCAFFOLD's control variates)."""
    del state  # Unused.
    return ()


class FederatedAlgorithm(NamedTuple):
    """A federated algorithm as pure functions (see the module docstring).

    Attributes:
      name: registry name.
      init: `(params, hparams: Mapping[str, float]) -> ServerState`.
      round: `(state, population, key) -> (state, metrics)`.
      hparam_defaults: the numeric hyperparameters and their defaults.
      personal_models: `state -> ` each training client's own model,
        leaves `[R, ...]` with row k client k's (R >= N as `clients`; what
        is evaluated and saved as personal models), or () for an algorithm
        without them. Default: `state.clients`
        (Ditto, L2SGD); APFL mixes its personal models with the global one.
      personalize: `(state, training population) -> ` personal models,
        leaves `[N, ...]`, made once after training from the final state and
        the clients' data (Per-FedAvg's adaptation step), or None.
      composition: the stages the round was composed of
        (`jaxfl.algorithms.stages.Composition`), or None for a round written
        by hand; algorithms built on another's stages read it (Ditto).
      model_sends: for a round written by hand that reports the
        `clients_uploading` metric, the clients it sends the model each round
        (uncompressed both ways: `jaxfl.communication.traffic`); None: its
        messages are not counted. A composed round's follow from its stages.
    """

    name: str
    init: Callable[[Params, Mapping[str, float]], ServerState]
    round: Callable[[ServerState, ClientPopulation, Key], tuple[ServerState, Metrics]]
    hparam_defaults: Mapping[str, float]
    personal_models: Callable[[ServerState], PyTree] = own_models
    personalize: Callable[[ServerState, ClientPopulation], PyTree] | None = None
    composition: Any = None
    model_sends: int | None = None


def place_state(state: ServerState, strategy: ClientStrategy) -> ServerState:
    """Puts a server state where the compiled round expects it: replicated over the strategy's mesh,
    but for the per-client state (`state.clients`), whose rows are split over the devices
    (`ClientStrategy.shard_rows`). A stacked state (a sweep's, `round` of shape `[G]`) has its
    client rows on axis 1.
    """
    replicated = strategy.replicate(dataclasses.replace(state, clients=()))
    clients = strategy.shard_rows(state.clients, row_axis=jnp.ndim(state.round))
    return dataclasses.replace(replicated, clients=clients)


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


SERVER_OPTIMIZERS = ("sgd", "avgm", "adagrad", "adam", "yogi")


def server_optimizer(
    name: str,
    learning_rate: float = 1.0,
    *,
    momentum: float | None = None,
    beta1: float = 0.9,
    beta2: float = 0.99,
    epsilon: float = 1e-3,
) -> optax.GradientTransformation:
    """Server optimizers by name, applied to the pseudo-gradient -mean(delta).

    Reddi et al., "Adaptive Federated Optimization" (ICLR 2021), Algorithms
    1-2, with optax's implementations (the published runs used Keras'
    optimizers, whose Adam also corrects the moments' bias):

    * 'sgd': w <- w + lr * mean(delta) (lr 1: plain FedAvg); `momentum`
      (default 0) makes it heavy-ball momentum;
    * 'avgm' (FedAvgM): the same with momentum 0.9 by default;
    * 'adagrad' (FedAdagrad): `optax.adagrad` with no initial accumulator,
      v_t = sum of squared pseudo-gradients, step lr * g / sqrt(v_t + eps);
    * 'adam' (FedAdam), 'yogi' (FedYogi): `optax.adam`/`optax.yogi` with
      beta1, beta2 and eps = the adaptivity tau. Reddi et al. use beta1 0.9,
      beta2 0.99 and tuned tau (1e-3 for Shakespeare, 1e-4/1e-5 for
      StackOverflow): eps is not a detail, it bounds the step size.

    The learning rate is an injected hyperparameter (in the optimizer state),
    so sweeps can vary it without recompiling.
    """
    if learning_rate <= 0:
        raise ValueError(f"server learning rate must be > 0, got {learning_rate}")
    if name not in SERVER_OPTIMIZERS:
        raise ValueError(f"unknown server optimizer {name!r}; choose one of {', '.join(SERVER_OPTIMIZERS)}")
    if momentum is not None and not 0.0 <= momentum < 1.0:
        raise ValueError(f"server momentum must be in [0, 1), got {momentum}")
    if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
        raise ValueError(f"server beta1 and beta2 must be in [0, 1), got {beta1} and {beta2}")
    if not epsilon > 0:
        raise ValueError(f"server epsilon must be > 0, got {epsilon}")
    if name in ("sgd", "avgm"):
        if momentum is None:
            momentum = 0.9 if name == "avgm" else 0.0
        return optax.inject_hyperparams(optax.sgd)(learning_rate=learning_rate, momentum=momentum or None)
    if name == "adagrad":
        return optax.inject_hyperparams(optax.adagrad)(
            learning_rate=learning_rate, initial_accumulator_value=0.0, eps=epsilon
        )
    transform = optax.adam if name == "adam" else optax.yogi
    return optax.inject_hyperparams(transform)(learning_rate=learning_rate, b1=beta1, b2=beta2, eps=epsilon)


def apply_server_update(
    tx: optax.GradientTransformation, state: ServerState, mean_delta: Params
) -> tuple[Params, optax.OptState]:
    """Feeds the pseudo-gradient -mean_delta to the server optimizer."""
    pseudo_gradient = jax.tree.map(jnp.negative, mean_delta)
    updates, opt_state = tx.update(pseudo_gradient, state.opt_state, state.params)
    return optax.apply_updates(state.params, updates), opt_state


def local_learning_rate(hparams: Mapping[str, jax.Array], round_index: jax.Array):
    """Step decay lr0 * c ** floor(t / t0) of Pillutla et al. 2023, Appendix C.2 (constant: c = 1)."""
    exponent = jnp.floor(round_index / hparams["lr_decay_period"])
    return hparams["lr"] * hparams["lr_decay"] ** exponent


def tree_norm(tree: Params) -> jax.Array:
    return optax.tree.norm(tree)
