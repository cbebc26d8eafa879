"""What the real-data loaders share: finding files, the cache, progress, partitioned populations."""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from jaxfl.data.cache import CacheBuilder, cached_dataset, file_fingerprint
from jaxfl.data.errors import DataFileError, MissingDataError
from jaxfl.data.population import FederatedDataset

_TASK_FIELDS = ("num_classes", "input_shape", "input_vocab_size", "excluded_target_ids", "description")


def progress_bar(total: int | None, description: str) -> tqdm:
    """A progress bar on stderr for conversions (hidden when stderr is not a terminal)."""
    return tqdm(
        total=total,
        desc=description,
        unit="client",
        file=sys.stderr,
        dynamic_ncols=True,
        disable=None,
        leave=False,
    )


def check_data_dir(data_dir: str | os.PathLike | None, dataset: str) -> Path | None:
    """`data_dir` as a Path, or a one-line error if it is not a readable directory."""
    if data_dir is None:
        return None
    path = Path(data_dir).expanduser()
    shown = str(path) if len(str(path)) <= 200 else f"{str(path)[:80]}...({len(str(path))} characters)"
    try:
        exists, is_dir = path.exists(), path.is_dir()
    except OSError as error:  # E.g. a name longer than the file system allows.
        raise MissingDataError(
            f"dataset {dataset!r}: --data-dir {shown} cannot be read ({error.strerror})"
        ) from None
    if not exists:
        raise MissingDataError(f"dataset {dataset!r}: --data-dir {shown} does not exist")
    if not is_dir:
        raise MissingDataError(f"dataset {dataset!r}: --data-dir {shown} is not a directory")
    return path


def find_file(directories: Iterable[Path], names: Sequence[str]) -> Path | None:
    """The first of `names` that exists in one of `directories` (in that order)."""
    for directory in directories:
        for name in names:
            candidate = directory / name
            if candidate.exists():
                return candidate
    return None


def search_directories(data_dir: Path | None, *defaults: str | os.PathLike) -> list[Path]:
    """`data_dir` and its immediate subdirectories, or the default locations that exist."""
    if data_dir is not None:
        return [data_dir, *sorted(p for p in data_dir.iterdir() if p.is_dir())]
    return [Path(d).expanduser() for d in defaults if Path(d).expanduser().is_dir()]


def missing(
    dataset: str, looked_for: str, places: Sequence[Path] | str, how: str | None = None
) -> MissingDataError:
    """The one-line error of a dataset whose files are absent; `how` says how to get them."""
    if isinstance(places, str):
        where = places
    else:
        where = ", ".join(str(p) for p in places) if places else "(no directory given: pass --data-dir)"
    how = how or "see docs/datasets.md for how to get them"
    return MissingDataError(f"dataset {dataset!r}: no {looked_for} found in {where}; {how}")


def load_cached(
    dataset: str,
    options: Mapping[str, Any],
    sources: Sequence[Path],
    build: Callable[[CacheBuilder], Mapping[str, Any]],
    *,
    converter_version: int,
) -> FederatedDataset:
    """The dataset from the cache, converted by `build` once (see `jaxfl.data.cache`).

    `build` writes populations named 'train', 'test' and optionally
    'validation', and returns the task's metadata (`num_classes`,
    `input_shape`, `input_vocab_size`, `description`, and anything else,
    e.g. statistics or the source's format), which `FederatedDataset`
    carries.
    """
    key = {
        "options": dict(options),
        "sources": file_fingerprint(sources),
        "converter": converter_version,
    }
    metadata, populations = cached_dataset(dataset, key, build)
    if "train" not in populations or "test" not in populations:
        raise DataFileError(f"dataset {dataset!r}: the conversion wrote no train or test clients")
    return FederatedDataset(
        name=dataset,
        train=populations["train"],
        test=populations["test"],
        validation=populations.get("validation"),
        num_classes=int(metadata["num_classes"]),
        input_shape=tuple(metadata["input_shape"]),
        input_vocab_size=metadata.get("input_vocab_size"),
        excluded_target_ids=tuple(metadata.get("excluded_target_ids", ())),
        description=metadata.get("description", ""),
        personal_splits=bool(metadata.get("personal_splits", False)),
    )


