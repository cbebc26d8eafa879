"""What the evaluation's chunk size costs in speed and memory, per model.

    python benchmarks/evaluation_chunks.py --repeats 3 --json out.json

`per_client_metrics` evaluates a population's examples in chunks of rows
(a `lax.scan` over chunks, per-client sums by segment sum). This times one
compiled evaluation of a synthetic population (64 clients) of each model at
several chunk sizes, alternated within each repeat so that the machine's
drift hits all of them, and reads XLA's temporary buffer size of each
compiled evaluation (`memory_analysis().temp_size_in_bytes`: the chunk's
activations). Models: the Shakespeare LSTM (`char-lstm`, sequences of 80),
the Delta-FL GRU (`char-gru`, 20 characters), the ConvNet (28x28x1) and the
linear model (60 features). `default` is the chunk `default_chunk_rows`
chooses.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import jax
import numpy as np

from jaxfl.data.population import pack_arrays
from jaxfl.evaluation.per_client import default_chunk_rows, per_client_metrics
from jaxfl.models import make_model
from jaxfl.training import Task

MODELS = {
    # name: (input shape, vocabulary (0: real inputs), classes, examples, sequence targets)
    "char-lstm": ((80,), 90, 90, 4096, True),
    "char-gru": ((20,), 53, 53, 16384, False),
    "convnet": ((28, 28, 1), 0, 10, 8192, False),
    "linear": ((60,), 0, 10, 262144, False),
}
CHUNKS = (4096, 1024, 256, 64)


def _population(shape, vocabulary, classes, examples, sequence_targets, rng):
    if vocabulary:
        x = rng.integers(1, vocabulary, (examples, *shape)).astype(np.int32)
    else:
        x = rng.normal(size=(examples, *shape)).astype(np.float32)
    y_shape = (examples, *shape) if sequence_targets else (examples,)
    y = rng.integers(1, classes, y_shape).astype(np.int32)
    return pack_arrays({"x": x, "y": y}, np.full(64, examples // 64))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    results = {
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "load_average_before": os.getloadavg(),
        "backend": jax.default_backend(),
        "models": {},
    }
    for name, (shape, vocabulary, classes, examples, sequence_targets) in MODELS.items():
        model = make_model(name, shape, classes, input_vocab_size=vocabulary or None)
        task = Task(model)
        params = model.init(jax.random.key(0))
        population = _population(shape, vocabulary, classes, examples, sequence_targets, rng)
        default = default_chunk_rows(population)
        compiled = {}
        for chunk in sorted({*CHUNKS, default}, reverse=True):
            evaluate = jax.jit(lambda p, pop, chunk=chunk: per_client_metrics(task, p, pop, chunk_rows=chunk))
            compiled[chunk] = evaluate.lower(params, population).compile()
            jax.block_until_ready(compiled[chunk](params, population))
        times = {chunk: [] for chunk in compiled}
        for _ in range(args.repeats):
            for chunk, run in compiled.items():
                start = time.perf_counter()
                jax.block_until_ready(run(params, population))
                times[chunk].append(time.perf_counter() - start)
        results["models"][name] = {
            "examples": examples,
            "default_chunk": default,
            "chunks": {
                str(chunk): {
                    "examples_per_s": examples / float(np.median(times[chunk])),
                    "temp_mib": compiled[chunk].memory_analysis().temp_size_in_bytes / 2**20,
                }
                for chunk in compiled
            },
        }
        print(name, json.dumps(results["models"][name]), flush=True)
    results["load_average_after"] = os.getloadavg()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
