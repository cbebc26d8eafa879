"""`jaxfl run`: validate everything, train each algorithm, write, print.

The order matters for the "bad input loses nothing" rule: every setting is
checked (including those that depend on the data, and the output directory's
state) before training starts, and results reach the output directory only
when the run has finished (`jaxfl.experiment.run_directory`). Meanwhile the
run's folder `DIR.partial` holds its checkpoints, so `--resume DIR`
continues a run stopped by SIGINT, SIGTERM, a crash or `kill -9`, and ends
bit for bit as the uninterrupted run would have.

Exit statuses: 0 finished, 2 refused settings, 3 diverged
(`jaxfl.experiment.health`), 128 + the signal on SIGINT/SIGTERM
(`jaxfl.experiment.interrupts`).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from jaxfl.experiment.checkpoints import RunCheckpoints
from jaxfl.experiment.config import RunConfig
from jaxfl.experiment.health import EXIT_DIVERGED
from jaxfl.experiment.interrupts import RunInterrupted, stop_on_signals
from jaxfl.experiment.outputs import (
    append_jsonl,
    format_table,
    write_clients_csv,
    write_comparison,
    write_json,
    write_jsonl,
)
from jaxfl.experiment.robustness import attack_record
from jaxfl.experiment.run_directory import OutputDirectory
from jaxfl.experiment.runner import (
    RunResult,
    evaluation_line,
    placement_line,
    run_algorithm,
    saved_personal_models,
    setup,
)
from jaxfl.experiment.saved_model import MODEL_FOLDER, save_model

CHECKPOINTS = "checkpoints"


def write_result(directory: Path, config: RunConfig, result: RunResult, run_setup) -> None:
    """The files of one finished (or diverged) algorithm's run, and its model.

    metrics.jsonl is rewritten from the history, so a resumed run's file is
    byte for byte the uninterrupted run's. summary.json is written last:
    it marks the algorithm finished (`read_result`), so a stop while the
    model is saved resumes from the checkpoint and saves it again.
    """
    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / "config.json", config.to_dict())
    write_jsonl(directory / "metrics.jsonl", result.history)
    if result.clients:
        write_clients_csv(directory / "clients.csv", result.clients)
    write_json(directory / "timing.json", result.timing)
    if result.state is not None:
        save_model_again(
            directory / MODEL_FOLDER, result.state.params, config, run_setup.dataset, result.algorithm,
            personal=saved_personal_models(run_setup.algorithms[result.algorithm], result.state),
        )
    write_json(directory / "summary.json", result.summary)
    if result.state is not None:
        shutil.rmtree(directory / CHECKPOINTS, ignore_errors=True)


def save_model_again(directory: Path, *args, **kwargs) -> None:
    """`save_model` into a folder that a stopped earlier attempt may have left half written."""
    shutil.rmtree(directory, ignore_errors=True)
    save_model(directory, *args, **kwargs)


def read_result(directory: Path, name: str) -> RunResult:
    """A finished algorithm's result read back from its files (for a resumed run's table and rows)."""
    summary = json.loads((directory / "summary.json").read_text())
    timing_path = directory / "timing.json"
    timing = json.loads(timing_path.read_text()) if timing_path.exists() else {}
    history = [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines() if line]
    # Its files are written already: only the summary and the timing are read again.
    return RunResult(name, None, history, summary, {}, timing)


def truncate_metrics(path: Path, last_round: int | None) -> None:
    """Keeps the evaluation records up to the checkpoint a run resumes from.

    A killed run may have written records after its last checkpoint, and its
    last line may be cut short; both go (the resumed run writes them again).
    """
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            break
        if last_round is None or record.get("round", 0) > last_round:
            break
        kept.append(line + "\n")
    path.write_text("".join(kept))


def sampling_secrecy(config: RunConfig) -> str:
    """What the observer's epsilon assumes of the cohort sampling, and whether this run's holds it."""
    runtime = config.runtime
    if runtime.seed_drawn:
        return "its seed was drawn from the OS: keep config.json private"
    return (
        f"the seed {runtime.seed} was given: it fixes the cohorts and the noise, so neither epsilon holds "
        "against whoever knows it; leave --seed unset to draw a secret one"
    )


def composition_note(releases: int) -> str | None:
    """The line that says several DP releases of the same clients' data compose (None for one)."""
    if releases < 2:
        return None
    return (
        f"jaxfl: note: {releases} models trained with DP on the same clients' data are released: together "
        "they are at most (sum of their epsilons, sum of their deltas)-DP, for each trust model"
    )


