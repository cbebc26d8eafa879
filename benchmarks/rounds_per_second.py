"""Rounds per second of a compiled round on a standard workload.

    python benchmarks/rounds_per_second.py --workload emnist-linear \
        --algorithm fedavg --rounds 20 --strategy sequential

The last line printed is one JSON object with at least: workload, algorithm,
strategy, devices, backend, rounds_per_s (steady state: after a warm-up
call), compile_s (tracing, lowering and compiling the round), useful_gflops_per_s (counted FLOPs of the real,
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
strategy on CPU; the CLI uses one per core). It is applied at import time,
before JAX starts, with the CLI's XLA:CPU settings (`jaxfl.xla_cpu`; set
JAXFL_XLA_CPU_DEFAULTS=1 to measure XLA's own).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _parse(argv=None) -> argparse.Namespace:
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
    parser.add_argument(
        "--loop", default="auto", choices=("auto", "scan", "while"),
        help="local loop (auto: the CLI's default for the backend)",
    )
    parser.add_argument(
        "--conv", default="auto", choices=("auto", "lax", "canonical", "patches"),
        help="convnet convolution (jaxfl.models.networks.ConvNet)",
    )
    parser.add_argument(
        "--sweep", type=int, default=0,
        help="G > 0: time G settings (learning rates) as one vmapped round against the "
        "same G settings run one after another",
    )
    parser.add_argument(
        "--rounds-per-call", type=int, default=None,
        help="rounds fused into one compiled call (default: the training loop's choice, "
        "jaxfl.experiment.runner.rounds_per_call, with --rounds as the evaluation period)",
    )
    return parser.parse_args(argv)


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:
    # As the CLI starts (before JAX does): CPU devices and XLA:CPU settings.
    from jaxfl.xla_cpu import configure_cpu

    configure_cpu(ARGS.devices or 1)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxfl.algorithms.base import server_optimizer  # noqa: E402
from jaxfl.algorithms.registry import Engine, build_algorithm  # noqa: E402
from jaxfl.data.registry import load_dataset  # noqa: E402
from jaxfl.experiment.runner import (  # noqa: E402
    choose_local_loop,
    choose_strategy,
    compile_rounds,
    must_sync_each_round,
    rounds_per_call,
)
from jaxfl.experiment.sweep import batched_round  # noqa: E402
from jaxfl.models.networks import count_parameters, default_conv, make_model  # noqa: E402
from jaxfl.training.local import LocalTraining, Task  # noqa: E402

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


def build(args):
    """Dataset, model, engine and algorithm of a benchmark configuration."""
    spec = WORKLOADS[args.workload]
    name, options = spec["dataset"]
    if args.workload == "population":
        options = {"num_clients": args.population}
    dataset = load_dataset(name, **options)
    population = dataset.train
    clients_per_round = args.clients_per_round or min(100, population.num_clients)
    model = make_model(spec["model"], dataset.input_shape, dataset.num_classes, conv=args.conv)
    num_parameters = count_parameters(jax.eval_shape(model.init, jax.random.key(0)))
    strategy = choose_strategy(args.strategy, num_parameters)
    engine = Engine(
        task=Task(model),
        local=LocalTraining(
            batch_size=spec["batch"], num_epochs=1, loop=choose_local_loop(args.loop)
        ),
        clients_per_round=clients_per_round,
        strategy=strategy,
        server_tx=server_optimizer("sgd", 1.0),
        client_weighting="num_examples",
        num_clients=population.num_clients,
    )
    hparams = {"lr": spec["lr"]}
    options = {}
    if args.algorithm == "deltafl":
        hparams["theta"] = args.theta
        options = {"reweighting": "exact"}
    algorithm = build_algorithm(args.algorithm, engine, options)
    return dataset, population, model, engine, algorithm, hparams


def _time_rounds(round_fn, state, population, keys, rounds, repeats, sync=False, rounds_per_call=1):
    """(compile seconds: trace, lower and compile; best seconds per round).

    `round_fn` runs `rounds_per_call` rounds per call.
    """
    start = time.perf_counter()
    round_fn = round_fn.lower(state, population, keys).compile()
    compile_s = time.perf_counter() - start
    state, _ = round_fn(state, population, keys)  # Warm-up: first-run allocations.
    jax.block_until_ready(state)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(rounds // rounds_per_call):
            state, _ = round_fn(state, population, keys)
            if sync:  # See jaxfl.experiment.runner.must_sync_each_round.
                jax.block_until_ready(state)
        jax.block_until_ready(state)
        best = min(best, (time.perf_counter() - start) / rounds)
    return compile_s, best


def measure(args) -> dict:
    """Rounds/s of one configuration (see the module docstring)."""
    dataset, population, model, engine, algorithm, hparams = build(args)
    strategy = engine.strategy
    clients_per_round = engine.clients_per_round
    state = strategy.replicate(algorithm.init(model.init(jax.random.key(0)), hparams))
    population = strategy.replicate(population)
    fused = args.rounds_per_call or rounds_per_call(strategy, args.rounds, args.rounds)
    if args.rounds % fused:
        raise SystemExit(f"--rounds-per-call {fused} must divide --rounds {args.rounds}")
    round_fn = compile_rounds(algorithm.round, fused)
    compile_s, best = _time_rounds(
        round_fn, state, population, jax.random.key(1), args.rounds, args.repeats,
        sync=must_sync_each_round(strategy), rounds_per_call=fused,
    )

    # All clients train every round in the peers' workload; for sampled
    # cohorts, count the average client.
    counts = np.asarray(population.counts)
    trained = counts if clients_per_round == len(counts) else np.full(
        clients_per_round, counts.mean()
    )
    flops = useful_flops_per_round(model, trained, 1, args.algorithm == "deltafl")
    peak = peak_matmul_gflops()
    return {
        "workload": args.workload,
        "algorithm": args.algorithm,
        "strategy": strategy.describe(),
        "loop": engine.local.loop,
        "rounds_per_call": fused,
        "conv": default_conv(jax.default_backend()) if args.conv == "auto" else args.conv,
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
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "date": time.strftime("%Y-%m-%d"),
    }


def measure_sweep(args) -> dict:
    """G settings as one vmapped round against the same G run one by one.

    Throughput is settings x rounds per second; the settings are G learning
    rates spread around the workload's, one seed each (as `jaxfl sweep` runs
    them: `jaxfl.experiment.sweep.batched_round`). The sequential baseline reuses one
    compiled single-setting round for all G settings (the fairest baseline:
    no recompilation), running each setting's rounds in turn.
    """
    dataset, population, model, engine, algorithm, hparams = build(args)
    grid = args.sweep
    lrs = np.geomspace(hparams["lr"] / 4, hparams["lr"] * 2, grid)
    states = [
        algorithm.init(model.init(jax.random.key(0)), {**hparams, "lr": float(lr)}) for lr in lrs
    ]
    keys = jnp.stack([jax.random.key(g) for g in range(grid)])
    # Placed as the strategy wants them (replicated over a sharded layout's
    # mesh), as `jaxfl.experiment.sweep.run_sweep` does.
    replicate = engine.strategy.replicate
    stacked = replicate(jax.tree.map(lambda *x: jnp.stack(x), *states))
    population = replicate(population)
    fused = args.rounds_per_call or rounds_per_call(engine.strategy, args.rounds, args.rounds)
    sweep_fn = batched_round(algorithm.round, fused)
    sync = must_sync_each_round(engine.strategy)
    compile_sweep, per_sweep_round = _time_rounds(
        sweep_fn, stacked, population, keys, args.rounds, args.repeats, sync, fused
    )
    single_fn = compile_rounds(algorithm.round, fused)
    compile_single, per_round = _time_rounds(
        single_fn, replicate(states[0]), population, jax.random.key(0), args.rounds,
        args.repeats, sync, fused,
    )
    # One after another: G times the single setting's time (same shapes,
    # same compiled function, so every setting costs the same).
    sequential_settings_rounds_per_s = 1.0 / per_round
    vmapped_settings_rounds_per_s = grid / per_sweep_round
    return {
        "workload": args.workload,
        "algorithm": args.algorithm,
        "strategy": engine.strategy.describe(),
        "loop": engine.local.loop,
        "backend": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,
        "devices": jax.device_count(),
        "sweep_points": grid,
        "rounds_per_call": fused,
        "vmapped_setting_rounds_per_s": vmapped_settings_rounds_per_s,
        "sequential_setting_rounds_per_s": sequential_settings_rounds_per_s,
        "speedup": vmapped_settings_rounds_per_s / sequential_settings_rounds_per_s,
        "compile_s_sweep": compile_sweep,
        "compile_s_single": compile_single,
        "jax": jax.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }


def main(argv=None) -> None:
    args = ARGS if argv is None else _parse(argv)
    result = measure_sweep(args) if args.sweep else measure(args)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    sys.exit(main())
