"""Where a compiled round's time goes: rounds/s and a profile of steady-state rounds.

    python benchmarks/round_profile.py --workload label-shift --loops fused scan while
    python benchmarks/round_profile.py --workload emnist-linear --loops scan --scan-unroll 40

For each local loop named, one process-wide configuration of
`rounds_per_second.py` (same workloads, same defaults) is compiled and timed
(`rounds_per_s`, compile time, roofline fraction), then `--profile-rounds`
more rounds run under the JAX profiler (`jax.profiler.trace`, read back
from its Perfetto JSON). One JSON line per configuration adds:

* `kernels_per_round`: device operations per round (GPU kernels, or
  XLA:CPU thunks on the CPU), `memcpy_per_round` (device copies, e.g. a
  while loop's predicate copied to the host each iteration);
* `host_api_per_round`: CUDA driver calls per round by name (kernel
  launches, graph launches, synchronizations);
* `phases`: per phase of the round, kernels and device microseconds per
  round. Phases come from the named scopes of the round template
  (`select`, `plan`, `client_update` with its `epoch_orders` and
  `local_steps`, `aggregate`, `server`); device work outside them
  (metrics, glue) is `other`;
* `device_busy_us_per_round` (kernel time summed) against
  `device_span_us_per_round` (first kernel start to last kernel end, over
  the profiled rounds): the gap is time the device waited for the host.

`--samplers floyd-loop` swaps in cohort sampling as it was before it was
vectorized (Floyd's algorithm as a loop of M steps), to measure that change
in the same process. XLA flags come from the environment (`XLA_FLAGS`),
recorded in each line; `benchmarks/gpu_check.sh` runs this script under
several. `--trace-dir` keeps the raw traces (open them in Perfetto).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# The round template's named scopes, most specific first.
PHASES = ("local_steps", "epoch_orders", "client_update", "select", "plan", "aggregate", "server")


def _parse(argv=None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="label-shift")
    parser.add_argument(
        "--loops", nargs="+", default=["auto"],
        help="local loops to measure in turn (auto, scan, while, fused)",
    )
    parser.add_argument(
        "--samplers", nargs="+", default=["floyd"], choices=("floyd", "floyd-loop"),
        help="cohort samplers to measure in turn (floyd-loop: as before it was vectorized)",
    )
    parser.add_argument("--profile-rounds", type=int, default=5)
    parser.add_argument("--trace-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None, help="append the JSON lines here")
    parser.add_argument("--label", default="", help="recorded in each line (e.g. the flag set's name)")
    parser.add_argument(
        "--from-traces", type=Path, default=None, metavar="DIR",
        help="only summarize the trace directories under DIR written by an earlier --trace-dir "
        "(rounds per trace: their rounds.txt, else --profile-rounds)",
    )
    return parser.parse_known_args(argv)


ARGS, REST = _parse() if __name__ == "__main__" else (None, None)
if ARGS is not None:
    from jaxfl.xla_cpu import configure_cpu

    configure_cpu(None)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import rounds_per_second as rps  # noqa: E402


def floyd_loop_sample(key, population_size: int, sample_size: int):
    """Floyd's sampling as one loop step per draw: the implementation before it was vectorized."""
    last = jnp.arange(population_size - sample_size, population_size, dtype=jnp.int32)
    draws = jax.random.randint(key, (sample_size,), 0, last + 1, dtype=jnp.int32)
    positions = jnp.arange(sample_size)

    def choose(i, chosen):
        seen = jnp.any((chosen == draws[i]) & (positions < i))
        return chosen.at[i].set(jnp.where(seen, last[i], draws[i]))

    return jax.lax.fori_loop(0, sample_size, choose, jnp.zeros(sample_size, jnp.int32))


@contextlib.contextmanager
def sampler(name: str):
    """Rounds built inside use the named cohort sampler."""
    if name == "floyd":
        yield
        return
    from jaxfl.training import cohort

    original = cohort.sample_without_replacement
    cohort.sample_without_replacement = floyd_loop_sample
    try:
        yield
    finally:
        cohort.sample_without_replacement = original


_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(ROOT )?%?([\w.\-]+) = ")
_OP_NAME = re.compile(r"op_name=\"([^\"]*)\"")
_CALLS = re.compile(r"calls=%?([\w.\-]+)")
_KERNEL_NAME = re.compile(r"[A-Za-z_]\w*kernel\w*")


