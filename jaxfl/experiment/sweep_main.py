"""`jaxfl sweep`: a grid of settings, each numeric sub-grid one compiled function.

    jaxfl sweep --algorithm deltafl --grid theta=0.1,0.5,0.8 --grid seed=0,1,2 \
                --grid batch_size=10,20 --out runs/sweep

Grid names are run settings. Numeric hyperparameters of the algorithm (those
in `ServerState.hparams`, e.g. lr, l2, theta, mu, q, tilt), `server_lr` and
`seed` vary inside one vmapped, once-compiled round; every other setting
(shapes such as clients_per_round, batch_size, local_epochs, and static
options such as reweighting) varies in an outer loop, one compilation per
combination.

`--out DIR` receives `results.csv` (one row per grid point: its settings and
the summaries of its test error and training loss) and `points/NNN/` per
point with the four files of a single run; `points/NNN/config.json` is the
equivalent single-run configuration (`jaxfl run --config` reproduces it).
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from tqdm import tqdm

from jaxfl.experiment.config import FIELDS, ConfigError, RunConfig, check_value
from jaxfl.experiment.outputs import (
    TABLE_COLUMNS,
    OutputDirectory,
    append_jsonl,
    write_clients_csv,
    write_json,
)
from jaxfl.experiment.runner import placement_line, setup
from jaxfl.experiment.sweep import SERVER_LR, SweepPoint, run_sweep

# Settings that are traced in the round (vmapped) when the algorithm takes them.
VMAPPED_EXTRA = (SERVER_LR, "seed")


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
        grid[name] = parsed
    return grid


def _points(grid: Mapping[str, list[Any]]) -> list[dict[str, Any]]:
    names = list(grid)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*grid.values())]


def run_sweep_main(config: RunConfig, grid: Mapping[str, list[Any]]) -> int:
    """Runs the grid; returns the exit status."""
    if len(config.algorithms) != 1:
        raise ConfigError("sweep runs one algorithm; give a single --algorithm")
    name = config.algorithms[0]
    if not grid:
        raise ConfigError("sweep needs at least one --grid NAME=V1,V2,...")
    # Validate every outer combination (and the algorithm) before training.
    base_setup = setup(config)
    traced = set(base_setup.algorithms[name].hparam_defaults) | set(VMAPPED_EXTRA)
    inner = {k: v for k, v in grid.items() if k in traced}
    outer = {k: v for k, v in grid.items() if k not in traced}
    outer_points = _points(outer)
    setups = []
    for static in outer_points:
        static_config = dataclasses.replace(config, **static)
        setups.append(base_setup if not static else setup(static_config))
    output = OutputDirectory(config.out, overwrite=config.overwrite) if config.out else None
    staging = output.open() if output is not None else None

    rows = []
    try:
        index = 0
        total = len(outer_points) * len(_points(inner))
        for static, run_setup in zip(outer_points, setups, strict=True):
            inner_points = _points(inner)
            points = [
                SweepPoint(
                    hparams={k: float(v) for k, v in p.items() if k != "seed"},
                    seed=int(p.get("seed", config.seed)),
                )
                for p in inner_points
            ]
            first = index
            directories = []
            for offset, p in enumerate(inner_points):
                directory = staging / "points" / f"{first + offset:03d}" if staging else None
                if directory is not None:
                    directory.mkdir(parents=True)
                    point_config = dataclasses.replace(
                        run_setup.config,
                        algorithm=name,
                        **{k: v for k, v in p.items() if k in FIELDS},
                    )
                    write_json(directory / "config.json", point_config.to_dict())
                directories.append(directory)

            def on_evaluation(g, record, directories=directories):
                if directories[g] is not None:
                    append_jsonl(directories[g] / "metrics.jsonl", record)

            label = ", ".join(f"{k}={v}" for k, v in static.items()) or name
            with tqdm(
                total=config.rounds, desc=f"{label} ({len(points)} points)", unit="round",
                disable=not config.progress, file=sys.stderr, dynamic_ncols=True,
            ) as bar:
                results = run_sweep(run_setup, name, points, on_evaluation=on_evaluation, progress=bar)
            for offset, (p, result) in enumerate(zip(inner_points, results, strict=True)):
                if directories[offset] is not None:
                    write_json(directories[offset] / "summary.json", result.summary)
                    write_clients_csv(directories[offset] / "clients.csv", result.clients)
                row = {"point": first + offset, **static, **p}
                for key, column in TABLE_COLUMNS:
                    row[f"test_error_{column}"] = result.summary["test_error"][key]
                row["train_loss_mean"] = result.summary["train_loss"]["mean"]
                rows.append(row)
            index += len(points)
        if staging is not None:
            write_json(staging / "config.json", {**config.to_dict(), "grid": dict(grid)})
            columns = list(dict.fromkeys(k for row in rows for k in row))
            with (staging / "results.csv").open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=columns)
                writer.writeheader()
                writer.writerows(rows)
            output.commit()
    except BaseException:
        if output is not None:
            output.abandon()
        raise
    print(placement_line(base_setup))
    _print_rows(rows, grid, total)
    if output is not None:
        print(f"results in {output.path}")
    return 0


def _print_rows(rows: list[dict[str, Any]], grid: Mapping[str, list[Any]], total: int) -> None:
    names = list(grid)
    header = ["point", *names, "test err mean %", "p90 %", "sq90 %", "train loss"]
    lines = [header]
    for row in rows:
        lines.append(
            [str(row["point"])]
            + [f"{row[n]:g}" if isinstance(row[n], float) else str(row[n]) for n in names]
            + [
                f"{100 * row['test_error_mean']:.2f}",
                f"{100 * row['test_error_p90']:.2f}",
                f"{100 * row['test_error_sq90']:.2f}",
                f"{row['train_loss_mean']:.4f}",
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    print(f"sweep of {total} points")
    for line in lines:
        print("  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)))
