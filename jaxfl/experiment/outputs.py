"""Writing a run's results without ever losing earlier ones.

A run writes into a staging directory next to its destination
(`DIR.partial`) and moves it into place only when it has finished, so a
crash or an interrupted run leaves any previous `DIR` untouched; replacing an
existing `DIR` needs `overwrite=True`, checked before any training.

Files of one algorithm's run:

* `config.json`: the resolved configuration (loadable with `--config`);
* `metrics.jsonl`: one JSON object per evaluation round;
* `clients.csv`: per-client final metrics, with each client's examples;
* `summary.json`: final summaries keyed `train_loss`, `train_error`,
  `test_loss`, `test_error` (errors as fractions), each holding `mean`,
  `std`, `p10` ... `p95`, `superquantile_90`, `superquantile_95`, `best_10`;
  plus timing and the resolved client strategy.

Several algorithms in one run get one subdirectory each, plus
`comparison.csv` and `comparison.md` at the top.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from jaxfl.experiment.config import ConfigError

TABLE_COLUMNS = (
    ("mean", "mean"),
    ("std", "std"),
    ("p10", "p10"),
    ("p50", "p50"),
    ("p90", "p90"),
    ("superquantile_90", "sq90"),
    ("best_10", "best10"),
)


class OutputDirectory:
    """A destination directory written through a staging directory."""

    def __init__(self, path: str | os.PathLike, *, overwrite: bool = False):
        self.path = Path(path)
        self.staging = self.path.with_name(self.path.name + ".partial")
        if self.path.exists() and not overwrite:
            raise ConfigError(
                f"out directory {str(self.path)!r} exists; pass --overwrite to replace it"
            )
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(f"out {str(self.path)!r} exists and is not a directory")

    def open(self) -> Path:
        """Creates a fresh staging directory (a leftover one is a dead run's)."""
        if self.staging.exists():
            shutil.rmtree(self.staging)
        self.staging.mkdir(parents=True)
        return self.staging

    def commit(self) -> Path:
        """Moves the finished staging directory to the destination."""
        if self.path.exists():
            retired = self.path.with_name(self.path.name + ".replaced")
            if retired.exists():
                shutil.rmtree(retired)
            os.replace(self.path, retired)
            os.replace(self.staging, self.path)
            shutil.rmtree(retired)
        else:
            os.replace(self.staging, self.path)
        return self.path

    def abandon(self) -> None:
        """Removes the staging directory of a failed run."""
        shutil.rmtree(self.staging, ignore_errors=True)


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, default=_json_default) + "\n")


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record, default=_json_default) + "\n")


def write_clients_csv(path: Path, clients: dict[str, dict[str, np.ndarray]]) -> None:
    """One row per client of every population: its examples, loss, error and counted targets.

    `targets` (the number of targets its error counts: examples, or real
    tokens of sequences) pools the clients' errors into one accuracy.
    """
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["population", "client", "num_examples", "loss", "error", "targets"])
        for population, metrics in clients.items():
            targets = metrics.get("targets", metrics["num_examples"])
            for i, (count, loss, error, counted) in enumerate(
                zip(metrics["num_examples"], metrics["loss"], metrics["error"], targets, strict=True)
            ):
                writer.writerow(
                    [population, i, int(count), f"{float(loss):.6g}", f"{float(error):.6g}", int(counted)]
                )


def comparison_rows(summaries: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per algorithm: test error statistics (%) and train loss."""
    rows = []
    for name, summary in summaries.items():
        row = {"algorithm": name}
        for key, label in TABLE_COLUMNS:
            row[f"test_error_{label}"] = 100.0 * summary["test_error"][key]
        row["train_loss_mean"] = summary["train_loss"]["mean"]
        rows.append(row)
    return rows


def format_table(summaries: dict[str, dict[str, Any]]) -> str:
    """A plain-text table of the test misclassification error (%)."""
    header = ["algorithm"] + [label for _, label in TABLE_COLUMNS] + ["train loss"]
    lines = []
    for row in comparison_rows(summaries):
        cells = [row["algorithm"]]
        cells += [f"{row[f'test_error_{label}']:.2f}" for _, label in TABLE_COLUMNS]
        cells.append(f"{row['train_loss_mean']:.4f}")
        lines.append(cells)
    widths = [max(len(r[i]) for r in [header, *lines]) for i in range(len(header))]
    fmt = lambda cells: "  ".join(  # noqa: E731
        c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
    )
    title = "test misclassification error over test clients (%)"
    return "\n".join([title, fmt(header), *(fmt(r) for r in lines)])


def write_comparison(directory: Path, summaries: dict[str, dict[str, Any]]) -> None:
    rows = comparison_rows(summaries)
    with (directory / "comparison.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row["algorithm"]] + [f"{row[k]:.2f}" for k in header[1:-1]]
        cells.append(f"{row['train_loss_mean']:.4f}")
        lines.append("| " + " | ".join(cells) + " |")
    (directory / "comparison.md").write_text("\n".join(lines) + "\n")
