"""What Ditto and the robust aggregators cost a round, measured through the CLI.

    python benchmarks/robustness_cost.py --repeats 3
    python benchmarks/robustness_cost.py --workload fmnist --repeats 2

Each variant runs as `jaxfl run ... --out DIR` in a fresh process, the
variants alternated within each repeat (reversed every other repeat) so that
the machine's drift hits all of them. A run's speed is its steady rounds per
second from `timing.json` (compilation excluded); the best of the repeats is
reported, with each variant's ratio to FedAvg's on the same workload.

Workloads: `main` (the quick-start run's dataset and defaults: label-shift, linear
model, 100 clients per round, 2,000 rounds), `main-split` (the same with each
client's examples split 72/8/20 into its own training, validation and test
data, which Ditto's dynamic lambda needs) and `fmnist` (the thesis's
Fashion-MNIST Ditto workload, docs/ditto-fashion-mnist.md: 500 devices, the
83k-parameter ConvNet, 10 clients per round, 2 local steps of batch 16, 200
rounds: a model whose local training dominates the round).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKLOADS = {
    "main": [],
    # The quick-start run with each client's own 72/8/20 split (what Ditto's dynamic lambda chooses on).
    "main-split": ["--client-split", "0.2", "--client-validation-split", "0.08"],
    "fmnist": [
        "--dataset", "fashion-mnist", "--dataset-option", "partition=ditto", "--model", "convnet",
        "--clients-per-round", "10", "--batch-size", "16", "--max-local-steps", "2", "--lr", "0.05",
        "--rounds", "200", "--eval-every", "200",
    ],
}  # fmt: skip
VARIANTS = {
    "fedavg": ["--algorithm", "fedavg"],
    "ditto": ["--algorithm", "ditto"],
    "median": ["--algorithm", "fedavg", "--aggregator", "median"],
    "krum": ["--algorithm", "fedavg", "--aggregator", "krum", "--byzantine", "10"],
    "geometric-median": ["--algorithm", "fedavg", "--aggregator", "geometric-median"],
    "ditto+geometric-median": ["--algorithm", "ditto", "--aggregator", "geometric-median"],
    "apfl": ["--algorithm", "apfl"],
    "l2sgd": ["--algorithm", "l2sgd"],
    "perfedavg": ["--algorithm", "perfedavg"],
    "mapper": ["--algorithm", "mapper"],
    # Personal models in host memory, the cohort's rows copied each way every round (and one round per call).
    "ditto-host-state": ["--algorithm", "ditto", "--client-state", "host"],
    # Needs validation client k = training client k (main-split, fmnist).
    "ditto-dynamic-lam": ["--algorithm", "ditto", "--ditto-dynamic-lam", "0.1,1,2"],
}


def run_once(workload: str, variant: str, root: Path) -> dict:
    out = root / f"{workload}-{variant}-{time.monotonic_ns()}"
    argv = [
        sys.executable, "-m", "jaxfl.cli", "run", *WORKLOADS[workload], *VARIANTS[variant],
        "--no-progress", "--checkpoint-seconds", "0", "--out", str(out),
    ]  # fmt: skip
    subprocess.run(argv, check=True, capture_output=True, text=True)
    timing = json.loads((out / "timing.json").read_text())
    return {
        "workload": workload,
        "variant": variant,
        "rounds_per_s": timing["rounds_per_s"],
        "compile_s": timing["compile_s"],
    }


def summarize(records: list[dict]) -> dict:
    best = {}
    for record in records:
        name = record["variant"]
        best[name] = max(best.get(name, 0.0), record["rounds_per_s"])
    return {
        "workload": records[0]["workload"],
        "rounds_per_s": best,
        "slowdown_vs_fedavg": {name: best["fedavg"] / value for name, value in best.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=tuple(WORKLOADS), action="append")
    parser.add_argument("--variant", choices=tuple(VARIANTS), action="append")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    variants = args.variant or list(VARIANTS)
    if "fedavg" not in variants:
        variants.insert(0, "fedavg")
    print(f"load average {os.getloadavg()}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="jaxfl-robustness-bench-") as root:
        for workload in args.workload or ["main"]:
            records = []
            for repeat in range(args.repeats):
                for variant in variants if repeat % 2 == 0 else variants[::-1]:
                    records.append(run_once(workload, variant, Path(root)))
                    print(json.dumps(records[-1]), file=sys.stderr)
            print(json.dumps(summarize(records)))
    print(f"load average {os.getloadavg()}", file=sys.stderr)


if __name__ == "__main__":
    main()
