"""What compressing the clients' updates costs a round, against the same round uncompressed.

    python benchmarks/compressed_round.py --repeats 5 --json out.json

Builds each setting as `jaxfl run` does (`jaxfl.experiment.run_setup.setup`,
the CLI's defaults otherwise: the label-shift data, 100 clients per round,
FedAvg, the backend's default strategy) and times the compiled call of
`rounds_per_call` rounds the runner would use, after one warm-up call. The
settings are alternated within each repeat, so that the machine's drift hits
all of them; the figure reported is each setting's median seconds per round,
and its ratio to the uncompressed round's median. Two models: the CLI's
default (linear, d = 210) and an MLP of two hidden layers of 256 (d = 73,738),
where compression's work per client grows with d.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import jax
import numpy as np

from jaxfl.experiment.config import RunConfig
from jaxfl.experiment.health import monitored
from jaxfl.experiment.run_setup import setup
from jaxfl.experiment.runner import initial_carry
from jaxfl.experiment.training_loop import compile_rounds, rounds_per_call, training_input

COMPRESSIONS = {
    "none": {},
    "qsgd-4bit": {"compression": "qsgd", "compression_bits": 4},
    "qsgd-4bit-rotated": {"compression": "qsgd", "compression_bits": 4, "compression_rotation": True},
    "rand-k-1%": {"compression": "rand-k", "compression_fraction": 0.01},
    "top-k-1%-ef": {"compression": "top-k", "compression_fraction": 0.01, "error_feedback": True},
}
MODELS = {"linear": {}, "mlp-256x2": {"model": "mlp", "hidden_sizes": (256, 256)}}


def _compiled(config: RunConfig):
    run_setup = setup(config)
    name = config.algorithms[0]
    carry, run_key = initial_carry(run_setup, name)
    per_call = rounds_per_call(run_setup.engine.strategy, config.server.rounds, config.evaluation.eval_every)
    population = training_input(run_setup, run_key, per_call)
    call = compile_rounds(monitored(run_setup.algorithms[name].round), per_call)
    carry, _ = call(carry, population, run_key)  # Compiles.
    jax.block_until_ready(carry)
    return {"call": call, "carry": carry, "population": population, "key": run_key, "per_call": per_call}


def _time(entry, calls: int) -> float:
    carry = entry["carry"]
    start = time.perf_counter()
    for _ in range(calls):
        carry, _ = entry["call"](carry, entry["population"], entry["key"])
    jax.block_until_ready(carry)
    entry["carry"] = carry
    return (time.perf_counter() - start) / (calls * entry["per_call"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=10, help="compiled calls timed per repeat")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    results = {
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "backend": jax.default_backend(),
        "jax": jax.__version__,
        "load_before": os.getloadavg(),
        "models": {},
    }
    for model, model_settings in MODELS.items():
        entries = {}
        for label, settings in COMPRESSIONS.items():
            config = RunConfig().replace(
                rounds=200, eval_every=200, progress=False, **model_settings, **settings
            )
            entries[label] = _compiled(config)
        times = {label: [] for label in entries}
        for _ in range(args.repeats):
            for label, entry in entries.items():
                times[label].append(_time(entry, args.calls))
        base = float(np.median(times["none"]))
        results["models"][model] = {
            label: {
                "s_per_round": float(np.median(values)),
                "ratio_to_uncompressed": float(np.median(values)) / base,
                "spread": [float(min(values)), float(max(values))],
            }
            for label, values in times.items()
        }
        print(json.dumps({model: results["models"][model]}, indent=1), flush=True)
    results["load_after"] = os.getloadavg()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
