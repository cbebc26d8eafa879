"""The round template every federated algorithm of jaxfl is built on.

`weighted_averaging_algorithm` builds a round that samples a cohort, plans,
trains every client locally, aggregates and takes a server optimizer step
(FedAvg is the template with no hooks: `jaxfl.algorithms.fedavg`). Every
algorithm of this package is this template with hooks that change what the
server decides around local training,

* `plan(cohort, state, key)`, before training: aggregation weights that are
  known already, which clients train (`active`: the others run no steps, so
  they cost nothing when clients run one at a time) and per-client epochs;
  it may read F_i(w_t) (`plan_uses_loss`, computed in a pass before
  training). Delta-FL, FedAvg-Sub and stragglers use it.
* `aggregate(results, cohort, plan, state, key)`, after training: turns the
  per-client updates into the server's update Delta (q-FFL, AFL).
* `reweight(results, alpha, state, key)`, after training: only the weights
  of step 3 (tilted ERM).

Robustness (`Robustness`, optional): the update attack of the run's
corrupted clients forges their rows of the cohort's updates right after
local training, for every algorithm (`jaxfl.attacks.attack_updates`, key
`fold_in(keys.server, ATTACK_STREAM)`); the aggregator
(`jaxfl.aggregators`) replaces the weighted mean of step 3 for the
algorithms that average weighted updates (those with no `aggregate` hook).

Keys: with `keys = round_keys(run_key, round)`, the cohort comes from
`keys.sampling`, client i's local training from `fold_in(keys.clients, i)`,
the plan's key is `split(keys.server)[0]` and the aggregation's (and
reweight's) `split(keys.server)[1]`. Algorithms derive their own choices
(stragglers, sub-cohorts, DP noise) from those, so tests can replay them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxfl.aggregators import Aggregator
from jaxfl.algorithms.base import (
    FederatedAlgorithm,
    ServerState,
    apply_server_update,
    local_learning_rate,
    resolve_hparams,
    server_optimizer,
    tree_norm,
)
from jaxfl.algorithms.plans import (
    cohort_losses,
)
from jaxfl.attacks import attack_updates
from jaxfl.data.population import ClientPopulation, GatheredCohort
from jaxfl.training.cohort import (
    CohortResults,
    StepFactory,
    client_rows,
    round_keys,
    select_cohort,
    train_cohort,
    weighted_mean,
)
from jaxfl.training.local import LocalHParams, LocalTraining, Task
from jaxfl.training.strategies import ClientStrategy
from jaxfl.types import Key, Metrics, Params, PyTree

# fold_in data of the attack's key (apart from the plan's and aggregation's).
ATTACK_STREAM = 0x41545441


class Robustness(NamedTuple):
    """Attacks and robust aggregation in the round (both optional).

    Attributes:
      aggregator: replaces the weighted mean of the updates (None: the mean).
      attack: an update attack of `jaxfl.attacks.UPDATE_ATTACKS`, or None
        (data attacks are applied to the population before the run).
      attack_options: the attack's options.
      attacked: `[N]` bool, the run's corrupted clients (chosen once per run),
        indexed by client id; needed with an attack.
    """

    aggregator: Aggregator | None = None
    attack: str | None = None
    attack_options: Mapping[str, Any] | None = None
    attacked: np.ndarray | None = None


# Local-training hyperparameters every algorithm of this family takes.
LOCAL_HPARAM_DEFAULTS = {
    "lr": 0.1,  # Local learning rate lr0.
    "lr_decay": 1.0,  # c of the step decay lr0 * c**floor(t / t0); 1 = constant.
    "lr_decay_period": 1e9,  # t0 (rounds).
    "l2": 0.0,  # lambda of (1 - lr*lambda) w - lr*grad.
}


class Cohort(NamedTuple):
    """The round's sampled clients as the server knows them.

    Attributes:
      client_ids: `[M]` int32.
      alpha: `[M]` data weights alpha_i (number of examples or 1).
      initial_loss: `[M]` F_i(w_t) on each client's full data, or None when
        the algorithm does not ask for it.
      initial_error: `[M]` misclassification of w_t on each client, or None.
    """

    client_ids: jax.Array
    alpha: jax.Array
    initial_loss: jax.Array | None = None
    initial_error: jax.Array | None = None


class ClientPlan(NamedTuple):
    """What the server decides before local training (all optional).

    Attributes:
      weights: `[M]` aggregation weights already known (normalized by the
        default aggregation), or None: alpha.
      active: `[M]` bool, the clients that train; the others run no local
        step and get zero weight in the default aggregation. None: all.
      num_epochs: `[M]` int32 local epochs per client (<= E), or None: E.
      extra: the new algorithm-specific state, or None: unchanged.
      metrics: extra round metrics, or None.
    """

    weights: jax.Array | None = None
    active: jax.Array | None = None
    num_epochs: jax.Array | None = None
    extra: PyTree = None
    metrics: Metrics | None = None


class Aggregation(NamedTuple):
    """The server's update from the cohort's results.

    Attributes:
      mean_delta: the update Delta fed to the server optimizer as -Delta.
      weights: `[M]` the effective weight of each client (its count of
        nonzero entries is the `clients_with_weight` metric).
      extra: the new algorithm-specific state.
      metrics: extra round metrics.
      aggregator_state: the aggregator's new state, or None: unchanged.
    """

    mean_delta: Params
    weights: jax.Array
    extra: PyTree
    metrics: Metrics
    aggregator_state: PyTree = None


# reweight(results, alpha, state, key) -> (weights [M], extra, metrics)
Reweight = Callable[
    [CohortResults, jax.Array, ServerState, Key], tuple[jax.Array, PyTree, Metrics]
]
# plan(cohort, state, key) -> ClientPlan
Plan = Callable[[Cohort, ServerState, Key], ClientPlan]
# aggregate(results, cohort, plan, state, key) -> Aggregation; `state.extra`
# is already the plan's.
Aggregate = Callable[[CohortResults, Cohort, ClientPlan, ServerState, Key], Aggregation]


def default_weights(cohort: Cohort, plan: ClientPlan) -> jax.Array:
    """The plan's weights (alpha if none), zero for clients that did not train."""
    weights = cohort.alpha if plan.weights is None else plan.weights
    if plan.active is not None:
        weights = jnp.where(plan.active, weights, 0.0)
    return weights


