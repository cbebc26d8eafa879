"""Many settings of one algorithm as one compiled function.

A sweep point is a set of numeric hyperparameters (those in
`ServerState.hparams`, plus the server learning rate) and a seed. Points that
share every shape-setting value (clients per round, batch size, epochs, ...)
are run together: their states are stacked along a leading axis G and the
round is `jax.vmap`ped over it (`in_axes=(0, None, 0)`: states and run keys
per point, the population shared), then jitted once. Evaluation is vmapped
the same way. Shape-setting values vary in an outer Python loop
(`jaxfl.experiment.sweep_cli`).

A point gives the same result as the same setting run alone, up to float
rounding (tested): its state, its key, and therefore its cohorts and example
orders are exactly those of the single run.

The vmapped round and evaluator are kept between calls (per round function,
and per dataset, task and client weighting): sweeps of the same algorithm with
the same number of points, e.g. the fixed-width chunks of
`jaxfl.experiment.tuning.run_points`, trace and compile once per process.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxfl.algorithms.base import ServerState
from jaxfl.algorithms.registry import CLIENT_STATE_ALGORITHMS, PRIVATE_ALGORITHMS
from jaxfl.experiment.checkpoints import RunCheckpoints
from jaxfl.experiment.config import ConfigError
from jaxfl.experiment.health import (
    AFTER_TRAINING,
    divergence,
    finite_points,
    host_health,
    initial_health,
    monitored,
)
from jaxfl.experiment.runner import (
    Checkpointing,
    RunResult,
    Setup,
    after_training_models,
    clock_fields,
    compile_rounds,
    evaluation_clients,
    make_evaluator,
    personal_evaluation_group,
    place_carry,
    restore_carry,
    resumed_rounds_per_call,
    rounds_per_call,
    run_summary,
    timing_fields,
    traffic_fields,
    training_input,
    training_loop,
)
from jaxfl.training.host_cohorts import CohortStream

SERVER_LR = "server_lr"


@dataclasses.dataclass(frozen=True)
class SweepPoint:
    """One setting: numeric hyperparameter overrides and a seed."""

    hparams: Mapping[str, float]
    seed: int

    def label(self) -> str:
        parts = [f"{k}={v:g}" for k, v in sorted(self.hparams.items())]
        return ",".join(parts + [f"seed={self.seed}"])


def set_server_lr(state: ServerState, learning_rate: float) -> ServerState:
    """Sets the server learning rate held by an injected optax optimizer."""
    opt_state = state.opt_state
    if not hasattr(opt_state, "hyperparams") or "learning_rate" not in opt_state.hyperparams:
        raise ValueError("this server optimizer has no injectable learning_rate")
    hyperparams = dict(opt_state.hyperparams)
    hyperparams["learning_rate"] = jnp.asarray(
        learning_rate, jnp.asarray(hyperparams["learning_rate"]).dtype
    )
    return dataclasses.replace(state, opt_state=opt_state._replace(hyperparams=hyperparams))


def initial_state(run_setup: Setup, name: str, point: SweepPoint) -> tuple[ServerState, jax.Array]:
    """The state and run key a single run of this point would start from."""
    algorithm = run_setup.algorithms[name]
    init_key, run_key = jax.random.split(jax.random.key(point.seed))
    params = run_setup.engine.task.model.init(init_key)
    hparams = dict(run_setup.hparams[name])
    overrides = {k: v for k, v in point.hparams.items() if k != SERVER_LR}
    unknown = sorted(set(overrides) - set(algorithm.hparam_defaults))
    if unknown:
        raise ValueError(
            f"{name} has no hyperparameter {unknown[0]!r}; sweepable: "
            f"{', '.join(sorted([*algorithm.hparam_defaults, SERVER_LR]))}, seed"
        )
    hparams.update(overrides)
    state = algorithm.init(params, hparams)
    if SERVER_LR in point.hparams:
        state = set_server_lr(state, point.hparams[SERVER_LR])
    return state, run_key


def stack(trees: Sequence[Any]) -> Any:
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)


# Evaluators go away with their dataset: datasets hold arrays and cannot be
# hashed, so they are keyed by id, and the entry is dropped when the dataset
# is collected (before the id can be reused).
_BATCHED_EVALUATORS: dict[int, tuple[weakref.ref, dict]] = {}


@functools.lru_cache(maxsize=16)  # The jitted round keeps round_fn alive: bounded.
def batched_round(
    round_fn: Callable, rounds_per_call: int = 1, cohort_per_point: bool = False, released_only: bool = False
) -> Callable:
    """`vmap(monitored(round_fn))` over (state, health) carries and keys, compiled
    as `rounds_per_call` rounds per call (`jaxfl.experiment.runner.compile_rounds`); the same
    object per (round_fn, rounds_per_call, cohort_per_point, released_only). With
    `cohort_per_point` (a host-resident population) the population argument
    holds each point's gathered cohort, batched like the states.
    `released_only`: the health checks only the parameters (a DP
    algorithm's; `jaxfl.experiment.health`).

    Every point keeps its own batched key and round counter, even when the
    points share a seed: unbatching them (so that all points read the same
    minibatch) was measured slower on CPU, as XLA then transposes the
    stacked models at every local step (benchmarks/RESULTS.md, section
    "The suite on this CPU (`suite.py --preset cpu --devices 2`, 2026-11-26)").
    """
    population_axis = 0 if cohort_per_point else None
    return compile_rounds(
        jax.vmap(monitored(round_fn, released_only=released_only), in_axes=(0, population_axis, 0)),
        rounds_per_call,
        cohort_per_round=cohort_per_point,
    )


# Per-client columns that are the same for every point of a sweep (no leading point axis).
SHARED_COLUMNS = ("num_examples", "attacked", "client")


def batched_evaluator(run_setup: Setup) -> Callable:
    """The batched `make_evaluator` of the setup, the same object per dataset."""
    engine, dataset = run_setup.engine, run_setup.dataset
    entry = _BATCHED_EVALUATORS.get(id(dataset))
    if entry is None or entry[0]() is not dataset:
        # The defaults bind the weakref callback to this dataset's id and to the cache itself (module
        # teardown may have cleared the global by the time the callback runs).
        forget = lambda _, key=id(dataset), cache=_BATCHED_EVALUATORS: cache.pop(key, None)  # noqa
        entry = (weakref.ref(dataset, forget), {})
        _BATCHED_EVALUATORS[id(dataset)] = entry
    evaluators = entry[1]
    corrupted = run_setup.corrupted
    # Setups of one dataset may differ in who is corrupted (a grid over attack_fraction).
    key = (
        engine.task,
        engine.client_weighting,
        personal_evaluation_group(engine.strategy),
        engine.strategy.mesh,
        None if corrupted is None else corrupted.tobytes(),
        run_setup.config.eval_clients,
        run_setup.config.eval_train,
        run_setup.config.seed,
    )
    if key not in evaluators:
        # The corrupted clients depend on the dataset's setup (seed, attack), as the dataset does.
        evaluators[key] = make_evaluator(
            engine.task, dataset, engine.client_weighting, batched=True, corrupted=run_setup.corrupted,
            personal_group=personal_evaluation_group(engine.strategy), sample=evaluation_clients(run_setup),
            train=run_setup.config.eval_train, mesh=engine.strategy.mesh,
        )
    return evaluators[key]


def check_client_state(run_setup: Setup, name: str) -> None:
    """A one-line ConfigError when a sweep of `name` would need host-resident personal models."""
    if run_setup.engine.strategy.host_client_state and name in CLIENT_STATE_ALGORITHMS:
        why = (
            "--client-state auto chose host memory, as the personal models fit the devices neither "
            "replicated nor split" if run_setup.config.client_state == "auto" else "--client-state host"
        )
        raise ConfigError(
            f"a sweep of {name} keeps its points' personal models on the device, but {why}: "
            "run the settings one at a time, or with fewer training clients"
        )


def run_sweep(
    run_setup: Setup,
    name: str,
    points: Sequence[SweepPoint],
    *,
    on_evaluation: Callable[[int, dict[str, Any]], None] | None = None,
    progress: Any = None,
    checkpoints: RunCheckpoints | None = None,
    on_checkpoint: Callable[[int], None] | None = None,
    resume: bool = False,
    on_restore: Callable[[int], None] | None = None,
) -> list[RunResult]:
    """Trains every point for `config.rounds` rounds in one vmapped round.

    Args:
      run_setup: the shared setup (static shapes, data, algorithm).
      name: which algorithm of the setup.
      points: the settings.
      on_evaluation: called with (point index, evaluation record).
      progress: a tqdm-like bar, updated once per round.
      checkpoints: where to save the stacked state of all points (as
        `config.checkpoint_every`/`checkpoint_seconds` say, and on
        SIGINT/SIGTERM), or None.
      on_checkpoint: called with the round after each checkpoint.
      resume: continue from the latest checkpoint in `checkpoints`, if any.
      on_restore: called with the round training continues from (0: the
        start; the latest readable checkpoint's when resuming, which is not
        the latest if that one is damaged), before the first round.

    Returns:
      One `RunResult` per point, in order. A point that diverged goes on
      with the others (they share the compiled round) and its summary is
      marked `status: diverged`, with the round and the quantity.

    Raises:
      RunInterrupted: on SIGINT/SIGTERM, after saving a checkpoint.
    """
    if not points:
        raise ValueError("a sweep needs at least one point")
    config = run_setup.config
    engine = run_setup.engine
    check_client_state(run_setup, name)
    algorithm = run_setup.algorithms[name]
    starts = [initial_state(run_setup, name, point) for point in points]
    # Placed as the round's outputs will be (replicated over a mesh under the
    # sharded strategy), or the second call would see new shardings and
    # compile again.
    carry = place_carry(
        run_setup, stack([(state, initial_health()) for state, _ in starts])
    )
    keys = jnp.stack([key for _, key in starts])
    start_round, carry, meta = restore_carry(run_setup, carry, checkpoints if resume else None)
    if on_restore is not None:
        on_restore(start_round)
    histories: list[list[dict[str, Any]]] = (
        [list(h) for h in meta["histories"]] if meta else [[] for _ in points]
    )
    num_rounds_per_call = resumed_rounds_per_call(
        rounds_per_call(engine.strategy, config.rounds, config.eval_every), start_round
    )
    train = training_input(run_setup, keys, num_rounds_per_call, first_round=start_round)
    round_fn = batched_round(
        algorithm.round, num_rounds_per_call, isinstance(train, CohortStream),
        released_only=name in PRIVATE_ALGORITHMS,
    )
    evaluate = batched_evaluator(run_setup)
    if progress is not None and start_round:
        progress.update(start_round)

    summaries: list[dict[str, Any]] = [{} for _ in points]
    clients: list[dict[str, Any]] = [{} for _ in points]

    def evaluate_points(params, personal):
        batch_summaries, batch_clients = evaluate(params, personal)
        for g in range(len(points)):
            summaries[g] = {
                group: {k: float(v[g]) for k, v in stats.items()}
                for group, stats in batch_summaries.items()
            }
            clients[g] = {
                population: {k: np.asarray(v if k in SHARED_COLUMNS else v[g]) for k, v in values.items()}
                for population, values in batch_clients.items()
            }

    def on_evaluate(round_index, states, metrics, health):
        evaluate_points(states.params, jax.vmap(algorithm.personal_models)(states))
        round_metrics = jax.device_get(metrics)
        uploads, clocks = jax.device_get((health.client_uploads, states.clock))  # One transfer.
        for g, point in enumerate(points):
            record = {
                "algorithm": name,
                "point": g,
                "hparams": dict(point.hparams),
                "seed": point.seed,
                "round": round_index,
                **traffic_fields(run_setup, name, round_index, uploads[g]),
                **clock_fields(jax.tree.map(lambda x, g=g: x[g], clocks)),
                "round_metrics": {k: float(v[g]) for k, v in round_metrics.items()},
                **summaries[g],
            }
            histories[g].append(record)
            if on_evaluation is not None:
                on_evaluation(g, record)

    def checkpoint_meta(round_index):
        return {"algorithm": name, "histories": histories, "config": config.to_dict(),
                "points": [point.label() for point in points]}

    checkpointing = (
        Checkpointing.from_config(checkpoints, config, checkpoint_meta, on_checkpoint)
        if checkpoints is not None else None
    )
    carry, timing = training_loop(
        round_fn, carry, train, keys, config, engine.strategy, on_evaluate, progress, num_rounds_per_call,
        start_round=start_round, checkpointing=checkpointing, stop_on_divergence=False,
    )
    states, health = carry
    health = host_health(health)
    # Made after training as in a single run (Per-FedAvg's adaptation, or --finetune-epochs).
    personal = after_training_models(run_setup, algorithm, states, keys, batched=True)
    finite_after_training = np.ones(len(points), bool)
    if personal is not None:
        finite_after_training = finite_points(personal, len(points))
        evaluate_points(states.params, personal)
    timing_record = timing_fields(timing, num_rounds_per_call, start_round)
    # Throughput of the whole sweep, in rounds of all points per second.
    timing_record["sweep_rounds_per_s"] = timing_record.pop("rounds_per_s")
    results = []
    for g, point in enumerate(points):
        state = jax.tree.map(lambda x, g=g: x[g], states)
        summary = run_summary(
            run_setup, name, summaries[g], int(health["rounds_without_weight"][g]),
            divergence(health, g)
            or (None if finite_after_training[g] else {"round": config.rounds, "quantity": AFTER_TRAINING}),
            state.hparams, int(health["client_uploads"][g]),
        )
        summary.update(hparams=dict(point.hparams), seed=point.seed, sweep_points=len(points))
        summary.update(clock_fields(state.clock))
        results.append(RunResult(name, state, histories[g], summary, clients[g], timing_record))
    return results
