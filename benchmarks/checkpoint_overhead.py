"""What checkpoints cost a run, measured end to end through the CLI.

    python benchmarks/checkpoint_overhead.py --workload main --repeats 2
    python benchmarks/checkpoint_overhead.py --workload mlp-4m --repeats 2

Each workload runs as `jaxfl run ... --out DIR` in a fresh process, three
ways, alternated within each repeat so that the machine's drift hits all
three: `none` (`--checkpoint-seconds 0`: no periodic checkpoint), `default`
(the CLI's default interval) and `dense` (`--checkpoint-every K`, many
checkpoints, to measure what one costs). The time of a run is its training
wall time from `timing.json` (`train_s` + `checkpoint_s`: compile, rounds,
checkpoints; evaluation excluded, the same in all three).

Reported per workload: checkpoints saved, the time per checkpoint (dense
minus none, over the dense run's checkpoints; on this noisy machine it can
come out below zero), the loop's own clock around each save (copying to the
host and handing to orbax, which writes in the background), the default
interval's overhead (default over none, minus 1) and the overhead the
per-checkpoint cost predicts at the default interval (cost / 120 s).
Workloads: `main` (the quick-start run: label-shift, linear model, 2,000 rounds,
FedAvg and Δ-FL) and `mlp-4m` (the large-model case on this CPU: an MLP of
two 2,048-wide layers, 4.3M parameters, 16 MB, on 500 label-shift clients,
60 rounds of 10 clients; its evaluation kept small so that a run takes about
a minute).
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
    "main": {"argv": [], "dense_every": 100},
    "mlp-4m": {
        "config": 'model = "mlp"\nhidden_sizes = [2048, 2048]\n',
        "argv": [
            "--dataset-option", "num_train_clients=500", "--dataset-option", "num_test_clients=100",
            "--dataset-option", "num_validation_clients=0", "--algorithm", "fedavg", "--rounds", "60",
            "--clients-per-round", "10", "--eval-every", "60", "--lr", "0.01",
        ],
        "dense_every": 5,
    },
}
MODES = ("none", "default", "dense")


def run_once(workload: str, mode: str, root: Path) -> dict:
    spec = WORKLOADS[workload]
    out = root / f"{workload}-{mode}-{time.monotonic_ns()}"
    argv = [sys.executable, "-m", "jaxfl.cli", "run", *spec["argv"], "--no-progress", "--out", str(out)]
    if "config" in spec:
        config = root / f"{workload}.toml"
        config.write_text(spec["config"])
        argv += ["--config", str(config)]
    if mode == "none":
        argv += ["--checkpoint-seconds", "0"]
    elif mode == "dense":
        argv += ["--checkpoint-every", str(spec["dense_every"])]
    subprocess.run(argv, check=True, capture_output=True, text=True)
    timings = [json.loads(p.read_text()) for p in sorted(out.rglob("timing.json"))]
    return {
        "workload": workload,
        "mode": mode,
        "seconds": sum(t["train_s"] + t["checkpoint_s"] for t in timings),
        "checkpoint_s": sum(t["checkpoint_s"] for t in timings),
        "checkpoints": sum(t["checkpoints_saved"] for t in timings),
    }


def summarize(records: list[dict], default_interval_s: float = 120.0) -> dict:
    by_mode = {mode: [r for r in records if r["mode"] == mode] for mode in MODES}
    best = {mode: min(r["seconds"] for r in rows) for mode, rows in by_mode.items()}
    dense = min(by_mode["dense"], key=lambda r: r["seconds"])
    per_checkpoint = (best["dense"] - best["none"]) / max(dense["checkpoints"], 1)
    return {
        "workload": records[0]["workload"],
        "seconds_none": best["none"],
        "seconds_default": best["default"],
        "seconds_dense": best["dense"],
        "checkpoints_default": by_mode["default"][0]["checkpoints"],
        "checkpoints_dense": dense["checkpoints"],
        "seconds_per_checkpoint": per_checkpoint,
        # The loop's own clock around each save (copy to host, hand to orbax): the part above the noise.
        "host_seconds_per_checkpoint": dense["checkpoint_s"] / max(dense["checkpoints"], 1),
        "default_overhead": best["default"] / best["none"] - 1.0,
        "predicted_overhead_at_default_interval": per_checkpoint / default_interval_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=tuple(WORKLOADS), action="append")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="jaxfl-checkpoint-bench-") as root:
        for workload in args.workload or list(WORKLOADS):
            records = []
            for repeat in range(args.repeats):
                order = MODES if repeat % 2 == 0 else MODES[::-1]
                for mode in order:
                    records.append(run_once(workload, mode, Path(root)))
                    print(json.dumps(records[-1]), file=sys.stderr)
            print(json.dumps(summarize(records)))
    print(f"load average {os.getloadavg()}", file=sys.stderr)


if __name__ == "__main__":
    main()
