"""Side-by-side rounds/s of jaxfl, the peer simulators and a hand-written loop, in one run.

    python benchmarks/compare_peers.py --workload emnist-linear \
        --strategies sequential vmap chunked:4 sharded --peers fedjax loop --repeats 2
    python benchmarks/compare_peers.py --workload shakespeare-lstm --max-local-steps 20 \
        --strategies auto vmap --peers fedjax loop --repeats 2

These 2-core machines drift 10-30% between runs, so absolute rounds/s mean
little: every jaxfl figure is reported as a ratio to a peer measured in the
same invocation, alternating peer and jaxfl measurements so that drift hits
both. The peers are the measuring instruments of `shared/peers/` (set up once
with `shared/peers/setup.sh fedjax`); they run the same workload (same data,
shapes and hyperparameters, see `rounds_per_second.py`).

Besides the peers, `loop` is `loop_baseline.py`: the same workload and the
same round (tested equal) written as Python loops over clients and
minibatches around one jitted SGD step, as a JAX user writes it by hand; it
runs in jaxfl's environment (on a GPU too) and appears as a row and a
column of the table.

shakespeare-lstm: fedjax runs `fedjax-shakespeare` (`shared/peers/fedjax_shakespeare.py`:
fedjax's own preprocessing and LSTM) on a FedJAX SQLite file of the
workload's 20 clients, written once per invocation by `rounds_per_second.py
--write-peer-data` (or given with `--peer-data`), with CLIENTS=10, BATCH=4,
LR=1.0, SEQ=80 and MAX_STEPS = `--max-local-steps` (default 20), the cap
jaxfl and the loop get too: every client of the subset has at least 20
batches, so all three run exactly 10 x K steps of batch 4 every round.
fedjax's cohorts are taken in a fixed order and jaxfl's sampled, which
changes nothing with the cap binding. Budget: fedjax's first round compiles
for about 300 s in every repeat on a quiet machine (687 s at load 8; its
steady rounds/s excludes it), and its steps take 0.33-0.53 s (a round of
200 steps: 1-2 minutes), jaxfl's and the loop's 0.03-0.1 s: roughly 20-30
minutes for `--repeats 2` on a quiet 2-core machine.

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
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PEERS = Path(os.environ.get("JAXFL_PEERS", HERE.parent.parent / "shared" / "peers"))
PEER_ENV = {
    "emnist-linear": {},
    "synthetic-small": {"DIM": "60", "NCLS": "10"},
    "emnist-cnn": {"MODEL": "cnn"},
    # DATA (the same clients) and MAX_STEPS are added per invocation.
    "shakespeare-lstm": {"CLIENTS": "10", "BATCH": "4", "LR": "1.0", "SEQ": "80"},
    "shakespeare-gru": {},  # The loop only: no peer runs the Delta-FL GRU.
}
PEER_ROUNDS = {"emnist-linear": 20, "synthetic-small": 50, "emnist-cnn": 2, "shakespeare-lstm": 2}
# The run.sh entry of a peer on a workload, where it is not the peer's own name.
PEER_SCRIPTS = {("fedjax", "shakespeare-lstm"): "fedjax-shakespeare"}
# Workloads only some peers run (default: those).
PEER_WORKLOADS = {"shakespeare-lstm": ["fedjax", "loop"], "shakespeare-gru": ["loop"]}
# Defaults per workload: jaxfl rounds per timed repetition, strategies, local step cap.
ROUNDS = {"shakespeare-lstm": 2, "shakespeare-gru": 5}
STRATEGIES = {"shakespeare-lstm": ["auto"]}
MAX_LOCAL_STEPS = {"shakespeare-lstm": 20}


def run_peer(peer: str, workload: str, rounds: int, extra_env: dict | None = None) -> float:
    env = {**os.environ, **PEER_ENV[workload], **(extra_env or {})}
    script = PEER_SCRIPTS.get((peer, workload), peer)
    out = subprocess.run(
        [str(PEERS / "run.sh"), script, str(rounds)],
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


def _last_json(command: list[str]) -> dict:
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _cap(max_local_steps: int | None) -> list[str]:
    return [] if max_local_steps is None else ["--max-local-steps", str(max_local_steps)]


def run_jaxfl(
    workload: str, config: str, algorithm: str, rounds: int, devices: int | None,
    max_local_steps: int | None = None,
) -> dict:
    # A config is a strategy followed by optional extra benchmark flags,
    # e.g. "sharded:sequential --loop while".
    strategy, *extra = config.split()
    command = [
        sys.executable, str(HERE / "rounds_per_second.py"),
        "--workload", workload, "--strategy", strategy,
        "--algorithm", algorithm, "--rounds", str(rounds), "--repeats", "2", *_cap(max_local_steps), *extra,
    ]
    if devices:
        command += ["--devices", str(devices)]
    return _last_json(command)


def run_loop(workload: str, rounds: int, max_local_steps: int | None) -> dict:
    """`loop_baseline.py` on the workload (jaxfl's environment, one device)."""
    return _last_json([
        sys.executable, str(HERE / "loop_baseline.py"), "--workload", workload,
        "--rounds", str(rounds), "--repeats", "2", *_cap(max_local_steps),
    ])


def write_peer_data(workload: str, path: Path) -> dict:
    """The workload's training clients as the FedJAX SQLite file the fedjax peer reads."""
    return _last_json([
        sys.executable, str(HERE / "rounds_per_second.py"), "--workload", workload,
        "--write-peer-data", str(path),
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="emnist-linear", choices=sorted(PEER_ENV))
    parser.add_argument(
        "--strategies", nargs="+", default=None,
        help='jaxfl configurations: a strategy and optional benchmark flags, e.g. "sharded --loop while" '
        "(default: sequential vmap sharded; shakespeare-lstm: auto, the CLI's)",
    )
    parser.add_argument("--algorithm", default="fedavg")
    parser.add_argument(
        "--peers", nargs="+", default=None,
        help="peers of shared/peers (fedjax, pfl, flwr) and 'loop' (loop_baseline.py); "
        "default: fedjax loop (shakespeare-gru: loop)",
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--rounds", type=int, default=None,
        help="rounds per timed repetition of jaxfl and the loop (default 20; shakespeare-lstm 2, -gru 5)",
    )
    parser.add_argument(
        "--max-local-steps", type=int, default=None,
        help="cap on local steps for jaxfl, the loop and fedjax-shakespeare's MAX_STEPS "
        "(default: shakespeare-lstm 20, else none)",
    )
    parser.add_argument(
        "--peer-data", type=Path, default=None,
        help="shakespeare-lstm: the FedJAX SQLite file of the workload's clients (default: written now)",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    strategies = args.strategies or STRATEGIES.get(args.workload, ["sequential", "vmap", "sharded"])
    rounds = args.rounds or ROUNDS.get(args.workload, 20)
    cap = args.max_local_steps or MAX_LOCAL_STEPS.get(args.workload)
    supported = PEER_WORKLOADS.get(args.workload)
    args.peers = args.peers or supported or ["fedjax", "loop"]
    if supported is not None and set(args.peers) - set(supported):
        parser.error(f"{args.workload} runs with the peers {supported} only")
    if args.algorithm != "fedavg" and "loop" in args.peers:
        parser.error("the loop baseline runs fedavg only")
    peer_env = {}
    if args.workload == "shakespeare-lstm":
        data = args.peer_data
        if data is None:
            data = Path(tempfile.mkdtemp(prefix="jaxfl-peer-data-")) / "shakespeare_train.sqlite"
            written = write_peer_data(args.workload, data)
            print(f"wrote {written['clients']} clients ({written['examples']} sequences) to {data}",
                  flush=True)
        peer_env = {"DATA": str(data)}
        if cap is not None:
            peer_env["MAX_STEPS"] = str(cap)
    elif cap is not None and set(args.peers) - {"loop"}:
        parser.error(f"the peers run {args.workload} without a step cap: use --peers loop")

    peer_speeds = {peer: [] for peer in args.peers}
    loop_results = []
    ours = {strategy: [] for strategy in strategies}
    records = []
    for _ in range(args.repeats):
        for peer in args.peers:
            if peer == "loop":
                result = {"peer": "loop", **run_loop(args.workload, rounds, cap)}
                loop_results.append(result)
                speed = result["rounds_per_s"]
                records.append(result)
            else:
                speed = run_peer(peer, args.workload, PEER_ROUNDS[args.workload], peer_env)
                records.append({"peer": peer, "workload": args.workload, "rounds_per_s": speed,
                                "max_local_steps": cap, "date": time.strftime("%Y-%m-%d")})
            peer_speeds[peer].append(speed)
            print(f"{peer}: {speed:.3f} rounds/s", flush=True)
        for strategy in strategies:
            # The sharded strategy needs one XLA device per core on CPU (the
            # benchmark's default, as the CLI's).
            devices = os.cpu_count() if strategy.startswith("sharded") else None
            result = run_jaxfl(args.workload, strategy, args.algorithm, rounds, devices, cap)
            ours[strategy].append(result)
            records.append(result)
            print(f"jaxfl {result['strategy']}: {result['rounds_per_s']:.3f} rounds/s", flush=True)
    if args.out:
        with args.out.open("a") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")

    peer_median = {peer: statistics.median(v) for peer, v in peer_speeds.items()}
    steps = f", at most {cap} local steps" if cap is not None else ""
    print(f"\n{args.workload}, {args.algorithm}{steps}: {time.strftime('%Y-%m-%d')}, "
          f"{platform.machine()} {os.cpu_count()} cores, {args.repeats} alternating repeats (medians)\n")
    header = "| jaxfl configuration | rounds/s | compile s | useful GFLOP/s | peak fraction | " + " | ".join(
        f"x {peer} ({peer_median[peer]:.3f} r/s)" for peer in args.peers) + " |"
    print(header)
    print("|" + "---|" * (5 + len(args.peers)))
    rows = list(ours.items())
    if loop_results:
        rows.append(("loop", loop_results))
    for strategy, results in rows:
        speed = statistics.median(r["rounds_per_s"] for r in results)
        label = "python loop (loop_baseline.py)" if strategy == "loop" else (
            f"{results[0]['strategy']} {' '.join(strategy.split()[1:])}".strip()
        )
        cells = [
            label, f"{speed:.3f}",
            f"{statistics.median(r['compile_s'] for r in results):.1f}",
            f"{statistics.median(r['useful_gflops_per_s'] for r in results):.1f}",
            f"{statistics.median(r['peak_fraction'] for r in results):.3f}",
        ] + [f"{speed / peer_median[peer]:.2f}" for peer in args.peers]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