def write_population(
    builder: CacheBuilder,
    population: str,
    clients: Iterable[tuple[str, Mapping[str, np.ndarray] | None]],
    *,
    total: int | None,
    description: str,
    empty_error: str,
) -> dict[str, int]:
    """Writes every client with at least one example into `population`; returns its `size_statistics`.

    `clients` yields (name, examples), examples None or with no row being a
    client to skip; `empty_error` is the `DataFileError` raised when none is kept.
    """
    writer = builder.population(population)
    counts = []
    with progress_bar(total, description) as bar:
        for name, examples in clients:
            bar.update(1)
            if examples is not None and len(examples["y"]):
                writer.add(name, examples)
                counts.append(len(examples["y"]))
    if not counts:
        raise DataFileError(empty_error)
    return size_statistics(np.asarray(counts))


def take_first(features: Mapping[str, np.ndarray], limit: int | None) -> dict[str, np.ndarray]:
    """A client's first `limit` examples (all when None), as TFF's `take(n)` caps clients."""
    if limit is None:
        return dict(features)
    return {k: v[:limit] for k, v in features.items()}


def size_statistics(counts: np.ndarray) -> dict[str, int]:
    counts = np.asarray(counts)
    return {
        "clients": int(counts.size),
        "examples": int(counts.sum()),
        "min": int(counts.min()),
        "median": int(np.median(counts)),
        "max": int(counts.max()),
    }


# ---------------------------------------------------------------------------
# Natural clients read from files: one iterator of (client, raw arrays) per
# population, whatever the format.
# ---------------------------------------------------------------------------


class ClientSource:
    """The clients of one population as a file holds them.

    Attributes:
      path: the file (for messages and the cache key).
      total: the number of clients, when the file says (for progress bars).
      clients: a callable returning an iterator of (client id, feature name
        -> array with one row per example).
    """

    def __init__(self, path: Path, total: int | None, clients: Callable[[], Iterable[tuple[str, dict]]]):
        self.path = path
        self.total = total
        self.clients = clients


def write_sources(
    builder: CacheBuilder,
    sources: Mapping[str, ClientSource],
    featurize: Callable[[Mapping[str, np.ndarray], str], Mapping[str, np.ndarray]],
    dataset: str,
) -> dict[str, dict[str, int]]:
    """Writes every population of `sources` (`write_population`); returns their statistics.

    Each client's raw features go through `featurize(raw, where)`, `where`
    naming the file and the client for error messages.
    """
    statistics = {}
    for population, source in sources.items():
        # Closed even on an error (a traceback would keep the file open).
        with contextlib.closing(source.clients()) as raw_clients:
            where = source.path.name
            clients = ((client, featurize(raw, f"{where}: {client}")) for client, raw in raw_clients)
            statistics[population] = write_population(
                builder, population, clients, total=source.total, description=f"{dataset} {population}",
                empty_error=f"{source.path}: no {population} client has an example",
            )  # fmt: skip
    return statistics


def stack_examples(examples: Sequence[Mapping[str, Any]], where: str) -> dict[str, np.ndarray]:
    """Parsed `tf.train.Example`s of one client as arrays, one row per example.

    float/int lists of one value give `[n]` arrays, of k values `[n, k]`;
    bytes lists of one value give `[n]` object arrays of bytes.
    """
    if not examples:
        return {}
    arrays = {}
    for name in examples[0]:
        values = [example.get(name) for example in examples]
        if any(v is None for v in values):
            raise DataFileError(f"{where}: feature {name!r} is missing from some examples")
        if isinstance(values[0], list):
            column = np.empty(len(values), dtype=object)
            for i, v in enumerate(values):
                column[i] = v[0] if len(v) == 1 else b" ".join(v)
            arrays[name] = column
            continue
        lengths = {len(v) for v in values}
        if len(lengths) != 1:
            raise DataFileError(f"{where}: feature {name!r} has examples of lengths {sorted(lengths)}")
        stacked = np.stack(values)
        arrays[name] = stacked[:, 0] if lengths == {1} else stacked
    return arrays


