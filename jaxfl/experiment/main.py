"""`jaxfl run`: validate everything, train each algorithm, write, print.

The order matters for the "bad input loses nothing" rule: every setting is
checked (including those that depend on the data, and the output directory's
state) before training starts, and results reach the output directory only
when the run has finished (see `jaxfl.experiment.outputs`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from tqdm import tqdm

from jaxfl.experiment.config import RunConfig
from jaxfl.experiment.outputs import (
    OutputDirectory,
    append_jsonl,
    format_table,
    write_clients_csv,
    write_comparison,
    write_json,
)
from jaxfl.experiment.runner import RunResult, placement_line, run_algorithm, setup


def _write_run(directory: Path, config: RunConfig, result: RunResult) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / "config.json", config.to_dict())
    write_clients_csv(directory / "clients.csv", result.clients)
    write_json(directory / "summary.json", result.summary)


def format_privacy(name: str, privacy: dict) -> str:
    """One line: the (epsilon, delta) a DP run spent, and how it was counted."""
    return (
        f"{name}: spent ({privacy['epsilon']:.3f}, {privacy['delta']:.3g})-DP "
        f"(client-level) over {privacy['rounds']} rounds: noise multiplier "
        f"{privacy['noise_multiplier']:.4g}, sampling rate "
        f"{privacy['sampling_rate']:.4g}, RDP accountant (dp-accounting)"
    )


def run_main(config: RunConfig) -> int:
    """Runs the configured algorithms; returns the process exit status."""
    run_setup = setup(config)
    output = (
        OutputDirectory(config.out, overwrite=config.overwrite) if config.out else None
    )
    names = config.algorithms
    staging = output.open() if output is not None else None
    try:
        results = {}
        for name in names:
            directory = None
            if staging is not None:
                directory = staging if len(names) == 1 else staging / name
                directory.mkdir(parents=True, exist_ok=True)
            metrics_path = directory / "metrics.jsonl" if directory else None
            on_evaluation = (
                (lambda record, path=metrics_path: append_jsonl(path, record))
                if metrics_path
                else None
            )
            with tqdm(
                total=config.rounds,
                desc=name,
                unit="round",
                disable=not config.progress,
                file=sys.stderr,
                dynamic_ncols=True,
            ) as bar:
                result = run_algorithm(
                    run_setup, name, on_evaluation=on_evaluation, progress=bar
                )
            results[name] = result
            if directory is not None:
                algorithm_config = RunConfig(
                    **{**config.to_dict(), "algorithm": name,
                       "hidden_sizes": config.hidden_sizes}
                ) if len(names) > 1 else config
                _write_run(directory, algorithm_config, result)
        summaries = {name: result.summary for name, result in results.items()}
        if staging is not None:
            if len(names) > 1:
                write_json(staging / "config.json", config.to_dict())
                write_comparison(staging, summaries)
            output.commit()
    except BaseException:
        if output is not None:
            output.abandon()
        raise
    dataset = run_setup.dataset
    print(
        f"{config.dataset}: {dataset.train.num_clients} training / "
        f"{dataset.test.num_clients} test clients, {config.rounds} rounds, "
        f"{config.clients_per_round} clients per round, strategy "
        f"{run_setup.engine.strategy.describe()}"
    )
    print(placement_line(run_setup))
    print(format_table(summaries))
    for name, summary in summaries.items():
        speed = summary["rounds_per_s"]
        speed_text = f"{speed:.1f} rounds/s" if speed else "n/a"
        print(f"{name}: {speed_text} after {summary['compile_s']:.1f} s of compilation")
    for name, summary in summaries.items():
        if "privacy" in summary:
            print(format_privacy(name, summary["privacy"]))
    if output is not None:
        print(f"results in {output.path}")
    return 0
