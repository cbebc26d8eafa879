"""Compare Δ-FL with the baselines of 004 (Tables 2-3, Appendix C Tables 6-9).

Reproduces, on the offline datasets, the comparison of paper 004
(`shared/papers/004_*.txt`, Section 7.2-7.4 and Appendix C.2-C.4): Table 2
(90th percentile of the test clients' misclassification error), Table 3
(its mean), the per-method tables of Appendix C (Tables 6-9: mean, std,
p10, median, p90, plus superquantile 90 and best 10% from C.3), the
histograms of per-client test error (Figures 3, 7, 8), the scatter of
per-client error against the client's number of examples (Figures 4, 9, 10)
and the curves over rounds (Appendix C.4's convergence study).

    python scripts/compare_methods.py --dataset label-shift
    python scripts/compare_methods.py --dataset synthetic --tune-l2 fedavg
    python scripts/compare_methods.py --dataset label-shift --quick   # smoke

Methods (rows): FedAvg; FedAvg-Sub (FedAvg on theta*m of the m sampled
clients) for theta in {0.8, 0.5, 0.1}; FedProx (mu tuned); q-FFL for q in
{1e-3, ..., 10}; Tilted ERM for t in {0.1, ..., 200}; AFL (Mohri et al.'s
projected ascent on the mixture weights; the paper's AFL row is q-FFL with
q = 10, also reported); Δ-FL (Algorithm 3, exact reweighting) for theta in
{0.8, 0.5, 0.1}.

Protocol (004 Section 7.2, Appendix C.2), in three stages:

1. Learning rate: FedAvg with lambda = 0 for each lr of the grid; the lr
   with the smallest terminal alpha-weighted training loss (mean over the
   tuning seeds) is used by *every* method.
2. Regularization lambda (and FedProx's mu, jointly): each setting is
   trained on the tuning clients and scored on validation clients by the
   90th percentile of their misclassification error (mean over the tuning
   seeds; ties, common with errors on 100 examples, go to the smaller mean
   error, then to the larger lambda). Validation clients: the dataset's own
   (label-shift: 500), or half of the training clients held out
   (`jaxfl.data.splits.hold_out_clients`, as 004 Appendix C.2 does; used for
   Synthetic(1,1)). `--tune-l2 per-row` tunes lambda for every table row;
   `--tune-l2 fedavg` tunes it for FedAvg and reuses it, like the lr.
3. Final runs: every row at its tuned values, trained on all training
   clients, for `--seeds` seeds; test-client statistics are averaged over
   seeds (mean and sample standard deviation). A run already made in the
   tuning stage with the same training clients, setting and seed is reused
   (label-shift: its tuning trains on the full training set).

As in the paper, the main table reports for q-FFL and Tilted ERM the q or t
with the smallest test 90th percentile, and for FedAvg-Sub the theta with
the smallest test 90th percentile; the full table lists every value.

Every stage runs as vmapped sweeps (`jaxfl.experiment.tuning.run_points`):
numeric settings and seeds are points of one compiled round, in chunks of a
fixed width so that each algorithm compiles once (JAX's persistent cache,
`--jax-cache`, keeps the programs across chunks, stages and invocations).
Clients are laid out per dataset: equal-sized clients (label-shift) are
vmapped with a scan of fixed length, all points in chunks of `--width`;
spread-out client sizes (Synthetic(1,1): 50 to 2740 examples) run one client
at a time with a while loop of the client's own length, and each seed's
points form one sweep: they share their cohorts (the same clients at the
same positions), so no point pays for another's larger clients.

Outputs (in `--out`, default runs/compare/<dataset>): table_main.{csv,md},
table_all.{csv,md}, runs.csv (every final run), tuning.csv (every tuning
run), curves.csv, clients.csv, protocol.json (settings, tuned values, wall
times), histograms.png, scatter.png, curves.png.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import sys
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

# Statistics of the test clients' misclassification error in the tables
# (004 Tables 6-9 and Appendix C.3), as (summary key, column label).
from jaxfl.experiment.outputs import TABLE_COLUMNS

LR_GRID = (0.003, 0.01, 0.03, 0.1, 0.3)
L2_GRID = (1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8)  # 004 Appendix C.2
MU_GRID = (1.0, 0.1, 0.01, 0.001)  # 004 Appendix C.2
SUB_THETAS = (0.8, 0.5, 0.1)
Q_GRID = (1e-3, 1e-2, 1e-1, 1.0, 10.0)
TILT_GRID = (0.1, 0.5, 1.0, 5.0, 10.0, 50.0, 100.0, 200.0)
DELTA_THETAS = (0.8, 0.5, 0.1)
QUICK_GRIDS = dict(
    lr=(0.03, 0.1), l2=(1e-3, 1e-6), mu=(0.1,), sub=(0.5,), q=(1e-3, 10.0),
    tilt=(1.0, 100.0), delta=(0.8, 0.5, 0.1),
)
METHOD_KEYS = ("fedavg", "fedavg-sub", "fedprox", "qffl", "term", "afl", "deltafl")

# Per-dataset protocol. label-shift: 004 Section 7.7 / Appendix D.2 (100
# clients per round; FedAvg's training loss flattens near 0.67 by 500 rounds
# at lr 0.1, see docs/experiments.md). Synthetic(1,1) has 100 clients: 20 per
# round keeps client sampling random and leaves Δ-FL theta = 0.1 two clients.
PROTOCOLS = {
    "label-shift": dict(rounds=500, clients_per_round=100, layout="vmap", width=6),
    "synthetic": dict(rounds=400, clients_per_round=20, layout="sequential", width=6),
}
QUICK_OPTIONS = {
    "label-shift": dict(
        num_train_clients=60, num_validation_clients=20, num_test_clients=20,
        pool_size=20000,
    ),
    "synthetic": dict(num_clients=30),
}


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of the full table: an algorithm with its fixed settings."""

    label: str  # e.g. "q-FFL q=0.01"
    method: str  # the main-table method it belongs to, e.g. "q-FFL"
    algorithm: str  # registry name
    fixed: Mapping[str, float] = dataclasses.field(default_factory=dict)