def _reader_source(
    path: Path,
    open_reader: Callable[[], Any],
    count: Callable[[Any], int],
    iterate: Callable[[Any], Iterable[tuple[str, dict]]],
) -> ClientSource:
    """A `ClientSource` of a format reader: opened once now to count the clients, and anew per pass.

    Args:
      path: the file (for messages and the cache key).
      open_reader: opens the file (a context manager).
      count: the number of clients, from the open reader.
      iterate: the (client id, feature name -> array) pairs, from the open reader.
    """
    with open_reader() as file:
        total = count(file)

    def clients():
        with open_reader() as file:
            yield from iterate(file)

    return ClientSource(path, total, clients)


def tff_hdf5_source(path: Path) -> ClientSource:
    from jaxfl.data.formats.tff_hdf5 import TffHdf5

    return _reader_source(
        path, lambda: TffHdf5(path), lambda file: len(file.client_ids()), lambda file: file.iter_clients()
    )


def _decompress_dir(path: Path) -> Path:
    """Where the decompressed copy of a `.sqlite.lzma` file goes: one directory per source path.

    Files of the same name in different directories (e.g. two releases) must
    not share a copy: `TffSqlite` reuses one that is newer than its source.
    """
    from jaxfl.data.cache import cache_root

    digest = hashlib.sha256(str(Path(path).resolve()).encode()).hexdigest()[:16]
    work_dir = cache_root() / "decompressed" / digest
    work_dir.mkdir(parents=True, exist_ok=True)
    return work_dir


def tff_sqlite_source(path: Path, split: str) -> ClientSource:
    from jaxfl.data.formats.tff_sqlite import TffSqlite

    work_dir = _decompress_dir(path)

    def stacked(file):
        for client, examples in file.iter_clients(split):
            yield client, stack_examples(examples, f"{path.name}: client {client!r}")

    return _reader_source(
        path, lambda: TffSqlite(path, work_dir=work_dir), lambda file: len(file.client_counts(split)), stacked
    )


def tff_sqlite_splits(path: Path) -> list[str]:
    from jaxfl.data.formats.tff_sqlite import TffSqlite

    with TffSqlite(path, work_dir=_decompress_dir(path)) as file:
        return file.splits()


def fedjax_sqlite_source(path: Path) -> ClientSource:
    from jaxfl.data.formats.fedjax_sqlite import FedjaxSqlite

    return _reader_source(
        path,
        lambda: FedjaxSqlite(path),
        lambda file: len(file.client_counts()),
        lambda file: file.iter_clients(),
    )


def find_tff_sources(
    data_dir: Path,
    hdf5: Mapping[str, str],
    sqlite: Sequence[str],
    sqlite_splits: Mapping[str, str],
    fedjax: Mapping[str, str] | None = None,
    *,
    optional: Collection[str] = (),
) -> tuple[str, dict[str, ClientSource]] | None:
    """The first format of a TFF dataset found in `data_dir`, and its client sources by population.

    The formats are tried in this order: TFF HDF5 (`hdf5`: population ->
    file name, each also found inside its TFF archive), TFF SQLite (the first
    of the file names `sqlite`, with `sqlite_splits`: population -> split),
    FedJAX SQLite (`fedjax`: population -> file name; None: not published in
    it). A format is taken when it holds every population not in `optional`;
    an optional population is read from it when its file, or its split of
    the SQLite file, is there too. The sources keep the order of the
    mappings.

    Returns:
      (the format's name, population -> `ClientSource`), or None when no
      format is complete.
    """
    directories = search_directories(data_dir)

    def complete(found: Mapping[str, Path | None]) -> bool:
        return all(found[population] for population in found if population not in optional)

    h5 = {population: find_file_or_archive(directories, name) for population, name in hdf5.items()}
    if complete(h5):
        return "TFF HDF5", {population: tff_hdf5_source(path) for population, path in h5.items() if path}
    path = find_file(directories, sqlite)
    if path:
        # Only an optional split is looked up first: an absent required one fails as its source opens.
        present = tff_sqlite_splits(path) if any(p in optional for p in sqlite_splits) else ()
        return "TFF SQLite", {
            population: tff_sqlite_source(path, split)
            for population, split in sqlite_splits.items()
            if population not in optional or split in present
        }
    if fedjax is None:
        return None
    fj = {population: find_file(directories, [name]) for population, name in fedjax.items()}
    if complete(fj):
        return "FedJAX SQLite", {population: fedjax_sqlite_source(p) for population, p in fj.items() if p}
    return None


