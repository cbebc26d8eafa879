"""Rounds per second of a compiled round on a standard workload.

    python benchmarks/rounds_per_second.py --workload emnist-linear \
        --algorithm fedavg --rounds 20 --strategy sequential

The last line printed is one JSON object with at least: workload, algorithm,
strategy, devices, backend, rounds_per_s (steady state: after the first call,
which compiles), compile_s, useful_gflops_per_s (counted FLOPs of the real,
unpadded local training per second) and peak_fraction (that over the peak
f32 matmul throughput measured in the same process).

Workloads (`shared/peers/README.md`; the peers run the same ones):

* emnist-linear: softmax regression 784 -> 62, 100 clients of U[20, 400]
  examples (the peers' data, bit for bit), batch 10, one epoch, lr 0.05,
  every client every round;
* synthetic-small: the same with 60 -> 10;
* emnist-cnn: the papers' ConvNet on the same clients, batch 16;
* population: N clients of 1-10 examples (`--population N`), 100 per round.

Useful FLOPs count 2 multiply-add FLOPs per weight per example forward, and
for training the forward plus the weight-gradient pass (x2) for the linear
model, or forward plus both backward passes (x3) for deeper models; padded
steps and padding examples are not counted. Δ-FL adds one forward pass over
each sampled client's data.

Set `--devices K` to split the CPU into K XLA devices (needed by the sharded
strategy on CPU); it must be given before JAX starts, so it is applied here
at import time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--workload",
        default="emnist-linear",
        choices=("emnist-linear", "synthetic-small", "emnist-cnn", "population"),
    )
    parser.add_argument("--algorithm", default="fedavg")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--devices", type=int, default=None, help="CPU devices to create")
    parser.add_argument("--population", type=int, default=1000, help="N for the population workload")
    parser.add_argument("--clients-per-round", type=int, default=None)
    parser.add_argument("--theta", type=float, default=0.5, help="Δ-FL tail fraction")
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions; the best is kept")
    return parser.parse_args()


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None and ARGS.devices:
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={ARGS.devices}"
    )

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxfl.algorithms.registry import Engine, build_algorithm  # noqa: E402
from jaxfl.algorithms.base import server_optimizer  # noqa: E402
from jaxfl.data.registry import load_dataset  # noqa: E402
from jaxfl.models.networks import count_parameters, make_model  # noqa: E402
from jaxfl.training.local import LocalTraining, Task  # noqa: E402
from jaxfl.experiment.runner import choose_strategy  # noqa: E402

WORKLOADS = {
    "emnist-linear": dict(dataset=("peer-benchmark", {}), model="linear", batch=10, lr=0.05),
    "synthetic-small": dict(
        dataset=("peer-benchmark", {"num_features": 60, "num_classes": 10}),
        model="linear", batch=10, lr=0.05,
    ),
    "emnist-cnn": dict(dataset=("peer-benchmark", {}), model="convnet", batch=16, lr=0.05),
    "population": dict(dataset=("many-clients", {}), model="linear", batch=10, lr=0.05),
}


def peak_matmul_gflops(size: int = 2048, repeats: int = 5) -> float:
    """Measured f32 matmul throughput of the default device (GFLOP/s)."""
    a = jnp.ones((size, size), jnp.float32)
    matmul = jax.jit(lambda x: x @ x)
    matmul(a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def useful_flops_per_round(model, counts: np.ndarray, num_epochs: int, extra_forward: bool) -> float:
    """Training FLOPs of the real examples of the clients trained in a round."""
    backward_factor = 2 if model.name == "linear" else 3
    examples = float(np.sum(counts)) * num_epochs
    flops = examples * backward_factor * model.flops_per_example
    if extra_forward:
        flops += float(np.sum(counts)) * model.flops_per_example
    return flops


def main() -> None:
    args = ARGS
    spec = WORKLOADS[args.workload]
    name, options = spec["dataset"]
    if args.workload == "population":
        options = {"num_clients": args.population}
    dataset = load_dataset(name, **options)
    population = dataset.train
    clients_per_round = args.clients_per_round or min(100, population.num_clients)
    model = make_model(spec["model"], dataset.input_shape, dataset.num_classes)
    num_parameters = count_parameters(jax.eval_shape(model.init, jax.random.key(0)))
    strategy = choose_strategy(args.strategy, num_parameters)
    engine = Engine(
        task=Task(model),
        local=LocalTraining(batch_size=spec["batch"], num_epochs=1),
        clients_per_round=clients_per_round,
        strategy=strategy,
        server_tx=server_optimizer("sgd", 1.0),
        client_weighting="num_examples",
    )
    hparams = {"lr": spec["lr"]}
    options = {}
    if args.algorithm == "deltafl":
        hparams["theta"] = args.theta
        options = {"reweighting": "exact"}
    algorithm = build_algorithm(args.algorithm, engine, options)
    state = strategy.replicate(algorithm.init(model.init(jax.random.key(0)), hparams))
    population = strategy.replicate(population)
    round_fn = jax.jit(algorithm.round, donate_argnums=0)
    key = jax.random.key(1)

    start = time.perf_counter()
    state, metrics = round_fn(state, population, key)
    jax.block_until_ready(state)
    compile_s = time.perf_counter() - start

    best = float("inf")
    for _ in range(args.repeats):
        start = time.perf_counter()
        for _ in range(args.rounds):
            state, metrics = round_fn(state, population, key)
        jax.block_until_ready(state)
        best = min(best, (time.perf_counter() - start) / args.rounds)

    # All clients train every round in the peers' workload; for sampled
    # cohorts, count the average client.
    counts = np.asarray(population.counts)
    trained = counts if clients_per_round == len(counts) else np.full(
        clients_per_round, counts.mean()
    )
    flops = useful_flops_per_round(model, trained, 1, args.algorithm == "deltafl")
    peak = peak_matmul_gflops()
    result = {
        "workload": args.workload,
        "algorithm": args.algorithm,
        "strategy": strategy.describe(),
        "devices": jax.device_count(),
        "backend": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,
        "clients": int(population.num_clients),
        "clients_per_round": clients_per_round,
        "rounds_per_s": 1.0 / best,
        "compile_s": compile_s,
        "useful_gflops_per_s": flops / best / 1e9,
        "peak_gflops_per_s": peak,
        "peak_fraction": flops / best / 1e9 / peak,
        "population_bytes": int(population.nbytes),
        "jax": jax.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    sys.exit(main())