def table_rows(methods: Sequence[str], grids: Mapping[str, Sequence[float]]) -> list[Row]:
    rows = []
    if "fedavg" in methods:
        rows.append(Row("FedAvg", "FedAvg", "fedavg"))
    if "fedavg-sub" in methods:
        rows += [Row(f"FedAvg-Sub θ={t:g}", "FedAvg-Sub", "fedavg-sub", {"theta": t})
                 for t in grids["sub"]]
    if "fedprox" in methods:
        rows.append(Row("FedProx", "FedProx", "fedprox"))
    if "qffl" in methods:
        rows += [Row(f"q-FFL q={q:g}", "q-FFL", "qffl", {"q": q}) for q in grids["q"]]
    if "term" in methods:
        rows += [Row(f"Tilted-ERM t={t:g}", "Tilted-ERM", "term", {"tilt": t})
                 for t in grids["tilt"]]
    if "afl" in methods:
        rows.append(Row("AFL", "AFL", "afl"))
    if "deltafl" in methods:
        rows += [Row(f"Δ-FL θ={t:g}", f"Δ-FL θ={t:g}", "deltafl", {"theta": t})
                 for t in grids["delta"]]
    return rows


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", choices=sorted(PROTOCOLS), default="label-shift")
    parser.add_argument("--rounds", type=int, help="communication rounds (default: per dataset)")
    parser.add_argument("--seeds", type=int, help="seeds of the final runs (default 5; quick 2)")
    parser.add_argument("--tune-seeds", type=int, default=1,
                        help="seeds of the tuning runs (lr and lambda/mu); the first seeds "
                        "of the final runs")
    parser.add_argument("--tune-l2", choices=("per-row", "fedavg"), default="per-row",
                        help="tune lambda for every row, or for FedAvg and reuse it")
    parser.add_argument("--clients-per-round", type=int, help="m (default: per dataset)")
    parser.add_argument("--methods", default=",".join(METHOD_KEYS),
                        help=f"comma-separated subset of {','.join(METHOD_KEYS)}")
    parser.add_argument("--width", type=int, help="points per compiled sweep (default 6)")
    parser.add_argument("--eval-points", type=int, default=20,
                        help="evaluations over the run (the curves' resolution)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke mode: small dataset, 4 rounds, 2 seeds, small grids")
    parser.add_argument("--out", help="output directory (default runs/compare/<dataset>)")
    parser.add_argument("--jax-cache", default="runs/jax-cache",
                        help="persistent compilation cache directory ('' to disable)")
    args = parser.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(methods) - set(METHOD_KEYS))
    if unknown or not methods:
        parser.error(f"--methods: unknown {unknown}; choose from {', '.join(METHOD_KEYS)}")
    args.methods = methods
    protocol = PROTOCOLS[args.dataset]
    args.rounds = args.rounds or (4 if args.quick else protocol["rounds"])
    args.seeds = args.seeds or (2 if args.quick else 5)
    args.clients_per_round = args.clients_per_round or (
        10 if args.quick else protocol["clients_per_round"]
    )
    args.width = args.width or protocol["width"]
    args.out = Path(args.out or f"runs/compare/{args.dataset}")
    if args.tune_seeds < 1 or args.tune_seeds > args.seeds:
        parser.error("--tune-seeds must be in [1, --seeds]")
    if min(args.rounds, args.seeds, args.clients_per_round, args.width, args.eval_points) < 1:
        parser.error("counts must be >= 1")
    return args


