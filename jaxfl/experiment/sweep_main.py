"""`jaxfl sweep`: a grid of settings, each numeric sub-grid one compiled function.

    jaxfl sweep --algorithm deltafl --grid theta=0.1,0.5,0.8 --grid seed=0,1,2 \
                --grid batch_size=10,20 --out runs/sweep

Grid names are run settings. Numeric hyperparameters of the algorithm (those
in `ServerState.hparams`, e.g. lr, l2, theta, mu, q, tilt), `server_lr` and
`seed` vary inside one vmapped, once-compiled round; every other setting
(shapes such as clients_per_round, batch_size, local_epochs, and static
options such as reweighting) varies in an outer loop, one compilation per
combination.

`--out DIR` receives `results.csv` (one row per grid point: its settings,
its status and the summaries of its test error and training loss) and
`points/NNN/` per point with the files of a single run;
`points/NNN/config.json` is the equivalent single-run configuration
(`jaxfl run --config` runs it; its results agree with the sweep's point up to
float rounding, as the vmapped round batches the arithmetic differently).
While it runs, `DIR.partial/checkpoints/group-NNN/` holds the checkpoints of
each outer combination; `jaxfl sweep --resume DIR` continues an unfinished
sweep, skipping the combinations that finished.
"""

from __future__ import annotations

import csv
import itertools
import shutil
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from tqdm import tqdm

from jaxfl.experiment.checkpoints import RunCheckpoints
from jaxfl.experiment.checks import check_grid_points, check_round_fits
from jaxfl.experiment.config import FIELDS, ConfigError, RunConfig, check_value, held_warnings
from jaxfl.experiment.health import EXIT_DIVERGED
from jaxfl.experiment.interrupts import RunInterrupted, stop_on_signals
from jaxfl.experiment.lambda_selection import select_lambda_per_client
from jaxfl.experiment.main import (
    CHECKPOINTS,
    composition_note,
    read_result,
    sampling_secrecy,
    save_model_again,
    truncate_metrics,
    warn_empty_rounds,
)
from jaxfl.experiment.outputs import (
    TABLE_COLUMNS,
    append_jsonl,
    write_clients_csv,
    write_json,
    write_jsonl,
)
from jaxfl.experiment.run_directory import OutputDirectory
from jaxfl.experiment.runner import evaluation_line, placement_line, saved_personal_models, setup
from jaxfl.experiment.saved_model import MODEL_FOLDER
from jaxfl.experiment.sweep import SERVER_LR, SweepPoint, check_client_state, run_sweep

# Settings that are traced in the round (vmapped) when the algorithm takes them.
VMAPPED_EXTRA = (SERVER_LR, "seed")


# Settings a grid cannot vary, and why (docs/reliability.md).
NOT_GRIDDED = {
    "algorithm": "a sweep runs one algorithm; run one sweep per algorithm",
    "task": "a preset sets many settings at once; run one sweep per task",
    "dataset_options": "a table of options; run one sweep per value (--dataset-option KEY=VALUE)",
    "hidden_sizes": "a list of widths; run one sweep per value (config file key hidden_sizes)",
    "out": "the sweep's output directory is one for all points",
    "overwrite": "it is about the output directory, one for all points",
    "progress": "it changes the display, not the points",
    "checkpoint_every": "checkpoints do not change the points' results",
    "checkpoint_seconds": "checkpoints do not change the points' results",
    "keep_checkpoints": "checkpoints do not change the points' results",
}


