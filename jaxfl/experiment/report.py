"""`jaxfl report`: the figures of a paper, drawn from finished or running output folders.

    jaxfl report runs/compare                       # writes runs/compare/report/
    jaxfl report runs/fedavg runs/deltafl --out runs/figures

Reads the folders `jaxfl run` and `jaxfl sweep` write (or their `DIR.partial`
staging folder while the run is going on, or after it was killed) and draws,
for every algorithm or sweep point:

* `learning_curves.png`: the training loss (mean over the training clients,
  alpha-weighted; runs with `--eval-train` only) and the mean and 90th
  percentile of the test clients' error at every evaluation round;
* `client_error_histogram.png`: the histogram of the final per-client test
  error, one panel per run side by side, sharing their axes (Pillutla et
  al. 2023, Figure 3), with the mean and the 90th percentile marked;
* `client_error_cdf.png`: the empirical CDF of the same errors, all runs on
  one axes (where a curve crosses 0.9 is its 90th percentile);
* `error_vs_client_size.png`: each test client's error against its number of
  examples, one panel per run (Pillutla et al. 2023, Figure 4);
* `error_vs_bytes.png`, where a run compressed its updates (`--compression`):
  the mean and 90th percentile test error against the bytes clients sent so
  far, every run that counted them on the same axes;
* `error_vs_time.png`, where a run ran on the simulated clock
  (`--availability`): the same against the simulated time (hours);

and `index.html`, one self-contained page (the PNGs embedded as data URIs, no
script, no external request) with the final test-error summary of every run.
Per-client figures need `clients.csv`, written when a run finishes, so they
leave out unfinished runs; the page says which runs are unfinished.

Folder layouts read (unknown files are ignored):

* one algorithm: `config.json`, `metrics.jsonl`, `clients.csv`, `summary.json`;
* several algorithms: one such subfolder per algorithm (plus
  `comparison.csv`, `comparison.md` and `config.json`);
* a sweep: `points/NNN/` per grid point (plus `results.csv`); a point is
  labelled by its grid settings.

From Python, `write_report(["runs/compare"])` writes the same files and
returns the page's path; `read_folder` and the data functions (`curve`,
`error_cdf`, `error_histogram`, `error_by_size`, `final_rows`) give the
plotted numbers without drawing. Figures are drawn on matplotlib `Figure`
objects with the Agg renderer, leaving pyplot's global state alone.

References:
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
"""

from __future__ import annotations

import base64
import csv
import dataclasses
import html
import io
import json
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxfl.experiment.config import ConfigError
from jaxfl.experiment.outputs import TABLE_COLUMNS
from jaxfl.experiment.run_directory import MARKER  # A run's status file.

# The files of one run; `config.json` alone also tops multi-algorithm and sweep folders.
RUN_FILES = ("metrics.jsonl", "summary.json", "clients.csv")
FIGURES = (
    "learning_curves.png",
    "client_error_histogram.png",
    "client_error_cdf.png",
    "error_vs_client_size.png",
    "error_vs_bytes.png",
    "error_vs_time.png",
)
PAGE = "index.html"
# Marks a folder as written by `jaxfl report`, so that it may be rewritten.
GENERATOR = '<meta name="generator" content="jaxfl report">'
# Columns of the final test-error table: summary key, header (the CLI's table's).
TABLE = TABLE_COLUMNS
HISTOGRAM_BINS = np.linspace(0.0, 100.0, 21)  # 5-point bins of the error in %.
PLOTS_HINT = "pip install 'jaxfl[plots]'"


class ReportError(ConfigError):
    """Input `jaxfl report` cannot use; the message is one line for users."""


@dataclasses.dataclass(frozen=True)
class RunResults:
    """One algorithm's or one sweep point's results, as read from its folder.

    Attributes:
      path: the folder holding its files.
      algorithm: the algorithm's name.
      label: its name in legends and tables (the algorithm, plus the grid
        settings of a sweep point, plus the folder's name when several
        folders hold the same label).
      finished: whether its run has finished (`summary.json` is written last).
      evaluations: the records of `metrics.jsonl`, in order (a truncated last
        line, left by a killed run, is dropped).
      clients: population -> column -> `[N]` array (`client`, `num_examples`,
        `loss`, `error`, `targets`), from `clients.csv`; empty until the run
        has finished.
      summary: `summary.json`, or None.
      config: the run's `config.json`, or None.
    """

    path: Path
    algorithm: str
    label: str
    finished: bool
    evaluations: tuple[dict[str, Any], ...]
    clients: dict[str, dict[str, np.ndarray]]
    summary: dict[str, Any] | None
    config: dict[str, Any] | None


@dataclasses.dataclass(frozen=True)
class ResultsFolder:
    """An output folder of `jaxfl run` or `jaxfl sweep`.

    Attributes:
      requested: the path the user gave.
      path: the folder read: `requested`, or `requested.partial` when only
        the staging folder of a running (or killed) run exists.
      layout: 'run' (one algorithm), 'algorithms' (one subfolder each) or
        'sweep' (`points/NNN/`).
      finished: False for a `.partial` staging folder.
      runs: its algorithms or sweep points.
      config: its top `config.json` (a run's settings; a sweep's with its
        grid), or None.
      marker: its `jaxfl-run.json` (the run's status and the round it
        reached), or None.
      pending: algorithms its config names that have no subfolder yet (a
        several-algorithm run still going through them).
    """

    requested: Path
    path: Path
    layout: str
    finished: bool
    runs: tuple[RunResults, ...]
    config: dict[str, Any] | None = None
    marker: dict[str, Any] | None = None
    pending: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """The folder's name without `.partial`."""
        return self.requested.name.removesuffix(".partial") or str(self.requested)


