"""Reproduce Figure 6 of 004: DP-FedAvg vs DP Delta-FL under (epsilon, 1/n)-DP.

004 Section 7.7 and Appendix D.2 (`shared/papers/004_81c8af14ec6ef25c.txt`):
the label-shift dataset (2500 training, 500 validation, 500 test clients of
100 examples), a linear model, 100 clients per round, 1000 rounds, one full
gradient step per client with learning rate 0.1; epsilon in {3, 5, 10, 15,
20} at delta = 1/n. Hyperparameters tuned on the validation clients for the
90th percentile of the misclassification error over the grids

    r in {0.1, 0.25, 0.5, 0.75}   (quantile budget over update budget)
    B in {0.7, 0.9, 1.1, 1.3, 1.5} (loss bound)
    b in {16, 32, 64}              (histogram bins)
    C in {0.9, 1.1, 1.3, 1.5}      (update norm bound)

(DP-FedAvg: C only). For each algorithm, theta and epsilon, the grid point
with the lowest validation p90 (averaged over the seeds it ran with) is
chosen and its test error (mean and 90th percentile over test clients) is
reported as mean and standard deviation over the seeds.

Noise: for each (epsilon, r) the update's noise multiplier and the
quantile's sigma come from `jaxfl.privacy.budget` (dp-accounting's RDP
accountant; see docs/privacy.md); they are numeric hyperparameters, so every
numeric setting (epsilon, r, B, C, theta, seed) of one b runs as one vmapped
compiled round (`jaxfl.experiment.sweep.run_sweep`), in chunks of at most
`--chunk` points; b changes shapes and runs in an outer loop.

Outputs under --out (default runs/figure6): `grid.csv` (every grid point and
seed: validation and test summaries), `figure6.csv` (the selected settings
and their test errors), `figure6.png`, `calibration.json` (the noise of each
(epsilon, r), reused by later runs with the same setting) and `run.json`
(what was run, and how long it took).

    python scripts/figure6_dp.py --quick          # smoke test, a minute
    python scripts/figure6_dp.py                  # the paper's grid
    python scripts/figure6_dp.py --seeds 3 --bins 32 --ratios 0.25,0.75 ...
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from jaxfl.algorithms.registry import algorithm_spec
from jaxfl.experiment.config import make_config
from jaxfl.experiment.runner import setup
from jaxfl.experiment.sweep import SweepPoint, run_sweep

PAPER = {  # 004 Section 7.7, at epsilon = 5 (90th percentile of test error, %).
    ("dp-fedavg", None): 55.7,
    ("dp-deltafl", 0.5): 52.6,
}


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line settings (defaults: the paper's)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/figure6")
    parser.add_argument("--quick", action="store_true", help="tiny smoke run")
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--epsilons", type=_floats, default=[3, 5, 10, 15, 20])
    parser.add_argument("--thetas", type=_floats, default=[0.5, 0.25])
    parser.add_argument("--ratios", type=_floats, default=[0.1, 0.25, 0.5, 0.75])
    parser.add_argument(
        "--loss-bounds", type=_floats, default=[0.7, 0.9, 1.1, 1.3, 1.5]
    )
    parser.add_argument("--bins", type=_ints, default=[16, 32, 64])
    parser.add_argument("--clip-norms", type=_floats, default=[0.9, 1.1, 1.3, 1.5])
    parser.add_argument("--chunk", type=int, default=400, help="points per sweep")
    parser.add_argument(
        "--dp-count", choices=("fixed", "exact"), default="fixed",
        help="DP Delta-FL's divisor: theta*m (sound default) or the exact count m_t (004 App. D)",
    )
    parser.add_argument("--strategy", default="vmap")
    parser.add_argument(
        "--algorithms", default="dp-fedavg,dp-deltafl", help="comma-separated"
    )
    parser.add_argument(
        "--calibration",
        default=None,
        help="calibration.json to start from (default: OUT/calibration.json)",
    )
    parser.add_argument(
        "--calibrate-only",
        action="store_true",
        help="only fill the calibration file (host-side accounting), then stop",
    )
    parser.add_argument(
        "--baselines",
        action="store_true",
        help="also train non-private FedAvg and Delta-FL (exact quantile, 004 "
        "Algorithm 1) on the same setup and seeds, for reference",
    )
    parser.add_argument(
        "--from-grid",
        default=None,
        help="skip training: select and plot from an existing grid.csv",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds = min(args.rounds, 20)
        args.seeds = min(args.seeds, 2)
        args.epsilons = args.epsilons[:2]
        args.ratios = args.ratios[:2]
        args.loss_bounds = args.loss_bounds[:2]
        args.bins = args.bins[:1]
        args.clip_norms = args.clip_norms[:2]
    return args


def base_config(args: argparse.Namespace, algorithm: str, bins: int = 32):
    """The run settings of 004 Appendix D.2 for one algorithm (and b)."""
    return make_config(
        dict(
            algorithm=algorithm,
            dataset="label-shift",
            model="linear",
            rounds=args.rounds,
            clients_per_round=100,
            local_epochs=1,
            # >= every client's 100 examples: one full-gradient step.
            batch_size=100,
            lr=0.1,
            eval_every=args.rounds,
            eval_train=True,  # The rows' train_loss_mean.
            strategy=args.strategy,
            dp_bins=bins,
            # DP Delta-FL's divisor: theta*m (sound, the default) or the paper's exact m_t.
            **({"dp_count": args.dp_count} if algorithm == "dp-deltafl" else {}),
            progress=False,
        )
    )


class Calibrations:
    """Noise hyperparameters per (algorithm, epsilon, r, b), cached in a file."""

    def __init__(self, path: Path):
        self.path = path
        self.table = json.loads(path.read_text()) if path.exists() else {}

    def get(self, config, algorithm: str, num_clients: int, epsilon: float, ratio):
        """The calibrated {'dp_noise_multiplier', ['dp_quantile_sigma']}."""
        key = json.dumps(
            [
                algorithm,
                float(epsilon),
                None if ratio is None else float(ratio),
                config.privacy.dp_bins,
                config.privacy.dp_scale,
                config.server.rounds,
                config.server.clients_per_round,
                num_clients,
            ]
        )
        if key not in self.table:
            settings = config.replace(epsilon=epsilon, dp_quantile_ratio=ratio or 0.25).flat()
            self.table[key] = algorithm_spec(algorithm).privacy.calibrate(
                settings,
                num_clients=num_clients,
                clients_per_round=config.server.clients_per_round,
                hparams={"clip_norm": 1.0},
            )
            self.path.write_text(json.dumps(self.table, indent=1))
        return self.table[key]


def grid_points(args, algorithm: str, bins: int):
    """(settings dict, SweepPoint-ready hparams) of one b's sweep."""
    seeds = range(args.seeds)
    if algorithm == "dp-fedavg":
        for epsilon, clip_norm, seed in itertools.product(
            args.epsilons, args.clip_norms, seeds
        ):
            yield dict(epsilon=epsilon, clip_norm=clip_norm, seed=seed)
        return
    for theta, epsilon, ratio, bound, clip_norm, seed in itertools.product(
        args.thetas,
        args.epsilons,
        args.ratios,
        args.loss_bounds,
        args.clip_norms,
        seeds,
    ):
        yield dict(
            theta=theta,
            epsilon=epsilon,
            dp_quantile_ratio=ratio,
            dp_loss_bound=bound,
            dp_bins=bins,
            clip_norm=clip_norm,
            seed=seed,
        )


