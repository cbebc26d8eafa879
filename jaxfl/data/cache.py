"""The on-disk cache of converted datasets, in the packed layout, memory-mapped.

Reading a federated dataset from the files users hold (TFF HDF5 or SQLite,
FedJAX SQLite, LEAF JSON, TFDS, IDX, ...) means decoding every example once;
jaxfl does it once per (dataset, options, source files) and keeps the result
in the layout the engine uses, so a second run maps it and starts in seconds:

    <cache root>/<dataset>/<key>/
        metadata.json                    what the dataset is (classes, shapes, statistics, source)
        <population>/counts.npy          [N] int32 examples per client
        <population>/clients.txt         client names, one per line (read only when asked for)
        <population>/<feature>.bin       [E, ...] raw C-order array, clients one after another

`<key>` hashes the dataset name, its options, the converter's version and
each source file's path, size and modification time, so changing any of them
converts again. An entry is written in a temporary directory and renamed
into place when complete (a crash, ^C or a concurrent conversion never leaves
a half-written entry in use), and its files' sizes are checked against
`metadata.json` when opened (a damaged entry is converted again).

The cache root is `$JAXFL_CACHE_DIR`, else `$XDG_CACHE_HOME/jaxfl`, else
`~/.cache/jaxfl`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import sys
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from jaxfl.data.errors import DataFileError
from jaxfl.data.host import HostPopulation

# Bump when the layout of an entry changes: older entries are then ignored.
CACHE_LAYOUT_VERSION = 1

_METADATA = "metadata.json"


def cache_root() -> Path:
    """Where converted datasets are kept (see the module docstring)."""
    explicit = os.environ.get("JAXFL_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "jaxfl"


def file_fingerprint(paths: Iterable[str | os.PathLike]) -> list[list[Any]]:
    """`[path, size, mtime_ns]` of each file (directories: of every file below them, sorted)."""
    entries = []
    for path in paths:
        path = Path(path).resolve()
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            stat = file.stat()
            entries.append([str(file), stat.st_size, stat.st_mtime_ns])
    return entries


def cache_key(parts: Mapping[str, Any]) -> str:
    text = json.dumps({**parts, "layout": CACHE_LAYOUT_VERSION}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


class PopulationWriter:
    """Appends clients to one population's packed files, one client at a time.

    Memory stays one client's examples whatever the population's size: each
    feature is a raw file grown by appending.
    """

    def __init__(self, directory: Path):
        self.directory = directory
        directory.mkdir(parents=True)
        self._files: dict[str, BinaryIO] = {}
        self._specs: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
        self._counts: list[int] = []
        self._names = (directory / "clients.txt").open("w", encoding="utf-8")

    @property
    def num_clients(self) -> int:
        return len(self._counts)

    def add(self, name: str, features: Mapping[str, np.ndarray]) -> None:
        """Appends one client (at least one example; every feature the same length)."""
        sizes = {np.shape(v)[0] for v in features.values()}
        if len(sizes) != 1:
            raise ValueError(f"client {name!r}: features have different numbers of examples {sorted(sizes)}")
        self.add_block([name], np.asarray(list(sizes)), features, what=f"client {name!r}")

    def add_block(
        self, names: list[str], counts: np.ndarray, features: Mapping[str, np.ndarray], *, what: str = "block"
    ) -> None:
        """Appends consecutive clients at once: `counts[j]` rows each, features packed.

        The fast path for generated populations of millions of clients (one
        `add` per client costs microseconds of Python each).
        """
        counts = np.asarray(counts, np.int64)
        if len(names) != counts.size:
            raise ValueError(f"{what}: {len(names)} names for {counts.size} clients")
        if np.any(counts < 1):
            raise ValueError(
                f"{what} has no examples" if counts.size == 1 else f"{what}: a client has no examples"
            )
        total = int(counts.sum())
        arrays = {k: np.ascontiguousarray(v) for k, v in features.items()}
        if any(a.shape[0] != total for a in arrays.values()):
            raise ValueError(f"{what}: features must have {total} rows (the counts' sum)")
        if not self._specs:
            for key, array in arrays.items():
                self._specs[key] = (array.dtype, array.shape[1:])
                self._files[key] = (self.directory / f"{key}.bin").open("wb")
        if set(arrays) != set(self._specs):
            raise ValueError(f"{what} has features {sorted(arrays)}, expected {sorted(self._specs)}")
        for key, array in arrays.items():
            dtype, trailing = self._specs[key]
            if array.dtype != dtype or array.shape[1:] != trailing:
                raise ValueError(
                    f"{what}: feature {key!r} is {array.dtype}{list(array.shape[1:])}, "
                    f"expected {dtype}{list(trailing)}"
                )
        for key, array in arrays.items():
            self._files[key].write(array.tobytes())
        self._counts.extend(counts.tolist())
        self._names.write("".join(name.replace("\n", " ") + "\n" for name in names))

    def close(self) -> dict[str, Any]:
        """Finishes the files; returns the population's entry of `metadata.json`."""
        for file in self._files.values():
            file.close()
        self._names.close()
        if not self._counts:
            raise ValueError(f"population {self.directory.name!r} has no clients")
        counts = np.asarray(self._counts, np.int64)
        if counts.sum() >= np.iinfo(np.int32).max:
            raise ValueError("populations above 2**31 examples are not supported")
        np.save(self.directory / "counts.npy", counts.astype(np.int32))
        return {
            "num_clients": int(counts.size),
            "num_examples": int(counts.sum()),
            "features": {
                key: {"dtype": dtype.str, "shape": list(trailing)}
                for key, (dtype, trailing) in self._specs.items()
            },
        }

    def abort(self) -> None:
        for file in self._files.values():
            file.close()
        self._names.close()