# ---------------------------------------------------------------------------
# Reading.
# ---------------------------------------------------------------------------


def resolve_folder(path: str | os.PathLike) -> tuple[Path, bool]:
    """The folder holding `path`'s results, and whether its run has finished.

    `DIR` is read when it exists; otherwise its staging folder `DIR.partial`
    (a running or killed run). A path ending in `.partial` is unfinished.

    Raises:
      ReportError: neither exists, or `path` is a file.
    """
    path = Path(path)
    staging = path.with_name(path.name + ".partial")
    if path.exists():
        if not path.is_dir():
            raise ReportError(f"{str(path)!r} is a file, not a results folder")
        return path, not path.name.endswith(".partial")
    if staging.is_dir():
        return staging, False
    raise ReportError(f"no results folder {str(path)!r} (nor {staging.name!r} of a running run)")


def _number(value: Any) -> float:
    """A JSON value as a float: null (a non-finite value) and non-numbers are NaN."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    return float(value)


def read_metrics(path: Path) -> tuple[dict[str, Any], ...]:
    """The records of a `metrics.jsonl` file; an unparsable last line is dropped.

    A killed run can leave its last line half written; any other unparsable
    line is damage, and an error.

    Raises:
      ReportError: a line other than the last is not a JSON object.
    """
    if not path.exists():
        return ()
    lines = path.read_text(errors="replace").splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not an object")
        except ValueError:
            if number == len(lines):
                break  # Truncated by a kill (or still being written).
            raise ReportError(f"{path} line {number} is not a JSON object") from None
        records.append(record)
    return tuple(records)


def read_clients(path: Path, *, strict: bool = True) -> dict[str, dict[str, np.ndarray]]:
    """`clients.csv` as population -> column -> array; empty when absent.

    Args:
      path: the file.
      strict: raise on a malformed file; otherwise (a folder still being
        written) treat it as absent.

    Raises:
      ReportError: `strict` and the file lacks a column or a value.
    """
    if not path.exists():
        return {}
    columns = ("client", "num_examples", "loss", "error", "targets")
    rows: dict[str, dict[str, list[float]]] = {}
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            missing = {"population", "num_examples", "error"} - set(reader.fieldnames or ())
            if missing:
                raise ValueError(f"lacks the column(s) {', '.join(sorted(missing))}")
            for row in reader:
                table = rows.setdefault(row["population"], {c: [] for c in columns})
                for column in columns:
                    text = row.get(column)
                    table[column].append(float(text) if text not in (None, "") else math.nan)
    except (ValueError, TypeError, csv.Error) as error:
        if not strict:
            return {}
        raise ReportError(f"{path} is not a clients.csv of jaxfl: {error}") from None
    return {
        population: {column: np.asarray(values, np.float64) for column, values in table.items()}
        for population, table in rows.items()
    }


def _read_json(path: Path, *, strict: bool = True) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except ValueError:
        if not strict:
            return None
        raise ReportError(f"{path} is not valid JSON") from None
    return data if isinstance(data, dict) else None


def read_run(path: Path, *, label: str | None = None, folder_finished: bool = True) -> RunResults:
    """One algorithm's files in `path` (any of them may be missing while it runs)."""
    evaluations = read_metrics(path / "metrics.jsonl")
    # Inside a staging folder the last files may be half written: tolerate them.
    summary = _read_json(path / "summary.json", strict=folder_finished)
    config = _read_json(path / "config.json", strict=folder_finished)
    clients = read_clients(path / "clients.csv", strict=folder_finished)
    algorithm = None
    if evaluations:
        algorithm = evaluations[-1].get("algorithm")
    if not algorithm and config:
        algorithm = config.get("algorithm")
    algorithm = str(algorithm or path.name)
    return RunResults(
        path=path,
        algorithm=algorithm,
        label=label or algorithm,
        finished=summary is not None and bool(clients),
        evaluations=evaluations,
        clients=clients,
        summary=summary,
        config=config,
    )


def _holds_run(path: Path, *, config_counts: bool = False) -> bool:
    names = (*RUN_FILES, "config.json") if config_counts else RUN_FILES
    return path.is_dir() and any((path / name).is_file() for name in names)


def _format_setting(value: Any) -> str:
    if isinstance(value, str):
        try:
            value = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            return value
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _sweep_grid_names(path: Path, point_configs: list[dict[str, Any] | None]) -> list[str]:
    """The swept settings: the sweep's config's grid, else results.csv's settings, else what differs."""
    top = _read_json(path / "config.json", strict=False) or {}
    if isinstance(top.get("grid"), dict) and top["grid"]:
        return [str(name) for name in top["grid"]]
    configs = [c for c in point_configs if c]
    settings = {k for c in configs for k in c}
    results = path / "results.csv"
    if results.exists() and settings:
        with results.open(newline="") as f:
            header = next(csv.reader(f), [])
        # Other columns (point, status, summaries) are not settings of a run.
        names = [n for n in header if n in settings]
        if names:
            return names
    keys = dict.fromkeys(k for c in configs for k in c)
    return [
        k for k in keys
        if k != "out" and len({json.dumps(c.get(k), sort_keys=True) for c in configs}) > 1
    ]


