"""One algorithm's run: build it (`run_setup`), train it (`training_loop`), evaluate it (`evaluator`).

`train_points` ties the pieces together for a single run (`run_algorithm`, one
point) and a sweep (`jaxfl.experiment.sweep.run_sweep`, points batched); the
names of those modules are also imported from here, where callers have long
found them.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, TypedDict, Unpack

import jax
import jax.numpy as jnp
import numpy as np

from jaxfl.algorithms.base import (
    ServerState,
    place_state,
)
from jaxfl.algorithms.registry import (
    CLIENT_STATE_ALGORITHMS,
    PRIVATE_ALGORITHMS,
    algorithm_spec,
)
from jaxfl.experiment.checkpoints import RunCheckpoints

# The run's pieces, by concern; their names are also imported from here.
from jaxfl.experiment.evaluator import (  # noqa: F401
    evaluated_sample,
    evaluation_clients,
    make_evaluator,
    personal_evaluation_group,
)
from jaxfl.experiment.health import (
    AFTER_TRAINING,
    divergence,
    finite_points,
    host_health,
    initial_health,
    monitored,
)

# The settings of a built algorithm; also imported from here.
from jaxfl.experiment.hparams import algorithm_hparams, algorithm_options, local_hparams  # noqa: F401
from jaxfl.experiment.personalization import (  # noqa: F401
    after_training_models,
    finetuned_models,
    personal_models,
    personalized_models,
    saved_personal_models,
)
from jaxfl.experiment.points import (
    SHARED_COLUMNS,
    SweepPoint,
    batched_evaluator,
    batched_round,
    check_client_state,
    initial_state,
    stack,
)
from jaxfl.experiment.robustness import attack_record
from jaxfl.experiment.run_setup import (  # noqa: F401
    Setup,
    asynchronous_warmup,
    check_model_fits_targets,
    choose_local_loop,
    choose_strategy,
    frozen_embeddings,
    ignored_settings,
    personal_test_split,
    place_dataset,
    placement_line,
    setup,
)
from jaxfl.experiment.training_loop import (  # noqa: F401
    MAX_ROUNDS_PER_CALL,
    Checkpointing,
    LoopTiming,
    RunDiverged,
    compile_rounds,
    must_sync_each_round,
    resumed_rounds_per_call,
    rounds_per_call,
    training_input,
    training_loop,
)
from jaxfl.training.client_state import HostClientState
from jaxfl.training.host_cohorts import CohortStream
from jaxfl.validation import check_keywords


@dataclasses.dataclass
class RunResult:
    """What one algorithm's run produced.

    Attributes:
      algorithm: its name.
      state: the final server state (None for a result read back from disk).
      history: one dict per evaluation (round, summaries, round metrics).
      summary: the final summaries (`train_loss`, `train_error`,
        `test_loss`, `test_error`, each a dict of statistics), the run's
        `status` ('finished' or 'diverged', with `diverged` saying where and
        what), `rounds_without_weight`, and what depends only on the config
        and the seed.
      clients: population name -> {'num_examples', 'loss', 'error', 'targets'} NumPy
        arrays of the final model (of the last evaluation of a diverged run).
      timing: wall-clock figures (compile, training, evaluation and
        checkpoint seconds, rounds per second), kept apart from the results.
    """

    algorithm: str
    state: ServerState | None
    history: list[dict[str, Any]]
    summary: dict[str, Any]
    clients: dict[str, dict[str, np.ndarray]]
    timing: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def diverged(self) -> dict[str, Any] | None:
        return self.summary.get("diverged")


def privacy_spent(run_setup: Setup, name: str, hparams: dict[str, float], rounds_done: int):
    """What a DP algorithm has spent after `rounds_done` rounds, or None for others."""
    privacy = algorithm_spec(name).privacy
    if privacy is None:
        return None
    return privacy.report(
        run_setup.config.flat(),
        num_clients=run_setup.dataset.train.num_clients,
        clients_per_round=run_setup.config.server.clients_per_round,
        hparams=hparams,
        rounds_done=rounds_done,
        num_examples=run_setup.dataset.train.num_examples,
    )


def initial_carry(run_setup: Setup, name: str) -> tuple[Any, Any]:
    """The (state, health) carry a single run of `name` starts from, placed, and its run key."""
    state, run_key = initial_state(run_setup, name, SweepPoint({}, run_setup.config.runtime.seed))
    return place_carry(run_setup, (state, initial_health())), run_key


def restore_carry(
    run_setup: Setup, carry: Any, checkpoints: RunCheckpoints | None
) -> tuple[int, Any, dict[str, Any] | None]:
    """(round, carry, meta) of the latest checkpoint, placed; (0, carry, None) if there is none."""
    restored = checkpoints.restore(jax.device_get(carry)) if checkpoints is not None else None
    if restored is None:
        return 0, carry, None
    start_round, saved_carry, meta = restored
    return start_round, place_carry(run_setup, saved_carry), meta


def place_carry(run_setup: Setup, carry: Any) -> Any:
    """Puts a carry (fresh or restored from host arrays) where the round expects it (`place_state`)."""
    state, health = carry
    strategy = run_setup.engine.strategy
    # Host-resident rows stay NumPy (`shard_rows` keeps them there); restored rows are host arrays either way.
    clients = state.clients if strategy.host_client_state else jax.device_put(state.clients)
    state = dataclasses.replace(jax.device_put(dataclasses.replace(state, clients=())), clients=clients)
    return place_state(state, strategy), strategy.replicate(jax.device_put(health))


def evaluation_line(run_setup: Setup) -> str | None:
    """What `--eval-clients` and the training clients' evaluation (`--eval-train`, off by default) leave
    out, for the run's header; None: nothing."""
    sample = evaluated_sample(run_setup)
    parts = []
    if sample:
        populations = run_setup.dataset.populations
        sampled = ", ".join(
            f"{ids.size} of {populations[name].num_clients} {name}" for name, ids in sample.items()
        )
        parts.append(f"on a fixed sample of clients (--eval-clients): {sampled}")
    if not run_setup.config.evaluation.eval_train:
        parts.append("not on the training clients (--eval-train adds them)")
        personal = [  # Their own, made after training, or fine-tuned (`after_training_models`).
            name for name in run_setup.config.algorithms
            if algorithm_spec(name).personal_models or algorithm_spec(name).adapts_after_training
            or (run_setup.config.personalization.finetune_epochs and name not in CLIENT_STATE_ALGORITHMS)
        ]
        if personal and not run_setup.dataset.personal_splits:
            # Their only data here is their clients' training data.
            parts.append(
                f"personal models of {', '.join(personal)} not evaluated (no test data of their clients "
                "here: --eval-train evaluates them on their training data, --client-split F holds some out)"
            )
    if not parts:
        return None
    return f"evaluation {'; '.join(parts)}; `jaxfl evaluate DIR` evaluates every client of a saved run"


