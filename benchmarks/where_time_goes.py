"""Where an emnist-linear round's time goes on the CPU: the round taken apart, in one process.

    python benchmarks/where_time_goes.py --repeats 5

Each line times one program that does a growing part of a FedAvg round of the
peers' workload (100 clients of U[20, 400] examples, softmax regression
784 -> 62, batch 10, one epoch, 2,234 local steps a round), on ONE XLA CPU
device, so that the parts add up on one core:

1. `matmuls`: the step's two products alone (forward x W and the weight
   gradient x^T g) on a fixed batch, in a `fori_loop` of 2,234 steps;
2. `sgd step, fixed batch`: the whole SGD step (softmax cross-entropy, its
   gradient, the update) on a fixed batch;
3. `+ gather`: the same with the batch gathered from the packed population
   by random row indices each step;
4. `local training`: `jaxfl.training.local.local_sgd` of the 100 clients one
   after another (`lax.map`): adds the per-client epoch orders, the padding
   mask and the while loop per client;
5. `round, 1 device`: the compiled FedAvg round (cohort, deltas, weighted
   mean, server step) with the sequential strategy;
6. `round, CLI default`: the round as `jaxfl run` runs it on this machine
   (one device per core, `sharded(2xsequential)`, 10 rounds per call), in a
   subprocess of `rounds_per_second.py`.

Prints one JSON line per part (ms per round, GFLOP/s of the 4 x 784 x 62 x B
FLOPs per step) and writes them to `--out` if given.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    from jaxfl.xla_cpu import configure_cpu

    configure_cpu(1)
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxfl.algorithms.base import server_optimizer
    from jaxfl.algorithms.fedavg import fedavg
    from jaxfl.data.registry import load_dataset
    from jaxfl.models.networks import make_model
    from jaxfl.training.local import LocalHParams, LocalTraining, Task, local_sgd
    from jaxfl.training.strategies import ClientStrategy

    population = load_dataset("peer-benchmark").train
    counts = np.asarray(population.counts)
    batch = 10
    steps = int(np.sum(-(-counts // batch)))
    flops_per_step = 4 * 784 * 62 * batch
    model = make_model("linear", (784,), 62)
    task = Task(model)
    params = model.init(jax.random.key(0))
    x_all = population.features["x"]
    y_all = population.features["y"]
    lr = jnp.float32(0.05)

    def timed(name, fn, *inputs):
        compiled = jax.jit(fn).lower(*inputs).compile()
        jax.block_until_ready(compiled(*inputs))
        best = float("inf")
        for _ in range(args.repeats):
            start = time.perf_counter()
            jax.block_until_ready(compiled(*inputs))
            best = min(best, time.perf_counter() - start)
        record = {
            "part": name,
            "ms_per_round": 1e3 * best,
            "us_per_step": 1e6 * best / steps,
            "gflops_per_s": steps * flops_per_step / best / 1e9,
        }
        print(json.dumps(record), flush=True)
        return record

    def step(w, x, y):
        def loss(w):
            logits = x @ w["dense"]["kernel"] + w["dense"]["bias"]
            return jnp.mean(-jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))

        grads = jax.grad(loss)(w)
        return jax.tree.map(lambda a, g: a - lr * g, w, grads)

    x0, y0 = x_all[:batch], y_all[:batch]

    def matmuls(w):
        def body(_, kernel):
            g = jnp.tanh(x0 @ kernel)  # Keeps the product live; cheap next to the dots.
            return kernel - lr * (x0.T @ g)

        return jax.lax.fori_loop(0, steps, body, w["dense"]["kernel"][:, :62])

    def fixed_batch(w):
        return jax.lax.fori_loop(0, steps, lambda _, w: step(w, x0, y0), w)

    rows = jax.random.randint(jax.random.key(1), (steps, batch), 0, x_all.shape[0])

    def gathered(w):
        return jax.lax.fori_loop(0, steps, lambda s, w: step(w, x_all[rows[s]], y_all[rows[s]]), w)

    config = LocalTraining(batch_size=batch, num_epochs=1, loop="while")
    keys = jax.random.split(jax.random.key(2), len(counts))

    def local_training(w):
        def one(client):
            client_id, key = client
            return local_sgd(task, w, population, client_id, key, LocalHParams(lr=lr), config).params

        return jax.lax.map(one, (jnp.arange(len(counts), dtype=jnp.int32), keys))

    algorithm = fedavg(
        task, config, len(counts), strategy=ClientStrategy("sequential"),
        server_tx=server_optimizer("sgd", 1.0),
    )
    state = algorithm.init(params, {"lr": 0.05})

    def one_round(state):
        return algorithm.round(state, population, jax.random.key(3))[0]

    records = [
        timed("matmuls", matmuls, params),
        timed("sgd step, fixed batch", fixed_batch, params),
        timed("+ gather", gathered, params),
        timed("local training", local_training, params),
        timed("round, 1 device", one_round, state),
    ]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    output = subprocess.run(
        [sys.executable, str(HERE / "rounds_per_second.py"), "--workload", "emnist-linear", "--rounds", "20",
         "--repeats", str(args.repeats)],
        capture_output=True, text=True, check=True, env=env,
    ).stdout.splitlines()[-1]
    cli = json.loads(output)
    records.append({
        "part": f"round, CLI default ({cli['strategy']}, {cli['rounds_per_call']} rounds per call)",
        "ms_per_round": 1e3 / cli["rounds_per_s"],
        "us_per_step": 1e6 / cli["rounds_per_s"] / steps,
        "gflops_per_s": steps * flops_per_step * cli["rounds_per_s"] / 1e9,
    })
    print(json.dumps(records[-1]), flush=True)
    if args.out:
        with args.out.open("a") as f:
            for record in records:
                stamp = {"date": time.strftime("%Y-%m-%d"), "load": os.getloadavg()}
                f.write(json.dumps({**record, **stamp}) + "\n")


if __name__ == "__main__":
    main()
