"""Checks of a run that depend on its data: memory of a round, settings the data makes moot.

`jaxfl.experiment.runner.setup` calls these once the dataset is loaded and
the model and the client layout are known, before any parameter, optimizer
state or round is allocated:

* `check_round_fits` refuses (one-line ConfigError) settings whose round
  cannot fit in memory: a batch size, a cohort trained at once, a number of
  local epochs of the largest client, or model widths. The estimate
  (`round_nbytes`) is a lower bound: what the clients trained at once hold
  (their gathered batches, the activations of one forward pass saved for the
  backward one, their epoch orders, their parameters, gradients and anchors),
  plus the cohort's stacked updates;
* `data_warnings` returns one line per setting the data makes ineffective
  (a step cap no client reaches, a batch larger than every client, a
  partition option the chosen partition does not read).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os

import jax
import numpy as np

from jaxfl.algorithms.registry import CLIENT_STATE_ALGORITHMS, algorithm_spec
from jaxfl.data.datasets.centralized import PARTITION_DEFAULTS, unused_partition_options
from jaxfl.data.memory import available_memory, check_memory
from jaxfl.data.population import FederatedDataset
from jaxfl.data.registry import dataset_options as _dataset_options
from jaxfl.experiment.config import (
    ConfigError,
    RunConfig,
    check_settings,
    full_batch_only,
    implied_setting,
    warn,
)
from jaxfl.experiment.hparams import algorithm_hparams
from jaxfl.training.local import LocalTraining, Task
from jaxfl.training.strategies import ClientStrategy


def _nbytes(tree) -> int:
    return sum(math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize for leaf in jax.tree.leaves(tree))


def example_activation_nbytes(task: Task, params, dataset: FederatedDataset) -> int:
    """Bytes of the values one example's forward pass creates (loss included).

    The sum of the outputs of the traced forward pass's top-level operations
    (a recurrence's stacked states count in full): a lower bound of what
    training keeps per example for the backward pass. Traced on shapes only.
    """
    features = dataset.train.features
    batch = {name: jax.ShapeDtypeStruct((1, *f.shape[1:]), f.dtype) for name, f in features.items()}
    key = jax.random.key(0) if task.model.stochastic else None
    jaxpr = jax.make_jaxpr(lambda p, b: task.example_stats(p, b, key))(params, batch)
    total = 0
    for eqn in jaxpr.eqns:
        for var in eqn.outvars:
            shape = getattr(var.aval, "shape", None)
            if shape is None:
                continue
            try:
                itemsize = np.dtype(var.aval.dtype).itemsize
            except TypeError:  # PRNG keys and other extended dtypes.
                itemsize = 8
            total += math.prod(shape) * itemsize
    return total


def clients_at_once(strategy: ClientStrategy, clients_per_round: int) -> int:
    """How many clients a layout trains at the same time (on all devices together)."""
    if strategy.kind == "vmap":
        return clients_per_round
    if strategy.kind == "sequential":
        return 1
    if strategy.kind == "chunked":
        return min(strategy.chunk_size, clients_per_round)
    devices = strategy.mesh.size
    per_device = -(-clients_per_round // devices)
    inner = {"vmap": per_device, "sequential": 1}.get(strategy.inner)
    if inner is None:
        inner = min(strategy.chunk_size, per_device)
    return min(devices * inner, devices * per_device)


def round_nbytes(
    task: Task,
    dataset: FederatedDataset,
    local: LocalTraining,
    clients_per_round: int,
    strategy: ClientStrategy,
) -> int:
    """A lower bound of the memory one round takes beyond the dataset (module docstring)."""
    params = jax.eval_shape(task.model.init, jax.random.key(0))
    param_bytes = _nbytes(params)
    train = dataset.train
    example_bytes = sum(
        math.prod(f.shape[1:]) * np.dtype(f.dtype).itemsize for f in train.features.values()
    )
    activation_bytes = example_activation_nbytes(task, params, dataset)
    max_count = int(train.max_count)
    per_client = (
        local.batch_size * (example_bytes + 2 * activation_bytes)  # Batch, activations and their gradients.
        + local.num_epochs * max_count * 4 * 2  # Epoch orders and their sort.
        + 3 * param_bytes  # Parameters, gradients, the anchor.
    )
    at_once = clients_at_once(strategy, clients_per_round)
    return at_once * per_client + clients_per_round * param_bytes + 2 * param_bytes


def round_memory_available() -> tuple[int, str]:
    """(bytes, what) the round may take: host memory on CPU, the device's free memory elsewhere."""
    host = available_memory()
    if jax.default_backend() == "cpu":
        return host, "memory"
    try:
        stats = jax.devices()[0].memory_stats() or {}
        limit = stats.get("bytes_limit")
        if limit:
            return int(limit) - int(stats.get("bytes_in_use", 0)), "device memory"
    except Exception:  # noqa: BLE001 - a backend without memory statistics.
        pass
    return host, "memory"


def client_state_nbytes(
    strategy: ClientStrategy, num_clients: int, num_parameters: int, algorithm: str
) -> int:
    """Bytes an algorithm's personal models take in the memory `round_memory_available` measures.

    One float32 model per training client (two for APFL,
    `CLIENT_STATE_ALGORITHMS`; docs/personalization.md). Under a layout
    over several devices each holds all the rows (replicated) or its share
    (split); on CPU the devices share the host's memory, so every device's
    copy counts. Host-resident rows (`host_client_state`) are one copy in
    host memory.
    """
    if strategy.host_client_state:
        # One host copy; the device holds only the cohort's rows (counted with the round).
        return CLIENT_STATE_ALGORITHMS[algorithm] * num_clients * num_parameters * 4
    mesh = strategy.mesh
    devices = mesh.size if mesh is not None else 1
    rows = strategy.client_state_rows(num_clients)
    per_device = rows // devices if strategy.shards_client_state else rows
    copies = devices if jax.default_backend() == "cpu" else 1
    return CLIENT_STATE_ALGORITHMS[algorithm] * per_device * copies * num_parameters * 4


# `--client-state auto` splits the personal models over the devices when
# their replicated copies would take more than this share of the memory.
SPLIT_CLIENT_STATE_SHARE = 0.25


def choose_client_state(
    config: RunConfig, strategy: ClientStrategy, num_clients: int, num_parameters: int,
    *, available: int | None = None,
) -> ClientStrategy:
    """The strategy with `split_client_state` and `host_client_state` as `--client-state` says.

    'split', 'replicated' and 'host' as named; 'auto' replicates unless the
    replicated personal models would take over `SPLIT_CLIENT_STATE_SHARE` of
    the memory (`total_memory`, or `available`), then splits them over the
    devices (a no-op on one device), and on an accelerator keeps them in host
    memory when even the split rows would take over that share. Splitting
    costs an all-reduce of the cohort's models a round and host residency a
    copy of the cohort's models each way, both measurably slower than
    replicated rows (measured: benchmarks/RESULTS.md, sections
    "The personalization baselines against FedAvg, and per-client state split over devices (2026-11-26)"
    and "Personal models in host memory (`--client-state host`) against device-resident ones (2026-11-26)"):
    each is chosen only where memory is short. On CPU host memory is the
    devices' memory, so 'auto' never picks 'host' there.
    """
    if config.personalization.client_state != "auto":
        return dataclasses.replace(
            strategy,
            split_client_state=config.personalization.client_state == "split",
            host_client_state=config.personalization.client_state == "host",
        )

    def personal_bytes(candidate):
        return sum(
            client_state_nbytes(candidate, num_clients, num_parameters, name)
            for name in config.algorithms if name in CLIENT_STATE_ALGORITHMS
        )

    if available is None:
        available = total_memory()
    budget = SPLIT_CLIENT_STATE_SHARE * available
    replicated = dataclasses.replace(strategy, split_client_state=False, host_client_state=False)
    if personal_bytes(replicated) <= budget:
        return replicated
    split = dataclasses.replace(replicated, split_client_state=True)
    if personal_bytes(split) <= budget or jax.default_backend() == "cpu":
        return split
    return dataclasses.replace(replicated, host_client_state=True)


def total_memory() -> int:
    """The memory `round_memory_available` draws from, in total rather than free: the host's on
    CPU, the device's limit elsewhere. `--client-state auto` decides on it, so that a run and
    its resumption (whose checkpoint holds the same rows) decide alike on one machine.
    """
    if jax.default_backend() != "cpu":
        try:
            limit = (jax.devices()[0].memory_stats() or {}).get("bytes_limit")
            if limit:
                return int(limit)
        except Exception:  # noqa: BLE001 - a backend without memory statistics.
            pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_round_fits(
    config: RunConfig,
    task: Task,
    dataset: FederatedDataset,
    local: LocalTraining,
    strategy: ClientStrategy,
    *,
    available: int | None = None,
    num_points: int = 1,
) -> None:
    """A one-line ConfigError when one round cannot fit in the memory available.

    Counted: the round (`round_nbytes`), the personal models of the run's
    algorithms (`client_state_nbytes`; with `host_client_state`, the
    cohort's rows on the device and all N in host memory, checked apart off
    CPU), and Per-FedAvg's N adapted models made at the end of training; all
    times `num_points`, the points of a sweep group trained together.

    Args:
      config: the run's settings (named in the message).
      task: the model and loss.
      dataset: the loaded dataset (its training clients' shapes).
      local: the local training's shape.
      strategy: how clients are laid out (how many train at once).
      available: bytes available (default: `round_memory_available()`).
      num_points: settings trained together by one vmapped round (a sweep's).
    """
    needed = round_nbytes(task, dataset, local, config.server.clients_per_round, strategy)
    resource = "memory"
    if available is None:
        available, resource = round_memory_available()
    at_once = clients_at_once(strategy, config.server.clients_per_round)
    num_parameters = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(
        jax.eval_shape(task.model.init, jax.random.key(0))
    ))
    what = (
        f"one round of batch_size={local.batch_size}, local_epochs={local.num_epochs} and model "
        f"{config.network.model} ({num_parameters:,} parameters) for {at_once} clients at once "
        f"(clients_per_round={config.server.clients_per_round}, strategy {strategy.describe()})"
    )
    personal_algorithms = [name for name in config.algorithms if name in CLIENT_STATE_ALGORITHMS]
    host_personal = 0
    for name in personal_algorithms:
        personal = client_state_nbytes(strategy, dataset.train.num_clients, num_parameters, name)
        if strategy.host_client_state:
            layout = "in host memory"
            # The cohort's rows on the device; the N rows in host memory (checked apart off CPU).
            needed += CLIENT_STATE_ALGORITHMS[name] * config.server.clients_per_round * num_parameters * 4
            # The rows, and the copy a checkpoint makes of them while it writes.
            host_personal += 2 * personal
            if resource == "memory":
                needed += 2 * personal
        else:
            layout = "split over the devices" if strategy.shards_client_state else "replicated"
            needed += personal
        what += f" with {name}'s {dataset.train.num_clients:,} personal models ({personal:,} bytes, {layout})"
    for name in config.algorithms:
        if algorithm_spec(name).adapts_after_training:
            adapted = dataset.train.num_clients * num_parameters * 4
            needed += adapted
            what += f" with {name}'s {dataset.train.num_clients:,} adapted models ({adapted:,} bytes)"
    if num_points > 1:
        needed *= num_points
        host_personal *= num_points
        what = f"{num_points} sweep points of {what}"
    try:
        check_memory(
            needed, what, available=available, resource=resource,
            hint="lower batch_size, clients_per_round or the model's size, or use --strategy sequential"
            + (f"; {', '.join(personal_algorithms)}: fewer training clients" if personal_algorithms else ""),
        )
    except ValueError as error:
        raise ConfigError(str(error)) from None
    if host_personal and resource != "memory":
        try:
            check_memory(
                host_personal,
                f"{', '.join(personal_algorithms)}'s {dataset.train.num_clients:,} personal models "
                "in host memory",
                hint="fewer training clients or a smaller model",
            )
        except ValueError as error:
            raise ConfigError(str(error)) from None


