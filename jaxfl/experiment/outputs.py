"""The files a run writes (`jaxfl.experiment.run_directory` says where and when).

Files of one algorithm's run:

* `config.json`: the resolved configuration (loadable with `--config`);
* `metrics.jsonl`: one JSON object per evaluation round;
* `clients.csv`: per-client final metrics, with each client's examples;
* `summary.json`: final summaries keyed `test_loss`, `test_error` and,
  with `--eval-train`, `train_loss`, `train_error` (errors as fractions; the
  training clients are evaluated only when asked), each holding `mean`,
  `std`, `p10` ... `p95`, `superquantile_90`, `superquantile_95`, `best_10`;
  the run's `status` (`finished` or `diverged`), the rounds in which no
  client got weight, the resolved client strategy;
* `timing.json`: the wall-clock figures (compilation, rounds per second,
  evaluation and checkpoint time), apart, so that the three files above
  depend only on the config and the seed, byte for byte;
* `model/`: the final model (`jaxfl.experiment.saved_model`).

Several algorithms in one run get one subdirectory each, plus
`comparison.csv` and `comparison.md` at the top.

JSON never holds a bare NaN or Infinity (which most JSON readers reject): a
non-finite value is written `null`, and the object holding it gets a
`nonfinite` entry mapping its path (e.g. `test_loss.mean`) to what it was
(`nan`, `inf`, `-inf`).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

TABLE_COLUMNS = (
    ("mean", "mean"),
    ("std", "std"),
    ("p10", "p10"),
    ("p50", "p50"),
    ("p90", "p90"),
    ("superquantile_90", "sq90"),
    ("best_10", "best10"),
)


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def json_safe(data: Any) -> Any:
    """`data` with non-finite floats as None, and a `nonfinite` entry saying which and what.

    The `nonfinite` entry (path -> 'nan' | 'inf' | '-inf') goes into the
    top-level object when `data` is a dict.
    """
    found: dict[str, str] = {}

    def clean(value, path):
        if isinstance(value, np.generic | np.ndarray):
            value = value.tolist()
        if isinstance(value, float) and not math.isfinite(value):
            found[path or "value"] = "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
            return None
        if isinstance(value, dict):
            return {k: clean(v, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(v, f"{path}[{i}]") for i, v in enumerate(value)]
        return value

    cleaned = clean(data, "")
    if found and isinstance(cleaned, dict):
        cleaned["nonfinite"] = found
    return cleaned


def _dumps(data: Any, **kwargs) -> str:
    return json.dumps(json_safe(data), default=_json_default, allow_nan=False, **kwargs)


def write_json(path: Path, data: Any) -> None:
    path.write_text(_dumps(data, indent=2) + "\n")


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(_dumps(record) + "\n")


def write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> None:
    """Writes the records afresh, one line each (as `append_jsonl` would have)."""
    path.write_text("".join(_dumps(record) + "\n" for record in records))


def write_clients_csv(path: Path, clients: dict[str, dict[str, np.ndarray]]) -> None:
    """One row per client of every population: its examples, loss, error and counted targets.

    `targets` (the number of targets its error counts: examples, or real
    tokens of sequences) pools the clients' errors into one accuracy. With
    personal models (Ditto) each row also has `personal_loss` and
    `personal_error`, the client's metrics under its own model (empty where a
    population's clients have none); with an attack, `attacked` (1 for the
    corrupted clients of the training population). A population evaluated
    on a sample of its clients (`--eval-clients`) has rows for those only,
    `client` being each one's index in the whole population.
    """
    extra = [
        column
        for column in ("personal_loss", "personal_error", "attacked")
        if any(column in metrics for metrics in clients.values())
    ]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["population", "client", "num_examples", "loss", "error", "targets", *extra])
        for population, metrics in clients.items():
            targets = metrics.get("targets", metrics["num_examples"])
            ids = metrics.get("client", range(len(metrics["loss"])))
            for i, (client, count, loss, error, counted) in enumerate(
                zip(ids, metrics["num_examples"], metrics["loss"], metrics["error"], targets, strict=True)
            ):
                row = [population, int(client), int(count)]
                row += [f"{float(loss):.6g}", f"{float(error):.6g}", int(counted)]
                for column in extra:
                    value = metrics.get(column)
                    if value is None:
                        row.append("")
                    elif column == "attacked":
                        row.append(int(value[i]))
                    else:
                        row.append(f"{float(value[i]):.6g}")
                writer.writerow(row)


def comparison_rows(summaries: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per algorithm: test error statistics (%) and train loss (NaN without `--eval-train`).

    An algorithm with personal models gets a second row, `NAME (personal)`:
    the clients' errors under their own models (on their own test data when
    the dataset has it, else on their training data, labelled so). A
    diverged algorithm's row is `NAME (diverged)`, its values NaN.
    """
    rows = []
    for name, summary in summaries.items():
        if summary.get("status") == "diverged":
            # Its last evaluation, if any, was of parameters before the divergence: not a result.
            row = {"algorithm": f"{name} (diverged)"}
            row.update({f"test_error_{label}": float("nan") for _, label in TABLE_COLUMNS})
            row["train_loss_mean"] = float("nan")
            rows.append(row)
            continue
        row = {"algorithm": name}
        for key, label in TABLE_COLUMNS:
            row[f"test_error_{label}"] = 100.0 * summary["test_error"][key]
        row["train_loss_mean"] = summary.get("train_loss", {}).get("mean", float("nan"))  # no --eval-train
        rows.append(row)
        personal = summary.get("personal_test_error")
        where = "personal"
        if personal is None and "personal_train_error" in summary:
            personal, where = summary["personal_train_error"], "personal, on train data"
        if personal is not None:
            row = {"algorithm": f"{name} ({where})"}
            for key, label in TABLE_COLUMNS:
                row[f"test_error_{label}"] = 100.0 * personal[key]
            row["train_loss_mean"] = summary.get("personal_train_loss", {}).get("mean", float("nan"))
            rows.append(row)
    return rows


def format_table(summaries: dict[str, dict[str, Any]]) -> str:
    """A plain-text table of the test misclassification error (%), and the train loss where the
    training clients were evaluated (`--eval-train`)."""
    train = any("train_loss" in s or "personal_train_loss" in s for s in summaries.values())
    header = ["algorithm"] + [label for _, label in TABLE_COLUMNS] + ["train loss"] * train
    lines = []
    for row in comparison_rows(summaries):
        cells = [row["algorithm"]]
        cells += [f"{row[f'test_error_{label}']:.2f}" for _, label in TABLE_COLUMNS]
        loss = row["train_loss_mean"]
        if train:
            # NaN: diverged, or not evaluated.
            cells.append("n/a" if np.isnan(loss) else f"{loss:.4f}")
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