def parse_grid(items: Sequence[str]) -> dict[str, list[Any]]:
    """Reads `NAME=V1,V2,...` items into setting -> list of checked values."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        name, sep, values = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not values.strip():
            raise ConfigError(f"--grid must be NAME=V1,V2,..., got {item!r}")
        if name not in FIELDS:
            raise ConfigError(
                f"--grid: unknown setting {name!r}; valid settings: {', '.join(sorted(FIELDS))}"
            )
        if name in grid:
            raise ConfigError(f"--grid: {name} is given twice")
        if name in NOT_GRIDDED:
            raise ConfigError(f"--grid cannot vary {name}: {NOT_GRIDDED[name]}")
        kind = str(FIELDS[name].type)
        parsed = []
        for text in values.split(","):
            text = text.strip()
            value: Any = text
            try:
                if kind.startswith("int"):
                    value = int(text)
                elif kind.startswith("float"):
                    value = float(text)
            except ValueError:
                pass  # check_value names the expected type and range.
            parsed.append(check_value(name, value))
        repeated = [v for i, v in enumerate(parsed) if v in parsed[:i]]
        if repeated:
            raise ConfigError(f"--grid: {name} lists {repeated[0]!r} twice (each point runs once)")
        grid[name] = parsed
    return grid


def _points(grid: Mapping[str, list[Any]]) -> list[dict[str, Any]]:
    names = list(grid)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*grid.values())]


def run_sweep_main(config: RunConfig, grid: Mapping[str, list[Any]], *, resume: bool = False) -> int:
    """Runs the grid; returns the exit status (3 when a point diverged).

    With `resume`, `config` and `grid` are the saved ones of `config.runtime.out`'s
    unfinished sweep: groups whose points finished are read back, the
    others continue from their latest checkpoints.
    """
    runtime = config.runtime
    if len(config.algorithms) != 1:
        raise ConfigError("sweep runs one algorithm; give a single --algorithm")
    name = config.algorithms[0]
    if not grid:
        raise ConfigError("sweep needs at least one --grid NAME=V1,V2,...")
    output = (
        OutputDirectory(runtime.out, overwrite=runtime.overwrite, command="sweep", resuming=resume)
        if runtime.out is not None else None
    )
    # Validate every outer combination (and the algorithm) before training;
    # warnings are printed once every point passed.
    with held_warnings():
        base_setup = setup(config)
        check_client_state(base_setup, name)
        traced = set(base_setup.algorithms[name].hparam_defaults) | set(VMAPPED_EXTRA)
        inner = {k: v for k, v in grid.items() if k in traced}
        outer = {k: v for k, v in grid.items() if k not in traced}
        outer_points = _points(outer)
        setups = []
        for static in outer_points:
            static_config = config.replace(**static)
            setups.append(base_setup if not static else setup(static_config))
        check_grid_points(config, grid, base_setup, name)
        # `setup` sized one point; a group's points train together in one vmapped round.
        for run_setup in setups:
            engine = run_setup.engine
            check_round_fits(
                run_setup.config, engine.task, run_setup.dataset, engine.local, engine.strategy,
                num_points=len(_points(inner)),
            )
    staging = None
    if output is not None:
        record = {**config.to_dict(), "grid": dict(grid)}
        staging = output.start(resume=resume, rounds=config.server.rounds, config=record)

    rows = []
    diverged = []
    try:
        with stop_on_signals():
            index = 0
            total = len(outer_points) * len(_points(inner))
            for group, (static, run_setup) in enumerate(zip(outer_points, setups, strict=True)):
                inner_points = _points(inner)
                results = _run_group(
                    run_setup, name, static, inner_points, index, group, staging, output, resume
                )
                for offset, (p, result) in enumerate(zip(inner_points, results, strict=True)):
                    rows.append(_result_row({"point": index + offset, **static, **p}, result.summary))
                    if result.diverged:
                        diverged.append((index + offset, result.diverged))
                if "lam" in inner:
                    point_rows = rows[-len(results):]
                    rows.extend(_lambda_per_client_rows(point_rows, inner_points, results, staging, group))
                index += len(inner_points)
        if staging is not None:
            columns = list(dict.fromkeys(k for row in rows for k in row))
            with (staging / "results.csv").open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=columns)
                writer.writeheader()
                writer.writerows(rows)
            # Each group removed its own; the folder that held them goes too, as a single run's does.
            shutil.rmtree(staging / CHECKPOINTS, ignore_errors=True)
            output.commit("diverged" if diverged else "finished")
    except RunInterrupted as stop:
        if output is not None:
            output.keep("interrupted", round=stop.round)
            where = f"checkpoint in {output.staging}; continue with: jaxfl sweep --resume {output.path}"
        else:
            where = "nothing saved (no --out)"
        print(f"jaxfl: interrupted at round {stop.round} of {config.server.rounds}; {where}", file=sys.stderr)
        return 128 + stop.signal_number
    except BaseException as error:
        if output is not None:
            if staging is not None and (staging / CHECKPOINTS).is_dir():
                output.keep("interrupted" if isinstance(error, KeyboardInterrupt) else "failed")
            else:
                output.abandon()
        raise
    _print_sweep(base_setup, rows, grid, total, diverged)
    if output is not None:
        print(f"results in {output.path}")
    return EXIT_DIVERGED if diverged else 0


def _result_row(row: dict[str, Any], summary: Mapping[str, Any]) -> dict[str, Any]:
    """A point's results.csv row: `row` (its number and grid values), then what its summary holds."""
    row = {**row, "status": summary["status"]}
    for key, column in TABLE_COLUMNS:
        row[f"test_error_{column}"] = summary.get("test_error", {}).get(key)
    row["train_loss_mean"] = summary.get("train_loss", {}).get("mean")
    # Personal models (ditto): on the clients' own test data, else on their training data.
    personal = summary.get("personal_test_error") or summary.get("personal_train_error")
    if personal is not None:
        where = "test" if "personal_test_error" in summary else "train"
        for key, column in TABLE_COLUMNS:
            row[f"personal_{where}_error_{column}"] = personal.get(key)
    row.update(privacy_columns(summary.get("privacy")))
    # Accuracy against communication (jaxfl.communication.traffic).
    row.update({k: summary[k] for k in ("bytes_up", "bytes_down") if k in summary})
    return row


