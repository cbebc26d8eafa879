"""Accuracy against bytes: FedAvg with compressed updates, with and without error feedback.

Runs FedAvg on Fashion-MNIST over 100 clients by Dirichlet(0.5) label
proportions, a 64-unit MLP (d = 50,890), 10 clients per round, one local
epoch of batch 32 at lr 0.05, 150 rounds, evaluated every 10 rounds on the
test clients, once per compressor and seed:

* `none`: float32 updates;
* `qsgd-4`, `qsgd-2-b512`: QSGD (Alistarh et al. 2017) with 4 bits per level,
  or 2 bits in buckets of 512 coordinates;
* `rand-k-10%` and `top-k-1%` (Stich et al. 2018; Aji and Heafield 2017),
  each without and with error feedback (Karimireddy et al. 2019), and
  `qsgd-2-b512` with it (with error feedback the unbiased compressors are
  scaled to contractions: docs/communication.md).

What the papers lead one to expect: QSGD near the uncompressed accuracy at a
fraction of the bytes; top-k without error feedback biased and worse, error
feedback recovering it (Stich et al. 2018, Karimireddy et al. 2019); rand-k,
unbiased but of variance (d / k - 1) ||x||^2, slower per round.

The table gives per setting the bytes of one client's update, the megabytes
clients sent in the whole run, the final mean test-client error (mean ± std
over seeds) and the megabytes sent when the mean test error first reached the
target (the uncompressed run's final error plus 2 points; '-' where it did not).

    python scripts/compression_vs_bytes.py --seeds 0 1 2 --out /tmp/compression

References:
  [Alistarh et al. 2017] D. Alistarh, D. Grubic, J. Li, R. Tomioka, M. Vojnovic. QSGD:
    Communication-Efficient SGD via Gradient Quantization and Encoding. NeurIPS 2017.
  [Stich et al. 2018] S. U. Stich, J.-B. Cordonnier, M. Jaggi. Sparsified SGD with Memory.
    NeurIPS 2018.
  [Aji and Heafield 2017] A. F. Aji, K. Heafield. Sparse Communication for Distributed
    Gradient Descent. EMNLP 2017.
  [Karimireddy et al. 2019] S. P. Karimireddy, Q. Rebjock, S. U. Stich, M. Jaggi. Error
    Feedback Fixes SignSGD and other Gradient Compression Problems. ICML 2019.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from jaxfl.cli import main as jaxfl_main

SETTING = [
    "--dataset", "fashion-mnist", "--dataset-option", "alpha=0.5", "--model", "mlp", "--algorithm", "fedavg",
    "--rounds", "150", "--clients-per-round", "10", "--local-epochs", "1", "--batch-size", "32",
    "--lr", "0.05", "--eval-every", "10", "--no-eval-train", "--no-progress",
]  # fmt: skip
COMPRESSORS = {
    "none": [],
    "qsgd-4": ["--compression", "qsgd", "--compression-bits", "4"],
    "qsgd-2-b512": ["--compression", "qsgd", "--compression-bits", "2", "--compression-bucket", "512"],
    "qsgd-2-b512 + EF": [
        "--compression",
        "qsgd",
        "--compression-bits",
        "2",
        "--compression-bucket",
        "512",
        "--error-feedback",
    ],
    "rand-k-10%": ["--compression", "rand-k", "--compression-fraction", "0.1"],
    "rand-k-10% + EF": ["--compression", "rand-k", "--compression-fraction", "0.1", "--error-feedback"],
    "top-k-1%": ["--compression", "top-k", "--compression-fraction", "0.01"],
    "top-k-1% + EF": ["--compression", "top-k", "--compression-fraction", "0.01", "--error-feedback"],
}
TARGET_MARGIN = 0.02


def read_run(run_dir: Path) -> dict:
    """The run's curve (MB sent up, mean test error) and its summary."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "curve": [(r["bytes_up"] / 1e6, r["test_error"]["mean"]) for r in records],
        "final_error": summary["test_error"]["mean"],
        "total_mb": summary["bytes_up"] / 1e6,
        "update_bytes": summary["bytes_up"] // summary["client_uploads"],
    }


def megabytes_to_reach(curve: list[tuple[float, float]], target: float) -> float | None:
    """The megabytes sent at the first evaluation whose mean test error is at most `target`."""
    return next((sent for sent, error in curve if error <= target), None)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    runs: dict[str, list[dict]] = {name: [] for name in COMPRESSORS}
    for seed in args.seeds:
        for name, flags in COMPRESSORS.items():
            run_dir = args.out / f"{name.replace(' + ', '-').replace('%', 'pc')}-seed{seed}"
            if not (run_dir / "summary.json").exists():
                argv = ["run", *SETTING, *flags, "--seed", str(seed), "--overwrite", "--out", str(run_dir)]
                if jaxfl_main(argv) != 0:
                    return 1
            runs[name].append(read_run(run_dir))
    target = statistics.fmean(r["final_error"] for r in runs["none"]) + TARGET_MARGIN
    lines = [
        f"FedAvg, Fashion-MNIST Dirichlet(0.5), MLP 64, seeds {' '.join(map(str, args.seeds))} "
        f"(mean ± std over seeds); target: mean test error {100 * target:.1f}% "
        f"(uncompressed final + {100 * TARGET_MARGIN:.0f})",
        "",
        "| updates | bytes per update | MB sent up | final mean test error (%) | MB up to the target |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, per_seed in runs.items():
        errors = [100 * r["final_error"] for r in per_seed]
        spread = statistics.stdev(errors) if len(errors) > 1 else 0.0
        reached = [megabytes_to_reach(r["curve"], target) for r in per_seed]
        reach = (
            f"{statistics.fmean(reached):.2f}"
            if all(m is not None for m in reached)
            else f"reached by {sum(m is not None for m in reached)} of {len(reached)} seeds"
        )
        update = per_seed[0]["update_bytes"]
        lines.append(
            f"| {name} | {update:,} | {statistics.fmean(r['total_mb'] for r in per_seed):.2f} | "
            f"{statistics.fmean(errors):.2f} ± {spread:.2f} | {reach} |"
        )
    print("\n".join(lines))
    (args.out / "compression_vs_bytes.json").write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
