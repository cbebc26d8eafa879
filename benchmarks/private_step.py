"""What example-level privacy costs a training step, against the same step without it.

    python benchmarks/private_step.py --repeats 5 --json out.json

One optimizer step of an MLP (784 -> 256 -> 256 -> 10, about 270k parameters; MNIST's shape) on a
batch of 64 examples, jitted, four ways:

* `sgd`: the mean loss's gradient, then SGD (no privacy);
* `dp-sgd (vmap)`: per-example gradients by `jax.vmap(jax.grad(...))`, then
  `jaxfl.privacy.optimizers.privatize` (clip each, sum, Gaussian noise) and SGD;
* `dp-sgd (loop)`: the same per-example gradients one example after another (`lax.map`), the
  baseline the vmapped path must not be slower than;
* `adadps (vmap)`: `dp-sgd (vmap)` with each example's gradient divided by fixed side information first.

The settings are alternated within each repeat so that the machine's drift hits all of them; each
reports its median seconds per step over the repeats and its ratio to `sgd`'s median.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxfl.privacy import optimizers

BATCH, SIZES, CLASSES = 64, (784, 256, 256), 10


def init(key):
    params = {}
    sizes = (*SIZES, CLASSES)
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        key, sub = jax.random.split(key)
        params[f"w{i}"] = jax.random.normal(sub, (a, b)) / np.sqrt(a)
        params[f"b{i}"] = jnp.zeros(b)
    return params


def loss(params, x, y):
    h = x
    for i in range(len(SIZES)):
        h = h @ params[f"w{i}"] + params[f"b{i}"][None]
        if i < len(SIZES) - 1:
            h = jax.nn.relu(h)
    return optax.softmax_cross_entropy_with_integer_labels(h, y).mean()


def one_example(params, x, y):
    return loss(params, x[None], y[None])


def steps(params):
    """Setting name -> a jitted (params, state, x, y) -> (params, state), with its initial state."""
    side = jax.tree.map(lambda p: jnp.full(p.shape, 0.5), params)
    private = optax.chain(optimizers.privatize(1.0, 1.0, jax.random.key(0)), optax.sgd(0.1))
    adadps = optax.chain(
        optimizers.scale_by_side_information(side), optimizers.privatize(1.0, 1.0, jax.random.key(0)),
        optax.sgd(0.1),
    )
    plain = optax.sgd(0.1)
    per_example_vmap = jax.vmap(jax.grad(one_example), in_axes=(None, 0, 0))

    def per_example_loop(p, x, y):
        return jax.lax.map(lambda xy: jax.grad(one_example)(p, *xy), (x, y))

    def make(tx, gradients):
        def step(p, state, x, y):
            updates, state = tx.update(gradients(p, x, y), state, p)
            return optax.apply_updates(p, updates), state

        return jax.jit(step), tx.init(params)

    return {
        "sgd": make(plain, jax.grad(loss)),
        "dp-sgd (vmap)": make(private, per_example_vmap),
        "dp-sgd (loop)": make(private, per_example_loop),
        "adadps (vmap)": make(adadps, per_example_vmap),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=50, help="steps timed per setting and repeat")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    key = jax.random.key(0)
    params = init(key)
    x = jax.random.normal(key, (BATCH, SIZES[0]))
    y = jax.random.randint(key, (BATCH,), 0, CLASSES)
    settings = steps(params)
    for step, state in settings.values():  # Compile.
        jax.block_until_ready(step(params, state, x, y))
    times = {name: [] for name in settings}
    for _ in range(args.repeats):
        for name, (step, state) in settings.items():
            p, s = params, state
            started = time.perf_counter()
            for _ in range(args.steps):
                p, s = step(p, s, x, y)
            jax.block_until_ready(p)
            times[name].append((time.perf_counter() - started) / args.steps)
    baseline = float(np.median(times["sgd"]))
    result = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {jax.devices()[0]}",
        "load_average": os.getloadavg(),
        "settings": {
            name: {"median_ms": 1e3 * float(np.median(t)), "ratio_to_sgd": float(np.median(t)) / baseline}
            for name, t in times.items()
        },
    }
    for name, row in result["settings"].items():
        print(f"{name}: {row['median_ms']:.3f} ms per step, {row['ratio_to_sgd']:.2f}x sgd")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
