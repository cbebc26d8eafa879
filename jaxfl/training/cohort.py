"""One round's cohort: sample it, train each client, collect per-client results.

The pieces every algorithm of the FedAvg family shares, so that algorithms
differ only in how they weight and combine client results.

References:
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxfl.data.population import ClientPopulation, GatheredCohort
from jaxfl.training.client_state import GatheredClientRows, host_rows
from jaxfl.training.fused import fused_layout, train_fused
from jaxfl.training.local import (
    LocalHParams,
    LocalStep,
    LocalTraining,
    Task,
    client_loss_and_error,
    client_loss_gradient,
    diagonal_fisher,
    local_sgd,
    minibatch_rows,
)

# CohortKeys and round_keys are also imported from here.
from jaxfl.training.sampling import CohortKeys, round_keys, sample_without_replacement  # noqa: F401
from jaxfl.training.strategies import ClientStrategy, map_clients
from jaxfl.types import Key, Params, PyTree

# local_step(hparams, step_hparams[, the client's row of per-client state]) -> a `local_sgd` step
# (`jaxfl.training.local.LocalStep`).
StepFactory = Callable[..., LocalStep]


class CohortResults(NamedTuple):
    """Per-client results of a cohort (leading axis M).

    Attributes:
      client_ids: `[M]` int32.
      deltas: the model updates w_i - w_t, each leaf `[M, ...]`.
      num_steps: `[M]` int32 real local steps.
      mean_batch_loss: `[M]` mean minibatch loss during local training.
      initial_loss: `[M]` F_i(w_t) on all the client's data before training,
        or None when not requested.
      initial_error: `[M]` misclassification of w_t on the client, or None.
      outputs: what the client update stage's `finalize` returns beside the
        clients' new rows (SCAFFOLD's control-variate updates), leading axis
        M, or None.
    """

    client_ids: jax.Array
    deltas: Params
    num_steps: jax.Array
    mean_batch_loss: jax.Array
    initial_loss: jax.Array | None
    initial_error: jax.Array | None
    outputs: PyTree = None


def train_cohort(
    task: Task,
    local: LocalTraining,
    strategy: ClientStrategy,
    params: Params,
    population: ClientPopulation,
    client_ids: jax.Array,
    clients_key: Key,
    hparams: LocalHParams,
    *,
    with_initial_loss: bool = False,
    num_epochs: jax.Array | None = None,
    active: jax.Array | None = None,
    slots: jax.Array | None = None,
    local_step: StepFactory | None = None,
    step_hparams: Mapping[str, jax.Array] | None = None,
    step_rows: Params | None = None,
    corrections: Params | None = None,
) -> CohortResults:
    """Runs local training on every client of the cohort.

    Args:
      task: the model and loss.
      local: the static shape of local training.
      strategy: how the cohort's clients are laid out on the hardware.
      params: the server model w_t.
      population: the training clients' examples.
      client_ids: `[M]` the cohort's global ids (they key each client's
        randomness).
      clients_key: base of the per-client keys.
      hparams: local step hyperparameters.
      with_initial_loss: also compute F_i(w_t) on each client's full data
        before training (Delta-FL, q-FFL, tilted ERM, AFL need it).
      num_epochs: optional `[M]` per-client epochs (stragglers).
      active: optional `[M]` bool; inactive clients run no steps.
      slots: `[M]` where each client's examples are in `population`
        (default: `client_ids`; a `GatheredCohort`'s clients sit at 0..M-1).
      local_step: replaces the local SGD step (Per-FedAvg's meta step):
        `local_step(hparams, step_hparams)` gives `local_sgd`'s `step`.
      step_hparams: traced scalars `local_step` reads (the state's hparams).
      step_rows: optional per-client state of the cohort (leaves `[M, ...]`):
        client i's row is `local_step`'s third argument (mapper's steps read
        the client's local model and mixing weight).
      corrections: optional per-client gradient corrections (leaves
        `[M, ...]`): client i adds row i to every step's gradient
        (`LocalHParams.correction`).

    Returns:
      The per-client results.
    """
    slots = client_ids if slots is None else slots
    per_client = client_inputs(client_ids, clients_key, slots=slots, active=active)
    if step_rows is not None:
        per_client["row"] = step_rows
    if corrections is not None:
        per_client["correction"] = corrections
    if num_epochs is not None:
        per_client["num_epochs"] = num_epochs
    fusable = local_step is None and corrections is None and _kernel_takes(hparams)
    layout = fused_layout(task, local, strategy, params, population) if fusable else None
    if layout is not None:
        return _train_cohort_fused(
            task, local, strategy, layout, params, population, client_ids, per_client, hparams,
            with_initial_loss,
        )

    def client_fn(shared, client):
        params, population, hparams, step_hparams = shared
        if "correction" in client:
            hparams = hparams._replace(correction=client["correction"])
        client_row = (client["row"],) if "row" in client else ()
        out = {}
        if with_initial_loss:
            # The client's tau-tilted risk where local training tilts its examples (hierarchical TERM).
            out["initial_loss"], out["initial_error"] = client_loss_and_error(
                task, params, population, client["id"], tilt=hparams.sample_tilt
            )
        result = local_sgd(
            task,
            params,
            population,
            client["id"],
            client["key"],
            hparams,
            local,
            num_epochs=client.get("num_epochs"),
            active=client["active"],
            step=None if local_step is None else local_step(hparams, step_hparams, *client_row),
        )
        out["delta"] = jax.tree.map(jnp.subtract, result.params, params)
        out["num_steps"] = result.num_steps
        out["mean_batch_loss"] = result.mean_batch_loss
        return out

    # Each client's work is about its number of local steps: layouts that
    # group clients use it to balance them.
    cost = local.num_steps(population.counts[slots], num_epochs)
    shared = (params, population, hparams, dict(step_hparams or {}))
    out = map_clients(client_fn, shared, per_client, strategy, cost=cost)
    return CohortResults(
        client_ids=client_ids,
        deltas=out["delta"],
        num_steps=out["num_steps"],
        mean_batch_loss=out["mean_batch_loss"],
        initial_loss=out.get("initial_loss"),
        initial_error=out.get("initial_error"),
    )


def _kernel_takes(hparams: LocalHParams) -> bool:
    """Whether the fused kernel's step has these terms (its proximal term is one scalar; no KL term, no
    correction, no preconditioner, no sample tilt, no per-example clipping)."""
    return (
        hparams.prox_weights is None and hparams.kl_mu is None and hparams.correction is None
        and hparams.preconditioner is None and hparams.sample_tilt is None and hparams.example_privacy is None
    )


def _train_cohort_fused(
    task, local, strategy, layout, params, population, client_ids, per_client, hparams, with_initial_loss
) -> CohortResults:
    """`train_cohort` with the local steps in one kernel (`jaxfl.training.fused`)."""
    trained, num_steps, mean_loss = train_fused(
        task,
        local,
        layout,
        params,
        params,
        population,
        per_client["id"],
        per_client["key"],
        hparams,
        num_epochs=per_client.get("num_epochs"),
        active=per_client["active"],
    )
    initial_loss = initial_error = None
    if with_initial_loss:

        def initial_fn(shared, client):
            return client_loss_and_error(task, shared[0], shared[1], client["id"])

        initial_loss, initial_error = map_clients(initial_fn, (params, population), per_client, strategy)
    return CohortResults(
        client_ids=client_ids,
        deltas=jax.tree.map(lambda client, server: client - server[None], trained, params),
        num_steps=num_steps,
        mean_batch_loss=mean_loss,
        initial_loss=initial_loss,
        initial_error=initial_error,
    )


class PersonalResults(NamedTuple):
    """Per-client results of personal training (leading axis M).

    Attributes:
      params: each client's personal model after training, leaves `[M, ...]`.
      num_steps: `[M]` int32 real local steps.
      mean_batch_loss: `[M]` mean minibatch loss of the personal model.
    """

    params: Params
    num_steps: jax.Array
    mean_batch_loss: jax.Array


def train_personal_models(
    task: Task,
    local: LocalTraining,
    strategy: ClientStrategy,
    anchor: Params,
    personal: Params,
    population: ClientPopulation,
    client_ids: jax.Array,
    clients_key: Key,
    hparams: LocalHParams,
    *,
    slots: jax.Array | None = None,
    prox_weights: Params | None = None,
) -> PersonalResults:
    """Trains each cohort client's personal model towards `anchor`.

    Client i runs `local_sgd` from its personal model v_i with the proximal
    term centered at `anchor` (w_t): v <- v - lr (grad F_i(v) + mu (v - w_t)),
    mu = `hparams.prox_mu`. Its key is `fold_in(clients_key, client_ids[i])`,
    the key of its global local training in `train_cohort`, so both visit the
    same minibatches in the same order: the personal and the global steps of
    Algorithm 7 of Li 2023 on the same minibatch, as the authors' code (they do not
    depend on each other within a round, so running them in two passes gives
    what interleaving them gives).

    Args:
      task: the model and loss.
      local: the static shape of local training (the global steps').
      strategy: how the cohort's clients are laid out on the hardware.
      anchor: w_t, the center of the proximal term.
      personal: the cohort's personal models, leaves `[M, ...]`.
      population: the training clients' examples.
      client_ids: `[M]` the cohort's global ids (they key each client).
      clients_key: base of the per-client keys (the round's `keys.clients`).
      hparams: learning rate, `prox_mu` = lambda, and l2 where given (Ditto
        gives none; L2SGD the run's).
      slots: `[M]` where each client's examples are in `population`.
      prox_weights: optional per-client weights of the proximal term,
        leaves `[M, ...]` (EWC's diagonal Fisher): mu F_i (v_i - w_i).

    Returns:
      The trained personal models and their step counts and losses.
    """
    slots = client_ids if slots is None else slots
    per_client = {**client_inputs(client_ids, clients_key, slots=slots), "start": personal}
    if prox_weights is not None:
        per_client["prox_weights"] = prox_weights
    fusable = prox_weights is None and _kernel_takes(hparams)
    layout = fused_layout(task, local, strategy, anchor, population) if fusable else None
    if layout is not None:
        trained, num_steps, mean_loss = train_fused(
            task, local, layout, personal, anchor, population, slots, per_client["key"], hparams
        )
        return PersonalResults(trained, num_steps, mean_loss)

    def client_fn(shared, client):
        anchor, population, hparams = shared
        if "prox_weights" in client:
            hparams = hparams._replace(prox_weights=client["prox_weights"])
        result = local_sgd(
            task,
            client["start"],
            population,
            client["id"],
            client["key"],
            hparams,
            local,
            active=client["active"],
            anchor=anchor,
        )
        return {"params": result.params, "num_steps": result.num_steps, "loss": result.mean_batch_loss}

    cost = local.num_steps(population.counts[slots])
    out = map_clients(client_fn, (anchor, population, hparams), per_client, strategy, cost=cost)
    return PersonalResults(out["params"], out["num_steps"], out["loss"])


def update_personal_models(
    task: Task,
    local: LocalTraining,
    strategy: ClientStrategy,
    anchor: Params,
    personal_models: Params,
    cohort: CohortData,
    clients_key: Key,
    hparams: LocalHParams,
) -> tuple[Params, PersonalResults]:
    """The cohort's rows of `personal_models` (leaves `[N, ...]`) trained and stored back.

    Gathers the cohort's personal models, runs `train_personal_models` toward
    `anchor` and scatters the results into their rows (the cohort's ids are
    distinct: sampling without replacement), inside the compiled round: the
    stateful clients of Ditto and L2SGD.

    Returns:
      (all N personal models, the cohort's `PersonalResults`).
    """
    personal = client_rows(personal_models, cohort.client_ids)
    trained = train_personal_models(
        task,
        local,
        strategy,
        anchor,
        personal,
        cohort.population,
        cohort.client_ids,
        clients_key,
        hparams,
        slots=cohort.slots,
    )
    return store_client_rows(personal_models, cohort.client_ids, trained.params), trained


def client_inputs(
    client_ids: jax.Array,
    clients_key: Key,
    *,
    slots: jax.Array | None = None,
    active: jax.Array | None = None,
) -> dict[str, jax.Array]:
    """A cohort's per-client inputs of `map_clients`: 'id' (its slot in the population: `slots`,
    default `client_ids`), 'key' (`fold_in(clients_key, client id)`) and 'active' (default all).
    """
    return {
        "id": client_ids if slots is None else slots,
        "key": jax.vmap(jax.random.fold_in, in_axes=(None, 0))(clients_key, client_ids),
        "active": jnp.ones(client_ids.shape[0], bool) if active is None else active,
    }


def train_client_rows(
    client_fn: Callable,
    shared,
    per_client_state: Params,
    cohort: CohortData,
    clients_key: Key,
    local: LocalTraining,
    strategy: ClientStrategy,
    *,
    active: jax.Array | None = None,
    extra: dict[str, jax.Array] | None = None,
) -> tuple[Params, dict[str, jax.Array]]:
    """Runs `client_fn(shared, client)` for the cohort on its rows of per-client state, and stores them back.

    `client` holds `client_inputs`, `extra` and 'start', the client's row
    of `per_client_state` (leaves `[R, ...]`); `client_fn` returns a dict
    whose 'params' is the client's new row. Gathered and scattered inside
    the compiled round (the stateful clients of Ditto's dynamic lambda and
    APFL).

    Returns:
      (the per-client state with the cohort's rows replaced, the other outputs, leading axis M).
    """
    per_client = {
        **client_inputs(cohort.client_ids, clients_key, slots=cohort.slots, active=active),
        **(extra or {}),
        "start": client_rows(per_client_state, cohort.client_ids),
    }
    cost = local.num_steps(cohort.population.counts[cohort.slots])
    out = map_clients(client_fn, shared, per_client, strategy, cost=cost)
    rows = out.pop("params")
    return store_client_rows(per_client_state, cohort.client_ids, rows), out


def cohort_gradients(task: Task, strategy: ClientStrategy, params: Params, cohort: CohortData) -> Params:
    """grad F_i(w) of each cohort client on all its data (`client_loss_gradient`), leaves `[M, ...]`."""

    def client_fn(shared, client):
        params, population = shared
        return client_loss_gradient(task, params, population, client["id"])

    per_client = {"id": cohort.slots, "active": jnp.ones(cohort.client_ids.shape[0], bool)}
    return map_clients(client_fn, (params, cohort.population), per_client, strategy)


def initial_client_models(params: Params, num_clients: int, strategy: ClientStrategy) -> Params:
    """One copy of `params` per training client: leaves `[R, ...]`, row k client k's.

    R = `strategy.client_state_rows(num_clients)`: N, or N rounded up to a
    multiple of the devices over which the rows are split (the rows past N
    are padding, never gathered).
    """
    if strategy.host_client_state:
        return host_rows(params, num_clients)
    rows = strategy.client_state_rows(num_clients)
    return jax.tree.map(lambda leaf: jnp.broadcast_to(leaf, (rows, *leaf.shape)).copy(), params)


def client_rows(per_client_state: Params | GatheredClientRows, client_ids: jax.Array) -> Params:
    """Rows `client_ids` of per-client state (leaves `[N, ...]`): the cohort's, leaves `[M, ...]`.

    Host-resident state arrives as the cohort's rows already gathered in the
    cohort's order (`jaxfl.training.client_state`), taken as they are.
    """
    if isinstance(per_client_state, GatheredClientRows):
        _check_gathered(per_client_state, client_ids)
        return per_client_state.rows
    return jax.tree.map(lambda rows: rows[client_ids], per_client_state)


def store_client_rows(
    per_client_state: Params | GatheredClientRows, client_ids: jax.Array, rows: Params
) -> Params | GatheredClientRows:
    """`per_client_state` with rows `client_ids` set to `rows` (distinct ids: sampled without replacement).

    Gathered host-resident rows are replaced whole, with the ids of the cohort
    that trained them (the host checks them against its own, then writes them back).
    """
    if isinstance(per_client_state, GatheredClientRows):
        _check_gathered(per_client_state, client_ids)
        return GatheredClientRows(rows, client_ids.astype(jnp.int32))
    return jax.tree.map(
        lambda state, new: state.at[client_ids].set(new, unique_indices=True), per_client_state, rows
    )


def _check_gathered(gathered: GatheredClientRows, client_ids: jax.Array) -> None:
    count = {leaf.shape[0] for leaf in jax.tree.leaves(gathered.rows)}
    if count != {client_ids.shape[0]}:
        raise ValueError(
            f"the gathered client rows hold {sorted(count)} clients, the cohort {client_ids.shape[0]}"
        )


def finetune_models(
    task: Task,
    local: LocalTraining,
    strategy: ClientStrategy,
    params: Params,
    population: ClientPopulation,
    key: Key,
    lr: jax.Array,
    *,
    ewc_lam: jax.Array | None = None,
    skl_lam: jax.Array | None = None,
) -> PersonalResults:
    """Every client's model fine-tuned from `params` (plain finetuning, EWC, SKL: Li 2023, Section 5.3.4).

    Client k runs `local` (its epochs: Li 2023 uses 50) of minibatch SGD
    with learning rate `lr` on all its examples, starting from the global
    model, with key `fold_in(key, k)`. A personalization baseline computed
    once after training; the models are evaluated like Ditto's.

    With `ewc_lam` (EWC, Li 2023, Appendix 5.6.2): client k minimizes
    F_k(w) + ewc_lam/2 sum_i F_ii (w_i - w*_i)^2, F its diagonal empirical
    Fisher at the global model w* on one minibatch (its first: the first
    batch of its first fine-tuning epoch; `diagonal_fisher`).

    With `skl_lam` (symmetrized KL, Li 2023, Appendix 5.6.2): client k minimizes
    F_k(w) + skl_lam/2 (KL(f(w) || f(w*)) + KL(f(w*) || f(w))), f the
    softmax output, each divergence the mean over the step's minibatch
    (`mean_symmetrized_kl`).

    Returns:
      Each client's fine-tuned model (leaves `[N, ...]`), steps and mean loss.
    """
    num_clients = population.num_clients
    client_ids = jnp.arange(num_clients, dtype=jnp.int32)
    start = jax.tree.map(lambda leaf: jnp.broadcast_to(leaf, (num_clients, *leaf.shape)), params)
    if ewc_lam is not None and skl_lam is not None:
        raise ValueError("fine-tune with one penalty: EWC's or the symmetrized KL, not both")
    hparams, fisher = LocalHParams(lr=lr, kl_mu=skl_lam), None
    if ewc_lam is not None:

        def client_fisher(shared, client):
            params, population = shared
            steps = local.num_steps(population.counts[client["id"]])
            rows = minibatch_rows(population, client["id"], client["key"], steps, local)[0]
            return diagonal_fisher(task, params, population, rows)

        fisher = map_clients(client_fisher, (params, population), client_inputs(client_ids, key), strategy)
        hparams = LocalHParams(lr=lr, prox_mu=ewc_lam)
    return train_personal_models(
        task, local, strategy, params, start, population, client_ids, key, hparams, prox_weights=fisher
    )


def sample_cohort(key: Key, population: ClientPopulation, clients_per_round: int):
    """`[M]` ids of the round's clients, uniformly without replacement."""
    return sample_without_replacement(key, population.num_clients, clients_per_round)


class CohortData(NamedTuple):
    """The round's clients and where their examples are.

    Attributes:
      client_ids: `[M]` int32 global ids (for keys, weights and state).
      population: the population holding their examples.
      slots: `[M]` int32 position of each client in `population`.
    """

    client_ids: jax.Array
    population: ClientPopulation
    slots: jax.Array


def select_cohort(
    key: Key, population: ClientPopulation | GatheredCohort, clients_per_round: int
) -> CohortData:
    """Samples the cohort, or takes the one gathered on the host for this round.

    A device-resident population is sampled with `sample_cohort(key, ...)`;
    a `GatheredCohort` already holds the clients the host drew with the same
    key (`jaxfl.training.host_cohorts.sampled_cohorts`) and their examples.
    """
    if isinstance(population, GatheredCohort):
        if population.client_ids.shape != (clients_per_round,):
            raise ValueError(
                f"the gathered cohort has {population.client_ids.shape[0]} clients, the round "
                f"samples {clients_per_round}"
            )
        slots = jnp.arange(clients_per_round, dtype=jnp.int32)
        return CohortData(population.client_ids, population.clients, slots)
    client_ids = sample_cohort(key, population, clients_per_round)
    return CohortData(client_ids, population, client_ids)


def weighted_mean(tree: Params, weights: jax.Array) -> Params:
    """sum_i weights_i tree_i / sum_i weights_i over the leading axis.

    Zero total weight (every client filtered out) gives zeros, i.e. no
    update, rather than NaN.
    """
    total = jnp.sum(weights)
    scale = jnp.where(total > 0, 1.0 / jnp.where(total > 0, total, 1.0), 0.0)
    return jax.tree.map(
        lambda x: jnp.tensordot(weights * scale, x, axes=(0, 0)).astype(x.dtype), tree
    )