def split_clients_by_name(names: Sequence[str], test_fraction: float, seed: int) -> set[str]:
    """The names of a seeded random `test_fraction` of clients (at least one, not all when >= 2)."""
    names = sorted(names)
    count = min(max(round(test_fraction * len(names)), 1), max(len(names) - 1, 1))
    chosen = np.random.default_rng(seed).permutation(len(names))[:count]
    return {names[i] for i in chosen}


# The archives TFF publishes (storage.googleapis.com/tff-datasets-public) and
# the files each holds; Keras' `get_file(..., extract=True)` keeps the archive
# next to what it extracted, so users often have both.
TFF_ARCHIVES: Mapping[str, tuple[str, ...]] = {
    "fed_emnist.tar.bz2": ("fed_emnist_train.h5", "fed_emnist_test.h5"),
    "fed_emnist_digitsonly.tar.bz2": ("fed_emnist_digitsonly_train.h5", "fed_emnist_digitsonly_test.h5"),
    "shakespeare.tar.bz2": ("shakespeare_train.h5", "shakespeare_test.h5"),
    "stackoverflow.tar.bz2": ("stackoverflow_train.h5", "stackoverflow_held_out.h5", "stackoverflow_test.h5"),
    "stackoverflow.word_count.tar.bz2": ("stackoverflow.word_count",),
    "stackoverflow.tag_count.tar.bz2": ("stackoverflow.tag_count",),
    "fed_cifar100.tar.bz2": ("fed_cifar100_train.h5", "fed_cifar100_test.h5"),
}


def held_out_split_point(n: int, test_fraction: float) -> int:
    """Where a client's n ordered examples split when its last `test_fraction` are held out.

    round(test_fraction * n) held out, at least one and leaving at least one
    for training (LEAF's `-t sample`); a client of fewer than two keeps all.
    """
    return n - min(max(round(test_fraction * n), 1), n - 1) if n >= 2 else n


def find_file_or_archive(directories: Sequence[Path], name: str) -> Path | None:
    """`name` in `directories`, or extracted once from the TFF archive that holds it.

    The archive's SHA-256 is checked against TFF's published one before
    anything is extracted (`jaxfl.data.formats.checksums`); the members are
    extracted into the cache (`<cache root>/extracted/<key>/`), atomically.
    """
    found = find_file(directories, [name])
    if found is not None:
        return found
    archive_name = next((a for a, members in TFF_ARCHIVES.items() if name in members), None)
    archive = find_file(directories, [archive_name]) if archive_name else None
    if archive is None:
        return None
    return extract_tff_archive(archive) / name


def extract_tff_archive(archive: Path) -> Path:
    """The directory holding `archive`'s members, extracted (after its checksum) if not yet."""
    import hashlib
    import shutil
    import tarfile
    import uuid

    from jaxfl.data.cache import cache_root, file_fingerprint
    from jaxfl.data.formats.checksums import verify_published

    key = hashlib.sha256(repr(file_fingerprint([archive])).encode()).hexdigest()[:16]
    target = cache_root() / "extracted" / f"{archive.name}-{key}"
    members = TFF_ARCHIVES[archive.name]
    if all((target / m).is_file() for m in members):
        return target
    verify_published(archive, what=f"TFF {archive.name}")
    staging = target.with_name(f"{target.name}.tmp-{uuid.uuid4().hex[:8]}")
    staging.mkdir(parents=True)
    try:
        with tarfile.open(archive, "r:*") as tar:
            wanted = {
                Path(m.name).name: m for m in tar.getmembers() if m.isfile() and Path(m.name).name in members
            }
            absent = [m for m in members if m not in wanted]
            if absent:
                raise DataFileError(f"{archive}: has no {', '.join(absent)}")
            with progress_bar(len(wanted), f"extracting {archive.name}") as bar:
                for name, member in wanted.items():
                    source = tar.extractfile(member)
                    with source, open(staging / name, "wb") as out:
                        shutil.copyfileobj(source, out, 1 << 20)
                    bar.update(1)
    except (tarfile.TarError, EOFError, OSError) as error:
        shutil.rmtree(staging, ignore_errors=True)
        raise DataFileError(f"{archive}: unreadable or truncated archive ({error})") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if target.exists():
        shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target
