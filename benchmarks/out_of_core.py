"""Populations larger than device memory: rounds/s and host memory of a host-resident population.

    python benchmarks/out_of_core.py --clients 10000000 --rounds 200 --repeats 2 --out results.jsonl

Workload: the `many-clients` population (N clients of 1-9 examples, 20
features, 10 classes; 10^7 clients = 5.0e7 examples = 4.2 GB) generated once
into the on-disk cache (`storage=disk`) and memory-mapped; FedAvg with the
linear model, 100 clients per round, batch 10, one local epoch, and every
other setting at the CLI's defaults for this machine (one XLA device per
core, the strategy and the rounds per call that `jaxfl run` picks).

Configurations, each in a fresh process (so that its peak RSS is its own),
alternated `--repeats` times:

* host-N: the N-client population host-resident (`--residency host`): each
  round's cohort gathered from the memory map one call ahead;
* device-small: a `--small`-client population of the same size law on the
  device (the same cohort shapes: M = 100 clients of at most 9 examples);
* host-small: the small population host-resident (the cost of gathering,
  apart from the population's size).

Reported per run: steady rounds/s (after the first, compiling call; no
evaluation), compile seconds, the process's peak RSS, and its RSS split
into anonymous memory (what a leak would grow) and file-backed pages (the
memory map's pages touched, which the kernel may drop) after the first call
and at the end. The summary gives host-N / device-small.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _rss() -> dict[str, float]:
    """Anonymous and file-backed resident memory of this process, MiB."""
    fields = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile", "VmRSS"):
                fields[key] = int(value.split()[0]) / 1024
    return fields


def _evict(population) -> None:
    """Drops the population's files from the page cache (clean pages; no root needed)."""
    for array in population.features.values():
        if getattr(array, "filename", None):
            fd = os.open(array.filename, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _warm(population) -> None:
    """Reads the population's files once, so that the page cache holds them."""
    for array in population.features.values():
        if getattr(array, "filename", None):
            with open(array.filename, "rb") as f:
                while f.read(1 << 24):
                    pass


def worker(args) -> dict:
    from jaxfl.xla_cpu import configure_cpu

    configure_cpu()
    import jax

    from jaxfl.experiment.config import make_config
    from jaxfl.experiment.runner import (
        compile_rounds,
        rounds_per_call,
        setup,
        training_input,
        training_loop,
    )
    from jaxfl.training.host_cohorts import CohortStream

    start = time.perf_counter()
    config = make_config(
        {
            "algorithm": "fedavg",
            "dataset": "many-clients",
            "dataset_options": {
                "num_clients": args.clients,
                "min_examples": 1,
                "max_examples": 9,
                "storage": "disk",
                "num_test_clients": 1000,
            },
            "residency": args.residency,
            "model": "linear",
            "rounds": args.rounds,
            "eval_every": args.rounds,
            "clients_per_round": 100,
            "batch_size": 10,
            "lr": 0.1,
            "progress": False,
            "seed": args.seed,
        }
    )
    run_setup = setup(config)
    load_s = time.perf_counter() - start
    if args.page_cache == "cold":
        _evict(run_setup.dataset.train)
    else:
        _warm(run_setup.dataset.train)
    engine = run_setup.engine
    strategy = engine.strategy
    algorithm = run_setup.algorithms["fedavg"]
    init_key, run_key = jax.random.split(jax.random.key(config.runtime.seed))
    state = strategy.replicate(algorithm.init(engine.task.model.init(init_key), run_setup.hparams["fedavg"]))
    fused = rounds_per_call(strategy, config.server.rounds, config.evaluation.eval_every)
    train = training_input(run_setup, run_key, fused)
    on_host = isinstance(train, CohortStream)
    round_fn = compile_rounds(algorithm.round, fused, cohort_per_round=on_host)
    samples = []

    class Progress:  # Samples memory after every call.
        def update(self, n):
            samples.append(_rss())

        def set_postfix_str(self, text):
            pass

    state, timing = training_loop(
        round_fn, state, train, run_key, config, strategy, lambda *a: None, Progress(), fused
    )
    jax.block_until_ready(state)
    return {
        "config": f"{'host' if on_host else 'device'}-{args.clients}"
        + ("-cold" if on_host and args.page_cache == "cold" else ""),
        "page_cache": args.page_cache,
        "seed": args.seed,
        "clients": args.clients,
        "examples": run_setup.dataset.train.num_examples,
        "population_mib": run_setup.dataset.train.nbytes / 2**20,
        "residency": args.residency,
        "strategy": strategy.describe(),
        "rounds_per_call": fused,
        "rounds": config.server.rounds,
        "rounds_per_s": timing.rounds_per_s,
        "compile_s": timing.compile_s,
        "load_s": load_s,
        "rss_after_first_call_mib": samples[0],
        "rss_end_mib": samples[-1],
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=10_000_000)
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--residency", default="host", help=argparse.SUPPRESS)
    parser.add_argument("--page-cache", default="warm", choices=("warm", "cold"), help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)), flush=True)
        return
    runs = [
        ("host", args.clients, False),
        ("host", args.clients, True),
        ("device", args.small, False),
        ("host", args.small, False),
    ]
    header = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {os.cpu_count()} cores, {platform.platform()}",
        "loadavg_start": os.getloadavg(),
    }
    print(json.dumps(header), flush=True)
    results = []
    for repeat in range(args.repeats):
        for residency, clients, cold in runs:
            command = [
                sys.executable,
                __file__,
                "--worker",
                "--residency",
                residency,
                "--clients",
                str(clients),
                "--rounds",
                str(args.rounds),
                "--seed",
                str(repeat),
                "--page-cache",
                "cold" if cold else "warm",
            ]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                print(done.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"worker failed: {' '.join(command)}")
            result = {
                **json.loads(done.stdout.strip().splitlines()[-1]),
                "repeat": repeat,
                "loadavg": os.getloadavg(),
            }
            results.append(result)
            print(json.dumps(result), flush=True)
            if args.out:
                with args.out.open("a") as f:
                    f.write(json.dumps({**header, **result}) + "\n")
    speeds = {}
    for result in results:
        speeds.setdefault(result["config"], []).append(result["rounds_per_s"])
    medians = {k: statistics.median(v) for k, v in speeds.items()}
    summary = {
        "summary": medians,
        "host_large_over_device_small": medians[f"host-{args.clients}"] / medians[f"device-{args.small}"],
        "host_large_cold_over_device_small": medians[f"host-{args.clients}-cold"]
        / medians[f"device-{args.small}"],
        "host_small_over_device_small": medians[f"host-{args.small}"] / medians[f"device-{args.small}"],
        "loadavg_end": os.getloadavg(),
    }
    print(json.dumps(summary), flush=True)
    if args.out:
        with args.out.open("a") as f:
            f.write(json.dumps({**header, **summary}) + "\n")


if __name__ == "__main__":
    main()
