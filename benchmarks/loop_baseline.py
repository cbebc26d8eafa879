"""Rounds per second of FedAvg written by hand: Python loops around one jitted SGD step.

    python benchmarks/loop_baseline.py --workload shakespeare-lstm --rounds 2 --max-local-steps 20

The baseline a simulator has to beat: how a user writes federated learning
in current JAX without one (and how fedjax's default backend runs it). A
Python loop over the round's clients and, inside it, over the client's
minibatches, each step one call of a single `jax.jit`-compiled SGD step
whose parameters are donated (`donate_argnums`); minibatches are gathered
with NumPy on the host and handed to the step; after each client its update
is added to a running example-weighted sum (one more jitted call), and the
server applies the weighted mean (server SGD, learning rate 1 = plain
FedAvg). Nothing is fused across steps or clients, and the host dispatches
every step. Runs wherever JAX runs (CPU, GPU); it needs no peer simulator.

Same workload as `rounds_per_second.py` (its `load_workload`: the same
clients, model, loss, batch size, learning rate, clients per round and
`--max-local-steps` cap), and the same round: the cohort, each client's
key and its per-epoch shuffles come from jaxfl's key scheme
(`round_keys`, `sample_without_replacement`, `epoch_orders`; one small
jitted call per round, where a user would call NumPy), each step
averages the loss over the batch's real examples (or real tokens) with the
last batch of an epoch holding the remainder (padded to the batch size and
masked, so one compiled step serves every batch), and the weights are the
clients' numbers of examples. Same seed, same result as jaxfl's compiled
round (tests/benchmarks/test_loop_baseline.py), so the two rounds/s compare
the same computation.

Prints one JSON object with the fields of `rounds_per_second.py`
(rounds_per_s, compile_s, useful_gflops_per_s, peak_fraction, ...);
`strategy` is "python-loop". It runs on one device (`--devices`, default 1:
what a plain JAX program gets on CPU) with the CLI's XLA:CPU settings
(`jaxfl.xla_cpu.configure_cpu`), so that both run the same kernels and
differ only in how the round is driven.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--workload", default="emnist-linear",
        choices=("emnist-linear", "synthetic-small", "emnist-cnn", "population", "shakespeare-lstm",
                 "shakespeare-gru"),
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds per timed repetition")
    parser.add_argument("--repeats", type=int, default=2, help="timed repetitions; the best is kept")
    parser.add_argument("--devices", type=int, default=1, help="CPU devices to create (the loop uses one)")
    parser.add_argument("--population", type=int, default=1000, help="N for the population workload")
    parser.add_argument("--clients-per-round", type=int, default=None)
    parser.add_argument("--max-local-steps", type=int, default=None, help="cap on each client's local steps")
    parser.add_argument("--conv", default="auto", choices=("auto", "lax", "canonical", "patches"))
    parser.add_argument("--seed", type=int, default=1, help="run key (rounds_per_second.py uses 1)")
    return parser.parse_args(argv)


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:
    from jaxfl.xla_cpu import configure_cpu

    configure_cpu(ARGS.devices)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxfl.data.population import ClientPopulation  # noqa: E402
from jaxfl.training.cohort import round_keys  # noqa: E402
from jaxfl.training.local import Task, epoch_orders  # noqa: E402
from jaxfl.training.sampling import sample_without_replacement  # noqa: E402
from jaxfl.types import Key, Params  # noqa: E402


class LoopFedAvg:
    """FedAvg as Python loops over clients and minibatches around one jitted SGD step.

    `round(params, run_key, round_index, lr)` computes what jaxfl's
    `fedavg(...).round` computes from a state at round `round_index` with
    the same `run_key` (module docstring).
    """

    def __init__(
        self,
        task: Task,
        population: ClientPopulation,
        *,
        batch_size: int,
        clients_per_round: int,
        num_epochs: int = 1,
        max_steps: int | None = None,
        server_lr: float = 1.0,
    ):
        if task.model.stochastic:
            raise ValueError("the loop baseline runs deterministic models only")
        self.task = task
        # The data live on the host, as a user's NumPy arrays; each step's batch is gathered there.
        self.features = {name: np.asarray(values) for name, values in population.features.items()}
        self.offsets = np.asarray(population.offsets, np.int64)
        self.counts = np.asarray(population.counts, np.int64)
        self.max_count = int(population.max_count)
        self.num_clients = len(self.counts)
        self.batch_size = batch_size
        self.clients_per_round = clients_per_round
        self.num_epochs = num_epochs
        self.max_steps = max_steps
        self.server_lr = server_lr
        self.step = jax.jit(self._sgd_step, donate_argnums=0)
        self.plan = jax.jit(self._plan)
        self.copy = jax.jit(lambda tree: jax.tree.map(jnp.copy, tree))
        self.zeros = jax.jit(lambda tree: jax.tree.map(jnp.zeros_like, tree))
        self.accumulate = jax.jit(self._accumulate, donate_argnums=0)
        self.server = jax.jit(self._server, donate_argnums=0)

    # ------------------------------------------------------------ jitted pieces

    def _sgd_step(self, params: Params, batch: dict, valid: jax.Array, lr: jax.Array):
        def loss_fn(p):
            stats = self.task.example_stats(p, batch)
            total = jnp.sum(jnp.where(valid, stats.loss_weight, 0.0))
            return jnp.sum(jnp.where(valid, stats.loss, 0.0)) / jnp.maximum(total, 1.0)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return jax.tree.map(lambda w, g: w - lr * g, params, grads), loss

    def _plan(self, run_key: Key, round_index: jax.Array):
        """The round's client ids and each one's example order per epoch `[M, E, max_count]`."""
        keys = round_keys(run_key, round_index)
        ids = sample_without_replacement(keys.sampling, self.num_clients, self.clients_per_round)
        client_keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(keys.clients, ids)
        counts = jnp.asarray(self.counts, jnp.int32)[ids]
        orders = jax.vmap(lambda k, n: epoch_orders(k, n, self.max_count, self.num_epochs))(
            client_keys, counts
        )
        return ids, orders

    @staticmethod
    def _accumulate(total: Params, params: Params, server: Params, weight: jax.Array) -> Params:
        return jax.tree.map(lambda t, w, s: t + weight * (w - s), total, params, server)

    def _server(self, params: Params, mean_delta: Params) -> Params:
        return jax.tree.map(lambda w, d: w + self.server_lr * d, params, mean_delta)

    # ------------------------------------------------------------ the loops

    def num_steps(self, count: int) -> int:
        steps = -(-count // self.batch_size) * self.num_epochs
        return steps if self.max_steps is None else min(steps, self.max_steps)

    def train_client(self, params: Params, client: int, order: np.ndarray, lr: jax.Array) -> Params:
        """Local SGD of one client from `params` (not modified); `order` `[E, max_count]`."""
        count, offset = int(self.counts[client]), int(self.offsets[client])
        per_epoch = -(-count // self.batch_size)
        in_batch = np.arange(self.batch_size)
        params = self.copy(params)  # The step donates its input.
        for step in range(self.num_steps(count)):
            epoch = step // per_epoch
            position = (step - epoch * per_epoch) * self.batch_size + in_batch
            valid = position < count
            # Positions past the client's end (the last batch's padding) read its first row, masked out.
            rows = offset + np.where(valid, order[epoch][np.minimum(position, self.max_count - 1)], 0)
            batch = {name: values[rows] for name, values in self.features.items()}
            params, _ = self.step(params, batch, valid, lr)
        return params

    def round(self, params: Params, run_key: Key, round_index: int, lr: float) -> Params:
        """One FedAvg round from the global `params` (donated: use the returned ones)."""
        ids, orders = jax.device_get(self.plan(run_key, jnp.asarray(round_index, jnp.int32)))
        lr = jnp.asarray(lr, jnp.float32)
        weights = self.counts[ids].astype(np.float32)
        weights = weights * (np.float32(1.0) / weights.sum(dtype=np.float32))
        total = self.zeros(params)
        for i, client in enumerate(ids):
            trained = self.train_client(params, int(client), orders[i], lr)
            total = self.accumulate(total, trained, params, weights[i])
        return self.server(params, total)


def measure(args) -> dict:
    """Rounds/s of the loop on a workload of rounds_per_second.py (see the module docstring)."""
    sys.path.insert(0, str(HERE))
    from rounds_per_second import load_workload, peak_matmul_gflops, round_flops

    from jaxfl.training.local import LocalTraining

    workload = load_workload(args)
    population = workload.population
    loop = LoopFedAvg(
        workload.task, population, batch_size=workload.batch_size,
        clients_per_round=workload.clients_per_round, max_steps=workload.max_steps,
    )
    run_key = jax.random.key(args.seed)
    params = workload.model.init(jax.random.key(0))

    # Compilation: every jitted piece once (a batch of one client's first example).
    start = time.perf_counter()
    ids, orders = jax.device_get(loop.plan(run_key, jnp.asarray(0, jnp.int32)))
    client = int(ids[0])
    rows = np.full(loop.batch_size, loop.offsets[client])
    batch = {name: values[rows] for name, values in loop.features.items()}
    lr = jnp.asarray(workload.lr, jnp.float32)
    trained, _ = loop.step(loop.copy(params), batch, np.ones(loop.batch_size, bool), lr)
    total = loop.accumulate(loop.zeros(params), trained, params, np.float32(1.0))
    jax.block_until_ready(loop.server(loop.copy(params), total))
    compile_s = time.perf_counter() - start

    params = loop.round(params, run_key, 0, workload.lr)  # Warm-up: first-run allocations.
    jax.block_until_ready(params)
    round_index, best = 1, float("inf")
    for _ in range(args.repeats):
        start = time.perf_counter()
        for _ in range(args.rounds):
            params = loop.round(params, run_key, round_index, workload.lr)
            round_index += 1
        jax.block_until_ready(params)
        best = min(best, (time.perf_counter() - start) / args.rounds)

    local = LocalTraining(batch_size=workload.batch_size, max_steps=workload.max_steps)
    flops = round_flops(workload.model, population.counts, workload.clients_per_round, local, False)
    peak = peak_matmul_gflops()
    return {
        "workload": args.workload,
        "algorithm": "fedavg",
        "model": workload.model.name,
        "batch_size": workload.batch_size,
        "max_local_steps": workload.max_steps,
        "strategy": "python-loop",
        "loop": "python",
        "devices": jax.device_count(),
        "backend": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,
        "clients": int(population.num_clients),
        "examples": int(population.num_examples),
        "clients_per_round": workload.clients_per_round,
        "rounds_per_s": 1.0 / best,
        "compile_s": compile_s,
        "useful_gflops_per_s": flops / best / 1e9,
        "peak_gflops_per_s": peak,
        "peak_fraction": flops / best / 1e9 / peak,
        "jax": jax.__version__,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "date": time.strftime("%Y-%m-%d"),
    }


def main(argv=None) -> None:
    args = ARGS if argv is None else _parse(argv)
    print(json.dumps(measure(args)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