# ---------------------------------------------------------------------------
# Running points, with a cache of runs already made.
# ---------------------------------------------------------------------------


class Runner:
    """Runs points of one algorithm on one split; remembers every run.

    A run is identified by (split, algorithm, settings, seed): asking again
    for one returns the stored result (a sweep point equals its single run,
    so the chunk it ran in does not matter).

    Args:
      setups: split name -> Setup.
      width: points per compiled sweep (equal-sized clients).
      by_seed: one sweep per seed instead (spread-out client sizes).
    """

    def __init__(self, setups: Mapping[str, Any], width: int, by_seed: bool):
        self.setups = setups
        self.width = width
        self.by_seed = by_seed
        self.done: dict[tuple, Any] = {}

    @staticmethod
    def key(split, algorithm, hparams, seed):
        return (split, algorithm, tuple(sorted(hparams.items())), seed)

    def run(self, split: str, algorithm: str, settings: Sequence[tuple[dict, int]],
            stage: str) -> list[Any]:
        from jaxfl.experiment.sweep import SweepPoint
        from jaxfl.experiment.tuning import run_points

        todo = []
        for hparams, seed in settings:
            k = self.key(split, algorithm, hparams, seed)
            if k not in self.done and k not in [self.key(split, algorithm, h, s) for h, s in todo]:
                todo.append((hparams, seed))
        if self.by_seed:
            # Points of one seed sample the same cohorts, so a sweep of them
            # runs each client position's own number of local steps (while
            # loop), no more: one sweep per seed, as wide as the grid.
            groups = defaultdict(list)
            for hparams, seed in todo:
                groups[seed].append((hparams, seed))
            batches = [(group, len(group)) for group in groups.values()]
        else:
            batches = [(todo, self.width)] if todo else []
        start = time.perf_counter()
        for batch, width in batches:
            points = [SweepPoint(dict(h), seed=s) for h, s in batch]

            def report(done, total, seed=batch[0][1]):
                which = f" seed {seed}" if self.by_seed else ""
                print(f"  [{stage}] {algorithm} on {split}{which}: {done}/{total} points, "
                      f"{time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)

            results = run_points(self.setups[split], algorithm, points, width=width,
                                 on_chunk=report)
            for (h, s), result in zip(batch, results, strict=True):
                self.done[self.key(split, algorithm, h, s)] = result
        return [self.done[self.key(split, algorithm, h, s)] for h, s in settings]


def error_stat(result, population: str, statistic: str) -> float:
    return float(result.summary[f"{population}_error"][statistic])


# ---------------------------------------------------------------------------
# Stages.
# ---------------------------------------------------------------------------


def tune_learning_rate(runner: Runner, grid, seeds, log) -> float:
    """Stage 1: FedAvg's lr by terminal alpha-weighted training loss."""
    from jaxfl.experiment.tuning import choose_best

    settings = [({"lr": lr, "l2": 0.0}, s) for lr in grid for s in seeds]
    results = runner.run("full", "fedavg", settings, "lr")
    losses = defaultdict(list)
    for (hparams, seed), result in zip(settings, results, strict=True):
        loss = float(result.summary["train_loss"]["mean"])
        losses[hparams["lr"]].append(loss)
        log.append(dict(stage="lr", row="FedAvg", algorithm="fedavg", seed=seed,
                        hparams=json.dumps(hparams), train_loss_mean=loss))
    best = choose_best([losses[lr] for lr in grid])
    return float(grid[best])


def tune_regularization(runner: Runner, split: str, rows: Sequence[Row], lr: float,
                        grids, seeds, mode: str, log) -> dict[str, dict[str, float]]:
    """Stage 2: lambda (and FedProx's mu) by the validation clients' p90.

    Returns row label -> the tuned settings of that row.
    """
    # Larger lambda first: among tied candidates the first wins.
    l2_grid = sorted(grids["l2"], reverse=True)
    tuned: dict[str, dict[str, float]] = {}
    shared_l2 = None
    if mode == "fedavg":
        fedavg = Row("FedAvg", "FedAvg", "fedavg")
        shared_l2 = tune_rows(runner, split, [fedavg], lr, [{"l2": v} for v in l2_grid],
                              seeds, log)["FedAvg"]["l2"]
    by_algorithm = defaultdict(list)
    for row in rows:
        by_algorithm[row.algorithm].append(row)
    for algorithm, algorithm_rows in by_algorithm.items():
        l2_values = l2_grid if shared_l2 is None else [shared_l2]
        candidates = [{"l2": v} for v in l2_values]
        if algorithm == "fedprox":
            candidates = [{"l2": v, "mu": mu} for v in l2_values for mu in grids["mu"]]
        if len(candidates) == 1:
            for row in algorithm_rows:
                tuned[row.label] = dict(candidates[0])
            continue
        tuned.update(tune_rows(runner, split, algorithm_rows, lr, candidates, seeds, log))
    return tuned


def tune_rows(runner: Runner, split, rows, lr, candidates, seeds, log):
    """Picks, for each row, the candidate with the smallest validation p90."""
    from jaxfl.experiment.tuning import choose_best

    algorithm = rows[0].algorithm
    settings = [({**row.fixed, "lr": lr, **c}, s)
                for row in rows for c in candidates for s in seeds]
    results = dict(zip([runner.key(split, algorithm, h, s) for h, s in settings],
                       runner.run(split, algorithm, settings, "lambda"), strict=True))
    tuned = {}
    for row in rows:
        p90s, means = [], []
        for c in candidates:
            hparams = {**row.fixed, "lr": lr, **c}
            p90, mean = [], []
            for s in seeds:
                result = results[runner.key(split, algorithm, hparams, s)]
                p90.append(error_stat(result, "validation", "p90"))
                mean.append(error_stat(result, "validation", "mean"))
                log.append(dict(stage="lambda", row=row.label, algorithm=algorithm, seed=s,
                                hparams=json.dumps(hparams),
                                train_loss_mean=float(result.summary["train_loss"]["mean"]),
                                validation_error_mean=mean[-1], validation_error_p90=p90[-1]))
            p90s.append(p90)
            means.append(mean)
        tuned[row.label] = dict(candidates[choose_best(p90s, means)])
    return tuned


def final_runs(runner: Runner, rows, lr, tuned, seeds) -> dict[str, list[Any]]:
    """Stage 3: every row at its tuned settings, all seeds, all training clients."""
    by_algorithm = defaultdict(list)
    for row in rows:
        by_algorithm[row.algorithm].append(row)
    out = {}
    for algorithm, algorithm_rows in by_algorithm.items():
        settings = [({**row.fixed, "lr": lr, **tuned[row.label]}, s)
                    for row in algorithm_rows for s in seeds]
        results = runner.run("full", algorithm, settings, "final")
        for i, row in enumerate(algorithm_rows):
            out[row.label] = results[i * len(seeds):(i + 1) * len(seeds)]
    return out


# ---------------------------------------------------------------------------
# Tables.
# ---------------------------------------------------------------------------


def seed_statistics(results) -> dict[str, tuple[float, float]]:
    """(mean, sample std) over seeds of each test-error statistic, in %."""
    out = {}
    for key, label in TABLE_COLUMNS:
        values = 100.0 * np.array([error_stat(r, "test", key) for r in results])
        std = float(np.std(values, ddof=1)) if values.size > 1 else 0.0
        out[label] = (float(np.mean(values)), std)
    losses = np.array([float(r.summary["train_loss"]["mean"]) for r in results])
    out["train_loss"] = (float(np.mean(losses)),
                         float(np.std(losses, ddof=1)) if losses.size > 1 else 0.0)
    return out


def main_rows(rows: Sequence[Row], stats) -> list[tuple[str, Row]]:
    """Tables 2-3: one row per method; q, t and FedAvg-Sub's theta by test p90."""
    chosen, seen = [], set()
    for row in rows:
        if row.method in seen:
            continue
        seen.add(row.method)
        members = [r for r in rows if r.method == row.method]
        best = min(members, key=lambda r: (stats[r.label]["p90"][0], stats[r.label]["mean"][0]))
        name = row.method if len(members) == 1 else f"{row.method} (best: {best.label.split()[-1]})"
        chosen.append((name, best))
    # The paper's AFL row is q-FFL with q = 10 (004 Section 7.2, Appendix C.2).
    paper_afl = [r for r in rows if r.algorithm == "qffl" and r.fixed.get("q") == 10.0]
    if paper_afl:
        index = next((i for i, (n, r) in enumerate(chosen) if r.algorithm == "afl"), len(chosen))
        chosen.insert(index + 1, ("AFL as q-FFL, q=10 (paper's AFL)", paper_afl[0]))
    return chosen


def tuned_text(values: Mapping[str, float]) -> str:
    return ", ".join(f"{'λ' if k == 'l2' else 'μ' if k == 'mu' else k}={v:g}"
                     for k, v in values.items())


def write_tables(directory: Path, rows, stats, tuned, named_rows) -> None:
    labels = [label for _, label in TABLE_COLUMNS]
    header = ["method", "tuned", *[f"{c}_{part}" for c in labels for part in ("mean", "std")],
              "train_loss_mean", "train_loss_std"]

    def record(name, row):
        s = stats[row.label]
        cells = [name, tuned_text(tuned[row.label])]
        cells += [f"{s[c][i]:.4f}" for c in labels for i in (0, 1)]
        cells += [f"{s['train_loss'][0]:.5f}", f"{s['train_loss'][1]:.5f}"]
        return cells

    def markdown(records, title):
        head = ["method", "tuned", *labels, "train loss"]
        lines = [title, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for name, row in records:
            s = stats[row.label]
            cells = [name, tuned_text(tuned[row.label])]
            cells += [f"{s[c][0]:.2f} ± {s[c][1]:.2f}" for c in labels]
            cells.append(f"{s['train_loss'][0]:.4f}")
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"

    everything = [(row.label, row) for row in rows]
    for stem, records, title in (
        ("table_all", everything, "Test misclassification error (%), every setting: "
         "mean ± std over seeds"),
        ("table_main", named_rows, "Test misclassification error (%), one row per method "
         "(004 Tables 2-3): mean ± std over seeds"),
    ):
        with (directory / f"{stem}.csv").open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(header)
            writer.writerows(record(name, row) for name, row in records)
        (directory / f"{stem}.md").write_text(markdown(records, title))


def write_csv(path: Path, records: Sequence[Mapping[str, Any]]) -> None:
    columns = list(dict.fromkeys(k for record in records for k in record))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(records)


# ---------------------------------------------------------------------------
# Figures (matplotlib, small PNGs).
# ---------------------------------------------------------------------------


def per_client_mean(results, population="test") -> tuple[np.ndarray, np.ndarray]:
    """(number of examples, error averaged over seeds) of each client."""
    errors = np.mean([r.clients[population]["error"] for r in results], axis=0)
    return np.asarray(results[0].clients[population]["num_examples"]), errors


def plot_figures(directory: Path, named_rows, finals, dataset_name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    count = len(named_rows)
    columns = min(count, 5)
    grid_rows = math.ceil(count / columns)
    bins = np.linspace(0.0, 1.0, 21)

    # Histograms of per-client test error (004 Figures 3, 7, 8).
    fig, axes = plt.subplots(grid_rows, columns, figsize=(3.0 * columns, 2.4 * grid_rows),
                             sharex=True, sharey=True, squeeze=False)
    for ax, (name, row) in zip(axes.flat, named_rows, strict=False):
        _, errors = per_client_mean(finals[row.label])
        ax.hist(errors, bins=bins, color="tab:blue", alpha=0.8)
        ax.axvline(np.mean(errors), color="k", lw=1, label="mean")
        ax.axvline(np.quantile(errors, 0.9, method="inverted_cdf"), color="tab:red", lw=1,
                   ls="--", label="p90")
        ax.set_title(name, fontsize=8)
    for ax in axes.flat[count:]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.supxlabel("test misclassification error of a client (mean over seeds)", fontsize=9)
    fig.supylabel("clients", fontsize=9)
    fig.suptitle(f"{dataset_name}: per-client test error", fontsize=10)
    fig.tight_layout()
    fig.savefig(directory / "histograms.png", dpi=80)
    plt.close(fig)

    # Per-client error against local data size (004 Figures 4, 9b, 10b).
    fig, axes = plt.subplots(grid_rows, columns, figsize=(3.0 * columns, 2.4 * grid_rows),
                             sharex=True, sharey=True, squeeze=False)
    for ax, (name, row) in zip(axes.flat, named_rows, strict=False):
        sizes, errors = per_client_mean(finals[row.label])
        ax.scatter(sizes, errors, s=4, alpha=0.5)
        if np.ptp(sizes) > 0:
            ax.set_xscale("log")
        ax.set_title(name, fontsize=8)
    for ax in axes.flat[count:]:
        ax.axis("off")
    fig.supxlabel("test examples of the client", fontsize=9)
    fig.supylabel("test error (mean over seeds)", fontsize=9)
    fig.suptitle(f"{dataset_name}: per-client test error vs local data size", fontsize=10)
    fig.tight_layout()
    fig.savefig(directory / "scatter.png", dpi=80)
    plt.close(fig)

    # Curves over rounds, mean over seeds (004 Appendix C.4, convergence).
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    panels = (("test_error", "mean", "mean test error"),
              ("test_error", "p90", "p90 of test error"),
              ("train_loss", "mean", "training loss (alpha-weighted)"))
    for name, row in named_rows:
        results = finals[row.label]
        rounds = [h["round"] for h in results[0].history]
        for ax, (group, key, _) in zip(axes, panels, strict=True):
            values = np.mean([[h[group][key] for h in r.history] for r in results], axis=0)
            ax.plot(rounds, values, lw=1, label=name)
    for ax, (_, _, title) in zip(axes, panels, strict=True):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("round", fontsize=8)
    axes[-1].set_yscale("log")
    axes[0].legend(fontsize=6)
    fig.suptitle(f"{dataset_name}: curves over rounds (mean over seeds)", fontsize=10)
    fig.tight_layout()
    fig.savefig(directory / "curves.png", dpi=80)
    plt.close(fig)


# ---------------------------------------------------------------------------
# Main.
# ---------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    wall_start = time.perf_counter()
    import jax

    if args.jax_cache:
        jax.config.update("jax_compilation_cache_dir", os.path.abspath(args.jax_cache))

    from jaxfl.data.splits import hold_out_clients
    from jaxfl.experiment.config import make_config
    from jaxfl.experiment.outputs import write_json
    from jaxfl.experiment.run_directory import OutputDirectory
    from jaxfl.experiment.runner import setup
    from jaxfl.experiment.tuning import rebuild_setup

    protocol = PROTOCOLS[args.dataset]
    grids = QUICK_GRIDS if args.quick else dict(
        lr=LR_GRID, l2=L2_GRID, mu=MU_GRID, sub=SUB_THETAS, q=Q_GRID, tilt=TILT_GRID,
        delta=DELTA_THETAS,
    )
    rows = table_rows(args.methods, grids)
    algorithms = list(dict.fromkeys(["fedavg", *(row.algorithm for row in rows)]))
    dataset_options = QUICK_OPTIONS[args.dataset] if args.quick else {}
    layout = protocol["layout"]
    config = make_config(dict(
        algorithm=",".join(algorithms), dataset=args.dataset,
        dataset_options=dataset_options, rounds=args.rounds,
        clients_per_round=args.clients_per_round, local_epochs=1, batch_size=10,
        eval_every=max(1, args.rounds // args.eval_points), progress=False, strategy=layout,
        eval_train=True,  # The tables' training loss (alpha-weighted, over the training clients).
    ))
    output = OutputDirectory(args.out, overwrite=True)
    full = setup(config)
    if layout == "sequential":
        full = rebuild_setup(full, local_loop="while")
    if full.dataset.validation is not None:
        tuning_split = "full"
        setups = {"full": full}
    else:
        # 004 Appendix C.2: half of the training clients become validation clients.
        tuning_split = "holdout"
        setups = {"full": full,
                  "holdout": rebuild_setup(full, dataset=hold_out_clients(full.dataset, 0.5))}
    runner = Runner(setups, args.width, by_seed=(layout == "sequential"))
    seeds = list(range(args.seeds))
    tune_seeds = seeds[: args.tune_seeds]
    log: list[dict[str, Any]] = []
    timings = {}
    dataset = full.dataset
    print(f"{dataset.name}: {dataset.train.num_clients} training clients, "
          f"{dataset.test.num_clients} test clients; validation: "
          f"{setups[tuning_split].dataset.validation.num_clients} clients "
          f"({tuning_split}); {args.rounds} rounds, m={args.clients_per_round}, "
          f"{len(rows)} rows, seeds {seeds}, tuning seeds {tune_seeds}", file=sys.stderr)

    start = time.perf_counter()
    lr = tune_learning_rate(runner, grids["lr"], tune_seeds, log) if len(grids["lr"]) > 1 \
        else float(grids["lr"][0])
    timings["lr_s"] = time.perf_counter() - start
    print(f"tuned lr = {lr:g}", file=sys.stderr)

    start = time.perf_counter()
    tuned = tune_regularization(runner, tuning_split, rows, lr, grids, tune_seeds,
                                args.tune_l2, log)
    timings["regularization_s"] = time.perf_counter() - start
    print("tuned: " + "; ".join(f"{k}: {tuned_text(v)}" for k, v in tuned.items()),
          file=sys.stderr)

    start = time.perf_counter()
    finals = final_runs(runner, rows, lr, tuned, seeds)
    timings["final_s"] = time.perf_counter() - start

    stats = {row.label: seed_statistics(finals[row.label]) for row in rows}
    named_rows = main_rows(rows, stats)
    staging = output.open()
    try:
        write_tables(staging, rows, stats, tuned, named_rows)
        run_records, curve_records = [], []
        for row in rows:
            for seed, result in zip(seeds, finals[row.label], strict=True):
                record = dict(row=row.label, method=row.method, algorithm=row.algorithm,
                              seed=seed, hparams=json.dumps(result.summary["hparams"]))
                for key, _ in TABLE_COLUMNS:
                    record[f"test_error_{key}"] = error_stat(result, "test", key)
                record["train_loss_mean"] = float(result.summary["train_loss"]["mean"])
                run_records.append(record)
                for h in result.history:
                    curve_records.append(dict(
                        row=row.label, seed=seed, round=h["round"],
                        test_error_mean=h["test_error"]["mean"],
                        test_error_p90=h["test_error"]["p90"],
                        train_loss_mean=h["train_loss"]["mean"]))
        write_csv(staging / "runs.csv", run_records)
        write_csv(staging / "curves.csv", curve_records)
        write_csv(staging / "tuning.csv", log)
        client_records = []
        for name, row in named_rows:
            sizes, errors = per_client_mean(finals[row.label])
            client_records += [dict(method=name, client=i, num_examples=int(n),
                                    test_error_mean_over_seeds=float(e))
                               for i, (n, e) in enumerate(zip(sizes, errors, strict=True))]
        write_csv(staging / "clients.csv", client_records)
        plot_figures(staging, named_rows, finals, dataset.name)
        timings["wall_s"] = time.perf_counter() - wall_start
        write_json(staging / "protocol.json", dict(
            command=" ".join(["python", "scripts/compare_methods.py", *(argv or sys.argv[1:])]),
            dataset=dataset.name, description=dataset.description,
            dataset_options=dataset_options, rounds=args.rounds,
            clients_per_round=args.clients_per_round, local_epochs=1, batch_size=10,
            seeds=seeds, tune_seeds=tune_seeds, tune_l2=args.tune_l2, grids=grids,
            validation=dict(split=tuning_split,
                            clients=setups[tuning_split].dataset.validation.num_clients,
                            training_clients=setups[tuning_split].dataset.train.num_clients),
            layout=dict(strategy=layout, local_loop=full.engine.local.loop, width=args.width),
            tuned_lr=lr, tuned=tuned, timings_s=timings, backend=jax.default_backend(),
            jax_version=jax.__version__,
        ))
        output.commit()
    except BaseException:
        output.abandon()
        raise
    print((args.out / "table_main.md").read_text())
    print(f"results in {args.out} ({timings['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
