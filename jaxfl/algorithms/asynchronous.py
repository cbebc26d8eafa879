"""Asynchronous federated learning on the simulated clock: a server step per batch of arrivals.

C clients train at once (the concurrency), each on the model it downloaded.
A round of an asynchronous algorithm is one server step:

1. **arrivals**: the K in-flight clients that finish first arrive (their
   finish times: when they started plus `jaxfl.clock.profiles.client_durations`);
   the clock moves to the K-th arrival. Client j's staleness s_j is the number
   of server updates since the version it downloaded;
2. **replacements**: each arrival's slot takes a new client, drawn uniformly
   among those not in flight (Gumbel top-K, key `keys.sampling`); it starts
   when the slot freed, on the model as it is before this step's update (a
   client starting at the instant of an update takes the model before it),
   trains with key `fold_in(keys.clients, id)`, and its result waits in the
   slot, to arrive later. With online windows (`availability`), the slots
   are filled in the order they freed, each at the first time some client is
   online, with a client online then (not in flight, not drawn for an earlier
   slot); a client that goes offline before it finishes frees its slot then,
   without a result, and a slot that finds no client tries again at the next
   step;
3. **server rule**: the algorithm's update from the arrivals' results and
   staleness (FedBuff's buffered mean, FedAsync's mixing); the server
   version advances when at least one arrival carried a result.

The slots start empty, as arrivals at time 0 without a result, so the first
floor(C / K) steps only start clients (all at time 0 on the initial model;
where K does not divide C the next step fills the last slots beside its
first arrivals), then every step updates the model. Training a client when it starts and
keeping its result until it arrives is the same as training it when it
arrives from the version it downloaded, without keeping old models.

References:
  [Nguyen et al. 2022] J. Nguyen, K. Malik, H. Zhan, A. Yousefpour, M. Rabbat, M. Malek, D. Huba.
    Federated Learning with Buffered Asynchronous Aggregation. AISTATS 2022.
  [Xie et al. 2019] C. Xie, S. Koyejo, I. Gupta. Asynchronous Federated Optimization. arXiv:1903.03934
    (OPT 2020).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxfl.algorithms.base import (
    FederatedAlgorithm,
    ServerState,
    local_learning_rate,
    no_personal_models,
    resolve_hparams,
    server_optimizer,
)
from jaxfl.algorithms.stages import LOCAL_HPARAM_DEFAULTS
from jaxfl.clock.availability import Availability, next_online, online, online_until
from jaxfl.clock.profiles import DeviceProfiles, client_durations
from jaxfl.communication.traffic import model_bytes
from jaxfl.data.population import GatheredCohort
from jaxfl.training.cohort import round_keys, train_cohort
from jaxfl.training.local import LocalHParams, LocalTraining, Task
from jaxfl.training.strategies import ClientStrategy
from jaxfl.types import Key, Metrics, Params

STALENESS_FUNCTIONS = ("constant", "polynomial", "hinge")


class InFlight(NamedTuple):
    """The C training clients (`state.extra` of an asynchronous algorithm), one slot each.

    Attributes:
      results: what each slot's client will send (its update, or its local
        model: the algorithm's choice), leaves `[C, ...]`.
      client_ids: `[C]` int32.
      version: `[C]` int32, the server version each downloaded.
      finish: `[C]` float32, when each arrives.
      alpha: `[C]` its data weight.
      holds_result: `[C]` bool, False for a slot not yet started.
      server_version: [] int32, the server updates so far.
    """

    results: Params
    client_ids: jax.Array
    version: jax.Array
    finish: jax.Array
    alpha: jax.Array
    holds_result: jax.Array
    server_version: jax.Array


class Arrivals(NamedTuple):
    """The step's K arrivals: their results (leaves `[K, ...]`), data weights, staleness and whether each
    carries a result."""

    results: Params
    alpha: jax.Array
    staleness: jax.Array
    holds_result: jax.Array


# rule(state, arrivals) -> (params, opt_state, metrics)
ServerRule = Callable[[ServerState, Arrivals], tuple[Params, Any, Metrics]]


def _online_replacements(
    availability: Availability, free_at: jax.Array, busy: jax.Array, key: Key
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Each freed slot's new client, in the order the slots freed: `(ids [K], starts [K], started [K])`.

    Slot j starts at the first time >= its free time at which some client is
    online, with a client drawn uniformly (Gumbel argmax, draws `[K, N]`
    from `key`) among those online then, not in flight and not drawn for an
    earlier slot; where there is none it stays empty (`started` False, id 0).
    """
    gumbel = jax.random.gumbel(key, (free_at.shape[0], busy.shape[0]))

    def pick(taken, inputs):
        free, draws = inputs
        start = next_online(availability, free)
        scores = jnp.where(online(availability, start) & ~taken, draws, -jnp.inf)
        client = jnp.argmax(scores).astype(jnp.int32)
        started = jnp.isfinite(scores[client])
        return taken.at[client].set(taken[client] | started), (jnp.where(started, client, 0), start, started)

    _, (ids, starts, started) = jax.lax.scan(pick, busy, (free_at, gumbel))
    return ids, starts, started