def _results_rows(path: Path) -> dict[str, dict[str, str]]:
    results = path / "results.csv"
    if not results.exists():
        return {}
    with results.open(newline="") as f:
        return {row.get("point", ""): row for row in csv.DictReader(f)}


def read_folder(path: str | os.PathLike) -> ResultsFolder:
    """Reads an output folder of any layout (or its `.partial` staging folder).

    Raises:
      ReportError: the folder is missing, or holds no jaxfl results.
    """
    requested = Path(path)
    folder, finished = resolve_folder(requested)
    pending: tuple[str, ...] = ()
    if _holds_run(folder):
        runs = [read_run(folder, folder_finished=finished)]
        layout = "run"
    elif (folder / "points").is_dir():
        layout = "sweep"
        points = sorted(p for p in (folder / "points").iterdir() if p.is_dir())
        configs = [_read_json(p / "config.json", strict=False) for p in points]
        names = _sweep_grid_names(folder, configs)
        rows = _results_rows(folder)
        runs = []
        for point, config in zip(points, configs, strict=True):
            row = rows.get(str(int(point.name))) if point.name.isdigit() else None
            settings = []
            for name in names:
                if config is not None and name in config:
                    settings.append(f"{name}={_format_setting(config[name])}")
                elif row is not None and name in row:
                    settings.append(f"{name}={_format_setting(row[name])}")
            run = read_run(point, folder_finished=finished)
            setting = ", ".join(settings) or f"point {point.name}"
            runs.append(dataclasses.replace(run, label=f"{run.algorithm} {setting}"))
    else:
        layout = "algorithms"
        subfolders = [p for p in folder.iterdir() if _holds_run(p, config_counts=True)]
        top = _read_json(folder / "config.json", strict=False) or {}
        order = [a.strip() for a in str(top.get("algorithm") or "").split(",") if a.strip()]
        subfolders.sort(key=lambda p: (order.index(p.name) if p.name in order else len(order), p.name))
        runs = [read_run(p, folder_finished=finished) for p in subfolders]
        pending = tuple(a for a in order if a not in {p.name for p in subfolders})
    if not runs:
        what = "no results yet (the run has not evaluated)" if not finished else "no jaxfl results"
        raise ReportError(
            f"{str(folder)!r} holds {what}: no metrics.jsonl, algorithm subfolders or sweep points/"
        )
    return ResultsFolder(
        requested=requested,
        path=folder,
        layout=layout,
        finished=finished,
        runs=tuple(runs),
        config=_read_json(folder / "config.json", strict=False),
        marker=_read_json(folder / MARKER, strict=False),
        pending=pending,
    )


def read_folders(paths: Sequence[str | os.PathLike]) -> list[ResultsFolder]:
    """Reads several folders and makes their runs' labels unique.

    A label shared by runs of different folders gets the folder's name: the
    folder's name alone for a one-algorithm folder, `NAME/label` otherwise.
    """
    folders = [read_folder(p) for p in paths]
    counts: dict[str, int] = {}
    for folder in folders:
        for run in folder.runs:
            counts[run.label] = counts.get(run.label, 0) + 1
    renamed = []
    for folder in folders:
        runs = []
        for run in folder.runs:
            if counts[run.label] > 1:
                label = folder.name if folder.layout == "run" else f"{folder.name}/{run.label}"
                run = dataclasses.replace(run, label=label)
            runs.append(run)
        renamed.append(dataclasses.replace(folder, runs=tuple(runs)))
    # Two folders of the same name (in different parents): number the repeats.
    seen: dict[str, int] = {}
    final = []
    for folder in renamed:
        runs = []
        for run in folder.runs:
            seen[run.label] = seen.get(run.label, 0) + 1
            if seen[run.label] > 1:
                run = dataclasses.replace(run, label=f"{run.label} ({seen[run.label]})")
            runs.append(run)
        final.append(dataclasses.replace(folder, runs=tuple(runs)))
    return final


# ---------------------------------------------------------------------------
# The plotted data (pure functions of a run).
# ---------------------------------------------------------------------------


def curve(run: RunResults, group: str, statistic: str) -> tuple[np.ndarray, np.ndarray]:
    """`(rounds [R], values [R])` of one summary over the evaluation rounds.

    Args:
      run: the run.
      group: a summary of `metrics.jsonl`, e.g. 'train_loss' or 'test_error'.
      statistic: one of its keys, e.g. 'mean' or 'p90'.

    Returns:
      The rounds whose value is finite, and those values as written (errors
      are fractions). Null (non-finite) and missing values are left out.
    """
    rounds, values = [], []
    for record in run.evaluations:
        summary = record.get(group)
        value = _number(summary.get(statistic)) if isinstance(summary, dict) else math.nan
        round_ = _number(record.get("round"))
        if math.isfinite(value) and math.isfinite(round_):
            rounds.append(round_)
            values.append(value)
    return np.asarray(rounds, np.float64), np.asarray(values, np.float64)


