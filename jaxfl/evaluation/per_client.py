"""Per-client loss and misclassification error of a model on a population.

Every example of the population is evaluated once, in fixed-size chunks of
rows (so memory stays proportional to the chunk, not the population), and
the per-example values are summed per client with a segment sum: the cost is
proportional to the total number of examples, whatever the client sizes.
A host-resident population (`jaxfl.data.host`) is evaluated the same way,
streamed to the device in blocks of clients (`host_population_metrics`).
Given a mesh, the chunks are dealt out to its devices and their per-client
sums added (`psum`): a population replicated on the devices would otherwise
be evaluated whole by every one of them.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from jaxfl.data.host import HostPopulation, client_blocks
from jaxfl.data.population import ClientPopulation
from jaxfl.training.client_state import HostPersonalModels, client_id_blocks
from jaxfl.training.local import ExampleStats, Task, client_loss_and_error, client_means
from jaxfl.types import Params


class ClientMetrics(NamedTuple):
    """`[N]` arrays: each client's mean loss and error on its own data.

    `targets` is the number of targets its error counts (its examples, or
    its tokens other than pad/oov/bos/eos for sequences): the weights that
    pool the clients' errors into one accuracy over all targets, the figure
    TFF and FedJAX report.
    """

    loss: jax.Array
    error: jax.Array
    targets: jax.Array


# Positions (examples times sequence length) evaluated together: a recurrent model's activations grow
# with both, so token sequences go in fewer rows at once (benchmarks/RESULTS.md, section "Evaluation
# chunks").
CHUNK_POSITIONS = 16_384
CHUNK_ROWS = 4096


def default_chunk_rows(population) -> int:
    """Examples evaluated together: `CHUNK_ROWS`, or for token sequences of length L
    `CHUNK_POSITIONS // L` of them (at least 64)."""
    inputs = population.features.get("x")
    if inputs is None or not jnp.issubdtype(inputs.dtype, jnp.integer) or inputs.ndim < 2:
        return CHUNK_ROWS
    length = int(np.prod(inputs.shape[1:]))
    return max(64, min(CHUNK_ROWS, CHUNK_POSITIONS // length))


def per_client_metrics(
    task: Task,
    params: Params,
    population: ClientPopulation,
    *,
    chunk_rows: int | None = None,
    mesh: Mesh | None = None,
) -> ClientMetrics:
    """Mean loss F_i(w) and misclassification error of every client.

    Means over each client's scored targets (`jaxfl.training.local.ExampleStats`):
    its examples, or its real tokens for sequence tasks.

    Args:
      task: model and loss.
      params: the model evaluated.
      population: the clients, packed.
      chunk_rows: examples evaluated together (static; None:
        `default_chunk_rows`).
      mesh: devices (one axis) that `params` and `population` are replicated
        on: each evaluates every D-th chunk and the sums are added; None, or
        one device: all chunks in one scan. The sums' order of addition, so
        their last bits, depends on the mesh.

    Returns:
      `ClientMetrics` with `[N]` float32 arrays.
    """
    num_rows = population.num_examples
    chunk = min(chunk_rows or default_chunk_rows(population), num_rows)
    num_chunks = -(-num_rows // chunk)
    num_devices = 1 if mesh is None else mesh.size

    def chunk_sums(params, population, starts):
        owners = population.example_client_ids

        def add_chunk(totals, start):
            rows = start + jnp.arange(chunk)
            valid = rows < num_rows
            rows = jnp.minimum(rows, num_rows - 1)
            batch = {name: feature[rows] for name, feature in population.features.items()}
            stats = task.example_stats(params, batch)
            # Padding rows (of the last chunk, and whole chunks past the end) go to an extra
            # segment, dropped below.
            segments = jnp.where(valid, owners[rows], population.num_clients)
            sums = jax.ops.segment_sum(
                jnp.stack(stats, axis=-1),
                segments,
                num_segments=population.num_clients + 1,
            )
            return totals + sums[:-1], None

        totals, _ = jax.lax.scan(
            add_chunk,
            jnp.zeros((population.num_clients, len(ExampleStats._fields)), jnp.float32),
            starts,
        )
        return totals

    # Chunk c goes to device c mod D: neighbouring chunks (the same large clients) are spread out.
    per_device = -(-num_chunks // num_devices)
    starts = (jnp.arange(per_device * num_devices) * chunk).reshape(per_device, num_devices).T
    if num_devices == 1:
        totals = chunk_sums(params, population, starts[0])
    else:
        axis = mesh.axis_names[0]
        totals = jax.shard_map(
            lambda params, population, starts: jax.lax.psum(chunk_sums(params, population, starts[0]), axis),
            mesh=mesh,
            in_specs=(PartitionSpec(), PartitionSpec(), PartitionSpec(axis)),
            out_specs=PartitionSpec(),
            # Models' scans start from replicated carries that the device's chunk makes varying;
            # nothing here is differentiated, and the psum makes the output replicated.
            check_vma=False,
        )(params, population, starts)
    sums = ExampleStats(*jnp.unstack(totals, axis=1))
    loss, error = client_means(sums)
    return ClientMetrics(loss=loss, error=error, targets=sums.error_weight)


def personal_client_metrics(
    task: Task, personal: Params, population: ClientPopulation, *, group: int = 16
) -> tuple[jax.Array, jax.Array]:
    """Each client's loss and error under its own model: F_k(v_k) (Ditto).

    Client k of `population` is evaluated with row k of `personal` (leaves
    `[R, ...]`, R >= N: rows past N, padding of a state split over devices,
    are not read), by `client_loss_and_error` over its examples; `group`
    clients at a time are vmapped (`lax.map` with a batch size), so memory is
    that of `group` clients' activations, not of all N. Each group gathers
    its rows by id, so rows split over devices are not all copied to each.

    Returns:
      (`[N]` mean loss, `[N]` misclassification error), float32.
    """
    ids = jnp.arange(population.num_clients, dtype=jnp.int32)
    personal = jax.tree.map(jnp.asarray, personal)

    def one(client_id):
        params = jax.tree.map(lambda rows: rows[client_id], personal)
        return client_loss_and_error(task, params, population, client_id)

    return jax.lax.map(one, ids, batch_size=min(group, population.num_clients))


def _block_metrics(task: Task, params: Params, block: ClientPopulation) -> ClientMetrics:
    return per_client_metrics(task, params, block)


_block_metrics_jit = jax.jit(_block_metrics, static_argnums=0)


def host_population_metrics(
    task: Task,
    params: Params,
    population: HostPopulation,
    *,
    block_rows: int = 1 << 16,
) -> ClientMetrics:
    """`per_client_metrics` of a host-resident population, streamed in blocks.

    Consecutive clients are copied to the device in blocks of at most
    `block_rows` examples (at least the largest client), each padded to the
    same static shape (one compilation): the block's clients, then empty
    clients, then one client holding the padding rows, whose metrics are
    dropped. Device memory is one block, whatever the population's size.

    Returns:
      `ClientMetrics` of `[N]` NumPy float32 arrays.
    """
    rows = max(block_rows, population.max_count)
    # A block holds at most `rows` clients (each has >= 1 example), plus the
    # padding client.
    slots = rows + 1
    losses = np.empty(population.num_clients, np.float32)
    errors = np.empty(population.num_clients, np.float32)
    targets = np.empty(population.num_clients, np.float32)
    for start, stop in client_blocks(population.counts, rows):
        block_ids = np.arange(start, stop)
        host = population.gather_host(block_ids, rows)
        used = int(host["counts"].sum())
        counts = np.zeros(slots, np.int32)
        counts[: stop - start] = host["counts"]
        counts[-1] = rows - used
        offsets = np.concatenate([[0], np.cumsum(counts[:-1], dtype=np.int64)]).astype(np.int32)
        block = ClientPopulation(
            features=host["features"], offsets=offsets, counts=counts, max_count=rows
        )
        metrics = jax.device_get(_block_metrics_jit(task, params, block))
        losses[start:stop] = metrics.loss[: stop - start]
        errors[start:stop] = metrics.error[: stop - start]
        targets[start:stop] = metrics.targets[: stop - start]
    return ClientMetrics(loss=losses, error=errors, targets=targets)


_personal_block_jit = jax.jit(
    lambda task, personal, block, group: personal_client_metrics(task, personal, block, group=group),
    static_argnums=(0, 3),
)


def host_personal_metrics(
    task: Task,
    personal: HostPersonalModels,
    population: HostPopulation,
    *,
    group: int = 16,
    block_clients: int = 256,
) -> tuple[np.ndarray, np.ndarray]:
    """`personal_client_metrics` of host-resident personal models, in blocks of clients.

    Each block of `block_clients` consecutive clients (the last one starting
    early: one shape, one compilation) has its models made on the device
    (`HostPersonalModels.block`) and its examples gathered from the host
    population, so device memory is one block of models and examples,
    whatever N.

    Returns:
      (`[N]` mean loss, `[N]` misclassification error), NumPy float32.
    """
    num_clients = population.num_clients
    if personal.num_clients < num_clients:
        raise ValueError(f"{personal.num_clients} personal models for {num_clients} clients")
    losses = np.empty(num_clients, np.float32)
    errors = np.empty(num_clients, np.float32)
    rows = population.cohort_rows(min(block_clients, num_clients))
    for ids in client_id_blocks(num_clients, block_clients):
        host = population.gather_host(ids, rows)
        block = ClientPopulation(
            features=host["features"], offsets=host["offsets"], counts=host["counts"],
            max_count=population.max_count,
        )
        loss, error = jax.device_get(_personal_block_jit(task, personal.block(ids), block, group))
        losses[ids], errors[ids] = loss, error
    return losses, errors