def data_warnings(config: RunConfig, dataset: FederatedDataset, local: LocalTraining) -> list[str]:
    """One line per setting that the data makes ineffective (module docstring)."""
    messages = []
    if set(PARTITION_DEFAULTS) <= set(_dataset_options(config.data.dataset)):
        messages.extend(unused_partition_options(config.data.dataset_options))
    max_count = int(dataset.train.max_count)
    if full_batch_only(config):
        return messages  # Batch size, epochs and the cap are not used (see config.setting_warnings).
    uncapped = -(-max_count // local.batch_size) * local.num_epochs
    cap = config.local.max_local_steps
    if cap is not None and cap >= uncapped and cap != implied_setting(config, "max_local_steps"):
        messages.append(
            f"max_local_steps={cap} is not less than any client's local steps (at most {uncapped}: "
            f"local_epochs={local.num_epochs} x ceil({max_count} examples of the largest training "
            f"client / batch_size={local.batch_size})); ignored"
        )
    if local.batch_size > max_count and local.batch_size != implied_setting(config, "batch_size"):
        messages.append(
            f"batch_size={local.batch_size} is more than the {max_count} examples of the largest training "
            f"client: every step takes a client's whole data, as batch_size={max_count} would, on "
            f"{local.batch_size} rows"
        )
    return messages



def check_grid_points(config: RunConfig, grid, base_setup, name: str, *, on_warning=warn) -> None:
    """Checks every point of a sweep's grid as a run of its own would be checked.

    A point's values are valid one by one (`parse_grid`); here each point's
    whole configuration goes through `check_settings`, and for a DP algorithm
    through its privacy calibration (a vmapped noise multiplier, for
    instance, must still stay below its bound). A grid setting also given as
    a flag or in the config file is reported: the grid replaces it.

    Raises:
      ConfigError: the first refused point, named by its values.
    """
    for setting in grid:
        value = config.setting(setting)
        if value != implied_setting(config, setting):
            on_warning(f"--grid {setting} replaces {setting}={value!r} given as a flag or in the config file")
    names = list(grid)
    privacy = algorithm_spec(name).privacy
    num_clients = base_setup.dataset.train.num_clients
    for values in itertools.product(*grid.values()):
        point = dict(zip(names, values, strict=True))
        label = ", ".join(f"{k}={v}" for k, v in point.items())
        point_config = config.replace(**point)
        try:
            check_settings(point_config)
        except ConfigError as error:
            raise ConfigError(f"--grid point {label}: {error}") from None
        if privacy is not None:
            hparams = algorithm_hparams(point_config, name, base_setup.algorithms[name])
            try:
                privacy.calibrate(
                    point_config.flat(),
                    num_clients=num_clients,
                    clients_per_round=point_config.server.clients_per_round,
                    hparams=hparams,
                    num_examples=base_setup.dataset.train.num_examples,
                )
            except ValueError as error:
                raise ConfigError(f"{name} at --grid point {label}: {str(error).splitlines()[0]}") from None
