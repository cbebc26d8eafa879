"""FedAvg over a device mesh spanning several processes (jax.distributed).

The client axis of the round is sharded with `jax.sharding` over every device
of every process (the `sharded` client strategy); JAX's own collectives move
the data: no home-made transport. The same script runs on one machine with
two processes (CPU collectives over gloo):

    python scripts/multiprocess_run.py --num-processes 2 --process-id 0 --out a.npz &
    python scripts/multiprocess_run.py --num-processes 2 --process-id 1

or on several GPU/TPU hosts: start one process per host with the same
`--coordinator HOST0:PORT` (the address of process 0), `--num-processes`
and its own `--process-id` (on Cloud TPU and SLURM, `jax.distributed.initialize()`
can discover all three by itself). Every process builds the same population
from the same seed; the mesh holds all devices of all processes, and each
device trains its share of every cohort. Process 0 writes the final model.

With `--num-processes 1 --local-devices K` it runs the same computation in one
process on K CPU devices: the reference that the multi-process run must match
(tests/test_multiprocess.py).
"""

from __future__ import annotations

import argparse
import os


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-processes", type=int, default=1)
    parser.add_argument("--process-id", type=int, default=0)
    parser.add_argument("--coordinator", default="localhost:12355")
    parser.add_argument("--local-devices", type=int, default=1, help="CPU devices per process")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients-per-round", type=int, default=6)
    parser.add_argument("--out", default=None, help="process 0 writes the final params (.npz)")
    args = parser.parse_args()

    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", args.local_devices)
    if args.num_processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=args.coordinator,
            num_processes=args.num_processes,
            process_id=args.process_id,
        )
    import numpy as np

    from jaxfl.algorithms import fedavg
    from jaxfl.data import load_dataset
    from jaxfl.models import make_model
    from jaxfl.training import ClientStrategy, LocalTraining, Task

    data = load_dataset(
        "label-shift", num_train_clients=40, num_validation_clients=0,
        num_test_clients=10, pool_size=20000,
    )
    task = Task(make_model("linear", data.input_shape, data.num_classes))
    strategy = ClientStrategy("sharded", inner="sequential")  # All global devices.
    algorithm = fedavg(task, LocalTraining(batch_size=10), args.clients_per_round, strategy=strategy)
    state = strategy.replicate(algorithm.init(task.model.init(jax.random.key(0)), {"lr": 0.1}))
    population = strategy.replicate(data.train)
    key = strategy.replicate(jax.random.key_data(jax.random.key(1)))
    round_fn = jax.jit(
        lambda state, population, key_data: algorithm.round(
            state, population, jax.random.wrap_key_data(key_data)
        ),
        donate_argnums=0,
    )
    for _ in range(args.rounds):
        state, metrics = round_fn(state, population, key)
    # The model is replicated: every process holds a full copy.
    params = jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), state.params)
    print(
        f"process {jax.process_index()}/{jax.process_count()}: {jax.device_count()} devices, "
        f"train loss {float(np.asarray(metrics['train_loss'].addressable_data(0))):.6f}"
    )
    if args.out and jax.process_index() == 0:
        flat = {"/".join(map(str, path)): leaf for path, leaf in _flatten(params)}
        np.savez(args.out, **flat)
    if args.num_processes > 1:
        jax.distributed.shutdown()


def _flatten(tree, path=()):
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _flatten(value, (*path, key))
    else:
        yield path, tree


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    main()
