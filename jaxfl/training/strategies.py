"""How the clients of a cohort are batched: a strategy, not a rewrite.

Every strategy computes the same thing, `[fn(shared, c) for c in clients]`
stacked along a leading client axis; they differ in how the work is laid out
on the hardware:

* `vmap`: all M clients at once (best on accelerators, and on CPU for small
  models);
* `chunked(k)`: `vmap` over groups of k clients, the groups one after another
  (bounds memory; a middle ground);
* `sequential`: one client at a time (`lax.map`); on CPU a client's model
  stays in cache, and a client's padding steps are skipped, not computed;
* `sharded(inner)`: clients split over a device mesh along the axis
  'clients' with `jax.shard_map`, each device running its share with the
  `inner` strategy; the cohort is padded with inactive clients to a multiple
  of the device count, and the padding is dropped from the outputs.

`shared` holds what every client reads (server model, population, numeric
hyperparameters); `per_client` holds one entry per client (ids, keys, flags).
By convention `per_client["active"]` exists and is False on padding clients,
so that `fn` can skip their work.

How to choose: see `default_strategy` and docs/strategies.md; the defaults
come from measurements in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxfl.types import PyTree

CLIENT_AXIS = "clients"


@dataclasses.dataclass(frozen=True)
class ClientStrategy:
    """A way to lay out a cohort's clients on the hardware.

    Attributes:
      kind: 'vmap', 'chunked', 'sequential' or 'sharded'.
      chunk_size: clients per vmapped group ('chunked', or 'sharded' with
        inner 'chunked').
      inner: how each device runs its clients under 'sharded'.
      num_devices: devices of the mesh under 'sharded' (None: all local
        devices).
      split_client_state: under 'sharded' over several devices, split
        per-client state (personal models) along the client axis, each
        device holding its share of the rows, rather than replicating it
        (`shard_rows`; the runner's `--client-state` chooses).
      host_client_state: keep per-client state in host memory, the
        cohort's rows moved to the device for each round
        (`jaxfl.training.client_state`); overrides `split_client_state`.
    """

    kind: str = "vmap"
    chunk_size: int | None = None
    inner: str = "sequential"
    num_devices: int | None = None
    split_client_state: bool = False
    host_client_state: bool = False

    def __post_init__(self):
        kinds = ("vmap", "chunked", "sequential", "sharded")
        if self.kind not in kinds:
            raise ValueError(f"strategy must be one of {kinds}, got {self.kind!r}")
        if self.kind == "sharded" and self.inner not in kinds[:3]:
            raise ValueError(
                f"inner strategy of 'sharded' must be one of {kinds[:3]}, got {self.inner!r}"
            )
        uses_chunks = self.kind == "chunked" or (
            self.kind == "sharded" and self.inner == "chunked"
        )
        if uses_chunks and (self.chunk_size is None or self.chunk_size < 1):
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")
        if self.num_devices is not None and self.num_devices < 1:
            raise ValueError(f"num_devices must be >= 1, got {self.num_devices}")

    @property
    def mesh(self) -> Mesh | None:
        if self.kind != "sharded":
            return None
        devices = jax.devices()
        count = self.num_devices or len(devices)
        if count > len(devices):
            raise ValueError(
                f"the sharded strategy asks for {count} devices, {len(devices)} exist"
            )
        return Mesh(np.array(devices[:count]), (CLIENT_AXIS,))

    def describe(self) -> str:
        if self.kind == "chunked":
            return f"chunked({self.chunk_size})"
        if self.kind == "sharded":
            inner = f"chunked({self.chunk_size})" if self.inner == "chunked" else self.inner
            return f"sharded({self.mesh.size}x{inner})"
        return self.kind

    def replicate(self, tree: PyTree) -> PyTree:
        """Places `tree` on every device of the mesh (no-op off 'sharded').

        Do this once for the population and the state before the loop, or
        the compiled round copies them to every device at every call.
        """
        mesh = self.mesh
        if mesh is None:
            return tree
        return _place(tree, NamedSharding(mesh, PartitionSpec()))

    @property
    def shards_client_state(self) -> bool:
        """Whether per-client state (rows indexed by client id) is split over several devices."""
        mesh = self.mesh
        return self.split_client_state and not self.host_client_state and mesh is not None and mesh.size > 1

    def client_state_rows(self, num_clients: int) -> int:
        """Rows of per-client state for N clients: N, or N rounded up to a multiple of the devices.

        Rounded up where the rows are split over devices: an array splits
        evenly or not at all. The rows past N are padding no client id reaches.
        """
        if not self.shards_client_state:
            return num_clients
        devices = self.mesh.size
        return -(-num_clients // devices) * devices

    def shard_rows(self, tree: PyTree, row_axis: int = 0) -> PyTree:
        """Places per-client state with its rows (axis `row_axis`) split over the mesh's devices.

        Each device holds `rows / devices` clients' rows (Ditto's personal
        models: N / D models a device, not N). Inside the compiled round a
        gather of the cohort's rows becomes each device's own rows and one
        all-reduce of the M gathered rows, and the scatter back stays local
        (XLA's SPMD partitioner; checked in tests/training/test_strategies.py).
        Replicates where the state is not split, and leaves host-resident
        state (`host_client_state`) on the host; the rows must be
        `client_state_rows`.
        """
        if self.host_client_state:
            # Written in place every round: a copy only of arrays that are not writable (N models each).
            def writable(rows):
                return rows if isinstance(rows, np.ndarray) and rows.flags.writeable else np.array(rows)

            return jax.tree.map(writable, tree)
        if not self.shards_client_state:
            return self.replicate(tree)
        spec = PartitionSpec(*([None] * row_axis), CLIENT_AXIS)
        return _place(tree, NamedSharding(self.mesh, spec))


def _place(tree: PyTree, sharding: NamedSharding) -> PyTree:
    if jax.process_count() == 1:
        return jax.device_put(tree, sharding)
    # Several processes (jax.distributed): every process holds the same host
    # values and contributes its own devices' shards.
    return jax.tree.map(
        lambda x: jax.make_array_from_callback(
            # The default binds this leaf's host copy (not a shared default).
            x.shape, sharding, lambda index, x=np.asarray(x): x[index]  # noqa: B008
        ),
        tree,
    )


def parse_strategy(text: str) -> ClientStrategy:
    """Reads 'vmap', 'sequential', 'chunked:K', 'sharded', 'sharded:INNER[:K]'."""
    parts = text.split(":")
    try:
        if parts[0] == "chunked" and len(parts) == 2:
            return ClientStrategy("chunked", chunk_size=int(parts[1]))
        if parts[0] == "sharded" and len(parts) <= 3:
            inner = parts[1] if len(parts) > 1 else "sequential"
            chunk = int(parts[2]) if len(parts) > 2 else None
            return ClientStrategy("sharded", inner=inner, chunk_size=chunk)
        if parts[0] in ("vmap", "sequential") and len(parts) == 1:
            return ClientStrategy(parts[0])
    except ValueError as error:
        raise ValueError(f"strategy {text!r}: {error}") from None
    raise ValueError(
        f"strategy {text!r} is not one of vmap, sequential, chunked:K, "
        "sharded[:vmap|sequential|chunked:K]"
    )


def _map_on_one_device(
    kind: str, chunk_size: int | None, fn: Callable, shared: PyTree, per_client: PyTree
) -> PyTree:
    one = lambda client: fn(shared, client)  # noqa: E731
    if kind == "vmap":
        return jax.vmap(one)(per_client)
    if kind == "sequential":
        return jax.lax.map(one, per_client)
    return jax.lax.map(one, per_client, batch_size=chunk_size)


def _layout_order(cost: jax.Array, kind: str, inner: str, num_devices: int) -> jax.Array:
    """A permutation of the clients that balances the work of the layout.

    `chunked` groups clients of similar cost, so that a vmapped group whose
    loop runs to its slowest member wastes little. `sharded` deals clients
    sorted by cost to the devices in snake order (0, 1, ..., D-1, D-1, ...,
    0, 0, 1, ...), so that every device gets a similar total (and, with an
    inner chunked layout, similar clients side by side).
    """
    del inner  # Unused: the inner layout runs in the order it is given.
    order = jnp.argsort(-cost, stable=True)
    if kind == "sharded":
        # Row r of [P, D] holds sorted clients r*D .. r*D + D - 1; odd rows are
        # reversed; column d (device d's positions d*P .. d*P + P - 1 after
        # the transpose) then alternates large and small.
        per_device = cost.shape[0] // num_devices
        rows = order.reshape(per_device, num_devices)
        rows = jnp.where((jnp.arange(per_device) % 2 == 1)[:, None], rows[:, ::-1], rows)
        order = rows.T.reshape(-1)
    return order


def map_clients(
    fn: Callable[[PyTree, PyTree], PyTree],
    shared: PyTree,
    per_client: PyTree,
    strategy: ClientStrategy,
    *,
    cost: jax.Array | None = None,
) -> PyTree:
    """Applies `fn(shared, client)` to every client, stacking the outputs.

    Args:
      fn: the per-client computation.
      shared: inputs common to all clients.
      per_client: inputs with a leading client axis M; must contain a
        boolean `active` entry ([M]) when passed as a dict.
      strategy: the layout.
      cost: optional `[M]` estimate of each client's work (e.g. its local
        steps). Layouts that group clients (chunked, sharded) then reorder
        them to balance the work; outputs come back in client order either
        way.

    Returns:
      The outputs with a leading axis M, in client order.
    """
    num_clients = jax.tree.leaves(per_client)[0].shape[0]
    mesh = strategy.mesh
    padding = (-num_clients) % mesh.size if mesh is not None else 0
    if padding:
        per_client = jax.tree.map(
            lambda x: jnp.concatenate([x, jnp.repeat(x[:1], padding, axis=0)]),
            per_client,
        )
        per_client["active"] = per_client["active"].at[num_clients:].set(False)
        if cost is not None:
            cost = jnp.concatenate([cost, jnp.zeros(padding, cost.dtype)])
    reorder = cost is not None and (
        strategy.kind == "chunked"
        or (strategy.kind == "sharded" and mesh.size > 1)
        or (strategy.kind == "sharded" and strategy.inner == "chunked")
    )
    if reorder:
        order = _layout_order(
            jnp.where(per_client["active"], cost, -1),
            strategy.kind,
            strategy.inner,
            mesh.size if mesh is not None else 1,
        )
        per_client = jax.tree.map(lambda x: x[order], per_client)

    if mesh is None:
        outputs = _map_on_one_device(
            strategy.kind, strategy.chunk_size, fn, shared, per_client
        )
    else:

        def on_device(shared, clients):
            return _map_on_one_device(
                strategy.inner, strategy.chunk_size, fn, shared, clients
            )

        spec = PartitionSpec(CLIENT_AXIS)
        outputs = jax.shard_map(
            on_device,
            mesh=mesh,
            in_specs=(PartitionSpec(), spec),
            out_specs=spec,
            # With the check on (the default, check_vma=True), `jax.grad`
            # w.r.t. a replicated input inside shard_map is implicitly summed
            # over devices: per-client updates come out num_devices times too
            # large. Each device's clients are independent here, so there is
            # nothing to check.
            check_vma=False,
        )(shared, per_client)
    if reorder:
        inverse = jnp.argsort(order)
        outputs = jax.tree.map(lambda x: x[inverse], outputs)
    return jax.tree.map(lambda x: x[:num_clients], outputs)


# Models up to this many parameters run in vmapped groups on CPU; larger ones
# one client at a time (their weights stay in cache).
SMALL_MODEL_PARAMETERS = 16_384
SMALL_MODEL_CHUNK = 10


def default_strategy(
    backend: str, num_parameters: int, num_local_devices: int = 1
) -> ClientStrategy:
    """The strategy to use when none is given, chosen from measurements.

    The figures are in docs/strategies.md, "The measurements behind them"
    (and benchmarks/RESULTS.md):

    * GPU/TPU: `vmap`: one wide computation per local step is what an
      accelerator wants (chunked layouts were slower on a GPU);
    * CPU, several devices: `sharded`, inner `chunked:10` for small models
      (up to `SMALL_MODEL_PARAMETERS`: per-operation overhead dominates, and
      batching 10 clients amortizes it while their models still fit in
      cache; faster there than inner vmap, inner sequential or plain vmap)
      and inner `sequential` for larger ones (one client's model at a time
      stays in cache, where a full vmap's private models spill it; faster
      there than inner chunked:5 or plain vmap);
    * CPU, one device: the same inner layouts.
    """
    if backend in ("gpu", "tpu"):
        return ClientStrategy("vmap")
    small = num_parameters <= SMALL_MODEL_PARAMETERS
    if num_local_devices > 1:
        if small:
            return ClientStrategy("sharded", inner="chunked", chunk_size=SMALL_MODEL_CHUNK)
        return ClientStrategy("sharded", inner="sequential")
    if small:
        return ClientStrategy("chunked", chunk_size=SMALL_MODEL_CHUNK)
    return ClientStrategy("sequential")


def strategy_names() -> Sequence[str]:
    return ("vmap", "sequential", "chunked:K", "sharded[:inner]")