def run_summary(
    run_setup: Setup,
    name: str,
    summaries: dict[str, Any],
    rounds_without_weight: int,
    diverged: dict[str, Any] | None,
    hparams: Any,
    client_uploads: int = 0,
) -> dict[str, Any]:
    """The summary of one run (or sweep point) of `name`: its evaluation summaries, then what it ran as.

    `diverged` says where a run diverged (None: it finished); `hparams`
    the run's hyperparameters (`state.hparams`, device or host arrays);
    `client_uploads` the updates its clients sent (`RunHealth.client_uploads`).
    """
    config, strategy = run_setup.config, run_setup.engine.strategy
    summary = {
        **summaries,
        "algorithm": name,
        "status": "diverged" if diverged else "finished",
        "rounds": config.server.rounds,
        "rounds_without_weight": rounds_without_weight,
        "strategy": strategy.describe(),
        "residency": run_setup.placement.residency if run_setup.placement else "device",
    }
    if name in CLIENT_STATE_ALGORITHMS:
        summary["client_state"] = (
            "host" if strategy.host_client_state
            else "split" if strategy.shards_client_state else "replicated"
        )
    attack = attack_record(config, run_setup.corrupted)
    if attack is not None:
        summary["attack"] = attack
    sample = evaluated_sample(run_setup)
    if sample:
        summary["evaluated_clients"] = {
            name: {"evaluated": int(ids.size), "of": run_setup.dataset.populations[name].num_clients}
            for name, ids in sample.items()
        }
    if diverged:
        summary["diverged"] = diverged
    # A single run stops where divergence was seen; a sweep point goes on with the others.
    rounds_done = (diverged or {}).get("detected_at_round", config.server.rounds)
    warmup = asynchronous_warmup(config, name, run_setup.dataset.train.num_clients)
    if warmup:
        summary["warmup_steps"] = warmup  # Server steps that only started clients.
    traffic = run_setup.traffic.get(name)
    if traffic is not None:
        summary.update(traffic.record(rounds_done, client_uploads))
        if traffic.compression is not None:
            summary["compression"] = traffic.compression
    hparams = {k: float(v) for k, v in jax.device_get(hparams).items()}
    privacy = privacy_spent(run_setup, name, hparams, rounds_done)
    if privacy is not None:
        summary["privacy"] = privacy
    return summary


