"""FedBuff against FedAvg and FedAsync: client updates and simulated time to a target accuracy.

Fashion-MNIST over 100 clients by Dirichlet(0.5) label proportions, a 64-unit
MLP, one local epoch of batch 32 at lr 0.05, every client online, the default
log-normal devices (jaxfl.clock.profiles), 1,500 client updates per run:

* `fedavg`: synchronous rounds of 10 clients, 150 rounds (each waits for its slowest client);
* `fedbuff`: 40 clients training at once, a server step per 10 arrivals
  (Nguyen et al. 2022), 154 steps (the first 4 fill the slots);
* `fedasync`: 40 clients at once, each arrival mixed in with alpha = 0.6
  (Xie et al. 2019), 1,540 steps.

Nguyen et al. 2022 report FedBuff reaching a target accuracy in
less time than synchronous FedAvg, whose rounds wait for stragglers, and with
fewer client updates than FedAsync. The table gives per algorithm (mean over
seeds) the final mean test-client error, the simulated time of the run, and
the simulated time and client updates when the mean test error first reached
30% and 25%.

    python scripts/async_vs_sync.py --seeds 0 1 2 --out /tmp/async

References:
  [Nguyen et al. 2022] J. Nguyen, K. Malik, H. Zhan, A. Yousefpour, M. Rabbat, M. Malek, D. Huba.
    Federated Learning with Buffered Asynchronous Aggregation. AISTATS 2022.
  [Xie et al. 2019] C. Xie, S. Koyejo, I. Gupta. Asynchronous Federated Optimization. arXiv:1903.03934.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from jaxfl.cli import main as jaxfl_main

DATA = [
    "--dataset", "fashion-mnist", "--dataset-option", "alpha=0.5", "--model", "mlp", "--local-epochs", "1",
    "--batch-size", "32", "--lr", "0.05", "--clients-per-round", "10", "--availability", "always",
    "--no-eval-train", "--no-progress",
]  # fmt: skip
RUNS = {
    "fedavg": ["--algorithm", "fedavg", "--rounds", "150", "--eval-every", "10"],
    "fedbuff": ["--algorithm", "fedbuff", "--concurrency", "40", "--rounds", "154", "--eval-every", "11"],
    "fedasync": ["--algorithm", "fedasync", "--concurrency", "40", "--rounds", "1540", "--eval-every", "110"],
}
TARGETS = (0.30, 0.25)  # Mean test-client error.


def _curve(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    curves: dict[str, list[list[dict]]] = {name: [] for name in RUNS}
    for seed in args.seeds:
        for name, flags in RUNS.items():
            run_dir = args.out / f"{name}-seed{seed}"
            if not (run_dir / "summary.json").exists():
                argv = ["run", *DATA, *flags, "--seed", str(seed), "--overwrite", "--out", str(run_dir)]
                if jaxfl_main(argv) != 0:
                    return 1
            curves[name].append(_curve(run_dir))
    lines = [
        f"Fashion-MNIST Dirichlet(0.5), MLP 64, 1,500 client updates, seeds {' '.join(map(str, args.seeds))} "
        "(mean over seeds)",
        "",
        "| algorithm | final mean test error (%) | simulated time (s) | "
        + " | ".join(f"to {100 * t:.0f}% error: s, client updates" for t in TARGETS)
        + " |",
        "| --- | --- | --- | " + " | ".join("---" for _ in TARGETS) + " |",
    ]
    for name, per_seed in curves.items():
        cells = []
        for target in TARGETS:
            reached = [
                next((r for r in curve if r["test_error"]["mean"] <= target), None) for curve in per_seed
            ]
            if any(r is None for r in reached):
                cells.append(f"reached by {sum(r is not None for r in reached)} of {len(reached)} seeds")
            else:
                cells.append(
                    f"{statistics.fmean(r['simulated_time'] for r in reached):,.1f} s, "
                    f"{statistics.fmean(r['client_uploads'] for r in reached):,.0f}"
                )
        lines.append(
            f"| {name} | {100 * statistics.fmean(c[-1]['test_error']['mean'] for c in per_seed):.2f} | "
            f"{statistics.fmean(c[-1]['simulated_time'] for c in per_seed):,.1f} | "
            + " | ".join(cells)
            + " |"
        )
    print("\n".join(lines))
    (args.out / "async_vs_sync.json").write_text(json.dumps(curves, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
