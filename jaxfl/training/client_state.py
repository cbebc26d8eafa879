"""Per-client state (personal models) kept in host memory, the cohort's rows moved each round.

Ditto, APFL and the other stateful algorithms keep one model per training
client in `ServerState.clients` (leaves `[N, ...]`). On the device that costs
N models of device memory, or N / D per device when split over a mesh
(`ClientStrategy.shard_rows`); past that, the rows live in host memory as
NumPy arrays and only the cohort's M rows visit the device:

1. before each compiled round the host computes the round's cohort exactly
   as the round will (`jaxfl.training.host_cohorts.sampled_cohorts`: the
   same keys, the same sampler), copies those clients' rows, in the
   cohort's order, to the device as `GatheredClientRows`;
2. the round reads and writes them through `cohort.client_rows` and
   `cohort.store_client_rows`, which take the gathered rows as they are
   (row j is the cohort's j-th client's) where they would index the
   device rows by client id;
3. after the round the host copies the M updated rows back into theirs
   (`HostClientState.store`).

A run so gives bit for bit the models of the device-resident state (tested
in tests/training/test_client_state.py). One round per compiled call: a
client sampled in two consecutive rounds must start the second from its
first's result. Device memory is O(M) models; host memory is N models.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxfl.training.host_cohorts import sampled_cohorts
from jaxfl.types import Key, PyTree


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GatheredClientRows:
    """The cohort's rows of host-resident per-client state, as the compiled round receives them.

    Attributes:
      rows: leaves `[M, ...]`, row j the cohort's j-th client's (the order
        `select_cohort` gives its `client_ids`).
      client_ids: `[M]` int32 whose rows they are: the host's cohort when
        gathered; the cohort the round trained once the round has stored
        its rows (`cohort.store_client_rows`), which the host checks
        against its own before writing them back.
    """

    rows: PyTree
    client_ids: jax.Array


def host_rows(params: PyTree, num_clients: int) -> PyTree:
    """One host copy of `params` per client: NumPy leaves `[N, ...]`, writable."""
    return jax.tree.map(
        lambda leaf: np.repeat(np.asarray(leaf)[None], num_clients, axis=0), jax.device_get(params)
    )


def is_on_host(per_client_state: PyTree) -> bool:
    """Whether per-client state is host-resident (NumPy leaves) rather than device arrays."""
    leaves = jax.tree.leaves(per_client_state)
    return bool(leaves) and all(isinstance(leaf, np.ndarray) for leaf in leaves)


class HostClientState:
    """Moves the cohort's rows of a state's host-resident `clients` to the device and back.

    `gather(state, round_index)` returns the state the compiled round takes:
    its `clients` the `GatheredClientRows` of round `round_index`'s cohort
    (0-based, the state's round counter), placed by `place`;
    `store(state, host, round_index)` writes the round's updated rows back
    into `host` (the arrays `gather` read) and returns the state with `clients` the host arrays
    again (what evaluation, checkpoints and saving read).

    Args:
      run_key: the run's key, as given to the round.
      num_clients: N.
      clients_per_round: M.
      place: puts the gathered rows on the device(s) (e.g. replicated over
        the strategy's mesh; default `jax.device_put`).
      rounds_ahead: cohorts computed per call of the sampler (its cost is
        one dispatch, whatever the count).
    """

    def __init__(
        self,
        run_key: Key,
        num_clients: int,
        clients_per_round: int,
        *,
        place=None,
        rounds_ahead: int = 256,
    ):
        if jnp.ndim(run_key) != 0:
            raise ValueError("host-resident client state runs one setting at a time, not a batch of run keys")
        self.run_key = run_key
        self.num_clients = num_clients
        self.clients_per_round = clients_per_round
        self.place = place or jax.device_put
        self.rounds_ahead = rounds_ahead
        self._block_start: int | None = None
        self._block: np.ndarray | None = None

    def cohort_ids(self, round_index: int) -> np.ndarray:
        """`[M]` the ids round `round_index` (0-based) samples."""
        start = round_index - round_index % self.rounds_ahead
        if start != self._block_start:
            self._block = np.asarray(self._sample(start))
            self._block_start = start
        return self._block[round_index - start]

    @functools.cached_property
    def _sample(self):
        return lambda start: sampled_cohorts(
            self.run_key,
            first_round=jnp.asarray(start, jnp.int32),
            num_rounds=self.rounds_ahead,
            num_clients=self.num_clients,
            clients_per_round=self.clients_per_round,
        )

    def gather(self, state: Any, round_index: int) -> Any:
        """`state` with its host rows replaced by round `round_index`'s cohort's, on the device."""
        ids = self.cohort_ids(round_index)
        rows = jax.tree.map(lambda host: host[ids], state.clients)
        # One placement and, in `store`, one fetch for rows and ids: separate ones made the
        # quick-start run's Ditto rounds measurably slower (benchmarks/RESULTS.md, section "Host
        # client rows with the cohort check: no speed change once rows and ids travel together
        # (2026-11-27)").
        rows, placed_ids = self.place((rows, ids.astype(np.int32)))
        return dataclasses.replace(state, clients=GatheredClientRows(rows, placed_ids))

    def store(self, state: Any, host: PyTree, round_index: int) -> Any:
        """`state` after round `round_index`, its gathered rows written into `host`, which it then holds."""
        ids = self.cohort_ids(round_index)
        trained, rows = jax.device_get((state.clients.client_ids, state.clients.rows))
        if not np.array_equal(trained, ids):
            # Writing back would give these rows to the wrong clients: stop before the host rows change.
            raise RuntimeError(
                f"round {round_index} trained clients {trained.tolist()} on the host rows of clients "
                f"{ids.tolist()}: the host's cohort is not the round's, so the rows are not written back"
            )

        def write(host_leaf, new_rows):
            host_leaf[ids] = new_rows
            return host_leaf

        return dataclasses.replace(state, clients=jax.tree.map(write, host, rows))


@dataclasses.dataclass(frozen=True)
class HostPersonalModels:
    """Each training client's own model, from host-resident client rows, made block by block.

    What `FederatedAlgorithm.personal_models` gives for device rows: `rows`
    are the host rows (NumPy leaves `[N, ...]`), and `to_models` maps a
    block of them, on the device, to that block's models (APFL's mixture
    with the global model), or is None where the rows are the models
    (Ditto). Evaluation and saving take blocks, so the N models are never on
    the device at once.
    """

    rows: PyTree
    to_models: Any = None  # Callable: device rows [B, ...] -> models [B, ...]; None: the rows.

    @property
    def num_clients(self) -> int:
        return int(jax.tree.leaves(self.rows)[0].shape[0])

    def block(self, client_ids: np.ndarray) -> PyTree:
        """The models of `client_ids`, on the device (leaves `[len(client_ids), ...]`)."""
        rows = jax.device_put(jax.tree.map(lambda host: host[client_ids], self.rows))
        return rows if self.to_models is None else self.to_models(rows)

    def to_host(self, block_size: int = 256) -> PyTree:
        """All N models as NumPy leaves `[N, ...]` (the rows themselves where they are the models)."""
        if self.to_models is None:
            return self.rows
        models = None
        for ids in client_id_blocks(self.num_clients, block_size):
            block = jax.device_get(self.block(ids))
            if models is None:
                models = jax.tree.map(lambda m: np.empty((self.num_clients, *m.shape[1:]), m.dtype), block)
            for out, new in zip(jax.tree.leaves(models), jax.tree.leaves(block), strict=True):
                out[ids] = new
        return models


def client_id_blocks(num_clients: int, block_size: int):
    """Consecutive `[B]` id blocks covering 0..N-1, B = min(block_size, N) for every block
    (one shape, one compilation): the last block starts early, repeating ids of the one before.
    """
    size = min(block_size, num_clients)
    for start in range(0, num_clients, size):
        first = min(start, num_clients - size)
        yield np.arange(first, first + size)