def error_against(run: RunResults, key: str, statistic: str = "mean") -> tuple[np.ndarray, np.ndarray]:
    """`(x [R], test error [R])`: the test error's `statistic` against a record's `key` (`bytes_up`,
    `simulated_time`) at each evaluation holding both."""
    xs, values = [], []
    for record in run.evaluations:
        summary = record.get("test_error")
        value = _number(summary.get(statistic)) if isinstance(summary, dict) else math.nan
        x = _number(record.get(key))
        if math.isfinite(value) and math.isfinite(x):
            xs.append(x)
            values.append(value)
    return np.asarray(xs, np.float64), np.asarray(values, np.float64)


def bytes_curve(run: RunResults, statistic: str = "mean") -> tuple[np.ndarray, np.ndarray]:
    """`(bytes_up [R], test error [R])`: the test error against the bytes clients had sent."""
    return error_against(run, "bytes_up", statistic)


def client_errors(run: RunResults, population: str = "test") -> np.ndarray:
    """`[N]` final per-client errors (fractions) of `population`, finite ones only."""
    table = run.clients.get(population)
    if table is None:
        return np.zeros((0,))
    errors = table["error"]
    return errors[np.isfinite(errors)]


def error_cdf(run: RunResults, population: str = "test") -> tuple[np.ndarray, np.ndarray]:
    """The empirical CDF of the per-client error: `(errors % sorted [N], fractions [N])`.

    `fractions[k] = (k + 1) / N` is the share of clients whose error is at most
    `errors[k]`.
    """
    errors = np.sort(100.0 * client_errors(run, population))
    return errors, np.arange(1, errors.size + 1) / max(errors.size, 1)


def error_histogram(
    run: RunResults, population: str = "test", bins: np.ndarray = HISTOGRAM_BINS
) -> tuple[np.ndarray, np.ndarray]:
    """`(counts [K], edges [K + 1])`: clients per bin of the error in % (right edge included)."""
    counts, edges = np.histogram(100.0 * client_errors(run, population), bins=bins)
    return counts, edges


def error_by_size(run: RunResults, population: str = "test") -> tuple[np.ndarray, np.ndarray]:
    """`(num_examples [N], error % [N])` of each client with a finite error."""
    table = run.clients.get(population)
    if table is None:
        return np.zeros((0,)), np.zeros((0,))
    keep = np.isfinite(table["error"]) & np.isfinite(table["num_examples"])
    return table["num_examples"][keep], 100.0 * table["error"][keep]


def percentile(errors: np.ndarray, p: float) -> float:
    """The lower ('inverted CDF') percentile, as in the runs' summaries."""
    return float(np.percentile(errors, p, method="inverted_cdf")) if errors.size else math.nan


def final_rows(folders: Sequence[ResultsFolder]) -> list[dict[str, Any]]:
    """One row per run: its status and final test-error summary (%) and training loss.

    A finished run's numbers come from `summary.json`; an unfinished run's
    from its last evaluation. Missing or non-finite values are NaN.
    """
    rows = []
    for folder in folders:
        for run in folder.runs:
            last = run.evaluations[-1] if run.evaluations else {}
            source = run.summary if run.summary is not None else last
            rounds = _number((run.config or folder.config or {}).get("rounds"))
            row: dict[str, Any] = {
                "label": run.label,
                "path": str(run.path),
                "finished": run.finished,
                "diverged": (run.summary or {}).get("status") == "diverged",
                "round": _number(last.get("round")),
                "rounds": rounds,
            }
            test_error = source.get("test_error") if isinstance(source.get("test_error"), dict) else {}
            for key, header in TABLE:
                row[f"test_error_{header}"] = 100.0 * _number(test_error.get(key))
            train_loss = source.get("train_loss") if isinstance(source.get("train_loss"), dict) else {}
            row["train_loss_mean"] = _number(train_loss.get("mean"))
            rows.append(row)
    return rows


# ---------------------------------------------------------------------------
# Drawing.
# ---------------------------------------------------------------------------


# Settings that say how a run's data were made: runs that differ in them are on different data.
DATA_SETTINGS = ("dataset", "dataset_options", "data_dir", "client_split", "client_validation_split")
# Settings that do not make two runs different experiments (a seed is one draw of the same one).
NOT_THE_EXPERIMENT = ("seed", "seed_drawn", "out", "overwrite", "progress")


def seed_groups(runs: Sequence[RunResults]) -> list[list[RunResults]]:
    """The runs, grouped where they differ only in their seed (a sweep's seed grid), first seen first.

    Runs without a config, and runs of different folders' parents, are
    never grouped.
    """
    groups: dict[Any, list[RunResults]] = {}
    for run in runs:
        if run.config is None:
            key = ("alone", str(run.path))
        else:
            settings = {k: v for k, v in run.config.items() if k not in NOT_THE_EXPERIMENT}
            key = (str(run.path.parent), json.dumps(settings, sort_keys=True, default=str))
        groups.setdefault(key, []).append(run)
    return list(groups.values())