def op_names(hlo_text: str) -> dict[str, str]:
    """HLO instruction name -> its `op_name` metadata (the JAX name stack).

    An instruction without metadata (a fusion, say) takes the op_name of the
    root of the computation it calls, where that has one.
    """
    names, roots, calls = {}, {}, {}
    computation = None
    for line in hlo_text.splitlines():
        header = _COMPUTATION.match(line)
        if header and " = " not in line:
            computation = header.group(1)
            continue
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        name = match.group(2)
        op_name = _OP_NAME.search(line)
        if op_name:
            names[name] = op_name.group(1)
            if match.group(1) and computation is not None:
                roots[computation] = op_name.group(1)
        called = _CALLS.search(line)
        if called:
            calls[name] = called.group(1)
        if op_name and "custom-call(" in line:
            # A Pallas call's kernel runs under its Python function's name, which
            # its serialized IR holds (conventionally `..._kernel`).
            for kernel in set(_KERNEL_NAME.findall(line)):
                names.setdefault(kernel, op_name.group(1))
    for name, computation in calls.items():
        if name not in names and computation in roots:
            names[name] = roots[computation]
    return names


def phase_of(op_name: str | None) -> str:
    """The most specific of PHASES in a name stack ("vmap(local_steps)" counts as "local_steps")."""
    if not op_name:
        return "other"
    scopes = {re.findall(r"\w+", part)[-1] for part in op_name.split("/") if re.search(r"\w", part)}
    for phase in PHASES:
        if phase in scopes:
            return phase
    return "other"


def leaves(ops: list[tuple]) -> list[tuple]:
    """Drops events that enclose the next event of their thread (XLA:CPU's loop thunks enclose their bodies').

    Enclosing means starting no later and ending no earlier: successive
    kernels of a CUDA graph overlap by a fraction of a microsecond, and both count.
    """
    kept = []
    ordered = sorted(ops, key=lambda op: (op[3], op[0], -op[1]))
    for index, op in enumerate(ordered):
        following = ordered[index + 1] if index + 1 < len(ordered) else None
        if (
            following is not None
            and following[3] == op[3]
            and following[0] + following[1] <= op[0] + op[1]
        ):
            continue
        kept.append(op)
    return kept


def _kernel_key(name: str) -> str:
    # XLA:GPU names a fusion's kernel after the instruction, '.' as '_'.
    return name.split("(")[0].strip().replace("_", ".")


def summarize_trace(events: list[dict], names: dict[str, str], rounds: int) -> dict:
    """Per-round counts and phase times of a Perfetto trace of `rounds` rounds."""
    process = {}
    for event in events:
        if event.get("ph") == "M" and event.get("name") == "process_name":
            process[event["pid"]] = event.get("args", {}).get("name", "")
    device_pids = {pid for pid, name in process.items() if "GPU" in name or "/device:" in name}
    by_underscore = {key.replace("_", "."): key for key in names}
    ops, copies = [], 0
    api = collections.Counter()
    for event in events:
        if event.get("ph") != "X" or str(event.get("name", "")).startswith("end: "):
            continue
        name = str(event.get("name", ""))
        args = event.get("args") or {}
        on_device = event.get("pid") in device_pids
        if not on_device and re.match(r"^cu[A-Z]\w*", name):
            api[name.split("(")[0].strip()] += 1
            continue
        if device_pids and not on_device:
            continue
        if not device_pids and "hlo_op" not in args:
            continue  # CPU: only XLA's thunks are device work.
        if "memcpy" in name.lower() or "memset" in name.lower():
            copies += 1
            continue
        # A kernel inside a CUDA graph reports the graph as its hlo_op; its own name is the fusion's.
        hlo_op = by_underscore.get(_kernel_key(name))
        if hlo_op is None:
            hlo_op = args.get("hlo_op", name)
        thread = (event.get("pid"), event.get("tid"))
        ops.append((float(event.get("ts", 0.0)), float(event.get("dur", 0.0)), phase_of(names.get(hlo_op)), thread))
    ops = leaves(ops)
    phases: dict[str, dict[str, float]] = {}
    for _, duration, phase, _ in ops:
        entry = phases.setdefault(phase, {"kernels": 0.0, "us": 0.0})
        entry["kernels"] += 1 / rounds
        entry["us"] += duration / rounds
    span = (max(op[0] + op[1] for op in ops) - min(op[0] for op in ops)) if ops else 0.0
    syncs = sum(count for name, count in api.items() if "Synchronize" in name or re.search(r"Memcpy\w*DtoH(?!\w*Async)", name))
    return {
        "kernels_per_round": len(ops) / rounds,
        "memcpy_per_round": copies / rounds,
        "host_syncs_per_round": syncs / rounds,
        "host_api_per_round": {name: count / rounds for name, count in api.most_common(12)},
        "device_busy_us_per_round": sum(op[1] for op in ops) / rounds,
        "device_span_us_per_round": span / rounds,
        "phases": {k: {"kernels": round(v["kernels"], 2), "us": round(v["us"], 1)} for k, v in sorted(phases.items())},
    }


