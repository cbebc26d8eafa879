"""The loop over rounds: compiled calls of several rounds, evaluations, checkpoints, stop requests.

The round is jitted once for the whole run with the server state donated;
the loop only dispatches it, so nothing goes back to the host between
evaluations, except where a layout must sync each round.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxfl.data.host import HostPopulation, place_population
from jaxfl.data.population import ClientPopulation
from jaxfl.experiment.checkpoints import RunCheckpoints
from jaxfl.experiment.config import RunConfig
from jaxfl.experiment.health import divergence, host_health
from jaxfl.experiment.interrupts import RunInterrupted, current_request
from jaxfl.experiment.run_setup import Setup
from jaxfl.training.client_state import HostClientState
from jaxfl.training.host_cohorts import CohortStream
from jaxfl.training.strategies import ClientStrategy


@dataclasses.dataclass(frozen=True)
class LoopTiming:
    """Where a training loop's time went (seconds)."""

    compile_s: float  # The first call: compilation plus its rounds.
    train_s: float  # Every later call, evaluations and checkpoints excluded.
    evaluation_s: float
    steady_rounds: int  # The rounds train_s covers.
    checkpoint_s: float = 0.0
    checkpoints: int = 0

    @property
    def rounds_per_s(self) -> float | None:
        return self.steady_rounds / self.train_s if self.steady_rounds and self.train_s > 0 else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "compile_s": self.compile_s,
            "rounds_per_s": self.rounds_per_s,
            "train_s": self.train_s + self.compile_s,
            "evaluation_s": self.evaluation_s,
            "checkpoint_s": self.checkpoint_s,
            "checkpoints_saved": self.checkpoints,
        }


# Rounds fused into one compiled call where that was measured faster: rounds
# sharded over CPU devices, and rounds on a GPU, where dispatching one call per
# round from Python is a large part of a small model's round; on one CPU device
# it made no difference (docs/strategies.md, section "Several rounds per call";
# benchmarks/RESULTS.md, sections
# "Several rounds per compiled call (2026-11-26, `results/cpu-rounds-per-call-2026-11-26.jsonl`)"
# and "NVIDIA H100 80GB HBM3 (JAX 0.11.2, CUDA 13), 2026-11-27: where a round's time goes (issue 27)").
MAX_ROUNDS_PER_CALL = 10


def must_sync_each_round(strategy: ClientStrategy) -> bool:
    """Whether rounds must run one at a time rather than be queued.

    On XLA:CPU, a round sharded over several devices meets its devices at
    collectives; with several rounds queued, a device's thread can start the
    next round while another is still waiting in the previous one, and the
    process hangs (seen at ~400 queued rounds of the label-shift job on 2
    devices: "collective permute ... only 1 of them arrived"). Waiting for
    each round avoids it; on one device, or on GPU/TPU, rounds queue freely.
    """
    return strategy.mesh is not None and jax.default_backend() == "cpu"


def rounds_per_call(strategy: ClientStrategy, rounds: int, eval_every: int) -> int:
    """How many rounds one compiled call runs.

    More than one only where measured faster: rounds sharded over several CPU
    devices (`must_sync_each_round`), and accelerators, where a round of a
    small model is short enough that dispatching each from Python is a
    measurable part of it. Then the largest divisor of both `rounds` and
    `eval_every` up to `MAX_ROUNDS_PER_CALL`, so that every evaluation falls
    between calls and every call has the same length (one compilation).
    """
    if not (must_sync_each_round(strategy) or jax.default_backend() in ("gpu", "tpu")):
        return 1
    common = math.gcd(rounds, eval_every)
    return max(k for k in range(1, MAX_ROUNDS_PER_CALL + 1) if common % k == 0)


def resumed_rounds_per_call(rounds_per_call: int, start_round: int) -> int:
    """Rounds per call for a run resumed at `start_round`: a divisor of both.

    A checkpoint written by a run that fused rounds differently (on another
    backend, say) may lie inside one of this run's calls; the largest common
    divisor still divides the rounds and the evaluation period.
    """
    return math.gcd(rounds_per_call, start_round) if start_round else rounds_per_call