def seed_curve(runs: Sequence[RunResults], group: str, statistic: str):
    """`(rounds, mean, low, high)` over the runs, at the rounds every one of them evaluated.

    low and high are the smallest and largest run's value at each round.
    """
    curves = [curve(run, group, statistic) for run in runs]
    common = sorted(set.intersection(*(set(rounds.tolist()) for rounds, _ in curves)))
    if not common:
        empty = np.zeros(0)
        return empty, empty, empty, empty
    values = np.stack([values[np.searchsorted(rounds, common)] for rounds, values in curves])
    return np.asarray(common), values.mean(axis=0), values.min(axis=0), values.max(axis=0)


def data_differences(runs: Sequence[RunResults]) -> list[str]:
    """The data settings on which the runs differ, each as `name: value (labels), ...`; [] if none."""
    differences = []
    for name in DATA_SETTINGS:
        by_value: dict[str, list[str]] = {}
        for run in runs:
            if run.config is not None:
                value = json.dumps(run.config.get(name), sort_keys=True, default=str)
                by_value.setdefault(value, []).append(run.label)
        if len(by_value) > 1:
            parts = [f"{value} ({', '.join(labels[:3])}{', ...' if len(labels) > 3 else ''})"
                     for value, labels in by_value.items()]
            differences.append(f"{name}: {'; '.join(parts)}")
    return differences


def _matplotlib():
    try:
        import matplotlib  # noqa: F401
        from matplotlib import ticker
        from matplotlib.figure import Figure
    except ImportError:
        raise ReportError(f"jaxfl report draws with matplotlib, not installed: {PLOTS_HINT}") from None
    return Figure, ticker


def _colors(count: int) -> list[Any]:
    import matplotlib

    if count <= 10:
        return [matplotlib.colormaps["tab10"](i) for i in range(count)]
    if count <= 20:
        return [matplotlib.colormaps["tab20"](i) for i in range(count)]
    return [matplotlib.colormaps["viridis"](i / (count - 1)) for i in range(count)]


def _legend_label(run: RunResults) -> str:
    return run.label if run.finished else f"{run.label} (unfinished)"


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def draw_learning_curves(runs: Sequence[RunResults], colors: Sequence[Any]):
    """Training loss, mean and p90 test error (%) over rounds: a Figure, or None without points.

    Runs that differ only in their seed (`seed_groups`) are drawn as one
    curve, the mean over the seeds, in a band from the lowest to the highest
    seed's value.
    """
    Figure, ticker = _matplotlib()
    panels = (
        ("train_loss", "mean", "training loss", "training loss (mean over training clients)"),
        ("test_error", "mean", "test error", "mean test error over test clients"),
        ("test_error", "p90", "test error, 90th percentile", "90th percentile of the test clients' error"),
    )
    figure = Figure(figsize=(13.5, 4.2), layout="constrained")
    axes = figure.subplots(1, 3)
    drawn = False
    color_of = {id(run): color for run, color in zip(runs, colors, strict=True)}
    for members in seed_groups(runs):
        color = color_of[id(members[0])]
        label = _legend_label(members[0])
        if len(members) > 1:
            label = re.sub(r"\bseed=[^,]*(, )?", "", label).rstrip(", ")
            label += f" (mean of {len(members)} seeds, band: min-max)"
        for ax, (group, statistic, _, _) in zip(axes, panels, strict=True):
            rounds, values, low, high = seed_curve(members, group, statistic)
            if not rounds.size:
                continue
            scale = 100.0 if group.endswith("error") else 1.0
            ax.plot(rounds, scale * values, color=color, lw=1.5, label=label,
                    marker="o" if rounds.size <= 25 else None, ms=3)
            if len(members) > 1:
                ax.fill_between(rounds, scale * low, scale * high, color=color, alpha=0.2, lw=0)
            drawn = True
    if not drawn:
        return None
    for ax, (group, _, ylabel, title) in zip(axes, panels, strict=True):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("round")
        ax.set_ylabel(ylabel + (" (%)" if group.endswith("error") else ""))
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    if not axes[0].has_data():  # The training clients are evaluated only when asked.
        axes[0].text(0.5, 0.5, "training clients not evaluated\n(runs with --eval-train show it)",
                     transform=axes[0].transAxes, ha="center", va="center", color="0.4")
    handles, labels = axes[0].get_legend_handles_labels()
    if not handles:  # No training loss anywhere: take the legend from a test panel.
        handles, labels = axes[1].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 5), frameon=False)
    return figure


def draw_error_by_bytes(runs: Sequence[RunResults], colors: Sequence[Any]):
    """Mean and p90 test error (%) against the bytes sent up: a Figure, or None where no run compressed
    its updates (or none counted its bytes)."""
    if not any((run.config or {}).get("compression") for run in runs):
        return None
    return _draw_error_against(runs, colors, "bytes_up", 1e-6, "MB sent by clients")


def draw_error_by_time(runs: Sequence[RunResults], colors: Sequence[Any]):
    """Mean and p90 test error (%) against the simulated time: a Figure, or None where no run ran on the
    simulated clock."""
    longest = max((error_against(run, "simulated_time")[0].max(initial=0.0) for run in runs), default=0.0)
    seconds, unit = next((s, u) for s, u in ((3600.0, "hours"), (60.0, "minutes"), (1.0, "seconds"))
                         if longest >= 2 * s or s == 1.0)  # fmt: skip
    return _draw_error_against(runs, colors, "simulated_time", 1 / seconds, f"simulated time ({unit})")