def traffic_fields(run_setup: Setup, name: str, round_index: int, client_uploads: Any) -> dict[str, int]:
    """`bytes_up`, `bytes_down` and `client_uploads` of `name` after `round_index` rounds.

    `client_uploads` is the count so far (a device or host integer); {} for an
    algorithm whose messages are not counted.
    """
    traffic = run_setup.traffic.get(name)
    if traffic is None:
        return {}
    return traffic.record(round_index, int(jax.device_get(client_uploads)))


def clock_fields(clock: Any) -> dict[str, float]:
    """`{'simulated_time': seconds}` of a state's clock (`ServerState.clock`), or {} without a clock."""
    if not jax.tree.leaves(clock):
        return {}
    return {"simulated_time": float(jax.device_get(clock))}


def timing_fields(timing: LoopTiming, num_rounds_per_call: int, start_round: int) -> dict[str, Any]:
    """What timing.json holds: the loop's times, how rounds were called, the backend, where it resumed."""
    return {
        **timing.as_dict(),
        "rounds_per_call": num_rounds_per_call,
        "backend": jax.default_backend(),
        "resumed_from_round": start_round or None,
    }


def _final_summary(run_setup: Setup, name: str, summaries, health, diverged, state, history) -> dict:
    """The run's summary.json: its last evaluation's summaries, health, divergence and clock."""
    summary = run_summary(
        run_setup, name, summaries, int(health["rounds_without_weight"]), diverged,
        run_setup.hparams[name] if state is None else state.hparams, int(health["client_uploads"]),
    )
    if history and "simulated_time" in history[-1]:
        summary["simulated_time"] = history[-1]["simulated_time"]  # At the last evaluation.
    if diverged:
        summary["evaluated_round"] = history[-1]["round"] if history else None
    return summary


def _compiled_rounds(run_setup: Setup, name: str, carry, run_keys, start_round: int, batched: bool):
    """What the loop calls: (host client state or None, rounds per call, training input, rounds).

    Host-resident client state moves each round's rows, so it takes one round
    per call (a single run's only: `check_client_state` refuses it in a sweep).
    """
    config, engine = run_setup.config, run_setup.engine
    server, evaluation = config.server, config.evaluation
    strategy = engine.strategy
    client_state = None
    if strategy.host_client_state and jax.tree.leaves(carry[0].clients):
        # Device arrays either way (`replicate` passes NumPy through off a mesh).
        place = strategy.replicate if strategy.mesh is not None else jax.device_put
        client_state = HostClientState(
            run_keys, run_setup.dataset.train.num_clients, engine.clients_per_round, place=place
        )
    num_rounds_per_call = (
        1 if client_state else rounds_per_call(strategy, server.rounds, evaluation.eval_every)
    )
    num_rounds_per_call = resumed_rounds_per_call(num_rounds_per_call, start_round)
    train = training_input(run_setup, run_keys, num_rounds_per_call, first_round=start_round)
    cohort_per_round = isinstance(train, CohortStream)
    released_only = name in PRIVATE_ALGORITHMS
    round_fn = run_setup.algorithms[name].round
    if batched:
        round_fn = batched_round(round_fn, num_rounds_per_call, cohort_per_round, released_only=released_only)
    else:
        round_fn = compile_rounds(
            monitored(round_fn, released_only=released_only), num_rounds_per_call,
            cohort_per_round=cohort_per_round,
        )
    return client_state, num_rounds_per_call, train, round_fn