def _print_sweep(base_setup, rows: list[dict], grid, total: int, diverged: list) -> None:
    """What a finished sweep prints: where it ran, its table, the privacy notes, the diverged points."""
    print(placement_line(base_setup))
    evaluated = evaluation_line(base_setup)
    if evaluated is not None:
        print(evaluated)
    _print_rows(rows, grid, total)
    private = [row for row in rows if any(key.startswith("privacy_") for key in row)]
    if private:
        secrecy = sampling_secrecy(base_setup.config)
        print(f"jaxfl: note: secret sampling assumed by the observer's epsilons: {secrecy}")
        if "seed" in grid:
            print("jaxfl: note: the grid's seeds are given, hence public: they fix those points' cohorts "
                  "and noise, so neither epsilon holds against whoever knows them")
        note = composition_note(len(private))
        if note is not None:
            print(note)
    for point, info in diverged:
        print(
            f"jaxfl: error: point {point} diverged at round {info['round']}: {info['quantity']}",
            file=sys.stderr,
        )


PRIVACY_COLUMNS = (
    "epsilon", "trust_model", "epsilon_against_observer", "epsilon_against_server", "delta",
    "noise_multiplier", "sampling_rate",
)


def privacy_columns(privacy: Mapping[str, Any] | None) -> dict[str, Any]:
    """What a DP point spent, as results.csv columns (none for other algorithms)."""
    if privacy is None:
        return {}
    return {f"privacy_{key}": privacy[key] for key in PRIVACY_COLUMNS if key in privacy}


def point_config(config: RunConfig, name: str, point: Mapping[str, Any]) -> RunConfig:
    """The single run a sweep point is: its settings, and no output folder of the sweep's."""
    return config.replace(
        algorithm=name, out=None, overwrite=False,
        **{k: v for k, v in point.items() if k in FIELDS},
    )


def _run_group(run_setup, name, static, inner_points, first, group, staging, output, resume):
    """Trains one outer combination's points together (one compiled round); writes their files."""
    config = run_setup.config
    directories = [
        staging / "points" / f"{first + offset:03d}" if staging is not None else None
        for offset in range(len(inner_points))
    ]
    if staging is not None and resume and all((d / "summary.json").exists() for d in directories):
        return [read_result(d, name) for d in directories]
    points = [
        SweepPoint(
            hparams={k: float(v) for k, v in p.items() if k != "seed"},
            seed=int(p.get("seed", config.runtime.seed)),
        )
        for p in inner_points
    ]
    checkpoints = None
    on_checkpoint = None
    if staging is not None:
        checkpoints = RunCheckpoints(
            staging / CHECKPOINTS / f"group-{group:03d}", keep=config.runtime.keep_checkpoints
        )
        for directory, p in zip(directories, inner_points, strict=True):
            directory.mkdir(parents=True, exist_ok=True)
            write_json(directory / "config.json", point_config(config, name, {**static, **p}).to_dict())
            if not resume:
                truncate_metrics(directory / "metrics.jsonl", None)

        def on_checkpoint(round_index):
            output.update(round=round_index, group=group)

    def on_evaluation(g, record):
        if directories[g] is not None:
            append_jsonl(directories[g] / "metrics.jsonl", record)

    label = ", ".join(f"{k}={v}" for k, v in static.items()) or name
    try:
        with tqdm(
            total=config.server.rounds, desc=f"{label} ({len(points)} points)", unit="round",
            disable=not config.runtime.progress, file=sys.stderr, dynamic_ncols=True,
        ) as bar:
            results = run_sweep(
                run_setup, name, points, on_evaluation=on_evaluation, progress=bar,
                checkpoints=checkpoints, on_checkpoint=on_checkpoint, resume=resume,
                on_restore=lambda start: [
                    truncate_metrics(d / "metrics.jsonl", start) for d in directories if d is not None
                ],
            )
    finally:
        if checkpoints is not None:
            checkpoints.close()
    for offset, (directory, result, p) in enumerate(
        zip(directories, results, inner_points, strict=True)
    ):
        warn_empty_rounds(f"point {first + offset}", result.summary)
        if directory is not None:
            write_jsonl(directory / "metrics.jsonl", result.history)
            write_json(directory / "timing.json", result.timing)
            if result.clients:
                write_clients_csv(directory / "clients.csv", result.clients)
            if not result.diverged:
                # As a single run saves its model: the global one, and the personal ones if any.
                save_model_again(
                    directory / MODEL_FOLDER,
                    result.state.params,
                    point_config(config, name, {**static, **p}),
                    run_setup.dataset,
                    name,
                    personal=saved_personal_models(run_setup.algorithms[name], result.state),
                )
            # Last: a group whose points all have one is finished (a resumed sweep reads it back).
            write_json(directory / "summary.json", result.summary)
    if checkpoints is not None:
        shutil.rmtree(checkpoints.directory, ignore_errors=True)
    return results