def run_grid(args, out: Path, calibrations: Calibrations) -> list[dict]:
    """Trains every grid point; returns one row per point and seed."""
    rows = []
    grid_path = out / "grid.csv"
    for algorithm in args.algorithms.split(","):
        for bins in args.bins if algorithm == "dp-deltafl" else [32]:
            config = base_config(args, algorithm, bins)
            run_setup = setup(config)
            n = run_setup.dataset.train.num_clients
            settings = list(grid_points(args, algorithm, bins))
            points = []
            for s in settings:
                noise = calibrations.get(
                    config, algorithm, n, s["epsilon"], s.get("dp_quantile_ratio")
                )
                numeric = {
                    k: v
                    for k, v in s.items()
                    if k in run_setup.algorithms[algorithm].hparam_defaults
                }
                points.append(SweepPoint(hparams={**numeric, **noise}, seed=s["seed"]))
            for start in range(0, len(points), args.chunk):
                chunk = points[start : start + args.chunk]
                began = time.perf_counter()
                results = run_sweep(run_setup, algorithm, chunk)
                seconds = time.perf_counter() - began
                print(
                    f"{algorithm} b={bins}: points {start}-{start + len(chunk) - 1}"
                    f" of {len(points)} in {seconds:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
                for s, point, result in zip(
                    settings[start:], chunk, results, strict=False
                ):
                    summary = result.summary
                    rows.append(
                        {
                            "algorithm": algorithm,
                            "theta": s.get("theta", ""),
                            "epsilon": s["epsilon"],
                            "dp_quantile_ratio": s.get("dp_quantile_ratio", ""),
                            "dp_loss_bound": s.get("dp_loss_bound", ""),
                            "dp_bins": s.get("dp_bins", ""),
                            "clip_norm": s["clip_norm"],
                            "seed": s["seed"],
                            "dp_noise_multiplier": point.hparams["dp_noise_multiplier"],
                            "dp_quantile_sigma": point.hparams.get(
                                "dp_quantile_sigma", ""
                            ),
                            "validation_error_mean": summary["validation_error"][
                                "mean"
                            ],
                            "validation_error_p90": summary["validation_error"]["p90"],
                            "test_error_mean": summary["test_error"]["mean"],
                            "test_error_p90": summary["test_error"]["p90"],
                            "train_loss_mean": summary["train_loss"]["mean"],
                            "seconds_per_point": seconds / len(chunk),
                        }
                    )
                write_csv(grid_path, rows)
    return rows


def calibrate_all(args, calibrations: Calibrations) -> None:
    """Fills the calibration file for every (algorithm, epsilon, r, b)."""
    num_clients = 2500
    for algorithm in args.algorithms.split(","):
        for bins in args.bins if algorithm == "dp-deltafl" else [32]:
            config = base_config(args, algorithm, bins)
            ratios = args.ratios if algorithm == "dp-deltafl" else [None]
            for epsilon, ratio in itertools.product(args.epsilons, ratios):
                noise = calibrations.get(config, algorithm, num_clients, epsilon, ratio)
                print(algorithm, bins, epsilon, ratio, noise, flush=True)


def read_grid(path: Path) -> list[dict]:
    """grid.csv back as rows (numbers parsed, empty cells kept as '')."""
    rows = []
    with path.open() as f:
        for raw in csv.DictReader(f):
            row = {}
            for key, value in raw.items():
                if key == "algorithm" or value == "":
                    row[key] = value
                elif key in ("seed", "dp_bins"):
                    row[key] = int(float(value))
                else:
                    row[key] = float(value)
            rows.append(row)
    return rows


def write_csv(path: Path, rows: list[dict]) -> None:
    """Rows (dicts with the same keys) as CSV."""
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


SETTING_KEYS = ("dp_quantile_ratio", "dp_loss_bound", "dp_bins", "clip_norm")


def select(rows: list[dict]) -> list[dict]:
    """Per (algorithm, theta, epsilon): the setting of lowest validation p90."""
    groups = defaultdict(lambda: defaultdict(list))
    for row in rows:
        curve = (row["algorithm"], row["theta"], row["epsilon"])
        setting = tuple(row[k] for k in SETTING_KEYS)
        groups[curve][setting].append(row)
    chosen = []
    for (algorithm, theta, epsilon), settings in sorted(
        groups.items(), key=lambda item: (item[0][0], str(item[0][1]), item[0][2])
    ):
        best = min(
            settings.values(),
            key=lambda runs: np.mean([r["validation_error_p90"] for r in runs]),
        )
        first = best[0]
        test_mean = np.array([r["test_error_mean"] for r in best]) * 100
        test_p90 = np.array([r["test_error_p90"] for r in best]) * 100
        chosen.append(
            {
                "algorithm": algorithm,
                "theta": theta,
                "epsilon": epsilon,
                **{k: first[k] for k in SETTING_KEYS},
                "dp_noise_multiplier": first["dp_noise_multiplier"],
                "dp_quantile_sigma": first["dp_quantile_sigma"],
                "seeds": len(best),
                "validation_p90_pct": 100
                * np.mean([r["validation_error_p90"] for r in best]),
                "test_mean_pct": test_mean.mean(),
                "test_mean_std": test_mean.std(),
                "test_p90_pct": test_p90.mean(),
                "test_p90_std": test_p90.std(),
            }
        )
    return chosen


def add_privacy(chosen: list[dict], args, num_clients: int) -> None:
    """The epsilon each selected setting spent, from the accountant."""
    for row in chosen:
        config = base_config(args, row["algorithm"], int(row["dp_bins"] or 32)).replace(
            epsilon=row["epsilon"],
            dp_quantile_ratio=row["dp_quantile_ratio"] or 0.25,
        )
        hparams = {
            "clip_norm": row["clip_norm"],
            "dp_noise_multiplier": row["dp_noise_multiplier"],
        }
        if row["dp_quantile_sigma"] != "":
            hparams["dp_quantile_sigma"] = row["dp_quantile_sigma"]
        report = algorithm_spec(row["algorithm"]).privacy.report(
            config.flat(),
            num_clients=num_clients,
            clients_per_round=config.server.clients_per_round,
            hparams=hparams,
            rounds_done=config.server.rounds,
        )
        row["epsilon_spent"] = report["epsilon"]
        row["delta"] = report["delta"]
        row["quantile_noise_per_node"] = report.get("quantile", {}).get(
            "noise_stddev_per_node", ""
        )


def quantile_error(row: dict, *, draws: int = 200, clients: int = 100) -> tuple:
    """Mean quantile error (004 eq. 19) of Algorithm 2 at a row's noise.

    m = 100 losses drawn uniformly on [0, B] (the clipped range), theta,
    b, sigma_q and c of the row; the error of an estimate Q is
    |fraction of losses below Q - (1 - theta)|, averaged over `draws`
    independent draws. Returns (with the row's noise, without noise).
    """
    import jax
    import jax.numpy as jnp

    from jaxfl.primitives import dp_quantile

    bound, theta = float(row["dp_loss_bound"]), float(row["theta"])

    def error(key, sigma):
        values_key, noise_key = jax.random.split(key)
        values = jax.random.uniform(values_key, (clients,), maxval=bound)
        estimate = dp_quantile(
            noise_key,
            values,
            theta,
            num_bins=int(row["dp_bins"]),
            upper=bound,
            sigma=sigma,
            scale=10,
            modulus=2**32,
        )
        return jnp.abs(jnp.mean(values < estimate) - (1 - theta))

    keys = jax.random.split(jax.random.key(0), draws)
    batched = jax.jit(jax.vmap(error, in_axes=(0, None)))
    noisy = float(jnp.mean(batched(keys, float(row["dp_quantile_sigma"]))))
    exact = float(jnp.mean(batched(keys, 0.0)))
    return noisy, exact


def run_baselines(args) -> list[dict]:
    """Non-private FedAvg and Delta-FL (exact quantile) on the same setup."""
    rows = []
    variants = [("fedavg", {})] + [
        ("deltafl", {"theta": theta}) for theta in args.thetas
    ]
    for algorithm, hparams in variants:
        config = base_config(args, "fedavg").replace(
            algorithm=algorithm,
            client_weighting="uniform",
        )
        if algorithm == "deltafl":
            config = config.replace(reweighting="threshold")
        run_setup = setup(config)
        points = [SweepPoint(hparams, seed) for seed in range(args.seeds)]
        results = run_sweep(run_setup, algorithm, points)
        test_mean = np.array([r.summary["test_error"]["mean"] for r in results]) * 100
        test_p90 = np.array([r.summary["test_error"]["p90"] for r in results]) * 100
        rows.append(
            {
                "algorithm": algorithm,
                "theta": hparams.get("theta", ""),
                "seeds": len(points),
                "test_mean_pct": test_mean.mean(),
                "test_mean_std": test_mean.std(),
                "test_p90_pct": test_p90.mean(),
                "test_p90_std": test_p90.std(),
            }
        )
        print(f"baseline {algorithm} {hparams}: done", file=sys.stderr, flush=True)
    return rows


def _method(algorithm: str, theta) -> str:
    """A curve's name: FedAvg or Delta-FL with its theta."""
    if algorithm.endswith("fedavg"):
        return "FedAvg"
    return f"Δ-FL θ = {float(theta):g}"


def plot(chosen: list[dict], path: Path, baselines: list[dict] | None = None) -> None:
    """Mean and p90 test error against epsilon, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    curves = defaultdict(list)
    for row in chosen:
        curves[_method(row["algorithm"], row["theta"])].append(row)
    colors = {}
    for label, rows in sorted(curves.items()):
        rows = sorted(rows, key=lambda r: r["epsilon"])
        eps = [r["epsilon"] for r in rows]
        for ax, stat in zip(axes, ("test_mean", "test_p90"), strict=True):
            line = ax.errorbar(
                eps,
                [r[f"{stat}_pct"] for r in rows],
                yerr=[r[f"{stat}_std"] for r in rows],
                marker="o",
                capsize=3,
                label=f"DP {label}",
                color=colors.get(label),
            )
            colors[label] = line[0].get_color()
    for row in baselines or []:
        label = _method(row["algorithm"].replace("dp-", ""), row["theta"])
        for ax, stat in zip(axes, ("test_mean", "test_p90"), strict=True):
            ax.axhline(
                float(row[f"{stat}_pct"]),
                linestyle="--",
                linewidth=1,
                color=colors.get(label, "gray"),
                label=f"{label}, no DP",
            )
    for (algorithm, theta), value in PAPER.items():
        label = _method(algorithm, "" if theta is None else theta)
        axes[1].plot(
            [5],
            [value],
            marker="x",
            markersize=9,
            linestyle="none",
            color=colors.get(label, "black"),
            label=f"paper, {label}",
        )
    axes[0].set_title("Mean test misclassification error (%)")
    axes[1].set_title("90th percentile of test error (%)")
    for ax in axes:
        ax.set_xlabel("ε  (δ = 1/n)")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    """Runs the grid, selects, writes the CSVs and the plot."""
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    calibrations = Calibrations(out / "calibration.json")
    if args.calibration:
        calibrations.table.update(json.loads(Path(args.calibration).read_text()))
    if args.calibrate_only:
        calibrate_all(args, calibrations)
        return 0
    if args.from_grid:
        rows = read_grid(Path(args.from_grid))
    else:
        rows = run_grid(args, out, calibrations)
    num_clients = 2500
    chosen = select(rows)
    add_privacy(chosen, args, num_clients)
    for row in chosen:
        row["quantile_error"], row["quantile_error_noiseless"] = (
            quantile_error(row) if row["algorithm"] == "dp-deltafl" else ("", "")
        )
    write_csv(out / "figure6.csv", chosen)
    baselines = None
    if args.baselines:
        baselines = run_baselines(args)
        write_csv(out / "baselines.csv", baselines)
    elif (out / "baselines.csv").exists():  # From an earlier run.
        with (out / "baselines.csv").open() as f:
            baselines = list(csv.DictReader(f))
    plot(chosen, out / "figure6.png", baselines)
    run_info = {
        **{k: v for k, v in vars(args).items()},
        "grid_points": len(rows),
        "seconds": time.perf_counter() - began,
    }
    (out / "run.json").write_text(json.dumps(run_info, indent=1))
    print(
        f"{'method':<22} {'eps':>5} {'mean %':>14} {'p90 %':>14} "
        f"{'eps spent':>9}  setting"
    )
    for row in chosen:
        label = (
            "DP-FedAvg"
            if row["algorithm"] == "dp-fedavg"
            else f"DP Delta-FL theta={row['theta']}"
        )
        setting = ", ".join(f"{k}={row[k]}" for k in SETTING_KEYS if row[k] != "")
        print(
            f"{label:<22} {row['epsilon']:>5g} "
            f"{row['test_mean_pct']:>7.2f} ± {row['test_mean_std']:<4.2f} "
            f"{row['test_p90_pct']:>7.2f} ± {row['test_p90_std']:<4.2f} "
            f"{row['epsilon_spent']:>9.3f}  {setting}"
        )
    for (algorithm, theta), value in PAPER.items():
        print(f"paper, epsilon = 5: {algorithm} theta={theta}: p90 {value}%")
    print(f"results in {out} ({time.perf_counter() - began:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