def compile_rounds(round_fn: Callable, num_rounds: int, *, cohort_per_round: bool = False) -> Callable:
    """`num_rounds` rounds of `round_fn` as one jitted call, the old state donated.

    The returned function maps (state, population, key) to (state, metrics
    of the last round). The rounds run in a `lax.scan`, which traces
    `round_fn` once whatever `num_rounds`; each round derives its keys from
    the state's round counter, so K rounds per call give the same result as
    one (tested). With `cohort_per_round`, `population` holds the K rounds'
    gathered cohorts stacked on a leading axis (`CohortStream`), scanned
    along with the rounds.
    """
    if num_rounds == 1:
        return jax.jit(round_fn, donate_argnums=0)

    def rounds(state, population, key):
        if cohort_per_round:
            state, metrics = jax.lax.scan(
                lambda state, cohort: round_fn(state, cohort, key), state, population
            )
        else:
            state, metrics = jax.lax.scan(
                lambda state, _: round_fn(state, population, key), state, length=num_rounds
            )
        return state, jax.tree.map(lambda m: m[-1], metrics)

    return jax.jit(rounds, donate_argnums=0)


def training_input(run_setup: Setup, run_keys: Any, num_rounds_per_call: int, first_round: int = 0) -> Any:
    """What each compiled call receives as its population.

    The training clients replicated as the strategy lays them out, or, for a
    host-resident population, the `CohortStream` that gathers each call's
    cohorts (one per run key when `run_keys` is a batch, as in sweeps). The
    engine's `personal_validation` comes with them as their `held_out` (all N
    clients', or each gathered cohort's own).
    Compile the round with `cohort_per_round=isinstance(result, CohortStream)`;
    `training_loop` closes the stream.
    """
    train = run_setup.dataset.train
    strategy = run_setup.engine.strategy
    held_out = run_setup.engine.personal_validation
    if isinstance(train, HostPopulation):
        return CohortStream(
            train,
            run_keys,
            run_setup.engine.clients_per_round,
            rounds_per_call=num_rounds_per_call,
            first_round=first_round,
            place=strategy.replicate,
            held_out=None if held_out is None else place_population(held_out, "host"),
        )
    if held_out is not None:
        held_out = place_population(held_out, "device")
    return strategy.replicate(dataclasses.replace(train, held_out=held_out))


class RunDiverged(Exception):
    """A single run's health says it diverged (`jaxfl.experiment.health`).

    Attributes:
      round: the first round whose outcome failed a check.
      quantity: what failed, in words.
      detected_at: the round at which the host saw it.
      health: the run's health then (host arrays).
    """

    def __init__(self, diverged: dict[str, Any], detected_at: int, health: dict[str, np.ndarray]):
        super().__init__(f"diverged at round {diverged['round']}: {diverged['quantity']}")
        self.round = diverged["round"]
        self.quantity = diverged["quantity"]
        self.detected_at = detected_at
        self.health = health


@dataclasses.dataclass
class Checkpointing:
    """When and where a training loop saves checkpoints.

    Attributes:
      checkpoints: where they go.
      every_rounds: save every this many rounds; None: by wall time.
      every_seconds: with `every_rounds` None, seconds between saves (0: never
        but on a signal).
      meta: round -> the JSON record saved with the arrays (history, ...).
      on_saved: called with the round after each save (e.g. to update the
        output folder's marker).
    """

    checkpoints: RunCheckpoints
    every_rounds: int | None
    every_seconds: float
    meta: Callable[[int], dict[str, Any]]
    on_saved: Callable[[int], None] | None = None

    @classmethod
    def from_config(cls, checkpoints: RunCheckpoints, config: RunConfig, meta, on_saved=None):
        runtime = config.runtime
        return cls(checkpoints, runtime.checkpoint_every, runtime.checkpoint_seconds, meta, on_saved)

    def due(self, round_index: int, rounds_per_call: int, seconds_since_last: float) -> bool:
        if self.every_rounds is not None:
            # A multiple of every_rounds within this call's rounds.
            return round_index // self.every_rounds > (round_index - rounds_per_call) // self.every_rounds
        return self.every_seconds > 0 and seconds_since_last >= self.every_seconds

    def save(self, round_index: int, carry: Any) -> None:
        self.checkpoints.save(round_index, carry, self.meta(round_index))
        if self.on_saved is not None:
            self.on_saved(round_index)