def staleness_weight(kind: str, staleness: jax.Array, hparams: Mapping[str, jax.Array]) -> jax.Array:
    """s(staleness), the staleness functions of Xie et al. 2019 (FedBuff's 1 / sqrt(1 + s): polynomial).

    constant: 1; polynomial: (1 + s)^-a; hinge: 1 if s <= b else 1 / (a (s - b) + 1),
    a = hparams['staleness_exponent'], b = hparams['staleness_hinge'].
    """
    s = staleness.astype(jnp.float32)
    a = hparams["staleness_exponent"]
    if kind == "constant":
        return jnp.ones_like(s)
    if kind == "polynomial":
        return (1.0 + s) ** -a
    if kind == "hinge":
        b = hparams["staleness_hinge"]
        return jnp.where(s <= b, 1.0, 1.0 / (a * (s - b) + 1.0))
    raise ValueError(f"staleness must be one of {', '.join(STALENESS_FUNCTIONS)}, got {kind!r}")


class Fleet(NamedTuple):
    """The simulated clients of an asynchronous run: C of the N training at once, on their devices.

    Attributes:
      concurrency: C, the clients training at once (at most N).
      num_clients: N, the training clients.
      profiles: their devices (`jaxfl.clock.profiles`: their durations).
      availability: their online windows (`jaxfl.clock.availability`), or
        None: always online.
    """

    concurrency: int
    num_clients: int
    profiles: DeviceProfiles
    availability: Availability | None = None


def _check_static(arrivals_per_step: int, fleet: Fleet, keeps: str, client_weighting: str) -> None:
    if arrivals_per_step < 1:
        raise ValueError(f"the arrivals per step must be >= 1, got {arrivals_per_step}")
    if fleet.concurrency < arrivals_per_step:
        raise ValueError(
            f"the buffer of {arrivals_per_step} arrivals is larger than the concurrency {fleet.concurrency} "
            "(the clients training at once): it would never fill"
        )
    if fleet.concurrency > fleet.num_clients:
        raise ValueError(f"concurrency {fleet.concurrency} exceeds the {fleet.num_clients} training clients")
    if keeps not in ("update", "model"):
        raise ValueError(f"keeps must be 'update' or 'model', got {keeps!r}")
    if client_weighting not in ("num_examples", "uniform"):
        raise ValueError(f"client_weighting must be 'num_examples' or 'uniform', got {client_weighting!r}")


def _empty_slots(params: Params, concurrency: int) -> InFlight:
    """C slots not yet started: arrivals at time 0 without a result."""
    return InFlight(
        results=jax.tree.map(lambda leaf: jnp.zeros((concurrency, *leaf.shape), leaf.dtype), params),
        client_ids=jnp.full((concurrency,), -1, jnp.int32),
        version=jnp.zeros((concurrency,), jnp.int32),
        finish=jnp.zeros((concurrency,), jnp.float32),
        alpha=jnp.zeros((concurrency,), jnp.float32),
        holds_result=jnp.zeros((concurrency,), bool),
        server_version=jnp.zeros((), jnp.int32),
    )


def _step_metrics(
    starting_loss: jax.Array, arrivals: Arrivals, server_version: jax.Array, seconds: jax.Array
) -> Metrics:
    reporting = arrivals.holds_result
    reporting_staleness = jnp.where(reporting, arrivals.staleness, 0)
    return {
        "train_loss": jnp.mean(starting_loss),  # Of the clients starting now.
        "clients_uploading": jnp.sum(reporting).astype(jnp.int32),
        "clients_with_weight": jnp.sum(reporting).astype(jnp.int32),
        "mean_staleness": jnp.sum(reporting_staleness) / jnp.maximum(jnp.sum(reporting), 1),
        "max_staleness": jnp.max(reporting_staleness),
        "server_version": server_version,
        "step_seconds": seconds,
    }