class CacheBuilder:
    """Writes one cache entry: populations, then metadata (see `cached_dataset`)."""

    def __init__(self, directory: Path):
        self.directory = directory
        self._writers: dict[str, PopulationWriter] = {}

    def population(self, name: str) -> PopulationWriter:
        if name in self._writers:
            raise ValueError(f"population {name!r} written twice")
        self._writers[name] = PopulationWriter(self.directory / name)
        return self._writers[name]

    def finish(self, metadata: Mapping[str, Any]) -> dict[str, Any]:
        populations = {name: writer.close() for name, writer in self._writers.items()}
        full = {**metadata, "populations": populations, "layout": CACHE_LAYOUT_VERSION}
        (self.directory / _METADATA).write_text(json.dumps(full, indent=2) + "\n")
        return full

    def abort(self) -> None:
        for writer in self._writers.values():
            writer.abort()


def _population_files_ok(directory: Path, entry: Mapping[str, Any]) -> str | None:
    """None if the population's files have the sizes `entry` says, else what is wrong."""
    counts_path = directory / "counts.npy"
    if not counts_path.is_file():
        return f"{counts_path} is missing"
    for key, spec in entry["features"].items():
        path = directory / f"{key}.bin"
        expected = entry["num_examples"] * np.dtype(spec["dtype"]).itemsize * math.prod(spec["shape"])
        actual = path.stat().st_size if path.is_file() else -1
        if actual != expected:
            return f"{path} has {actual} bytes, expected {expected}"
    return None


def open_population(directory: Path, entry: Mapping[str, Any]) -> HostPopulation:
    """The population of a cache entry, memory-mapped read-only."""
    counts = np.load(directory / "counts.npy")
    rows = int(entry["num_examples"])
    features = {
        key: np.memmap(
            directory / f"{key}.bin", dtype=np.dtype(spec["dtype"]), mode="r", shape=(rows, *spec["shape"])
        )
        for key, spec in entry["features"].items()
    }
    names_path = directory / "clients.txt"

    def client_names() -> list[str]:
        return names_path.read_text(encoding="utf-8").splitlines()

    return HostPopulation(
        features=features,
        offsets=np.concatenate([[0], np.cumsum(counts, dtype=np.int64)[:-1]]),
        counts=counts,
        client_names=client_names,
    )


def read_entry(directory: Path) -> tuple[dict[str, Any], dict[str, HostPopulation]] | None:
    """An entry's metadata and populations, or None if absent, incomplete or damaged."""
    metadata_path = directory / _METADATA
    if not metadata_path.is_file():
        return None
    try:
        metadata = json.loads(metadata_path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if metadata.get("layout") != CACHE_LAYOUT_VERSION:
        return None
    for name, entry in metadata["populations"].items():
        problem = _population_files_ok(directory / name, entry)
        if problem is not None:
            print(f"jaxfl: cache entry {directory} is damaged ({problem}); converting again", file=sys.stderr)
            return None
    populations = {
        name: open_population(directory / name, entry) for name, entry in metadata["populations"].items()
    }
    return metadata, populations


def cached_dataset(
    dataset: str,
    key_parts: Mapping[str, Any],
    build: Callable[[CacheBuilder], Mapping[str, Any]],
    *,
    root: Path | None = None,
) -> tuple[dict[str, Any], dict[str, HostPopulation]]:
    """Opens the cache entry of `key_parts`, converting with `build` first if needed.

    Args:
      dataset: the dataset's name (the entry's parent directory).
      key_parts: everything the converted data depends on (options, the
        converter's version, `file_fingerprint`s of the sources).
      build: writes the populations with `builder.population(name).add(...)`
        and returns the metadata (num_classes, input_shape, description,
        ...); it may raise `DataFileError` for a bad source file, in which
        case nothing is left behind.
      root: the cache root (default `cache_root()`).

    Returns:
      (metadata, {population name: memory-mapped `HostPopulation`}).
    """
    root = cache_root() if root is None else Path(root)
    final = root / dataset / cache_key({"dataset": dataset, **key_parts})
    opened = read_entry(final)
    if opened is not None:
        return opened
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DataFileError(f"cannot create the cache directory {final.parent}: {error.strerror}") from None
    staging = final.with_name(f"{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    staging.mkdir()
    builder = CacheBuilder(staging)
    try:
        builder.finish(build(builder))
    except BaseException:
        builder.abort()
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if final.exists():
        # A damaged entry, or another process's conversion that finished
        # first: ours replaces a damaged one and yields to a good one.
        if read_entry(final) is None:
            shutil.rmtree(final, ignore_errors=True)
        else:
            shutil.rmtree(staging, ignore_errors=True)
    with contextlib.suppress(FileExistsError, OSError):
        os.rename(staging, final)
    shutil.rmtree(staging, ignore_errors=True)
    opened = read_entry(final)
    if opened is None:
        raise DataFileError(f"the cache entry {final} could not be written")
    return opened
