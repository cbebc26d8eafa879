"""Runs several benchmark configurations in one process (one device start).

    python benchmarks/suite.py --preset gpu --out results.jsonl
    python benchmarks/suite.py --preset cpu --devices 2 --out results.jsonl

Each configuration is a `rounds_per_second.py` command line; results are
printed and appended to `--out` as JSON lines as soon as each finishes, so a
run cut short keeps what it measured. The presets are the configurations of
benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

PRESETS = {
    "gpu": [
        "--workload emnist-linear --strategy vmap --rounds 30",
        "--workload emnist-linear --strategy vmap --rounds 30 --loop while",
        "--workload emnist-linear --strategy vmap --rounds 30 --algorithm deltafl",
        "--workload synthetic-small --strategy vmap --rounds 30",
        "--workload population --population 1000 --strategy vmap --rounds 30",
        "--workload population --population 1000000 --strategy vmap --rounds 30",
        "--workload emnist-linear --strategy vmap --rounds 5 --sweep 64",
        "--workload emnist-cnn --strategy vmap --rounds 5 --repeats 2",
        "--workload emnist-cnn --strategy vmap --rounds 5 --repeats 2 --algorithm deltafl",
        "--workload emnist-cnn --strategy chunked:20 --rounds 3 --repeats 1",
    ],
    # One XLA device per core by default, as the CLI; the strategy and local
    # loop are the defaults ('auto').
    "cpu": [
        "--workload emnist-linear --rounds 10 --repeats 2",
        "--workload emnist-linear --rounds 10 --repeats 2 --algorithm deltafl",
        "--workload synthetic-small --rounds 40 --repeats 2",
        "--workload synthetic-small --rounds 40 --repeats 2 --algorithm deltafl",
        "--workload population --population 1000 --rounds 40 --repeats 2",
        "--workload population --population 1000000 --rounds 40 --repeats 2",
        "--workload population --population 1000 --rounds 40 --repeats 2 --algorithm deltafl",
        "--workload emnist-linear --rounds 5 --repeats 2 --sweep 8",
        "--workload synthetic-small --rounds 20 --repeats 2 --sweep 8",
        "--workload emnist-cnn --rounds 1 --repeats 2",
        "--workload emnist-cnn --rounds 1 --repeats 2 --algorithm deltafl",
    ],
    # Issue 14: the fused local-training kernel against the scan, side by side
    # on one machine (benchmarks/fused_kernel.py times the kernel's schedules alone).
    "gpu-fused": [
        "--workload emnist-linear --strategy vmap --rounds 100 --loop scan",
        "--workload emnist-linear --strategy vmap --rounds 200 --loop fused",
        "--workload emnist-linear --strategy vmap --rounds 200 --loop fused --algorithm deltafl",
        "--workload label-shift --strategy vmap --rounds 200 --loop scan",
        "--workload label-shift --strategy vmap --rounds 400 --loop fused",
        "--workload synthetic-small --strategy vmap --rounds 400 --loop fused",
        "--workload emnist-linear --strategy vmap --rounds 10 --sweep 64 --loop fused --sweep-seeds same",
        "--workload emnist-linear --strategy vmap --rounds 10 --sweep 64 --loop fused",
        "--workload emnist-linear --strategy vmap --rounds 100 --loop fused --rounds-per-call 10",
        "--workload label-shift --strategy vmap --rounds 400 --loop fused --rounds-per-call 20",
    ],
    # Rounds fused into one call on the GPU (dispatch cost per call).
    "gpu-probe": [
        "--workload emnist-linear --strategy vmap --rounds 100 --loop scan --rounds-per-call 10",
        "--workload emnist-linear --strategy vmap --rounds 200 --loop fused --rounds-per-call 10",
        "--workload label-shift --strategy vmap --rounds 200 --loop scan --rounds-per-call 20",
        "--workload label-shift --strategy vmap --rounds 400 --loop fused --rounds-per-call 20",
        "--workload synthetic-small --strategy vmap --rounds 400 --loop fused --rounds-per-call 20",
    ],
    "gpu-convnet": [
        "--workload emnist-cnn --strategy vmap --rounds 5 --repeats 2",
        "--workload emnist-cnn --strategy vmap --rounds 5 --repeats 2 --conv patches",
        "--workload emnist-cnn --strategy chunked:25 --loop while --rounds 5 --repeats 2 --conv patches",
        "--workload emnist-cnn --strategy chunked:50 --loop while --rounds 5 --repeats 2 --conv patches",
        "--workload emnist-cnn --strategy chunked:25 --loop while --rounds 5 --repeats 2",
        "--workload emnist-linear --strategy chunked:25 --loop while --rounds 30",
        "--workload emnist-linear --strategy chunked:50 --loop while --rounds 30",
        "--workload emnist-linear --strategy vmap --rounds 5 --sweep 64 --loop while",
        "--workload emnist-linear --strategy chunked:50 --rounds 5 --sweep 16 --loop while",
    ],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="gpu")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--devices", type=int, default=None,
        help="CPU devices to create (one process, so one count for the whole preset; default: "
        "the CLI's, one per core)",
    )
    args = parser.parse_args()
    from jaxfl.xla_cpu import configure_cpu

    configure_cpu(args.devices)  # Before JAX starts, as the CLI does (None: one per core).
    import rounds_per_second

    for line in PRESETS[args.preset]:
        start = time.perf_counter()
        try:
            config = rounds_per_second._parse(shlex.split(line))
            result = rounds_per_second.run_configuration(config)
        except Exception as error:  # Keep measuring the others.
            traceback.print_exc()
            result = {"config": line, "error": repr(error)}
        result["config"] = line
        result["wall_s"] = time.perf_counter() - start
        print(json.dumps(result), flush=True)
        if args.out:
            with args.out.open("a") as f:
                f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