def _draw_error_against(runs, colors, key: str, scale: float, xlabel: str):
    Figure, _ = _matplotlib()
    figure = Figure(figsize=(10, 4.2), layout="constrained")
    axes = figure.subplots(1, 2)
    drawn = False
    for run, color in zip(runs, colors, strict=True):
        for ax, statistic in zip(axes, ("mean", "p90"), strict=True):
            xs, values = error_against(run, key, statistic)
            if xs.size:
                ax.plot(xs * scale, 100 * values, color=color, lw=1.5, label=_legend_label(run),
                        marker="o" if xs.size <= 25 else None, ms=3)
                drawn = True
    if not drawn:
        return None
    titles = ("mean test error", "90th percentile of the test clients' error")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test error (%)")
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 5), frameon=False)
    return figure


def _panel_grid(Figure, count: int, *, sharex: bool = True):
    columns = min(count, 4)
    rows = math.ceil(count / columns)
    figure = Figure(figsize=(3.6 * columns + 0.6, 3.0 * rows + 0.7), layout="constrained")
    axes = figure.subplots(rows, columns, sharex=sharex, sharey=True, squeeze=False)
    for ax in axes.flat[count:]:
        ax.set_axis_off()
    return figure, list(axes.flat[:count])


def draw_error_histograms(runs: Sequence[RunResults], colors: Sequence[Any]):
    """Per-client test error histograms, one panel per run (Pillutla et al. 2023, Figure 3).

    None without clients.
    """
    Figure, ticker = _matplotlib()
    chosen = [(r, c) for r, c in zip(runs, colors, strict=True) if client_errors(r).size]
    if not chosen:
        return None
    figure, axes = _panel_grid(Figure, len(chosen))
    for ax, (run, color) in zip(axes, chosen, strict=True):
        counts, edges = error_histogram(run)
        ax.stairs(counts, edges, fill=True, color=color, alpha=0.75)
        errors = 100.0 * client_errors(run)
        ax.axvline(errors.mean(), color="black", lw=1.2, label=f"mean {errors.mean():.1f}%")
        p90 = percentile(errors, 90)
        ax.axvline(p90, color="black", lw=1.2, ls="--", label=f"p90 {p90:.1f}%")
        ax.set_title(f"{run.label} ({errors.size} clients)", fontsize=10)
        ax.legend(fontsize=8, loc="best", framealpha=0.9)
        ax.set_xlim(0, 100)
        ax.grid(alpha=0.3, axis="y")
    figure.supxlabel("test error of a client (%)")
    figure.supylabel("number of test clients")
    return figure


def draw_error_cdfs(runs: Sequence[RunResults], colors: Sequence[Any]):
    """Empirical CDFs of the per-client test error, all runs on one axes; None without clients."""
    Figure, ticker = _matplotlib()
    chosen = [(r, c) for r, c in zip(runs, colors, strict=True) if client_errors(r).size]
    if not chosen:
        return None
    figure = Figure(figsize=(7.5, 4.8), layout="constrained")
    ax = figure.subplots()
    for run, color in chosen:
        errors, fractions = error_cdf(run)
        # Steps: 0 below the smallest error, (k + 1) / N from errors[k] on, 1 to 100%.
        x = np.concatenate([[0.0], errors, [100.0]])
        y = np.concatenate([[0.0], fractions, [1.0]])
        ax.plot(x, y, drawstyle="steps-post", color=color, lw=1.6, label=run.label)
    ax.axhline(0.9, color="gray", lw=0.8, ls=":", label="0.9 (crossing: 90th percentile)")
    ax.set_xlim(0, 100)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("test error of a client (%)")
    ax.set_ylabel("fraction of test clients with at most this error")
    ax.set_title("cumulative distribution of the per-client test error", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9, loc="lower right")
    return figure


def draw_error_by_size(runs: Sequence[RunResults], colors: Sequence[Any]):
    """Each test client's error against its examples, one panel per run (Pillutla et al. 2023, Figure 4)."""
    Figure, ticker = _matplotlib()
    chosen = [(r, c) for r, c in zip(runs, colors, strict=True) if error_by_size(r)[0].size]
    if not chosen:
        return None
    figure, axes = _panel_grid(Figure, len(chosen))
    all_sizes = np.concatenate([error_by_size(r)[0] for r, _ in chosen])
    log_scale = all_sizes.min() > 0 and all_sizes.max() / all_sizes.min() > 10
    for ax, (run, color) in zip(axes, chosen, strict=True):
        sizes, errors = error_by_size(run)
        ax.scatter(sizes, errors, s=12, color=color, alpha=0.6, edgecolors="none")
        ax.set_title(f"{run.label} ({sizes.size} clients)", fontsize=10)
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
        if log_scale:
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
        elif all_sizes.min() == all_sizes.max():
            ax.set_xticks([all_sizes.min()])
    xlabel = "examples held by the test client"
    if all_sizes.min() == all_sizes.max():
        xlabel += f" (every client holds {all_sizes.min():g})"
    if log_scale:
        xlabel += " (log scale)"
    figure.supxlabel(xlabel)
    figure.supylabel("test error of the client (%)")
    return figure


