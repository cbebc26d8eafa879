"""Populations larger than device memory: examples in host memory, cohorts gathered per round.

A `HostPopulation` has the packed layout of `ClientPopulation` (one flat
array per feature, clients as contiguous slices given by offsets and
counts), but its arrays are NumPy arrays, usually memory-mapped from the
on-disk cache (`jaxfl.data.cache`), so a population of 10^7 clients costs
the pages it touches, not its size.

The compiled round never sees it. Cohort sampling is a function of the run
key and the round (`jaxfl.training.cohort.round_keys`), so the host can
compute round t's cohort itself, copy those clients' examples into a small
`GatheredCohort` (static shapes: the sum of the M largest client sizes), and
hand it to the device; `jaxfl.training.host_cohorts.CohortStream` does this
one call ahead of the device, in a background thread (double-buffered), so
gathering round t+1 overlaps the device computing round t. Device memory is O(cohort); host
memory is the page cache of the examples read plus two gathered cohorts.
The round trains the same clients with the same keys on the same examples,
so a run gives the same result as on the device-resident population (tested
in tests/data/test_host.py).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxfl.data.population import ClientPopulation, GatheredCohort, PackedLayout


@dataclasses.dataclass(frozen=True, eq=False)
class HostPopulation(PackedLayout):
    """Packed examples of N clients in host memory (usually memory-mapped).

    Attributes:
      features: feature name -> NumPy array `[E, ...]` (a `np.memmap` when
        read from the cache); client i owns rows
        `offsets[i] : offsets[i] + counts[i]`.
      offsets: `[N]` int64 start rows.
      counts: `[N]` int32 numbers of examples (>= 1).
      client_names: optional callable returning the clients' names (read
        lazily: 10^7 names are not loaded unless asked for).
    """

    features: Mapping[str, np.ndarray]
    offsets: np.ndarray
    counts: np.ndarray
    client_names: Callable[[], list[str]] | None = None

    def __post_init__(self):
        counts = np.asarray(self.counts)
        if counts.ndim != 1 or counts.size == 0 or np.any(counts < 1):
            raise ValueError("counts must be a non-empty vector of positive integers")
        total = int(counts.sum(dtype=np.int64))
        for name, array in self.features.items():
            if array.shape[0] != total:
                raise ValueError(f"feature {name!r} has {array.shape[0]} rows, counts sum to {total}")
        if total >= np.iinfo(np.int32).max:
            raise ValueError("populations above 2**31 examples are not supported")

    @classmethod
    def from_arrays(cls, features: Mapping[str, np.ndarray], counts: np.ndarray) -> HostPopulation:
        counts = np.asarray(counts, np.int32)
        offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)[:-1]])
        return cls(features=dict(features), offsets=offsets, counts=counts)

    @classmethod
    def from_device(cls, population: ClientPopulation) -> HostPopulation:
        """A host copy of a device population (for tests and small data)."""
        return cls(
            features={k: np.asarray(v) for k, v in population.features.items()},
            offsets=np.asarray(population.offsets, np.int64),
            counts=np.asarray(population.counts, np.int32),
        )

    @functools.cached_property
    def _files(self) -> dict[str, _FileRows]:
        """The memory-mapped features, read with `pread` instead of through the map."""
        return {
            name: _FileRows(array.filename, array.offset, array.dtype, array.shape[1:])
            for name, array in self.features.items()
            if isinstance(array, np.memmap) and array.filename is not None
        }

    @functools.cached_property
    def max_count(self) -> int:
        return int(self.counts.max())

    @property
    def nbytes(self) -> int:
        """Bytes the population would take on the device (features and index arrays)."""
        feature_bytes = sum(int(v.nbytes) for v in self.features.values())
        return feature_bytes + 8 * self.num_clients  # int32 offsets and counts

    def client(self, i: int) -> dict[str, np.ndarray]:
        start, count = int(self.offsets[i]), int(self.counts[i])
        return {k: np.asarray(v[start : start + count]) for k, v in self.features.items()}

    def client_weights(self, kind: str = "num_examples") -> np.ndarray:
        """`[N]` client weights alpha_i, as `ClientPopulation.client_weights`."""
        if kind == "num_examples":
            return self.counts.astype(np.float32)
        if kind == "uniform":
            return np.ones(self.counts.shape, np.float32)
        raise ValueError(f"client weights must be 'num_examples' or 'uniform', got {kind!r}")

    def to_device(self) -> ClientPopulation:
        """The whole population as a device-resident `ClientPopulation` (a copy)."""
        return ClientPopulation(
            features={k: jnp.asarray(np.asarray(v)) for k, v in self.features.items()},
            offsets=jnp.asarray(self.offsets, jnp.int32),
            counts=jnp.asarray(self.counts, jnp.int32),
            max_count=self.max_count,
        )

    def cohort_rows(self, clients_per_round: int) -> int:
        """Rows of a gathered cohort: the sum of the M largest client sizes.

        Every cohort of M distinct clients fits, so the gathered cohort's
        shapes are static for a whole run.
        """
        if not 1 <= clients_per_round <= self.num_clients:
            raise ValueError(f"clients_per_round must be in [1, {self.num_clients}], got {clients_per_round}")
        largest = np.partition(self.counts, self.num_clients - clients_per_round)
        return int(largest[self.num_clients - clients_per_round :].sum(dtype=np.int64))

    def gather_host(self, client_ids: np.ndarray, num_rows: int) -> dict[str, Any]:
        """The examples of `client_ids`, packed in that order and zero-padded to `num_rows` rows.

        Returns a dict of NumPy arrays: `features`, `offsets`, `counts` (the
        fields of the cohort's `ClientPopulation`) and `client_ids`.
        """
        client_ids = np.asarray(client_ids, np.int64)
        counts = self.counts[client_ids].astype(np.int32)
        starts = self.offsets[client_ids]
        used = int(counts.sum(dtype=np.int64))
        if used > num_rows:
            raise ValueError(f"the cohort holds {used} examples, more than the {num_rows} rows given")
        cohort_offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)[:-1]])
        features = {}
        for name, array in self.features.items():
            out = np.zeros((num_rows, *array.shape[1:]), array.dtype)
            file_rows = self._files.get(name)
            if file_rows is not None:
                file_rows.read_into(out, starts, counts, cohort_offsets)
            else:
                # Row r of the cohort is row starts[j] + (r - cohort_offsets[j]).
                rows = np.repeat(starts - cohort_offsets, counts) + np.arange(used)
                out[:used] = array[rows]
            features[name] = out
        return {
            "features": features,
            "offsets": cohort_offsets.astype(np.int32),
            "counts": counts,
            "client_ids": client_ids.astype(np.int32),
        }

    def prefetch(self, client_ids: np.ndarray) -> None:
        """Starts reading these clients' examples from disk in the background (file-backed features).

        A hint, not a read: the kernel reads the ranges asynchronously, many
        at once, so that a later `gather_host` finds them in the page cache.
        On a cold cache one read at a time would bound a round by the disk's
        latency (one random read per client and feature).
        """
        if not self._files or not hasattr(os, "posix_fadvise"):
            return
        client_ids = np.asarray(client_ids, np.int64).reshape(-1)
        starts, counts = self.offsets[client_ids], self.counts[client_ids]
        for file_rows in self._files.values():
            file_rows.advise(starts, counts)

    def gather(self, client_ids: np.ndarray, num_rows: int) -> GatheredCohort:
        """`gather_host`, as a device `GatheredCohort`."""
        return to_cohort(self.gather_host(client_ids, num_rows), self.max_count, self.num_clients)


class _FileRows:
    """Reads rows of a raw array file with `pread`, into a caller's buffer.

    Gathering a cohort through the memory map would map every page it
    touches into the process, and with the kernel's large page-cache folios
    one touched client maps megabytes: the resident memory of a long run
    would grow towards the population's size (measured: benchmarks/RESULTS.md,
    section "Populations larger than device memory (`out_of_core.py`, 2026-11-26)").
    `pread` copies just the client's bytes; the page cache still serves
    repeated reads but is not the process's memory.
    """

    def __init__(self, path: str, offset: int, dtype: np.dtype, row_shape: tuple[int, ...]):
        self.path = path
        self.offset = int(offset)
        self.row_bytes = int(np.dtype(dtype).itemsize * math.prod(row_shape))
        self._fd: int | None = None

    def _descriptor(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
            # Closed with this object, or at exit while `os` still exists.
            weakref.finalize(self, os.close, self._fd)
        return self._fd

    def advise(self, starts: np.ndarray, counts: np.ndarray) -> None:
        """Asks the kernel to start reading these rows now (`POSIX_FADV_WILLNEED`, asynchronous)."""
        fd = self._descriptor()
        for start, count in zip(starts.tolist(), counts.tolist(), strict=True):
            os.posix_fadvise(
                fd, self.offset + start * self.row_bytes, count * self.row_bytes, os.POSIX_FADV_WILLNEED
            )

    def read_into(
        self, out: np.ndarray, starts: np.ndarray, counts: np.ndarray, out_rows: np.ndarray
    ) -> None:
        fd = self._descriptor()
        buffer = memoryview(out.reshape(-1).view(np.uint8))
        for start, count, row in zip(starts.tolist(), counts.tolist(), out_rows.tolist(), strict=True):
            size = count * self.row_bytes
            first = row * self.row_bytes
            read = os.preadv(fd, [buffer[first : first + size]], self.offset + start * self.row_bytes)
            if read != size:
                raise OSError(
                    f"{self.path}: short read ({read} of {size} bytes): the file changed or is truncated"
                )


def to_cohort(
    host: Mapping[str, Any], max_count: int, num_clients: int, held_out_max_count: int | None = None
) -> GatheredCohort:
    """The `GatheredCohort` of `gather_host`'s arrays (and of the cohort's held-out examples,
    `host['held_out']`, where given: `ClientPopulation.held_out`).
    """
    held_out = None
    if "held_out" in host:
        held_out = ClientPopulation(
            features=dict(host["held_out"]["features"]),
            offsets=host["held_out"]["offsets"],
            counts=host["held_out"]["counts"],
            max_count=held_out_max_count,
        )
    return GatheredCohort(
        client_ids=host["client_ids"],
        clients=ClientPopulation(
            features=dict(host["features"]),
            offsets=host["offsets"],
            counts=host["counts"],
            max_count=max_count,
        ),
        num_clients=num_clients,
        held_out=held_out,
    )


def client_blocks(counts: np.ndarray, max_rows: int) -> Iterator[tuple[int, int]]:
    """Consecutive client ranges [a, b) whose examples fit in `max_rows` rows.

    Every client fits alone (callers pass max_rows >= the largest client).
    """
    ends = np.cumsum(counts, dtype=np.int64)
    start, first_row = 0, 0
    num_clients = counts.shape[0]
    while start < num_clients:
        stop = int(np.searchsorted(ends, first_row + max_rows, side="right"))
        stop = max(stop, start + 1)
        yield start, stop
        first_row = int(ends[stop - 1])
        start = stop


RESIDENCIES = ("auto", "device", "host")

# Share of the device's memory a device-resident population may take: the
# rest is for the model, the cohort's per-client copies and XLA's temporaries.
DEVICE_MEMORY_SHARE = 0.5


def device_memory_bytes() -> int | None:
    """Memory of the default device: its allocator's limit on GPU/TPU; on CPU, available RAM."""
    device = jax.devices()[0]
    if device.platform != "cpu":
        stats = device.memory_stats() or {}
        limit = stats.get("bytes_limit")
        return int(limit) if limit else None
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a population lives for a run, and why (printed by the CLI)."""

    residency: str  # 'device' or 'host'
    reason: str


def choose_residency(population_bytes: int, requested: str = "auto") -> Placement:
    """Device-resident when asked, or ('auto') when the population fits.

    'auto' puts the population on the device when its bytes are at most
    `DEVICE_MEMORY_SHARE` of the device's memory (`device_memory_bytes`),
    else keeps it in host memory and gathers each round's cohort.
    """
    if requested not in RESIDENCIES:
        raise ValueError(f"residency must be one of {', '.join(RESIDENCIES)}, got {requested!r}")
    size = f"{population_bytes / 2**20:,.1f} MiB"
    if requested != "auto":
        return Placement(requested, f"{size}, as asked")
    memory = device_memory_bytes()
    if memory is None:
        return Placement("device", f"{size}; device memory unknown")
    budget = DEVICE_MEMORY_SHARE * memory
    if population_bytes <= budget:
        return Placement("device", f"{size} fits in {budget / 2**20:,.0f} MiB of device memory")
    return Placement("host", f"{size} exceeds {budget / 2**20:,.0f} MiB of device memory")


def place_population(population, residency: str):
    """The population as a device `ClientPopulation` ('device') or a `HostPopulation` ('host')."""
    if residency == "device":
        return population.to_device() if isinstance(population, HostPopulation) else population
    if residency == "host":
        if isinstance(population, ClientPopulation):
            return HostPopulation.from_device(population)
        return population
    raise ValueError(f"residency must be 'device' or 'host', got {residency!r}")