def training_loop(
    round_fn: Callable,
    carry: Any,
    train: ClientPopulation,
    keys: Any,
    config: RunConfig,
    strategy: ClientStrategy,
    on_evaluate: Callable[[int, Any, Any], None],
    progress: Any = None,
    rounds_per_call: int = 1,
    *,
    start_round: int = 0,
    checkpointing: Checkpointing | None = None,
    stop_on_divergence: bool = True,
    client_state: HostClientState | None = None,
) -> tuple[Any, LoopTiming]:
    """Runs rounds `start_round + 1 .. config.server.rounds`, evaluating every `config.evaluation.eval_every`.

    `round_fn` is a compiled call running `rounds_per_call` rounds of a
    `monitored` round (`compile_rounds`) over the carry `(state, RunHealth)`;
    `train` is the training population, or the `CohortStream` of a
    host-resident one (each call then gets its rounds' gathered cohorts).
    Calls are dispatched without waiting for each other (nothing goes back
    to the host between evaluations and checkpoints) except where
    `must_sync_each_round`. `on_evaluate(round_index, state, metrics, health)` runs
    after the evaluation rounds and the last one; its time is counted apart.

    Between calls the loop saves a checkpoint when `checkpointing` says it is
    due, and stops on SIGINT/SIGTERM (`jaxfl.experiment.interrupts`) after
    saving one, raising `RunInterrupted`. Whenever it waits for the device
    anyway (evaluations, checkpoints, the end) it reads the run's health; a
    diverged single run raises `RunDiverged` before evaluating or saving
    the diverged state (`stop_on_divergence`; a sweep's points go on).

    With `client_state`, the state's per-client rows live in host memory:
    each call (one round) receives its cohort's rows and the loop writes
    them back after it (`jaxfl.training.client_state`).
    """
    if config.server.rounds % rounds_per_call or config.evaluation.eval_every % rounds_per_call:
        raise ValueError(f"rounds_per_call {rounds_per_call} must divide rounds and eval_every")
    if start_round % rounds_per_call:
        raise ValueError(f"start_round {start_round} must be a multiple of rounds_per_call {rounds_per_call}")
    if client_state is not None and rounds_per_call != 1:
        raise ValueError("host-resident client state runs one round per call")
    try:
        return _training_loop(
            round_fn, carry, train, keys, config, strategy, on_evaluate, progress, rounds_per_call,
            start_round, checkpointing, stop_on_divergence, client_state,
        )
    finally:
        if isinstance(train, CohortStream):
            train.close()


def _check_health(carry: Any, round_index: int, stop_on_divergence: bool) -> None:
    if not stop_on_divergence:
        return
    health = host_health(carry[1])
    diverged = divergence(health)
    if diverged is not None:
        raise RunDiverged(diverged, round_index, health)


def _training_loop(
    round_fn, carry, train, keys, config, strategy, on_evaluate, progress, rounds_per_call,
    start_round, checkpointing, stop_on_divergence, client_state,
):
    sync = must_sync_each_round(strategy)
    stop = current_request()
    evaluation_s = compile_s = checkpoint_s = 0.0
    saved = 0
    loop_start = last_save = time.perf_counter()
    first_call = start_round + rounds_per_call
    for round_index in range(first_call, config.server.rounds + 1, rounds_per_call):
        population = train.next_call() if isinstance(train, CohortStream) else train
        if client_state is not None:
            host_rows = carry[0].clients
            carry = (client_state.gather(carry[0], round_index - 1), carry[1])
        carry, metrics = round_fn(carry, population, keys)
        if client_state is not None:
            carry = (client_state.store(carry[0], host_rows, round_index - 1), carry[1])
        if round_index == first_call:
            jax.block_until_ready(carry)
            compile_s = time.perf_counter() - loop_start
        elif sync:
            jax.block_until_ready(carry)
        if progress is not None:
            progress.update(rounds_per_call)
        last = round_index == config.server.rounds
        evaluating = round_index % config.evaluation.eval_every == 0 or last
        stopping = stop is not None and stop.signal is not None and not last
        saving = checkpointing is not None and not last and (
            stopping or checkpointing.due(round_index, rounds_per_call, time.perf_counter() - last_save)
        )
        if evaluating or saving or stopping:
            jax.block_until_ready(carry)
            _check_health(carry, round_index, stop_on_divergence)
        if evaluating:
            evaluation_start = time.perf_counter()
            on_evaluate(round_index, carry[0], metrics, carry[1])
            evaluation_s += time.perf_counter() - evaluation_start
        if saving:
            save_start = time.perf_counter()
            checkpointing.save(round_index, carry)
            last_save = time.perf_counter()
            checkpoint_s += last_save - save_start
            saved += 1
        if stopping:
            if checkpointing is not None:
                checkpointing.checkpoints.wait()
            raise RunInterrupted(stop.signal, round_index, saving)
    if checkpointing is not None:
        checkpointing.checkpoints.wait()
    train_s = time.perf_counter() - loop_start - compile_s - evaluation_s - checkpoint_s
    steady_rounds = config.server.rounds - start_round - rounds_per_call
    return carry, LoopTiming(compile_s, train_s, evaluation_s, steady_rounds, checkpoint_s, saved)