def _point(tree: Any, g: int, batched: bool) -> Any:
    """Point `g`'s part of a tree whose leaves carry a leading point axis where `batched`."""
    return jax.tree.map(lambda x: x[g], tree) if batched else tree


class RunHooks(TypedDict, total=False):
    """How a caller follows, checkpoints and resumes a run or a sweep (all optional).

    Attributes:
      progress: an object with `update(n)` and `set_postfix_str(s)` (a tqdm
        bar), updated once per round.
      checkpoints: where to save checkpoints (as `config.runtime.checkpoint_every`
        or `checkpoint_seconds` say, and on SIGINT/SIGTERM); a sweep saves the
        stacked state of all its points.
      on_checkpoint: called with the round after each checkpoint.
      resume: continue from the latest checkpoint in `checkpoints` (if any):
        the result is bit for bit that of the uninterrupted run.
      on_restore: called with the round training continues from (0: the
        start; the latest readable checkpoint's when resuming, which is not
        the latest if that one is damaged), before the first round.
    """

    progress: Any
    checkpoints: RunCheckpoints | None
    on_checkpoint: Callable[[int], None] | None
    resume: bool
    on_restore: Callable[[int], None] | None


def train_points(
    run_setup: Setup,
    name: str,
    points: Sequence[SweepPoint],
    *,
    batched: bool,
    on_evaluation: Callable[[int, dict[str, Any]], None] | None = None,
    **hooks: Unpack[RunHooks],
) -> list[RunResult]:
    """Trains `points` of `name` for `config.server.rounds` rounds: the one path of a run and of a sweep.

    A single run (`batched=False`) is one point whose state is the round's;
    a sweep (`batched=True`) stacks its points' states along a leading axis
    and runs the round `vmap`ped over them (`jaxfl.experiment.points`). The
    rest is shared, so the two cannot drift apart. What differs is what a
    batch of points cannot do or record the same way: a single run may keep
    per-client rows in host memory, stops at divergence (`RunDiverged`), and
    its records and checkpoints carry no point fields; a sweep's diverged
    point is marked and goes on with the others (they share the compiled
    round). The arguments are `run_sweep`'s.
    """
    check_keywords("train_points", hooks, RunHooks.__annotations__)
    progress, checkpoints = hooks.get("progress"), hooks.get("checkpoints")
    on_checkpoint, on_restore = hooks.get("on_checkpoint"), hooks.get("on_restore")
    resume = hooks.get("resume", False)
    if not points:
        raise ValueError("a sweep needs at least one point")
    if not batched and len(points) != 1:
        raise ValueError(f"a single run is one point, got {len(points)}")
    config, engine = run_setup.config, run_setup.engine
    server = config.server
    strategy = engine.strategy
    algorithm = run_setup.algorithms[name]
    if batched:
        check_client_state(run_setup, name)
    carry, keys, start_round, histories = _starting_points(
        run_setup, name, points, batched, checkpoints if resume else None
    )
    if on_restore is not None:
        on_restore(start_round)
    client_state, num_rounds_per_call, train, round_fn = _compiled_rounds(
        run_setup, name, carry, keys, start_round, batched
    )
    if batched:
        evaluate = batched_evaluator(run_setup)
    else:
        evaluate = make_evaluator(
            engine.task, run_setup.dataset, engine.client_weighting, corrupted=run_setup.corrupted,
            personal_group=personal_evaluation_group(strategy), sample=evaluation_clients(run_setup),
            train=config.evaluation.eval_train, mesh=strategy.mesh,
        )
    if progress is not None and start_round:
        progress.update(start_round)

    summaries: list[dict[str, Any]] = [{} for _ in points]
    clients: list[dict[str, Any]] = [{} for _ in points]

    def evaluate_points(params, personal):
        point_summaries, point_clients = evaluate(params, personal)
        if not batched:
            summaries[0], clients[0] = point_summaries, point_clients
            return
        summaries[:], clients[:] = _split_points(point_summaries, point_clients, len(points))

    def on_evaluate(round_index, states, metrics, health):
        if progress is not None and not batched:
            progress.set_postfix_str("evaluating")  # It can take longer than the rounds between.
        if batched:
            evaluate_points(states.params, jax.vmap(algorithm.personal_models)(states))
        else:
            evaluate_points(states.params, personal_models(algorithm, states))
        round_metrics = jax.device_get(metrics)
        uploads, clocks = jax.device_get((health.client_uploads, states.clock))  # One transfer.
        for g, point in enumerate(points):
            record: dict[str, Any] = {"algorithm": name}
            if batched:
                record.update(point=g, hparams=dict(point.hparams), seed=point.seed)
            record.update(
                round=round_index,
                **traffic_fields(run_setup, name, round_index, _point(uploads, g, batched)),
                **clock_fields(_point(clocks, g, batched)),
                round_metrics={k: float(_point(v, g, batched)) for k, v in round_metrics.items()},
                **summaries[g],
            )
            histories[g].append(record)
            if on_evaluation is not None:
                on_evaluation(g, record)
        if progress is not None and not batched:
            progress.set_postfix_str(f"test error {100 * summaries[0]['test_error']['mean']:.1f}%")

    def checkpoint_meta(round_index):
        if batched:
            return {"algorithm": name, "histories": histories, "config": config.to_dict(),
                    "points": [point.label() for point in points]}
        hparams = {k: float(v) for k, v in jax.device_get(run_setup.hparams[name]).items()}
        return {
            "algorithm": name,
            "history": histories[0],
            "config": config.to_dict(),
            "privacy_spent": privacy_spent(run_setup, name, hparams, round_index),
        }

    checkpointing = (
        Checkpointing.from_config(checkpoints, config, checkpoint_meta, on_checkpoint)
        if checkpoints is not None else None
    )
    diverged = None
    finite_after_training = np.ones(len(points), bool)
    try:
        carry, timing = training_loop(
            round_fn, carry, train, keys, config, strategy, on_evaluate, progress, num_rounds_per_call,
            start_round=start_round, checkpointing=checkpointing, stop_on_divergence=not batched,
            client_state=client_state,
        )
        states, health = carry[0], host_health(carry[1])
        started = time.perf_counter()
        # Made after training (Per-FedAvg's adaptation, or --finetune-epochs), each point as its single run.
        personal = after_training_models(run_setup, algorithm, states, keys, batched=batched)
        if personal is not None:
            finite_after_training = finite_points(personal, len(points))
            if not batched and not finite_after_training[0]:
                raise RunDiverged({"round": server.rounds, "quantity": AFTER_TRAINING}, server.rounds, health)
            evaluate_points(states.params, personal)
            spent = time.perf_counter() - started
            timing = dataclasses.replace(timing, evaluation_s=timing.evaluation_s + spent)
    except RunDiverged as error:  # A single run's only (`stop_on_divergence`).
        # The carry was donated to the rounds after the last good one: only the host copy is left.
        states, health = None, error.health
        diverged = {"round": error.round, "quantity": error.quantity, "detected_at_round": error.detected_at}
        diverged["last_checkpoint_round"] = checkpoints.latest_round() if checkpoints is not None else None
        timing = LoopTiming(0.0, 0.0, 0.0, 0)
    timing_record = timing_fields(timing, num_rounds_per_call, start_round)
    if not batched:
        summary = _final_summary(run_setup, name, summaries[0], health, diverged, states, histories[0])
        return [RunResult(name, states, histories[0], summary, clients[0], timing_record)]
    # Throughput of the whole sweep, in rounds of all points per second.
    timing_record["sweep_rounds_per_s"] = timing_record.pop("rounds_per_s")
    return [
        RunResult(
            name, _point(states, g, batched), histories[g],
            _point_summary(run_setup, name, points, g, summaries[g], health, _point(states, g, batched),
                           finite_after_training[g]),
            clients[g], timing_record,
        )
        for g in range(len(points))
    ]