def profile(compiled, state, population, key, rounds_per_call: int, calls: int, trace_dir: Path) -> dict:
    """Runs `calls` calls of the compiled round under the profiler and summarizes the trace."""
    hlo_text = compiled.as_text()
    trace_dir.mkdir(parents=True, exist_ok=True)
    (trace_dir / "hlo.txt").write_text(hlo_text)
    names = op_names(hlo_text)
    with jax.profiler.trace(str(trace_dir), create_perfetto_trace=True):
        for _ in range(calls):
            state, _ = compiled(state, population, key)
        jax.block_until_ready(state)
    traces = sorted(glob.glob(str(trace_dir / "**" / "perfetto_trace.json.gz"), recursive=True), key=os.path.getmtime)
    if not traces:
        return {"profile_error": f"no perfetto trace under {trace_dir}"}
    (trace_dir / "rounds.txt").write_text(str(calls * rounds_per_call))
    return {**summarize_trace(load_events(traces[-1]), names, calls * rounds_per_call), "trace": traces[-1]}


def load_events(path: str) -> list[dict]:
    with gzip.open(path) as handle:
        data = json.load(handle)
    return data["traceEvents"] if isinstance(data, dict) else data


def summarize_saved(trace_dir: Path, rounds: int) -> dict:
    """`summarize_trace` of a trace directory written by `profile` (its HLO, its round count)."""
    traces = sorted(glob.glob(str(trace_dir / "**" / "perfetto_trace.json.gz"), recursive=True))
    hlo = trace_dir / "hlo.txt"
    names = op_names(hlo.read_text()) if hlo.exists() else {}
    counted = trace_dir / "rounds.txt"
    rounds = int(counted.read_text()) if counted.exists() else rounds
    return {"trace_dir": trace_dir.name, **summarize_trace(load_events(traces[-1]), names, rounds)}


def run(args, rest) -> list[dict]:
    lines = []
    for loop, sampler_name in [(loop, name) for name in args.samplers for loop in args.loops]:
        config = rps._parse(["--workload", args.workload, "--loop", loop, *rest])
        trace_dir = args.trace_dir or Path(tempfile.mkdtemp(prefix="round-profile-"))
        trace_dir = trace_dir / f"{args.workload}-{config.algorithm}-{loop}-{sampler_name}-{args.label or 'default'}"

        def inspect(compiled, state, population, key, rounds_per_call):
            if args.profile_rounds < 1:
                return {}
            try:
                return profile(compiled, state, population, key, rounds_per_call, args.profile_rounds, trace_dir)
            except Exception as error:  # A failed profile must not lose the timing.
                return {"profile_error": f"{type(error).__name__}: {error}"}

        start = time.perf_counter()
        try:
            with sampler(sampler_name):
                line = rps.run_configuration(config, inspect=inspect)
        except Exception as error:
            line = {"workload": args.workload, "loop": loop, "error": f"{type(error).__name__}: {error}"[:500]}
        line.update(label=args.label, sampler=sampler_name, wall_s=time.perf_counter() - start)
        print(json.dumps(line), flush=True)
        if args.out:
            with open(args.out, "a") as handle:
                handle.write(json.dumps(line) + "\n")
        lines.append(line)
    return lines


def table(lines: list[dict]) -> str:
    """A Markdown table of the lines: rounds/s, kernels and the phases' device time."""
    rows = ["| workload | loop | label | sampler | rounds/s | kernels | copies | syncs | busy µs | span µs | phases (µs) |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for line in lines:
        if "error" in line:
            rows.append(f"| {line['workload']} | {line['loop']} | {line.get('label', '')} | | error: {line['error'][:80]} |")
            continue
        phases = ", ".join(f"{k} {v['us']:.0f}" for k, v in line.get("phases", {}).items())
        rows.append(
            f"| {line['workload']} | {line['loop']}{'' if line.get('scan_unroll', 1) == 1 else ' x' + str(line['scan_unroll'])} "
            f"| {line.get('label', '')} | {line.get('sampler', '')} | {line['rounds_per_s']:.1f} "
            f"| {line.get('kernels_per_round', float('nan')):.0f} | {line.get('memcpy_per_round', float('nan')):.0f} "
            f"| {line.get('host_syncs_per_round', float('nan')):.0f} | {line.get('device_busy_us_per_round', float('nan')):.0f} "
            f"| {line.get('device_span_us_per_round', float('nan')):.0f} | {phases} |"
        )
    return "\n".join(rows)


def main() -> None:
    if ARGS.from_traces is not None:
        for trace_dir in sorted(path for path in ARGS.from_traces.iterdir() if path.is_dir()):
            print(json.dumps(summarize_saved(trace_dir, ARGS.profile_rounds)), flush=True)
        return
    lines = run(ARGS, REST)
    print(table(lines))


if __name__ == "__main__":
    main()