def asynchronous_algorithm(
    name: str,
    task: Task,
    local: LocalTraining,
    arrivals_per_step: int,
    fleet: Fleet,
    rule: ServerRule,
    *,
    strategy: ClientStrategy,
    keeps: str = "update",
    proximal: str | None = None,
    hparam_defaults: Mapping[str, float] | None = None,
    server_tx=None,
    client_weighting: str = "num_examples",
) -> FederatedAlgorithm:
    """An asynchronous algorithm's init and server step (see the module docstring).

    Args:
      name: registry name.
      task, local: the model and local training.
      arrivals_per_step: K, the arrivals each server step processes.
      fleet: the C <= N clients training at once, their devices and windows.
      rule: the server's update from the arrivals.
      strategy: how the K new clients' training is laid out.
      keeps: what a slot keeps of its client: 'update' (local model minus
        the model it downloaded) or 'model' (the local model).
      proximal: the hyperparameter weighing a proximal term to the
        downloaded model in local training (FedAsync's rho), or None.
      hparam_defaults: the rule's numeric hyperparameters.
      server_tx: the server optimizer (for rules that use one).
      client_weighting: 'num_examples' or 'uniform' data weights.

    Raises:
      ValueError: K > C, C > N, or another invalid static setting (one line).
    """
    _check_static(arrivals_per_step, fleet, keeps, client_weighting)
    concurrency, num_clients, profiles, availability = fleet
    server = server_tx or server_optimizer("sgd", 1.0)
    defaults = {**LOCAL_HPARAM_DEFAULTS, **(hparam_defaults or {})}
    if proximal is not None:
        defaults.setdefault(proximal, 0.0)

    def init(params: Params, hparams: Mapping[str, float] | None = None) -> ServerState:
        return ServerState(
            round=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=server.init(params),
            hparams=resolve_hparams(defaults, hparams),
            extra=_empty_slots(params, concurrency),
            clock=jnp.zeros((), jnp.float32),
        )

    def round_fn(state: ServerState, population, key: Key) -> tuple[ServerState, Metrics]:
        if isinstance(population, GatheredCohort):
            raise ValueError(
                f"{name} draws its clients on the device; a host-resident population is not supported"
            )
        if population.num_clients != num_clients:
            raise ValueError(
                f"{name} was built for {num_clients} training clients, got {population.num_clients}"
            )
        keys = round_keys(key, state.round)
        slots: InFlight = state.extra
        with jax.named_scope("arrivals"):
            _, arrived = jax.lax.top_k(-slots.finish, arrivals_per_step)
            now = jnp.maximum(state.clock, jnp.max(slots.finish[arrived]))
            arrivals = Arrivals(
                jax.tree.map(lambda leaf: leaf[arrived], slots.results),
                slots.alpha[arrived],
                slots.server_version - slots.version[arrived],
                slots.holds_result[arrived],
            )
        with jax.named_scope("replacements"):
            busy = jnp.zeros(num_clients + 1, bool).at[slots.client_ids].set(True)
            busy = busy.at[slots.client_ids[arrived]].set(False)[:num_clients]  # Id -1 (empty) lands past N.
            free_at = slots.finish[arrived]
            if availability is None:
                scores = jnp.where(busy, -jnp.inf, jax.random.gumbel(keys.sampling, (num_clients,)))
                _, new_ids = jax.lax.top_k(scores, arrivals_per_step)
                new_ids = new_ids.astype(jnp.int32)
                started, starts = jnp.ones(arrivals_per_step, bool), free_at
            else:
                new_ids, starts, started = _online_replacements(availability, free_at, busy, keys.sampling)
            lr = local_learning_rate(state.hparams, state.round)
            results = train_cohort(
                task, local, strategy, state.params, population, new_ids, keys.clients,
                LocalHParams(lr=lr, l2=state.hparams["l2"],
                             prox_mu=None if proximal is None else state.hparams[proximal]),
                active=None if availability is None else started,
            )  # fmt: skip
            size = model_bytes(state.params)
            durations = client_durations(profiles, new_ids, results.num_steps, size, size)
            finish, completes = starts + durations, started
            if availability is not None:
                # A client that goes offline before it finishes frees its slot then, without a result; a slot
                # that found no client tries again at the next step.
                until = jax.vmap(lambda t, client: online_until(availability, t)[client])(starts, new_ids)
                offline_in = until - starts
                completes = started & (durations <= offline_in)
                finish = jnp.where(started, starts + jnp.minimum(durations, offline_in), now)
            kept = results.deltas
            if keeps == "model":
                kept = jax.tree.map(lambda delta, w: delta + w[None], results.deltas, state.params)
        with jax.named_scope("server"):
            params, opt_state, metrics = rule(state, arrivals)
            updated = jnp.any(arrivals.holds_result)
        new_slots = InFlight(
            results=jax.tree.map(lambda old, new: old.at[arrived].set(new), slots.results, kept),
            client_ids=slots.client_ids.at[arrived].set(jnp.where(started, new_ids, -1)),
            version=slots.version.at[arrived].set(slots.server_version),
            finish=slots.finish.at[arrived].set(finish),
            alpha=slots.alpha.at[arrived].set(population.cohort_weights(client_weighting, new_ids)),
            holds_result=slots.holds_result.at[arrived].set(completes),
            server_version=slots.server_version + updated.astype(jnp.int32),
        )
        metrics = {
            **_step_metrics(results.mean_batch_loss, arrivals, new_slots.server_version, now - state.clock),
            **metrics,
        }
        new_state = ServerState(
            round=state.round + 1,
            params=params,
            opt_state=opt_state,
            hparams=state.hparams,
            extra=new_slots,
            clock=now,
        )
        return new_state, metrics

    return FederatedAlgorithm(
        name=name,
        init=init,
        round=round_fn,
        hparam_defaults=defaults,
        personal_models=no_personal_models,
        model_sends=arrivals_per_step,  # The K clients each step starts.
    )
