"""One algorithm's run: build it (`run_setup`), train it (`training_loop`), evaluate it (`evaluator`).

`run_algorithm` ties the pieces together; the names of those modules are also
imported from here, where callers have long found them.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
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
from jaxfl.evaluation.sampling import evaluation_sample
from jaxfl.experiment.checkpoints import RunCheckpoints

# The run's pieces, by concern; their names are also imported from here.
from jaxfl.experiment.evaluator import make_evaluator, personal_evaluation_group  # noqa: F401
from jaxfl.experiment.health import AFTER_TRAINING, finite_points, host_health, initial_health, monitored

# The settings of a built algorithm; also imported from here.
from jaxfl.experiment.hparams import algorithm_hparams, algorithm_options, local_hparams  # noqa: F401
from jaxfl.experiment.personalization import (  # noqa: F401
    after_training_models,
    finetuned_models,
    personal_models,
    personalized_models,
    saved_personal_models,
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
        run_setup.config,
        num_clients=run_setup.dataset.train.num_clients,
        clients_per_round=run_setup.config.clients_per_round,
        hparams=hparams,
        rounds_done=rounds_done,
        num_examples=run_setup.dataset.train.num_examples,
    )


def initial_carry(run_setup: Setup, name: str) -> tuple[Any, Any]:
    """The (state, health) carry a run of `name` starts from, placed, and its run key."""
    config = run_setup.config
    init_key, run_key = jax.random.split(jax.random.key(config.seed))
    params = run_setup.engine.task.model.init(init_key)
    state = run_setup.algorithms[name].init(params, run_setup.hparams[name])
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


def evaluation_clients(run_setup: Setup) -> dict[str, np.ndarray]:
    """Population name -> the clients sampled for evaluation (`--eval-clients`), for the populations sampled.

    The training clients' sample is there without `--eval-train` too: it
    picks the personal models that go with the test clients under personal
    splits (`make_evaluator`).
    """
    config = run_setup.config
    if config.eval_clients is None:
        return {}
    return evaluation_sample(run_setup.dataset, config.eval_clients, config.seed)


def _evaluated_sample(run_setup: Setup) -> dict[str, np.ndarray]:
    """`evaluation_clients` of the populations evaluated."""
    sample = evaluation_clients(run_setup)
    if not run_setup.config.eval_train:
        sample.pop("train", None)
    return sample


def evaluation_line(run_setup: Setup) -> str | None:
    """What `--eval-clients` and the training clients' evaluation (`--eval-train`, off by default) leave
    out, for the run's header; None: nothing."""
    sample = _evaluated_sample(run_setup)
    parts = []
    if sample:
        populations = run_setup.dataset.populations
        sampled = ", ".join(
            f"{ids.size} of {populations[name].num_clients} {name}" for name, ids in sample.items()
        )
        parts.append(f"on a fixed sample of clients (--eval-clients): {sampled}")
    if not run_setup.config.eval_train:
        parts.append("not on the training clients (--eval-train adds them)")
        personal = [  # Their own, made after training, or fine-tuned (`after_training_models`).
            name for name in run_setup.config.algorithms
            if algorithm_spec(name).personal_models or algorithm_spec(name).adapts_after_training
            or (run_setup.config.finetune_epochs and name not in CLIENT_STATE_ALGORITHMS)
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
        "rounds": config.rounds,
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
    sample = _evaluated_sample(run_setup)
    if sample:
        summary["evaluated_clients"] = {
            name: {"evaluated": int(ids.size), "of": run_setup.dataset.populations[name].num_clients}
            for name, ids in sample.items()
        }
    if diverged:
        summary["diverged"] = diverged
    # A single run stops where divergence was seen; a sweep point goes on with the others.
    rounds_done = (diverged or {}).get("detected_at_round", config.rounds)
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


def _compiled_rounds(run_setup: Setup, name: str, carry, run_key, start_round: int):
    """What a single run's loop calls: (host client state or None, rounds per call, training input, rounds).

    Host-resident client state moves each round's rows, so it takes one round per call.
    """
    config, engine = run_setup.config, run_setup.engine
    strategy = engine.strategy
    client_state = None
    if strategy.host_client_state and jax.tree.leaves(carry[0].clients):
        # Device arrays either way (`replicate` passes NumPy through off a mesh).
        place = strategy.replicate if strategy.mesh is not None else jax.device_put
        client_state = HostClientState(
            run_key, run_setup.dataset.train.num_clients, engine.clients_per_round, place=place
        )
    num_rounds_per_call = 1 if client_state else rounds_per_call(strategy, config.rounds, config.eval_every)
    num_rounds_per_call = resumed_rounds_per_call(num_rounds_per_call, start_round)
    train = training_input(run_setup, run_key, num_rounds_per_call, first_round=start_round)
    round_fn = compile_rounds(
        monitored(run_setup.algorithms[name].round, released_only=name in PRIVATE_ALGORITHMS),
        num_rounds_per_call,
        cohort_per_round=isinstance(train, CohortStream),
    )
    return client_state, num_rounds_per_call, train, round_fn


def run_algorithm(
    run_setup: Setup,
    name: str,
    *,
    on_evaluation: Callable[[dict[str, Any]], None] | None = None,
    progress: Any = None,
    checkpoints: RunCheckpoints | None = None,
    on_checkpoint: Callable[[int], None] | None = None,
    resume: bool = False,
    on_restore: Callable[[int], None] | None = None,
) -> RunResult:
    """Trains one algorithm for `config.rounds` rounds.

    Args:
      run_setup: from `setup`.
      name: which of its algorithms.
      on_evaluation: called with each evaluation record (e.g. to append it to
        metrics.jsonl as it happens).
      progress: an object with `update(n)` and `set_postfix_str(s)` (a tqdm
        bar), or None.
      checkpoints: where to save checkpoints (when `config.checkpoint_every`
        or `checkpoint_seconds` says, and on SIGINT/SIGTERM), or None.
      on_checkpoint: called with the round after each checkpoint.
      resume: continue from the latest checkpoint in `checkpoints` (if any):
        the result is bit for bit that of the uninterrupted run.
      on_restore: called with the round training continues from (0: the
        start; the latest readable checkpoint's when resuming, which is not
        the latest if that one is damaged), before the first round.

    Returns:
      The `RunResult`; a diverged run's has `summary['status'] == 'diverged'`.

    Raises:
      RunInterrupted: on SIGINT/SIGTERM, after saving a checkpoint.
    """
    config = run_setup.config
    engine = run_setup.engine
    algorithm = run_setup.algorithms[name]
    strategy = engine.strategy
    carry, run_key = initial_carry(run_setup, name)
    start_round, carry, meta = restore_carry(run_setup, carry, checkpoints if resume else None)
    if on_restore is not None:
        on_restore(start_round)
    history: list[dict[str, Any]] = list(meta["history"]) if meta else []
    client_state, num_rounds_per_call, train, round_fn = _compiled_rounds(
        run_setup, name, carry, run_key, start_round
    )
    evaluate = make_evaluator(
        engine.task,
        run_setup.dataset,
        engine.client_weighting,
        corrupted=run_setup.corrupted,
        personal_group=personal_evaluation_group(strategy),
        sample=evaluation_clients(run_setup),
        train=config.eval_train,
        mesh=strategy.mesh,
    )
    latest: dict[str, Any] = {"summaries": {}, "clients": {}}
    if progress is not None and start_round:
        progress.update(start_round)

    def on_evaluate(round_index, state, metrics, health):
        if progress is not None:
            progress.set_postfix_str("evaluating")  # It can take longer than the rounds between.
        summaries, clients = evaluate(state.params, personal_models(algorithm, state))
        latest.update(summaries=summaries, clients=clients)
        record = {
            "algorithm": name,
            "round": round_index,
            **traffic_fields(run_setup, name, round_index, health.client_uploads),
            **clock_fields(state.clock),
            "round_metrics": {k: float(v) for k, v in jax.device_get(metrics).items()},
            **summaries,
        }
        history.append(record)
        if on_evaluation is not None:
            on_evaluation(record)
        if progress is not None:
            progress.set_postfix_str(f"test error {100 * summaries['test_error']['mean']:.1f}%")

    def checkpoint_meta(round_index):
        hparams = {k: float(v) for k, v in jax.device_get(run_setup.hparams[name]).items()}
        return {
            "algorithm": name,
            "history": history,
            "config": config.to_dict(),
            "privacy_spent": privacy_spent(run_setup, name, hparams, round_index),
        }

    checkpointing = (
        Checkpointing.from_config(checkpoints, config, checkpoint_meta, on_checkpoint)
        if checkpoints is not None else None
    )
    diverged = None
    try:
        carry, timing = training_loop(
            round_fn, carry, train, run_key, config, strategy, on_evaluate, progress, num_rounds_per_call,
            start_round=start_round, checkpointing=checkpointing, client_state=client_state,
        )
        state, health = carry[0], host_health(carry[1])
        started = time.perf_counter()
        personal = after_training_models(run_setup, algorithm, state, run_key)
        if personal is not None:
            if not finite_points(personal)[0]:
                raise RunDiverged({"round": config.rounds, "quantity": AFTER_TRAINING}, config.rounds, health)
            summaries, clients = evaluate(state.params, personal)
            latest.update(summaries=summaries, clients=clients)
            spent = time.perf_counter() - started
            timing = dataclasses.replace(timing, evaluation_s=timing.evaluation_s + spent)
    except RunDiverged as error:
        # The carry was donated to the rounds after the last good one: only the host copy is left.
        state, health = None, error.health
        diverged = {"round": error.round, "quantity": error.quantity, "detected_at_round": error.detected_at}
        diverged["last_checkpoint_round"] = checkpoints.latest_round() if checkpoints is not None else None
        timing = LoopTiming(0.0, 0.0, 0.0, 0)
    summary = _final_summary(run_setup, name, latest["summaries"], health, diverged, state, history)
    timing_record = timing_fields(timing, num_rounds_per_call, start_round)
    return RunResult(name, state, history, summary, latest["clients"], timing_record)