def format_privacy(name: str, privacy: dict, config: RunConfig) -> str:
    """One line: the (epsilon, delta) a DP run spent against each trust model, and how it was counted."""
    noise = (
        f"calibrated against the {privacy['trust_model']}" if privacy.get("target_epsilon") is not None
        else "given: epsilon only reported"
    )
    return (
        f"{name}: spent ({privacy['epsilon_against_observer']:.3f}, {privacy['delta']:.3g})-DP against an "
        f"observer of the released models (secret sampling, amplified) and "
        f"({privacy['epsilon_against_server']:.3f}, {privacy['delta']:.3g})-DP against the server (no "
        f"amplification), {privacy.get('unit', 'client')}-level, over {privacy['rounds']} rounds: noise "
        f"multiplier {privacy['noise_multiplier']:.4g} ({noise}), "
        f"sampling rate {privacy['sampling_rate']:.4g}, RDP accountant (dp-accounting); secret sampling "
        f"assumed: {sampling_secrecy(config)}"
    )


def describe_divergence(name: str, diverged: dict[str, Any], checkpoints: Path | None) -> str:
    """The one-line message of a diverged run."""
    where = ""
    if diverged.get("last_checkpoint_round") is not None and checkpoints is not None:
        where = f"; last finite checkpoint: round {diverged['last_checkpoint_round']} in {checkpoints}"
    return (
        f"jaxfl: error: {name} diverged at round {diverged['round']}: {diverged['quantity']} "
        f"(seen at round {diverged.get('detected_at_round', diverged['round'])}){where}; "
        "lower the learning rates or clip"
    )


def warn_empty_rounds(name: str, summary: dict[str, Any]) -> None:
    """A warning when most rounds trained nothing (no client got weight)."""
    # An asynchronous algorithm's first steps only start clients (`warmup_steps`).
    warmup = min(summary.get("warmup_steps", 0), summary.get("rounds_without_weight", 0))
    empty, rounds = summary.get("rounds_without_weight", 0) - warmup, summary.get("rounds", 0) - warmup
    if rounds > 0 and empty * 2 > rounds:
        print(
            f"jaxfl: warning: {name}: no client got weight in {empty} of {rounds} rounds (stragglers or "
            "filtering dropped every client): the model did not move in those rounds",
            file=sys.stderr,
        )


def run_main(config: RunConfig, *, resume: bool = False) -> int:
    """Runs the configured algorithms; returns the process exit status.

    With `resume`, `config` is the saved one of `config.runtime.out`'s unfinished
    run, whose finished algorithms are read back and whose others continue
    from their latest checkpoints.
    """
    output = None
    if config.runtime.out is not None:
        output = OutputDirectory(config.runtime.out, overwrite=config.runtime.overwrite, resuming=resume)
    run_setup = setup(config)
    names = config.algorithms
    print(run_header(run_setup, config), flush=True)
    staging = None
    if output is not None:
        staging = output.start(resume=resume, rounds=config.server.rounds, config=config.to_dict())
    results: dict[str, RunResult] = {}
    current = None
    try:
        with stop_on_signals():
            for name in names:
                current = name
                results[name] = _run_one(run_setup, name, staging, output, resume)
        diverged = {name: r.diverged for name, r in results.items() if r.diverged}
        if staging is not None:
            if len(names) > 1:
                write_comparison(staging, {name: r.summary for name, r in results.items()})
            output.commit("diverged" if diverged else "finished")
    except RunInterrupted as stop:
        return _interrupted(output, config, current, stop)
    except BaseException as error:
        if output is not None:
            if staging is not None and any((staging / d).is_dir() for d in _checkpoint_dirs(names)):
                # Resumable from its last checkpoint.
                output.keep("interrupted" if isinstance(error, KeyboardInterrupt) else "failed")
            else:
                output.abandon()
        raise
    _print_results(run_setup, config, results)
    for name, info in diverged.items():
        checkpoints = _directory(output.path, names, name) / CHECKPOINTS if output is not None else None
        print(describe_divergence(name, info, checkpoints), file=sys.stderr)
    if output is not None:
        print(f"results in {output.path}")
    return EXIT_DIVERGED if diverged else 0


def _directory(root: Path, names: list[str], name: str) -> Path:
    return root if len(names) == 1 else root / name


def _checkpoint_dirs(names: list[str]) -> list[str]:
    return [CHECKPOINTS] if len(names) == 1 else [f"{name}/{CHECKPOINTS}" for name in names]


def _run_one(run_setup, name: str, staging: Path | None, output, resume: bool) -> RunResult:
    config = run_setup.config
    names = config.algorithms
    directory = _directory(staging, names, name) if staging is not None else None
    if directory is not None and resume and (directory / "summary.json").exists():
        return read_result(directory, name)
    checkpoints = None
    on_evaluation = on_checkpoint = None
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        checkpoints = RunCheckpoints(directory / CHECKPOINTS, keep=config.runtime.keep_checkpoints)
        metrics_path = directory / "metrics.jsonl"
        if not resume:
            truncate_metrics(metrics_path, None)

        def on_evaluation(record):
            append_jsonl(metrics_path, record)

        def on_checkpoint(round_index):
            output.update(round=round_index, algorithm=name)

    try:
        with tqdm(
            total=config.server.rounds, desc=name, unit="round", disable=not config.runtime.progress,
            file=sys.stderr, dynamic_ncols=True,
        ) as bar:
            result = run_algorithm(
                run_setup, name, on_evaluation=on_evaluation, progress=bar,
                checkpoints=checkpoints, on_checkpoint=on_checkpoint, resume=resume,
                # The records past the round it continues from go: that of the checkpoint it restores.
                on_restore=None if directory is None else lambda start: truncate_metrics(metrics_path, start),
            )
    finally:
        if checkpoints is not None:
            checkpoints.close()
    warn_empty_rounds(name, result.summary)
    if directory is not None:
        algorithm_config = config
        if len(names) > 1:
            algorithm_config = config.replace(algorithm=name)
        write_result(directory, algorithm_config, result, run_setup)
    return result