# ---------------------------------------------------------------------------
# The page.
# ---------------------------------------------------------------------------

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 1400px; margin: 1.5em auto;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { padding: 0.25em 0.7em; border-bottom: 1px solid #e4e4e4; text-align: right; }
th:first-child, td:first-child, td.status { text-align: left; }
thead th { border-bottom: 2px solid #888; }
figure { margin: 0.5em 0 1.5em 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 0.9em; color: #444; max-width: 70em; }
.unfinished { background: #fff4d6; border-left: 4px solid #e0a800; padding: 0.5em 1em; }
code { font-size: 0.95em; }
"""

_CAPTIONS = {
    "learning_curves.png": (
        "Learning curves",
        "Left: training loss, the mean over all training clients weighted by their examples (runs with "
        "--eval-train; the training clients are not evaluated otherwise). Middle and "
        "right: the mean and the 90th percentile of the test clients' misclassification error, at every "
        "evaluation round.",
    ),
    "client_error_histogram.png": (
        "Per-client test error: histograms",
        "Final misclassification error of each test client, one panel per run with shared axes (5-point "
        "bins; Pillutla et al. 2023, Figure 3). Solid line: mean; dashed line: 90th percentile. A thinner "
        "right tail is better for the worst-off clients.",
    ),
    "client_error_cdf.png": (
        "Per-client test error: cumulative distribution",
        "Share of test clients whose final error is at most x. Curves to the left and above are better; "
        "where a curve crosses the dotted line is its 90th percentile.",
    ),
    "error_vs_client_size.png": (
        "Test error against client size",
        "Final error of each test client against the number of examples it holds (Pillutla et al. 2023, "
        "Figure 4).",
    ),
    "error_vs_bytes.png": (
        "Test error against communication",
        "Mean and 90th percentile of the test clients' error against the megabytes clients had sent by "
        "each evaluation (compressed updates where a run compressed them; metrics.jsonl's bytes_up).",
    ),
    "error_vs_time.png": (
        "Test error against simulated time",
        "Mean and 90th percentile of the test clients' error against the simulated clock at each evaluation "
        "(rounds last as long as their clients' devices and availability make them; metrics.jsonl's "
        "simulated_time).",
    ),
}


def _cell(value: float, digits: int = 2) -> str:
    # `+ 0.0` turns a rounded -0.0 (e.g. best10 = -superquantile(-errors)) into 0.0.
    return f"{round(value, digits) + 0.0:.{digits}f}" if math.isfinite(value) else "&ndash;"


def _status(row: dict[str, Any]) -> str:
    at = f"round {row['round']:g}" if math.isfinite(row["round"]) else "no evaluation yet"
    if not math.isfinite(row["round"]):
        return at
    of = f" of {row['rounds']:g}" if math.isfinite(row["rounds"]) else ""
    if row["diverged"]:
        return f"diverged, {at}"
    return f"finished, {at}" if row["finished"] else f"unfinished: {at}{of}"


def render_page(folders: Sequence[ResultsFolder], figures: dict[str, bytes], notes: Sequence[str]) -> str:
    """The self-contained HTML page: table, figures as data URIs, notes; no script."""
    names = ", ".join(html.escape(f.name) for f in folders)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        GENERATOR,
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>jaxfl report: {names}</title>",
        f"<style>{_STYLE}</style>",
        "</head>",
        "<body>",
        f"<h1>jaxfl report: {names}</h1>",
        "<ul>",
    ]
    layouts = {"run": "one algorithm", "algorithms": "several algorithms", "sweep": "a sweep"}
    for folder in folders:
        state = "finished" if folder.finished else "<strong>unfinished</strong> (running, or stopped)"
        status = (folder.marker or {}).get("status")
        if not folder.finished and isinstance(status, str):
            state += f"; its status file says: {html.escape(status)}"
        if folder.pending:
            state += f"; not started yet: {html.escape(', '.join(folder.pending))}"
        parts.append(
            f"<li><code>{html.escape(str(folder.path))}</code>: {layouts[folder.layout]}, "
            f"{len(folder.runs)} run{'s' if len(folder.runs) > 1 else ''}, {state}</li>"
        )
    parts.append("</ul>")
    unfinished = [f for f in folders if not f.finished]
    if unfinished:
        listed = ", ".join(f"<code>{html.escape(str(f.path))}</code>" for f in unfinished)
        parts.append(
            f'<p class="unfinished"><strong>This report shows unfinished runs</strong> ({listed}): '
            "their curves stop at the last evaluation written, and runs that have not finished have no "
            "per-client results yet, so the per-client figures leave them out. Run "
            "<code>jaxfl report</code> again for newer results.</p>"
        )
    for note in notes:
        parts.append(f"<p>{html.escape(note)}</p>")
    parts += [
        "<h2>Final test error</h2>",
        "<p>Misclassification error of the test clients (%), each client counting once; training loss: "
        "mean over training clients weighted by their examples (&ndash; where they were not evaluated: "
        "runs without --eval-train). Unfinished runs: at their last evaluation."
        "</p>",
        "<table>",
        "<thead><tr><th>run</th><th>status</th>"
        + "".join(f"<th>{header}</th>" for _, header in TABLE)
        + "<th>train loss</th></tr></thead>",
        "<tbody>",
    ]
    for row in final_rows(folders):
        cells = [f"<td>{html.escape(row['label'])}</td>", f'<td class="status">{_status(row)}</td>']
        cells += [f"<td>{_cell(row[f'test_error_{header}'])}</td>" for _, header in TABLE]
        cells.append(f"<td>{_cell(row['train_loss_mean'], 4)}</td>")
        parts.append("<tr>" + "".join(cells) + "</tr>")
    parts += ["</tbody>", "</table>"]
    for name, png in figures.items():
        title, caption = _CAPTIONS[name]
        data = base64.b64encode(png).decode("ascii")
        parts += [
            f"<h2>{html.escape(title)}</h2>",
            "<figure>",
            f'<img src="data:image/png;base64,{data}" alt="{html.escape(title)}">',
            f"<figcaption>{html.escape(caption)} (<code>{name}</code>)</figcaption>",
            "</figure>",
        ]
    parts += ["</body>", "</html>", ""]
    return "\n".join(parts)


def is_report_folder(path: Path) -> bool:
    """Whether `path` is a folder `jaxfl report` wrote (and may rewrite)."""
    page = path / PAGE
    try:
        return page.is_file() and GENERATOR in page.read_text(errors="replace")[:2000]
    except OSError:
        return False


def check_out(out: Path) -> None:
    """Refuses an `--out` that is a file or a folder of something else than a report.

    Raises:
      ReportError: as above.
    """
    if not out.exists():
        return
    if not out.is_dir():
        raise ReportError(f"--out {str(out)!r} is a file, not a folder")
    if any(out.iterdir()) and not is_report_folder(out):
        raise ReportError(
            f"--out {str(out)!r} exists and is not a folder of jaxfl report; choose a new or report folder"
        )


def default_out(folders: Sequence[ResultsFolder]) -> Path:
    """`DIR/report` (in the folder read, `DIR.partial` while unfinished) for one folder.

    Raises:
      ReportError: several folders, which need an explicit `--out`.
    """
    if len(folders) != 1:
        raise ReportError("reporting on several folders needs --out REPORT_DIR")
    return folders[0].path / "report"


def write_report(dirs: Sequence[str | os.PathLike], out: str | os.PathLike | None = None) -> Path:
    """Draws the figures of `dirs` into `out` and returns the path of `out/index.html`.

    Args:
      dirs: output folders of `jaxfl run` or `jaxfl sweep` (or the `DIR` of a
        running one whose `DIR.partial` exists).
      out: the report folder; new, empty or an earlier report. Default, for
        one folder: `DIR/report` (`DIR.partial/report` while unfinished).

    Returns:
      The path of the page.

    Raises:
      ReportError: a folder is missing or holds no results, `out` is a file or
        a folder of something else, or matplotlib is missing.

    Example:
      >>> write_report(["runs/compare"])  # doctest: +SKIP
      PosixPath('runs/compare/report/index.html')
    """
    if not dirs:
        raise ReportError("give at least one results folder")
    _matplotlib()  # Before anything is written.
    folders = read_folders(dirs)
    out = Path(out) if out is not None else default_out(folders)
    check_out(out)
    runs = [run for folder in folders for run in folder.runs]
    colors = _colors(len(runs))
    drawers = {
        "learning_curves.png": draw_learning_curves,
        "client_error_histogram.png": draw_error_histograms,
        "client_error_cdf.png": draw_error_cdfs,
        "error_vs_client_size.png": draw_error_by_size,
        "error_vs_bytes.png": draw_error_by_bytes,
        "error_vs_time.png": draw_error_by_time,
    }
    figures: dict[str, bytes] = {}
    for name, draw in drawers.items():
        figure = draw(runs, colors)
        if figure is not None:
            figures[name] = _png(figure)
    if not figures:
        raise ReportError(
            "nothing to draw yet: no evaluation in " + ", ".join(repr(str(f.path)) for f in folders)
        )
    notes = []
    differences = data_differences(runs)
    if differences:
        notes.append(
            "These runs are not on the same data, so their figures do not compare like with like: "
            + "; ".join(differences) + "."
        )
    if not any(client_errors(r).size for r in runs):
        notes.append("No run has finished yet: the per-client figures appear once one has.")
    elif any(not client_errors(r).size for r in runs):
        left_out = ", ".join(r.label for r in runs if not client_errors(r).size)
        notes.append(f"Per-client figures leave out the runs without per-client results yet: {left_out}.")
    out.mkdir(parents=True, exist_ok=True)
    for name in FIGURES:  # Drop an earlier report's figure that is not drawn now.
        if name not in figures and (out / name).exists():
            (out / name).unlink()
    for name, png in figures.items():
        (out / name).write_bytes(png)
    page = out / PAGE
    page.write_text(render_page(folders, figures, notes))
    return page


def report_main(dirs: Sequence[str], out: str | None) -> int:
    """`jaxfl report`: writes the report and prints where; returns the exit status."""
    page = write_report(dirs, out)
    names = [n for n in FIGURES if (page.parent / n).exists()]
    print(f"report in {page} ({', '.join(names)})")
    return 0