def _split_points(summaries: dict[str, Any], clients: dict[str, Any], num_points: int):
    """A batched evaluation's (summaries, per-client metrics), one of each per point (host values)."""
    return (
        [
            {group: {k: float(v[g]) for k, v in stats.items()} for group, stats in summaries.items()}
            for g in range(num_points)
        ],
        [
            {
                population: {k: np.asarray(v if k in SHARED_COLUMNS else v[g]) for k, v in values.items()}
                for population, values in clients.items()
            }
            for g in range(num_points)
        ],
    )


def _starting_points(
    run_setup: Setup, name: str, points: Sequence[SweepPoint], batched: bool,
    checkpoints: RunCheckpoints | None,
) -> tuple[Any, Any, int, list[list[dict[str, Any]]]]:
    """(carry, run keys, first round, evaluation histories) that `train_points` starts from.

    The points' initial states (stacked where `batched`), or the latest
    checkpoint's carry and histories in `checkpoints` when there is one.
    """
    starts = [initial_state(run_setup, name, point) for point in points]
    if batched:
        carry = stack([(state, initial_health()) for state, _ in starts])
        keys = jnp.stack([key for _, key in starts])
    else:
        (state, keys), = starts
        carry = (state, initial_health())
    # Placed as the round's outputs will be (replicated over a mesh under the sharded strategy), or the
    # second call would see new shardings and compile again.
    carry = place_carry(run_setup, carry)
    start_round, carry, meta = restore_carry(run_setup, carry, checkpoints)
    if meta is None:
        histories: list[list[dict[str, Any]]] = [[] for _ in points]
    else:
        histories = [list(h) for h in meta["histories"]] if batched else [list(meta["history"])]
    return carry, keys, start_round, histories