def weighted_averaging_algorithm(
    name: str,
    task: Task,
    local: LocalTraining | Callable[[ClientPopulation], LocalTraining],
    clients_per_round: int,
    *,
    strategy: ClientStrategy,
    server_tx: optax.GradientTransformation | None = None,
    client_weighting: str = "num_examples",
    reweight: Reweight | None = None,
    with_initial_loss: bool = False,
    plan: Plan | None = None,
    plan_uses_loss: bool = False,
    plan_selects_only: bool = False,
    aggregate: Aggregate | None = None,
    extra_hparam_defaults: Mapping[str, float] | None = None,
    init_extra: Callable[[Params], PyTree] = lambda params: (),
    proximal: bool = False,
    use_l2: bool = True,
    robustness: Robustness | None = None,
    local_step: StepFactory | None = None,
    local_step_reads_rows: bool = False,
) -> FederatedAlgorithm:
    """Builds a round that samples, plans, trains, aggregates, steps.

    Args:
      name: registry name.
      task: model and loss.
      local: static local-training shape, or a function of the training
        population giving it (FedSGD's full batch needs the largest client's
        size, a static property of the population).
      clients_per_round: M.
      strategy: how clients are laid out on the hardware.
      server_tx: server optimizer (default SGD with learning rate 1).
      client_weighting: 'num_examples' or 'uniform' data weights alpha_i.
      reweight: turns per-client results and alpha into aggregation weights
        (default: the plan's weights, else alpha, i.e. FedAvg).
      with_initial_loss: compute F_i(w_t) with local training (one pass);
        hooks find it in `cohort.initial_loss` (and `results.initial_loss`).
      plan: decides weights, active clients and epochs before training.
      plan_uses_loss: compute F_i(w_t) before training, for the plan.
      plan_selects_only: the plan only weights clients (its `active` is
        `weights > 0`, it sets no epochs), so the round may instead let every
        client compute F_i(w_t) and train in one pass and apply the plan
        after: the same aggregate. It does so where a second pass over the
        cohort costs more than the filtered-out clients' training: layouts
        sharded over several devices, where each pass meets the devices at
        collectives (see `single_pass_preferred`).
      aggregate: computes the server update from the results (default: the
        weighted mean of the updates with `reweight`'s or the plan's weights).
      extra_hparam_defaults: numeric hyperparameters of the algorithm.
      init_extra: initial algorithm-specific state.
      proximal: include FedProx's proximal term (hyperparameter 'mu').
      use_l2: include the l2 term in local steps (hyperparameter 'l2').
      robustness: the run's update attack and aggregator (see the module
        docstring), or None.
      local_step: replaces the local SGD step (`train_cohort`; Per-FedAvg's
        meta step), reading the state's hyperparameters.
      local_step_reads_rows: `local_step` also takes the client's row of the
        state's per-client state `clients` (mapper's global steps read the
        client's local model and mixing weight).

    Returns:
      The `FederatedAlgorithm`.

    Raises:
      ValueError: invalid static settings.
    """
    if clients_per_round < 1:
        raise ValueError(f"clients_per_round must be >= 1, got {clients_per_round}")
    if client_weighting not in ("num_examples", "uniform"):
        raise ValueError(
            f"client_weighting must be 'num_examples' or 'uniform', got {client_weighting!r}"
        )
    if reweight is not None and aggregate is not None:
        raise ValueError("give either reweight or aggregate, not both")
    if plan_uses_loss and plan is None:
        raise ValueError("plan_uses_loss needs a plan")
    robustness = robustness or Robustness()
    aggregator = robustness.aggregator
    if aggregator is not None and aggregator.name == "mean":
        aggregator = None  # The template's own weighted mean, bit for bit.
    if aggregator is not None and aggregate is not None:
        raise ValueError(
            f"{name} computes its own server update; aggregator {aggregator.name!r} applies to "
            "the algorithms that average weighted updates (fedavg, fedprox, fedavg-sub, fedsgd, "
            "term, deltafl, ditto)"
        )
    attacked = None
    if robustness.attack is not None:
        if robustness.attacked is None:
            raise ValueError("an attack needs the corrupted clients (Robustness.attacked)")
        attacked = np.asarray(robustness.attacked, bool)
    server_tx = server_tx or server_optimizer("sgd", 1.0)
    defaults = {**LOCAL_HPARAM_DEFAULTS, **(extra_hparam_defaults or {})}
    if proximal:
        defaults.setdefault("mu", 0.0)

    def init(params: Params, hparams: Mapping[str, float] | None = None) -> ServerState:
        return ServerState(
            round=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=server_tx.init(params),
            hparams=resolve_hparams(defaults, hparams),
            extra=init_extra(params),
            aggregator=aggregator.init(params) if aggregator is not None else (),
        )

    def default_aggregate(results, cohort, client_plan, state, key):
        if reweight is None:
            weights, extra, metrics = (
                default_weights(cohort, client_plan),
                state.extra,
                {},
            )
        else:
            weights, extra, metrics = reweight(results, cohort.alpha, state, key)
        if aggregator is None:
            return Aggregation(weighted_mean(results.deltas, weights), weights, extra, metrics)
        losses = results.mean_batch_loss if aggregator.uses_losses else None
        update, aggregator_state, aggregator_metrics = aggregator.aggregate(
            results.deltas, weights, state.aggregator, losses=losses
        )
        return Aggregation(
            update, weights, extra, {**metrics, **aggregator_metrics}, aggregator_state
        )

    def round_fn(
        state: ServerState, population: ClientPopulation | GatheredCohort, key: Key
    ) -> tuple[ServerState, Metrics]:
        if clients_per_round > population.num_clients:
            raise ValueError(
                f"clients_per_round={clients_per_round} exceeds the "
                f"{population.num_clients} training clients"
            )
        keys = round_keys(key, state.round)
        plan_key, aggregate_key = jax.random.split(keys.server)
        # Named scopes label each phase's kernels in profiles (benchmarks/round_profile.py).
        with jax.named_scope("select"):
            client_ids, data, slots = select_cohort(keys.sampling, population, clients_per_round)
            cohort = Cohort(client_ids, data.cohort_weights(client_weighting, slots))
        single_pass = plan_uses_loss and plan_selects_only and single_pass_preferred(strategy)
        with jax.named_scope("plan"):
            if plan_uses_loss and not single_pass:
                losses, errors = cohort_losses(task, strategy, state.params, data, slots)
                cohort = cohort._replace(initial_loss=losses, initial_error=errors)
            if plan is None:
                client_plan = ClientPlan()
            elif not single_pass:
                client_plan = plan(cohort, state, plan_key)
                if client_plan.extra is not None:
                    state = dataclasses.replace(state, extra=client_plan.extra)
        hparams = LocalHParams(
            lr=local_learning_rate(state.hparams, state.round),
            l2=state.hparams["l2"] if use_l2 else None,
            prox_mu=state.hparams["mu"] if proximal else None,
        )
        with jax.named_scope("client_update"):
            results = train_cohort(
                task,
                local(data) if callable(local) else local,
                strategy,
                state.params,
                data,
                client_ids,
                keys.clients,
                hparams,
                with_initial_loss=single_pass or (with_initial_loss and not plan_uses_loss),
                num_epochs=None if single_pass else client_plan.num_epochs,
                active=None if single_pass else client_plan.active,
                slots=slots,
                local_step=local_step,
                step_hparams=state.hparams if local_step is not None else None,
                step_rows=client_rows(state.clients, client_ids) if local_step_reads_rows else None,
            )
        if results.initial_loss is not None:
            cohort = cohort._replace(
                initial_loss=results.initial_loss, initial_error=results.initial_error
            )
        if single_pass:
            # Everyone trained; the plan's weights drop the filtered clients.
            client_plan = plan(cohort, state, plan_key)
            if client_plan.num_epochs is not None:
                raise ValueError(f"{name}: a plan that sets epochs cannot run after training")
            if client_plan.extra is not None:
                state = dataclasses.replace(state, extra=client_plan.extra)
        if attacked is not None:
            # The corrupted clients forge their updates; a client without
            # weight takes no part (and is left as it is).
            is_attacked = jnp.asarray(attacked)[client_ids]
            results = results._replace(
                deltas=attack_updates(
                    robustness.attack,
                    results.deltas,
                    is_attacked,
                    default_weights(cohort, client_plan),
                    jax.random.fold_in(keys.server, ATTACK_STREAM),
                    options=robustness.attack_options,
                )
            )
        with jax.named_scope("aggregate"):
            aggregation = (aggregate or default_aggregate)(
                results, cohort, client_plan, state, aggregate_key
            )
        with jax.named_scope("server"):
            params, opt_state = apply_server_update(
                server_tx, state, aggregation.mean_delta
            )
        trained = cohort.alpha
        if client_plan.active is not None:
            trained = jnp.where(client_plan.active, trained, 0.0)
        metrics = {
            # Mean minibatch loss of the clients that trained.
            "train_loss": jnp.sum(trained * results.mean_batch_loss)
            / jnp.maximum(jnp.sum(trained), jnp.finfo(jnp.float32).tiny),
            "update_norm": tree_norm(aggregation.mean_delta),
            "clients_with_weight": jnp.sum(aggregation.weights > 0).astype(jnp.int32),
            "local_steps": jnp.mean(results.num_steps.astype(jnp.float32)),
        }
        if cohort.initial_loss is not None:
            # F(w_t) over the cohort, alpha-weighted: what the plan saw.
            metrics["cohort_loss"] = jnp.sum(
                cohort.alpha * cohort.initial_loss
            ) / jnp.sum(cohort.alpha)
        metrics.update(client_plan.metrics or {})
        metrics.update(aggregation.metrics)
        new_state = ServerState(
            round=state.round + 1,
            params=params,
            opt_state=opt_state,
            hparams=state.hparams,
            extra=aggregation.extra,
            clients=state.clients,
            aggregator=(
                state.aggregator if aggregation.aggregator_state is None
                else aggregation.aggregator_state
            ),
        )
        return new_state, metrics

    return FederatedAlgorithm(
        name=name, init=init, round=round_fn, hparam_defaults=defaults
    )


def single_pass_preferred(strategy: ClientStrategy) -> bool:
    """Whether one fused loss-and-training pass beats two passes (see above)."""
    mesh = strategy.mesh
    return mesh is not None and mesh.size > 1
