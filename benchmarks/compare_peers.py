"""Side-by-side rounds/s of jaxfl and the peer simulators, in one run.

    python benchmarks/compare_peers.py --workload emnist-linear \
        --strategies sequential vmap chunked:4 sharded --peers fedjax --repeats 2

These 2-core machines drift 10-30% between runs, so absolute rounds/s mean
little: every jaxfl figure is reported as a ratio to a peer measured in the
same invocation, alternating peer and jaxfl measurements so that drift hits
both. The peers are the measuring instruments of `shared/peers/` (set up once
with `shared/peers/setup.sh fedjax`); they run the same workload (same data,
shapes and hyperparameters, see `rounds_per_second.py`).

Prints a Markdown table (for benchmarks/RESULTS.md) and writes the raw
measurements as JSON lines to `--out` if given.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PEERS = Path(os.environ.get("JAXFL_PEERS", HERE.parent.parent / "shared" / "peers"))
PEER_ENV = {
    "emnist-linear": {},
    "synthetic-small": {"DIM": "60", "NCLS": "10"},
    "emnist-cnn": {"MODEL": "cnn"},
}
PEER_ROUNDS = {"emnist-linear": 20, "synthetic-small": 50, "emnist-cnn": 2}


def run_peer(peer: str, workload: str, rounds: int) -> float:
    env = {**os.environ, **PEER_ENV[workload]}
    out = subprocess.run(
        [str(PEERS / "run.sh"), peer, str(rounds)],
        env=env, capture_output=True, text=True, check=True,
    ).stdout
    # fedjax prints "X rounds/s (Y ms/round)", X with two decimals only (0.02
    # for the ConvNet), so read Y when present; pfl and Flower print
    # "steady X rounds/s".
    milliseconds = re.search(r"\(([0-9.]+) ms/round\)", out)
    if milliseconds:
        return 1000.0 / float(milliseconds.group(1))
    match = re.search(r"([0-9.]+) rounds/s", out)
    if not match:
        raise RuntimeError(f"could not read {peer}'s rounds/s from: {out[-500:]}")
    return float(match.group(1))


def run_jaxfl(workload: str, config: str, algorithm: str, rounds: int, devices: int | None) -> dict:
    # A config is a strategy followed by optional extra benchmark flags,
    # e.g. "sharded:sequential --loop while".
    strategy, *extra = config.split()
    command = [
        sys.executable, str(HERE / "rounds_per_second.py"),
        "--workload", workload, "--strategy", strategy,
        "--algorithm", algorithm, "--rounds", str(rounds), "--repeats", "2", *extra,
    ]
    if devices:
        command += ["--devices", str(devices)]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="emnist-linear", choices=sorted(PEER_ENV))
    parser.add_argument(
        "--strategies", nargs="+", default=["sequential", "vmap", "sharded"],
        help='jaxfl configurations: a strategy and optional benchmark flags, e.g. "sharded --loop while"',
    )
    parser.add_argument("--algorithm", default="fedavg")
    parser.add_argument("--peers", nargs="+", default=["fedjax"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    peer_speeds = {peer: [] for peer in args.peers}
    ours = {strategy: [] for strategy in args.strategies}
    records = []
    for _ in range(args.repeats):
        for peer in args.peers:
            speed = run_peer(peer, args.workload, PEER_ROUNDS[args.workload])
            peer_speeds[peer].append(speed)
            records.append({"peer": peer, "rounds_per_s": speed})
        for strategy in args.strategies:
            # The sharded strategy needs one XLA device per core on CPU.
            devices = os.cpu_count() if strategy.startswith("sharded") else None
            result = run_jaxfl(args.workload, strategy, args.algorithm, args.rounds, devices)
            ours[strategy].append(result)
            records.append(result)
    if args.out:
        with args.out.open("a") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")

    peer_median = {peer: statistics.median(v) for peer, v in peer_speeds.items()}
    print(f"\n{args.workload}, {args.algorithm}: {time.strftime('%Y-%m-%d')}, "
          f"{platform.machine()} {os.cpu_count()} cores, {args.repeats} alternating repeats (medians)\n")
    header = "| jaxfl configuration | rounds/s | compile s | useful GFLOP/s | peak fraction | " + " | ".join(
        f"x {peer} ({peer_median[peer]:.2f} r/s)" for peer in args.peers) + " |"
    print(header)
    print("|" + "---|" * (5 + len(args.peers)))
    for strategy, results in ours.items():
        speed = statistics.median(r["rounds_per_s"] for r in results)
        cells = [
            f"{results[0]['strategy']} {' '.join(strategy.split()[1:])}".strip(), f"{speed:.2f}",
            f"{statistics.median(r['compile_s'] for r in results):.1f}",
            f"{statistics.median(r['useful_gflops_per_s'] for r in results):.1f}",
            f"{statistics.median(r['peak_fraction'] for r in results):.3f}",
        ] + [f"{speed / peer_median[peer]:.2f}" for peer in args.peers]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