def _interrupted(output, config: RunConfig, name: str | None, stop: RunInterrupted) -> int:
    if output is None:
        print(
            f"jaxfl: interrupted at round {stop.round} of {config.server.rounds} ({name}); nothing saved "
            "(no --out)",
            file=sys.stderr,
        )
    else:
        output.keep("interrupted", round=stop.round, algorithm=name)
        print(
            f"jaxfl: interrupted at round {stop.round} of {config.server.rounds} ({name}); checkpoint in "
            f"{output.staging}; continue with: jaxfl run --resume {output.path}",
            file=sys.stderr,
        )
    return 128 + stop.signal_number


def run_header(run_setup, config: RunConfig) -> str:
    """What is about to run, printed before it runs: data, layout, algorithms, attack and aggregator."""
    dataset = run_setup.dataset
    lines = [
        f"{config.data.dataset}: {dataset.train.num_clients} training / "
        f"{dataset.test.num_clients} test clients, {config.server.rounds} rounds, "
        f"{config.server.clients_per_round} clients per round, strategy "
        f"{run_setup.engine.strategy.describe()}",
        placement_line(run_setup),
    ]
    robustness = []
    attack = attack_record(config, run_setup.corrupted)
    if attack is not None:
        data = f" and {attack['attack_data']} data" if attack["attack_data"] else ""
        robustness.append(
            f"attack {attack['attack']}{data} by {attack['corrupted_clients']} corrupted clients; "
            "summaries over the benign ones"
        )
    if config.robustness.aggregator != "mean":
        robustness.append(f"aggregator {config.robustness.aggregator}")
    details = f": {'; '.join(robustness)}" if robustness else ""
    lines.append(f"running {', '.join(config.algorithms)}{details}")
    sampled = evaluation_line(run_setup)
    if sampled is not None:
        lines.append(sampled)
    return "\n".join(lines)


def timing_text(timing: dict[str, Any]) -> str:
    """Compilation, training and evaluation apart: the first call compiles and runs its rounds too."""
    rounds = int(timing.get("rounds_per_call") or 1)
    first = f"first call {timing.get('compile_s', 0.0):.1f} s "
    first += f"(compiling, and {rounds} round{'s' * (rounds > 1)})"
    training = timing.get("train_s", 0.0) - timing.get("compile_s", 0.0)
    return f"{first}, later rounds {training:.1f} s, evaluation {timing.get('evaluation_s', 0.0):.1f} s"


def _megabytes(count: int) -> str:
    return f"{count / 1e6:.3g} MB"


def traffic_text(summary: dict) -> str | None:
    """'X MB sent up (code: Y bytes per update, Z times smaller), W MB down', or None without a count."""
    if "bytes_up" not in summary:
        return None
    text = f"{_megabytes(summary['bytes_up'])} sent up"
    code = summary.get("compression")
    if code is not None:
        ratio = code["uncompressed_update_bytes"] / code["update_bytes"]
        text += f" ({code['compressor']}: {code['update_bytes']:,} bytes per update, {ratio:.3g}x smaller)"
    return f"{text}, {_megabytes(summary['bytes_down'])} down"


def _print_results(run_setup, config: RunConfig, results: dict[str, RunResult]) -> None:
    finished = {name: r.summary for name, r in results.items() if not r.diverged}
    if finished:
        print(format_table(finished))
    for name, result in results.items():
        if result.diverged:
            print(f"{name}: diverged at round {result.diverged['round']}")
            continue
        speed = result.timing.get("rounds_per_s")
        speed_text = f"{speed:.1f} rounds/s" if speed else "n/a"
        print(f"{name}: {speed_text}; {timing_text(result.timing)}")
    if config.communication.compression is not None:
        for name, result in results.items():
            line = traffic_text(result.summary)
            if line is not None:
                print(f"{name}: {line}")
    private = [name for name, result in results.items() if "privacy" in result.summary]
    for name in private:
        privacy = results[name].summary["privacy"]
        print(format_privacy(name, privacy, config))
        quantile = privacy.get("quantile", {})
        if quantile.get("selected_count_public"):
            print(f"{name}: divides by {quantile['divisor']}; assumes {quantile['assumption']}")
    note = composition_note(len(private))
    if note is not None:
        print(note)