def _lambda_per_client_rows(point_rows, inner_points, results, staging, group: int) -> list[dict[str, Any]]:
    """Ditto sweeps over `lam`: one more row per setting of the other axes, each client's lambda
    chosen on its own validation data (`jaxfl.experiment.lambda_selection`), and its choices in
    `lambda-per-client-<group>.csv`.
    """
    partitions: dict[tuple, list[int]] = {}
    for i, point in enumerate(inner_points):
        key = tuple(sorted((k, v) for k, v in point.items() if k != "lam"))
        partitions.setdefault(key, []).append(i)
    rows = []
    for number, members in enumerate(partitions.values()):
        selection = select_lambda_per_client(
            [(float(inner_points[i]["lam"]), results[i].clients) for i in members]
        )
        if selection is None:
            continue
        # The global model does not depend on lambda: the first point's columns hold for it.
        row = {**point_rows[members[0]], "point": "-", "lam": "per-client"}
        row = {k: v for k, v in row.items() if not k.startswith("personal_")}
        for key, column in TABLE_COLUMNS:
            row[f"personal_test_error_{column}"] = selection["summary"][key]
        rows.append(row)
        if staging is not None:
            with (staging / f"lambda-per-client-{group}-{number}.csv").open("w", newline="") as f:
                writer = csv.writer(f)
                writer.writerow(
                    ["client", "lam", "validation_personal_loss", "test_personal_error", "attacked"]
                )
                attacked = selection["attacked"]
                for k, (lam, loss, error) in enumerate(zip(
                    selection["lam"], selection["validation_loss"], selection["test_error"], strict=True
                )):
                    flag = "" if attacked is None else int(attacked[k])
                    writer.writerow([k, f"{lam:g}", f"{loss:.6g}", f"{error:.6g}", flag])
    return rows


def _print_rows(rows: list[dict[str, Any]], grid: Mapping[str, list[Any]], total: int) -> None:
    names = list(grid)
    personal = next(
        (k for row in rows for k in row if k.startswith("personal_") and k.endswith("_error_mean")), None
    )
    # The train loss where the training clients were evaluated (--eval-train).
    train = any(row.get("train_loss_mean") is not None for row in rows)
    header = ["point", *names, "test err mean %", "p90 %", "sq90 %", *["train loss"] * train]
    if personal is not None:
        header.append("personal err mean %")
    lines = [header]
    for row in rows:
        lines.append(
            [str(row["point"])]
            + [f"{row[n]:g}" if isinstance(row[n], float) else str(row[n]) for n in names]
            + [
                f"{100 * row['test_error_mean']:.2f}",
                f"{100 * row['test_error_p90']:.2f}",
                f"{100 * row['test_error_sq90']:.2f}",
            ]
            + ([] if not train else [
                "n/a" if row.get("train_loss_mean") is None else f"{row['train_loss_mean']:.4f}"
            ])
            + ([] if personal is None else [
                "" if row.get(personal) is None else f"{100 * row[personal]:.2f}"
            ])
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    print(f"sweep of {total} points")
    for line in lines:
        print("  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)))
