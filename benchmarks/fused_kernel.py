"""The fused local-training kernel alone, schedule by schedule, on emnist-linear's shapes.

    python benchmarks/fused_kernel.py --out kernel.jsonl          # on a GPU
    python benchmarks/fused_kernel.py --quick                     # one launch (for a profiler)

One cohort's local training as `jaxfl.kernels.local_training` runs it: 100
clients of U[20, 400] examples of 784 features, 62 classes, batch 10, one
epoch (up to 40 steps), the minibatches random permutations of each client's
rows. Times the kernel (best of `--repeats` after a warm-up) for each
`Schedule` and tile width, the same kernel with every client at 0 and at 10
steps (launch and copies; the cost of a step), a 64-setting sweep (the
kernel vmapped over learning rates, with shared minibatches), and the
pure-XLA reference (`fused_local_sgd_reference`: `vmap` over clients of a
`fori_loop` of steps). Each line of output is a JSON object. It also checks,
for the linear model and an MLP, that two launches give the same bits (no
race between the program's threads) and how far the kernel is from the
reference at f32 products, and every schedule against the reference.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from jaxfl.kernels.local_training import DenseLayout, Schedule, fused_local_sgd, fused_local_sgd_reference


def cohort(num_clients=100, num_features=784, batch=10, seed=0, max_steps=None):
    """Features, labels, rows `[M, S, B]` and step counts of a random cohort."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(20, 401, size=num_clients)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    num_examples = int(counts.sum())
    x = jnp.asarray(rng.normal(size=(num_examples, num_features)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 62, size=num_examples), jnp.int32)
    steps = -(-counts // batch)
    length = int(steps.max())
    rows = np.full((num_clients, length, batch), -1, np.int32)
    for client, (count, offset) in enumerate(zip(counts, offsets, strict=True)):
        order = offset + rng.permutation(count)
        padded = np.full(length * batch, -1, np.int32)
        padded[:count] = order
        rows[client] = padded.reshape(length, batch)
    if max_steps is not None:
        steps = np.minimum(steps, max_steps)
    return x, y, jnp.asarray(rows), jnp.asarray(steps, jnp.int32)


def best_seconds(fn, repeats):
    jax.block_until_ready(fn())
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - start)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="one launch of the default schedule, then exit")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--settings", type=int, default=64, help="learning rates of the sweep")
    args = parser.parse_args()
    interpret = jax.default_backend() == "cpu"  # A smoke test only: the interpreter is slow.
    from jaxfl.training.fused import SCHEDULE

    widths = (784, 62)
    x, y, rows, steps = cohort(args.clients)
    layers = [(jnp.zeros((784, 62), jnp.float32), jnp.zeros((62,), jnp.float32))]
    lr = jnp.float32(0.05)

    def kernel(layout, schedule, steps=steps, lr=lr):
        return fused_local_sgd(
            layers, layers, x, y, rows, steps, lr, layout=layout, schedule=schedule, interpret=interpret
        )

    if args.quick:
        jax.block_until_ready(kernel(DenseLayout(widths, 10), SCHEDULE))
        return

    def emit(record):
        record = {"device_kind": jax.devices()[0].device_kind, "date": time.strftime("%Y-%m-%d"), **record}
        print(json.dumps(record), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(record) + "\n")

    def time_variant(name, fn):
        try:
            start = time.perf_counter()
            jax.block_until_ready(fn())
            first = time.perf_counter() - start
            emit({"variant": name, "ms": 1e3 * best_seconds(fn, args.repeats), "first_call_s": first})
        except Exception as error:  # Keep measuring the others.
            emit({"variant": name, "error": repr(error)[:400]})

    layout = DenseLayout(widths, 10)
    time_variant("xla reference (vmap of fori_loop)",
                 lambda: fused_local_sgd_reference(layers, layers, x, y, rows, steps, lr, layout=layout))
    schedules = [Schedule(num_warps=warps) for warps in (4, 8, 16)] + [
        Schedule(num_warps=warps, tile_loop=True, num_stages=stages)
        for warps, stages in ((4, 1), (4, 3), (8, 1), (8, 2), (8, 3))
    ]
    for schedule in schedules:
        time_variant(f"kernel {schedule}", lambda schedule=schedule: kernel(layout, schedule))
    for max_tile in (32, 64):
        for schedule in (Schedule(num_warps=8), Schedule(num_warps=8, tile_loop=True, num_stages=3)):
            time_variant(f"kernel tile {max_tile} {schedule}",
                         lambda m=max_tile, s=schedule: kernel(DenseLayout(widths, 10, max_tile=m), s))
    for fixed in (0, 10):
        time_variant(f"kernel {SCHEDULE} all clients {fixed} steps",
                     lambda f=fixed: kernel(layout, SCHEDULE, steps=jnp.full_like(steps, f)))
    lrs = jnp.geomspace(0.01, 0.1, args.settings).astype(jnp.float32)
    for schedule in (SCHEDULE, Schedule(num_warps=4), Schedule(num_warps=8, tile_loop=True, num_stages=3)):
        sweep = jax.jit(jax.vmap(lambda lr, schedule=schedule: kernel(layout, schedule, lr=lr)))
        time_variant(f"sweep of {args.settings} lrs, shared minibatches, {schedule}",
                     lambda sweep=sweep: sweep(lrs))

    # Every schedule timed above against the reference at f32 products (only the default is in
    # the tests marked gpu): the schedule must not change the result.
    with jax.default_matmul_precision("highest"):
        want, _ = fused_local_sgd_reference(layers, layers, x, y, rows, steps, lr, layout=layout)
        for schedule in schedules:
            try:
                got, _ = kernel(layout, schedule)
                error = max(float(jnp.max(jnp.abs(a - b)))
                            for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True))
                emit({"check": f"schedule {schedule} against the reference", "max_abs_error": error})
            except Exception as failure:  # Keep checking the others.
                emit({"check": f"schedule {schedule}", "error": repr(failure)[:400]})

    # Races and precision: the kernel twice (bitwise) and against the reference at f32.
    for hidden in ((), (200,)):
        mlp_widths = (784, *hidden, 62)
        mlp_layout = DenseLayout(mlp_widths, 16)
        small = cohort(num_clients=args.clients, batch=16, seed=1)
        rng = np.random.default_rng(2)
        start = [
            (jnp.asarray(rng.normal(size=(a, b)) * 0.05, jnp.float32), jnp.zeros((b,), jnp.float32))
            for a, b in zip(mlp_widths[:-1], mlp_widths[1:], strict=True)
        ]
        for precision in ("highest", "default"):
            default = precision == "default"
            with contextlib.nullcontext() if default else jax.default_matmul_precision(precision):
                run = [fused_local_sgd(start, start, *small, lr, layout=mlp_layout, schedule=SCHEDULE,
                                       interpret=interpret) for _ in range(2)]
                want = fused_local_sgd_reference(start, start, *small, lr, layout=mlp_layout)
            same = all(bool(jnp.array_equal(a, b)) for a, b in
                       zip(jax.tree.leaves(run[0]), jax.tree.leaves(run[1]), strict=True))
            errors = [float(jnp.max(jnp.abs(a - b))) for a, b in
                      zip(jax.tree.leaves(run[0]), jax.tree.leaves(want), strict=True)]
            emit({"check": f"widths {mlp_widths} precision {precision}", "two_launches_equal": same,
                  "max_abs_error_per_leaf": errors})


if __name__ == "__main__":
    main()