def _point_summary(
    run_setup: Setup, name: str, points: Sequence[SweepPoint], g: int, summaries, health, state,
    finite_after_training: bool,
) -> dict[str, Any]:
    """Sweep point `g`'s summary.json: `run_summary`, with its setting, and its diverged round if any."""
    config = run_setup.config
    diverged = divergence(health, g) or (
        None if finite_after_training else {"round": config.server.rounds, "quantity": AFTER_TRAINING}
    )
    summary = run_summary(
        run_setup, name, summaries, int(health["rounds_without_weight"][g]), diverged, state.hparams,
        int(health["client_uploads"][g]),
    )
    point = points[g]
    summary.update(hparams=dict(point.hparams), seed=point.seed, sweep_points=len(points))
    summary.update(clock_fields(state.clock))
    return summary


def run_algorithm(
    run_setup: Setup,
    name: str,
    *,
    on_evaluation: Callable[[dict[str, Any]], None] | None = None,
    **hooks: Unpack[RunHooks],
) -> RunResult:
    """Trains one algorithm for `config.server.rounds` rounds: `train_points` of the run's one point.

    Args:
      run_setup: from `setup`.
      name: which of its algorithms.
      on_evaluation: called with each evaluation record (e.g. to append it to
        metrics.jsonl as it happens).
      **hooks: the `RunHooks`: a progress bar, checkpoints, resuming.

    Returns:
      The `RunResult`; a diverged run's has `summary['status'] == 'diverged'`.

    Raises:
      RunInterrupted: on SIGINT/SIGTERM, after saving a checkpoint.
    """
    (result,) = train_points(
        run_setup, name, [SweepPoint({}, run_setup.config.runtime.seed)], batched=False,
        on_evaluation=None if on_evaluation is None else lambda _, record: on_evaluation(record),
        **hooks,
    )
    return result
