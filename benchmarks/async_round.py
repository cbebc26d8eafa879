"""An asynchronous server step's cost against a synchronous round on the same workload.

    python benchmarks/async_round.py --repeats 5 --json out.json

Built as `jaxfl run` builds them (the CLI's defaults: label-shift data, 100
clients per round, every client online on the simulated clock): FedAvg's
synchronous round of 100 clients without the clock and on it, FedBuff's server step (100 arrivals, 100
new clients trained, concurrency 400) and FedAsync's (1 arrival, 1 new
client, concurrency 400), each timed as the runner calls it
(`compressed_round._compiled`), alternated within each repeat. Reported:
median seconds per round or step, and per client trained.
"""

from __future__ import annotations

import argparse
import json
import os
import platform

import jax
import numpy as np
from compressed_round import _compiled, _time

from jaxfl.experiment.config import RunConfig

SETTINGS = {
    "fedavg, no clock (100 clients)": ({"algorithm": "fedavg", "availability": None}, 100),
    "fedavg on the clock (100 clients)": ({"algorithm": "fedavg"}, 100),
    "fedbuff (K = 100, C = 400)": ({"algorithm": "fedbuff", "concurrency": 400}, 100),
    "fedasync (K = 1, C = 400)": ({"algorithm": "fedasync", "concurrency": 400}, 1),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--json")
    args = parser.parse_args()
    entries = {
        label: _compiled(RunConfig().replace(rounds=200, eval_every=200, progress=False,
                                              **{"availability": "always", **settings}))
        for label, (settings, _) in SETTINGS.items()
    }  # fmt: skip
    times = {label: [] for label in entries}
    for _ in range(args.repeats):
        for label, entry in entries.items():
            times[label].append(_time(entry, args.calls))
    results = {
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "backend": jax.default_backend(),
        "jax": jax.__version__,
        "load_after": os.getloadavg(),
        "settings": {
            label: {
                "s_per_step": float(np.median(values)),
                "s_per_client_trained": float(np.median(values)) / SETTINGS[label][1],
                "spread": [float(min(values)), float(max(values))],
            }
            for label, values in times.items()
        },
    }
    print(json.dumps(results, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
