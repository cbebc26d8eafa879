"""A round as four stages: select, client_update, aggregate, server.

`compose_round(name, task, M, select=..., client_update=..., aggregate=...,
**options)` builds a `FederatedAlgorithm` whose round, with `keys = round_keys(key, state.round)`
and `plan_key, aggregate_key = split(keys.server)`, runs

1. **select** (`SelectStage`): samples the cohort (`keys.sampling`) and
   decides, before training, the aggregation weights already known, which
   clients train and their epochs (`plan(cohort, state, plan_key)`:
   stragglers, FedAvg-Sub, Delta-FL's tail). A plan that reads the cohort's
   losses F_i(w_t) says so (`reads_initial_loss`), and the round computes
   them before training;
2. **client_update** (`ClientUpdateStage`): local training of every cohort
   client from w_t with key `fold_in(keys.clients, client id)`: minibatch
   SGD with the terms the stage declares (l2, proximal, a per-client
   gradient correction, or a whole replacement step). A stage may own one
   **row of per-client state** per training client (`init_row`): the round
   gathers the cohort's rows, gives them to `correction` and `finalize`, and
   scatters `finalize`'s new rows back, on device, split over devices or in
   host memory alike (`jaxfl.training.cohort.client_rows`);
3. **aggregate** (`AggregateStage`): the server's update Delta from the
   cohort's results: by default the weighted mean of the updates (the run's
   aggregator, `jaxfl.aggregators`, in its place, and the run's update attack
   in front of it, key `fold_in(keys.server, ATTACK_STREAM)`), or the
   stage's own rule (q-FFL, AFL, FedNova, SCAFFOLD's control variates).
   With the run's update compression (`jaxfl.communication`), every client
   that reports sends its (possibly forged) update compressed, key
   `fold_in(keys.server, COMPRESSION_STREAM)`, and every rule reads the
   decoded updates (a DP rule clips them, so its sensitivity holds);
4. **server**: an optax transformation fed -Delta (`options['server_tx']`).

Each stage brings its own numeric hyperparameters and their defaults
(`hparam_defaults`, traced scalars in `state.hparams`, so sweeps vmap over
them) and at most one of select and aggregate keeps algorithm state
(`init`, in `state.extra`). How the round runs on the hardware (the client
strategy, the fused kernel, host residency, one pass or two) is the
`strategy`'s, never a stage's: with the server optimizer, the client
weighting and the run's robustness it is one of the `RoundOptions` every
algorithm factory passes through unchanged.

References:
  [Karimireddy et al. 2020] SCAFFOLD: Stochastic Controlled Averaging for Federated Learning. ICML 2020.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypedDict, Unpack

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
    no_personal_models,
    own_models,
    resolve_hparams,
    server_optimizer,
    tree_norm,
)
from jaxfl.algorithms.plans import cohort_losses
from jaxfl.attacks import attack_updates
from jaxfl.clock.reporting import Clock, reports, select_online
from jaxfl.communication.compression import UpdateCompression, compress_updates, initial_residuals
from jaxfl.communication.traffic import model_bytes, update_bytes
from jaxfl.data.population import ClientPopulation, GatheredCohort
from jaxfl.training.cohort import (
    CohortData,
    CohortResults,
    StepFactory,
    client_rows,
    initial_client_models,
    round_keys,
    select_cohort,
    store_client_rows,
    train_cohort,
    weighted_mean,
)
from jaxfl.training.local import ExamplePrivacy, LocalHParams, LocalTraining, Task
from jaxfl.training.strategies import ClientStrategy
from jaxfl.types import Key, Metrics, Params, PyTree
from jaxfl.validation import check_keywords

# fold_in data of the attack's key (apart from the plan's and aggregation's).
ATTACK_STREAM = 0x41545441
# fold_in data of the update compression's key.
COMPRESSION_STREAM = 0x434F4D50

# Local-training hyperparameters every algorithm takes.
LOCAL_HPARAM_DEFAULTS = {
    "lr": 0.1,  # Local learning rate lr0.
    "lr_decay": 1.0,  # c of the step decay lr0 * c**floor(t / t0); 1 = constant.
    "lr_decay_period": 1e9,  # t0 (rounds).
    "l2": 0.0,  # lambda of (1 - lr*lambda) w - lr*grad.
}


class Robustness(NamedTuple):
    """Attacks and robust aggregation in the round (both optional): the run's, not an algorithm's.

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
      num_epochs: `[M]` int32 local epochs per client (at most the local
        training's `num_epochs`), or None: that number.
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


# plan(cohort, state, key) -> ClientPlan
Plan = Callable[[Cohort, ServerState, Key], ClientPlan]
# reweight(results, alpha, state, key) -> (weights [M], extra, metrics)
Reweight = Callable[[CohortResults, jax.Array, ServerState, Key], tuple[jax.Array, PyTree, Metrics]]
# aggregate(results, cohort, plan, state, key) -> Aggregation; `state.extra` is already the plan's.
Aggregate = Callable[[CohortResults, Cohort, ClientPlan, ServerState, Key], Aggregation]
# correction(state, rows, cohort, cohort data) -> per-client gradient corrections, leaves [M, ...].
Correction = Callable[[ServerState, PyTree, "Cohort", CohortData], Params]
# finalize(state, rows, results, lr, cohort data) -> (the cohort's new rows, per-client outputs).
Finalize = Callable[[ServerState, PyTree, CohortResults, jax.Array, CohortData], tuple[PyTree, PyTree]]
# update(state, cohort data, clients key, lr, round population, active) -> (all rows, metrics).
PersonalUpdate = Callable[
    [ServerState, CohortData, Key, jax.Array, Any, "jax.Array | None"], tuple[PyTree, Metrics]
]
# init_row(params, hparams) -> one client's initial row.
InitRow = Callable[[Params, Mapping[str, jax.Array]], PyTree]
# update_state(results, cohort, state) -> the aggregate stage's new state (`state.extra`).
UpdateState = Callable[[CohortResults, Cohort, ServerState], PyTree]


def _no_state(params: Params) -> PyTree:
    del params  # Unused.
    return ()


class SelectStage(NamedTuple):
    """select: the cohort and what the server decides before training.

    Attributes:
      plan: `(cohort, state, key) -> ClientPlan`, or None: every sampled
        client trains E epochs with weight alpha.
      reads_initial_loss: the plan reads F_i(w_t) (`cohort.initial_loss`),
        computed in a pass before training.
      weights_only: the plan only weights clients (its `active` is `weights >
        0`, it sets no epochs), so the round may let every client compute
        F_i(w_t) and train in one pass and apply the plan after: the same
        aggregate. It does where a second pass costs more than the filtered
        clients' training (`single_pass_preferred`).
      hparam_defaults: the stage's numeric hyperparameters.
      init: `params -> ` its initial state (`state.extra`), or () for none.
    """

    plan: Plan | None = None
    reads_initial_loss: bool = False
    weights_only: bool = False
    hparam_defaults: Mapping[str, float] = {}
    init: Callable[[Params], PyTree] = _no_state


class ClientUpdateStage(NamedTuple):
    """client_update: each cohort client's local training, and its per-client state.

    Attributes:
      local: static local-training shape, or a function of the training
        population giving it (FedSGD's full batch).
      l2: the step's l2 term (hyperparameter 'l2').
      proximal: the hyperparameter weighing a proximal term mu/2 ||w -
        w_t||^2 ('mu': FedProx's; FedDyn's alpha), or None: no such term.
      reports_initial_loss: also compute F_i(w_t) in the training pass
        (`results.initial_loss`, `cohort.initial_loss`: q-FFL, TERM, AFL).
      step: replaces the SGD step (`local_step(hparams, state hparams[,
        row])`: Per-FedAvg's meta step), or None.
      step_reads_rows: `step` also takes the client's row (mapper).
      init_row: `(params, hparams) -> ` one client's initial row of
        per-client state (SCAFFOLD's c_i = 0), or None: no rows.
      correction: `(state, rows, cohort, cohort data) -> ` per-client
        gradient corrections added to every local step
        (`LocalHParams.correction`: SCAFFOLD's c - c_i, FedDane's global
        minus local gradient), or None.
      sample_tilt: the hyperparameter tilting each client's examples (tau of
        hierarchical TERM: local steps on the minibatch's tau-tilted risk, and
        F_i(w_t) the client's tau-tilted risk; `LocalHParams.sample_tilt`), or
        None: means.
      preconditioner: `state -> ` a tree like the parameters dividing every
        local gradient coordinate by coordinate (`LocalHParams.
        preconditioner`: AdaDPS's side information, DP^2's delayed second
        moment), computed from the server's state alone, or None.
      example_privacy: the hyperparameters (C, z) of DP-SGD's per-example
        clipping and noise in every local step (`LocalHParams.
        example_privacy`: example-level DP, `jaxfl.algorithms.dp_sgd_fedavg`),
        or None.
      finalize: `(state, rows, results, lr, cohort data) -> (new rows,
        outputs)` after training (`cohort data`: the cohort's ids, the
        population holding their examples and their slots in it,
        `jaxfl.training.cohort.CohortData`); the new rows are stored back
        and `outputs` reach the aggregate stage as `results.outputs`. None:
        rows unchanged.
      side_messages: model-sized vectors each reporting client receives and
        sends besides the model and its update (SCAFFOLD's control variates,
        FedDane's gradients: 1), counted uncompressed in the run's bytes
        (`jaxfl.communication.traffic`).
      hparam_defaults: the stage's numeric hyperparameters.
    """

    local: LocalTraining | Callable[[ClientPopulation], LocalTraining]
    l2: bool = True
    proximal: str | None = None
    reports_initial_loss: bool = False
    step: StepFactory | None = None
    step_reads_rows: bool = False
    init_row: InitRow | None = None
    correction: Correction | None = None
    sample_tilt: str | None = None
    preconditioner: Callable[[ServerState], Params] | None = None
    example_privacy: tuple[str, str] | None = None
    finalize: Finalize | None = None
    side_messages: int = 0
    hparam_defaults: Mapping[str, float] = {}


class AggregateStage(NamedTuple):
    """aggregate: the server's update Delta from the cohort's results.

    Attributes:
      aggregate: `(results, cohort, plan, state, key) -> Aggregation`, the
        algorithm's own rule (then the run's aggregator does not apply), or
        None: the weighted mean (or the run's aggregator) of the updates.
      reweight: `(results, alpha, state, key) -> (weights, extra, metrics)`,
        the default rule's weights from the results (TERM), or None: the
        plan's weights, else alpha.
      update_state: `(results, cohort, state) -> ` the stage's new state
        beside the default rule's update (SCAFFOLD's server control
        variate), or None: unchanged.
      hparam_defaults: the stage's numeric hyperparameters.
      init: `params -> ` its initial state (`state.extra`), or () for none.
    """

    aggregate: Aggregate | None = None
    reweight: Reweight | None = None
    update_state: UpdateState | None = None
    hparam_defaults: Mapping[str, float] = {}
    init: Callable[[Params], PyTree] = _no_state


class PersonalStage(NamedTuple):
    """personal: a second update of the round's own cohort, training each client's own model.

    Personalization next to a global algorithm (Ditto, APFL, mapper): the
    composed round runs `update` on the cohort it sampled, after the plan and
    before the global local training, with the keys of the clients' global
    training, so nothing outside the round redraws its cohort. The global
    local training then reads the updated rows (mapper's steps do).

    Attributes:
      update: `(state, cohort data, clients key, lr, population, active) ->
        (rows, metrics)`: the per-client rows (`state.clients`, all of them,
        the cohort's updated) and metrics; `population` is the round's input
        (for its `held_out` validation examples) and `active` the plan's
        `[M]` clients that train (None: all).
      init_row: `(params, hparams) -> ` one client's initial row.
      hparam_defaults: the stage's numeric hyperparameters.
    """

    update: PersonalUpdate
    init_row: InitRow
    hparam_defaults: Mapping[str, float] = {}


class RoundOptions(TypedDict, total=False):
    """How a run lays out and adds to any algorithm's round (every factory passes them through).

    Attributes:
      strategy: how clients are laid out on the hardware (required).
      robustness: the run's update attack and aggregator, or None.
      server_tx: the server optimizer (default: SGD with learning rate 1).
      client_weighting: 'num_examples' (default) or 'uniform' data weights
        alpha_i of the cohort.
      compression: how the reporting clients compress their updates, or None.
      clock: the simulated clock (availability, devices, over-selection and
        the report deadline; `jaxfl.clock.reporting`), or None: every sampled
        client reports, and rounds take no time.
    """

    strategy: ClientStrategy
    robustness: Robustness | None
    server_tx: optax.GradientTransformation | None
    client_weighting: str
    compression: UpdateCompression | None
    clock: Clock | None


class Composition(NamedTuple):
    """What `compose_round` built an algorithm from (`FederatedAlgorithm.composition`), so that
    another algorithm can be built on its stages (Ditto on any global algorithm)."""

    name: str
    task: Task
    clients_per_round: int
    select: SelectStage
    client_update: ClientUpdateStage
    aggregate: AggregateStage
    num_clients: int | None
    rows_are_models: bool
    personal: PersonalStage | None
    options: RoundOptions

    @property
    def strategy(self) -> ClientStrategy:
        """How the round lays out its clients (`options['strategy']`)."""
        return self.options["strategy"]

    def rebuilt(self, **changes) -> FederatedAlgorithm:
        """`compose_round` of these stages with `changes` (Ditto adds a personal stage)."""
        fields = {**self._asdict(), **changes}
        return compose_round(**{k: v for k, v in fields.items() if k != "options"}, **fields["options"])


def uniform_weights(name: str, options: RoundOptions) -> RoundOptions:
    """`options` with uniform client weights, for algorithms defined with them (AFL's mixture, DP's sums).

    Raises:
      ValueError: the options ask for another weighting.
    """
    weighting = options.get("client_weighting", "uniform")
    if weighting != "uniform":
        raise ValueError(f"{name} weighs clients uniformly; client_weighting={weighting!r} does not apply")
    return {**options, "client_weighting": "uniform"}


def zeros_row(params: Params, hparams: Mapping[str, jax.Array] | None = None) -> Params:
    """A row of zeros shaped like the model: the usual `init_row` of control variates."""
    del hparams  # Unused.
    return jax.tree.map(jnp.zeros_like, params)


def default_weights(cohort: Cohort, plan: ClientPlan) -> jax.Array:
    """The plan's weights (alpha if none), zero for clients that did not train."""
    weights = cohort.alpha if plan.weights is None else plan.weights
    if plan.active is not None:
        weights = jnp.where(plan.active, weights, 0.0)
    return weights


def compose_round(
    name: str,
    task: Task,
    clients_per_round: int,
    *,
    client_update: ClientUpdateStage,
    select: SelectStage = SelectStage(),
    aggregate: AggregateStage = AggregateStage(),
    num_clients: int | None = None,
    rows_are_models: bool = False,
    personal: PersonalStage | None = None,
    **options: Unpack[RoundOptions],
) -> FederatedAlgorithm:
    """The `FederatedAlgorithm` whose round runs the four stages (see the module docstring).

    Args:
      name: registry name.
      task: model and loss.
      clients_per_round: M.
      client_update, select, aggregate: the stages (by default, uniform
        sampling without a plan, and the weighted mean of the updates).
      num_clients: N, needed where `client_update` keeps per-client rows.
      rows_are_models: the per-client rows are the clients' own models,
        evaluated and saved as personal models; False: they are other state
        (SCAFFOLD's c_i), and the algorithm has no personal models.
      personal: a personal stage training per-client models on the round's
        cohort (Ditto), or None.
      **options: the run's `RoundOptions`: strategy, robustness, server
        optimizer, client weighting.

    Raises:
      ValueError: invalid static settings, or stages that cannot go together.
    """
    check_keywords("compose_round", options, RoundOptions.__annotations__)
    if "strategy" not in options:
        raise TypeError("compose_round needs the client strategy (strategy=...)")
    composition = Composition(
        name, task, clients_per_round, select, client_update, aggregate, num_clients, rows_are_models,
        personal, dict(options),
    )  # fmt: skip
    composed = _ComposedRound(composition)
    return FederatedAlgorithm(
        name=name,
        init=composed.init,
        round=composed.round,
        hparam_defaults=composed.hparam_defaults,
        personal_models=own_models if rows_are_models else no_personal_models,
        composition=composition,
    )


class _ComposedRound:
    """`compose_round`'s init and round, one method per phase; every setting is checked once, here."""

    def __init__(self, composition: Composition):
        self.composition = c = composition
        options = c.options
        self.strategy = options["strategy"]
        self.client_weighting = options.get("client_weighting", "num_examples")
        self.server = options.get("server_tx") or server_optimizer("sgd", 1.0)
        self.robustness = options.get("robustness") or Robustness()
        self.aggregator = self.robustness.aggregator
        if self.aggregator is not None and self.aggregator.name == "mean":
            self.aggregator = None  # The round's own weighted mean, bit for bit.
        self.compression = options.get("compression")
        self.clock = options.get("clock")
        self.cohort_size = c.clients_per_round
        if self.clock is not None:
            self.cohort_size = self.clock.selected(c.clients_per_round)
        self.attacked = None
        if self.robustness.attack is not None:
            if self.robustness.attacked is None:
                raise ValueError("an attack needs the corrupted clients (Robustness.attacked)")
            self.attacked = np.asarray(self.robustness.attacked, bool)
        self._check()
        self.init_row = c.client_update.init_row if c.personal is None else c.personal.init_row
        self.rows_used = c.client_update.init_row is not None or c.client_update.step_reads_rows
        self.init_extra = c.aggregate.init if c.select.init is _no_state else c.select.init
        self.aggregate_fn = c.aggregate.aggregate or self._default_aggregate
        self.hparam_defaults = {
            **LOCAL_HPARAM_DEFAULTS,
            **c.select.hparam_defaults,
            **c.client_update.hparam_defaults,
            **c.aggregate.hparam_defaults,
            **(c.personal.hparam_defaults if c.personal is not None else {}),
        }
        if c.client_update.proximal is not None:
            self.hparam_defaults.setdefault(c.client_update.proximal, 0.0)

    def _check(self) -> None:
        c = self.composition
        if c.clients_per_round < 1:
            raise ValueError(f"clients_per_round must be >= 1, got {c.clients_per_round}")
        if self.client_weighting not in ("num_examples", "uniform"):
            raise ValueError(
                f"client_weighting must be 'num_examples' or 'uniform', got {self.client_weighting!r}"
            )
        own_rule = c.aggregate.aggregate is not None
        if own_rule and (c.aggregate.reweight or c.aggregate.update_state) is not None:
            raise ValueError("an aggregate stage's own rule takes no reweight or update_state")
        if c.select.reads_initial_loss and c.select.plan is None:
            raise ValueError("reads_initial_loss needs a plan")
        if c.select.init is not _no_state and c.aggregate.init is not _no_state:
            raise ValueError("one stage keeps the algorithm's state: select's or aggregate's, not both")
        if c.client_update.init_row is not None and c.personal is not None:
            raise ValueError(
                f"{c.name}: the client update and the personal stage would both keep the client rows"
            )
        keeps_rows = c.client_update.init_row is not None or c.personal is not None
        if keeps_rows and c.num_clients is None:
            raise ValueError(f"{c.name} keeps a row per client: give num_clients")
        if self.aggregator is not None and c.aggregate.aggregate is not None:
            raise ValueError(
                f"{c.name} computes its own server update; aggregator {self.aggregator.name!r} applies to "
                "the algorithms that average weighted updates (fedavg, fedprox, fedavg-sub, fedsgd, "
                "term, deltafl, ditto)"
            )
        if self.clock is not None:
            reads_everyone = [
                what for what, present in (
                    ("its own aggregation rule", c.aggregate.aggregate is not None),
                    ("its server state's update", c.aggregate.update_state is not None),
                    ("per-client rows", c.client_update.init_row is not None),
                    ("a personal stage", c.personal is not None),
                ) if present
            ]  # fmt: skip
            if reads_everyone:
                raise ValueError(
                    f"{c.name} has {reads_everyone[0]}, which reads every selected client's training; "
                    "the clock drops clients after they trained (fedavg, fedprox, fedavg-sub, fedsgd, term, "
                    "deltafl, feddane and perfedavg run on it)"
                )
        if self.compression is not None and self.compression.error_feedback:
            if self.strategy.host_client_state:
                raise ValueError(
                    "error feedback keeps its residual rows on the devices; host-resident client state "
                    "(--client-state host) does not hold them"
                )

    def init(self, params: Params, hparams: Mapping[str, float] | None = None) -> ServerState:
        hparams = resolve_hparams(self.hparam_defaults, hparams)
        clients = residuals = ()
        if self.init_row is not None:
            row = self.init_row(params, hparams)
            clients = initial_client_models(row, self.composition.num_clients, self.strategy)
        if self.compression is not None and self.compression.error_feedback:
            row = initial_residuals(params)
            residuals = initial_client_models(row, self.compression.num_clients, self.strategy)
        return ServerState(
            round=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=self.server.init(params),
            hparams=hparams,
            extra=self.init_extra(params),
            clients=clients,
            aggregator=self.aggregator.init(params) if self.aggregator is not None else (),
            error_feedback=residuals,
            clock=jnp.zeros((), jnp.float32) if self.clock is not None else (),
        )

    def round(
        self, state: ServerState, population: ClientPopulation | GatheredCohort, key: Key
    ) -> tuple[ServerState, Metrics]:
        c = self.composition
        self._check_population(population)
        keys = round_keys(key, state.round)
        plan_key, aggregate_key = jax.random.split(keys.server)
        # Named scopes label each phase's kernels in profiles (benchmarks/round_profile.py).
        with jax.named_scope("select"):
            selection = None
            if self.clock is None:
                cohort_data = select_cohort(keys.sampling, population, c.clients_per_round)
            else:
                if isinstance(population, GatheredCohort):
                    raise ValueError(
                        "the clock selects among the clients online in the round, on the device; a "
                        "host-resident population's cohorts are drawn ahead of it"
                    )
                selection = select_online(
                    self.clock, state.clock, keys.sampling, population.num_clients, self.cohort_size
                )
                cohort_data = CohortData(selection.client_ids, population, selection.client_ids)
            cohort = Cohort(
                cohort_data.client_ids,
                cohort_data.population.cohort_weights(self.client_weighting, cohort_data.slots),
            )
            if selection is not None:
                # Offline entries padding the clock's cohort weigh nothing in any plan or rule.
                cohort = cohort._replace(alpha=jnp.where(selection.selected, cohort.alpha, 0.0))
        single_pass = (
            c.select.reads_initial_loss and c.select.weights_only and single_pass_preferred(self.strategy)
        )
        with jax.named_scope("plan"):
            cohort, client_plan, state = self._plan(state, cohort, cohort_data, plan_key, single_pass)
            if selection is not None:
                client_plan = _only(client_plan, selection.selected)
        with jax.named_scope("client_update"):
            results, clients, personal_metrics = self._update_clients(
                state, cohort, cohort_data, client_plan, keys.clients, population, single_pass
            )
        if results.initial_loss is not None:
            cohort = cohort._replace(initial_loss=results.initial_loss, initial_error=results.initial_error)
        if single_pass:
            # Everyone trained; the plan's weights drop the filtered clients.
            client_plan = c.select.plan(cohort, state, plan_key)
            if client_plan.num_epochs is not None:
                raise ValueError(f"{c.name}: a plan that sets epochs cannot run after training")
            if client_plan.extra is not None:
                state = dataclasses.replace(state, extra=client_plan.extra)
            if selection is not None:
                client_plan = _only(client_plan, selection.selected)
        clock = state.clock
        if selection is not None:
            with jax.named_scope("clock"):
                client_plan, clock = self._reports(state, cohort, selection, client_plan, results)
        if self.attacked is not None:
            results = self._attack(results, cohort, client_plan, keys.server)
        residuals = state.error_feedback
        if self.compression is not None:
            with jax.named_scope("compress"):
                results, residuals = self._compress(results, cohort, client_plan, residuals, keys.server)
        with jax.named_scope("aggregate"):
            aggregation = self.aggregate_fn(results, cohort, client_plan, state, aggregate_key)
        with jax.named_scope("server"):
            params, opt_state = apply_server_update(self.server, state, aggregation.mean_delta)
        metrics = {**round_metrics(cohort, client_plan, results, aggregation), **personal_metrics}
        new_state = ServerState(
            round=state.round + 1,
            params=params,
            opt_state=opt_state,
            hparams=state.hparams,
            extra=aggregation.extra,
            clients=clients,
            aggregator=(
                state.aggregator if aggregation.aggregator_state is None else aggregation.aggregator_state
            ),
            error_feedback=residuals,
            clock=clock,
        )
        return new_state, metrics

    def _check_population(self, population) -> None:
        c = self.composition
        if c.num_clients is not None and population.num_clients != c.num_clients:
            raise ValueError(
                f"{c.name} was built for {c.num_clients} training clients, got a population of "
                f"{population.num_clients}"
            )
        if c.clients_per_round > population.num_clients:
            raise ValueError(
                f"clients_per_round={c.clients_per_round} exceeds the "
                f"{population.num_clients} training clients"
            )

    def _plan(self, state, cohort, cohort_data, plan_key, single_pass):
        """The cohort's losses where the plan reads them, and the plan: (cohort, plan, state)."""
        select = self.composition.select
        if select.reads_initial_loss and not single_pass:
            losses, errors = cohort_losses(
                self.composition.task, self.strategy, state.params, cohort_data.population, cohort_data.slots
            )
            cohort = cohort._replace(initial_loss=losses, initial_error=errors)
        client_plan = ClientPlan()
        if select.plan is not None and not single_pass:
            client_plan = select.plan(cohort, state, plan_key)
            if client_plan.extra is not None:
                state = dataclasses.replace(state, extra=client_plan.extra)
        return cohort, client_plan, state

    def _update_clients(self, state, cohort, cohort_data, client_plan, clients_key, population, single_pass):
        """The personal stage, local training and the rows' update: (results, rows, personal metrics)."""
        c = self.composition
        update = c.client_update
        client_ids, data, slots = cohort_data
        lr = local_learning_rate(state.hparams, state.round)
        hparams = LocalHParams(
            lr=lr,
            l2=state.hparams["l2"] if update.l2 else None,
            prox_mu=None if update.proximal is None else state.hparams[update.proximal],
            preconditioner=None if update.preconditioner is None else update.preconditioner(state),
            sample_tilt=None if update.sample_tilt is None else state.hparams[update.sample_tilt],
            example_privacy=None if update.example_privacy is None else ExamplePrivacy(
                *(state.hparams[name] for name in update.example_privacy)
            ),
        )
        clients, personal_metrics = state.clients, {}
        if c.personal is not None:
            active = None if single_pass else client_plan.active
            clients, personal_metrics = c.personal.update(
                state, cohort_data, clients_key, lr, population, active
            )
        rows = client_rows(clients, client_ids) if self.rows_used else None
        corrections = None
        if update.correction is not None:
            corrections = update.correction(state, rows, cohort, cohort_data)
        results = train_cohort(
            c.task,
            update.local(data) if callable(update.local) else update.local,
            self.strategy,
            state.params,
            data,
            client_ids,
            clients_key,
            hparams,
            with_initial_loss=(
                single_pass or (update.reports_initial_loss and not c.select.reads_initial_loss)
            ),
            num_epochs=None if single_pass else client_plan.num_epochs,
            active=None if single_pass else client_plan.active,
            slots=slots,
            local_step=update.step,
            step_hparams=state.hparams if update.step is not None else None,
            step_rows=rows if update.step_reads_rows else None,
            corrections=corrections,
        )
        if update.finalize is not None:
            new_rows, outputs = update.finalize(state, rows, results, lr, cohort_data)
            results = results._replace(outputs=outputs)
            clients = store_client_rows(clients, client_ids, new_rows)
        return results, clients, personal_metrics

    def _attack(self, results, cohort, client_plan, server_key):
        """The corrupted clients forge their updates; a client without weight takes no part (and is left as
        it is)."""
        is_attacked = jnp.asarray(self.attacked)[cohort.client_ids]
        deltas = attack_updates(
            self.robustness.attack,
            results.deltas,
            is_attacked,
            default_weights(cohort, client_plan),
            jax.random.fold_in(server_key, ATTACK_STREAM),
            options=self.robustness.attack_options,
        )
        return results._replace(deltas=deltas)

    def _reports(self, state, cohort, selection, client_plan, results):
        """The plan keeping only the clients that report by the deadline, and the time the round ends."""
        size = model_bytes(state.params)
        side = self.composition.client_update.side_messages * size
        outcome = reports(
            self.clock,
            selection,
            uploading_clients(cohort, client_plan),
            results.num_steps,
            self.composition.clients_per_round,
            size + side,
            update_bytes(state.params, self.compression) + side,
        )
        metrics = {**(client_plan.metrics or {}), **outcome.metrics}
        end = selection.start + outcome.seconds
        return client_plan._replace(active=outcome.reporting, metrics=metrics), end

    def _compress(self, results, cohort, client_plan, residuals, server_key):
        """The reporting clients' updates as the server decodes them, and the residual rows (or ())."""
        uploading = uploading_clients(cohort, client_plan)
        rows = None
        if self.compression.error_feedback:
            rows = client_rows(residuals, cohort.client_ids)
        deltas, new_rows = compress_updates(
            self.compression,
            results.deltas,
            cohort.client_ids,
            jax.random.fold_in(server_key, COMPRESSION_STREAM),
            uploading,
            rows,
        )
        if new_rows is not None:
            residuals = store_client_rows(residuals, cohort.client_ids, new_rows)
        return results._replace(deltas=deltas), residuals

    def _default_aggregate(self, results, cohort, client_plan, state, key):
        """The weighted mean of the updates, or the run's aggregator, with the stage's weights and state."""
        stage = self.composition.aggregate
        if stage.reweight is None:
            weights, extra, metrics = default_weights(cohort, client_plan), state.extra, {}
        else:
            weights, extra, metrics = stage.reweight(results, cohort.alpha, state, key)
            if client_plan.active is not None:  # Clients that did not report (the clock's) weigh nothing.
                weights = jnp.where(client_plan.active, weights, 0.0)
        if stage.update_state is not None:
            extra = stage.update_state(results, cohort, state)
        if self.aggregator is None:
            return Aggregation(weighted_mean(results.deltas, weights), weights, extra, metrics)
        losses = results.mean_batch_loss if self.aggregator.uses_losses else None
        update, aggregator_state, aggregator_metrics = self.aggregator.aggregate(
            results.deltas, weights, state.aggregator, losses=losses
        )
        return Aggregation(update, weights, extra, {**metrics, **aggregator_metrics}, aggregator_state)


def _only(client_plan: ClientPlan, selected: jax.Array) -> ClientPlan:
    """The plan with the clients not selected (offline padding of the clock's cohort) inactive."""
    active = selected if client_plan.active is None else client_plan.active & selected
    return client_plan._replace(active=active)


def uploading_clients(cohort: Cohort, client_plan: ClientPlan) -> jax.Array:
    """`[M]` bool: the clients that report an update (the plan's active ones; all without a plan)."""
    if client_plan.active is None:
        return jnp.ones(cohort.client_ids.shape, bool)
    return client_plan.active


def round_metrics(
    cohort: Cohort, client_plan: ClientPlan, results: CohortResults, aggregation: Aggregation
) -> Metrics:
    """Every round's metrics, then the plan's and the aggregation's own."""
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
        # The clients that sent an update (the run's bytes: jaxfl.communication.traffic).
        "clients_uploading": jnp.sum(uploading_clients(cohort, client_plan)).astype(jnp.int32),
    }
    if cohort.initial_loss is not None:
        # F(w_t) over the cohort, alpha-weighted: what the plan saw.
        metrics["cohort_loss"] = jnp.sum(cohort.alpha * cohort.initial_loss) / jnp.sum(cohort.alpha)
    metrics.update(client_plan.metrics or {})
    metrics.update(aggregation.metrics)
    return metrics


def single_pass_preferred(strategy: ClientStrategy) -> bool:
    """Whether one fused loss-and-training pass beats two passes (see `SelectStage.weights_only`)."""
    mesh = strategy.mesh
    return mesh is not None and mesh.size > 1
