"""TensorFlow Federated's SQLite format (TFF since 2021).

TFF hosts `emnist_all`, `shakespeare`, `stackoverflow` and `cifar100` as
`<name>.sqlite.lzma` and decompresses them once into `~/.tff/<name>.sqlite`
(`tensorflow_federated/python/simulation/datasets/download.py`). The database
(`sql_client_data.py`, `sql_client_data_utils.py`) holds:

    examples(split_name TEXT, client_id TEXT, serialized_example_proto BLOB)
        one row per example, indexed on client_id and (split_name, client_id)
    client_metadata(client_id TEXT, split_name TEXT, num_examples INTEGER)
        one row per (client, split)

Each blob is a `tf.train.Example` (see `tf_example.py`). Split names:
EMNIST `digits_only_{train,test}`, `all_{train,test}`; Shakespeare and
CIFAR-100 `train`, `test`; StackOverflow `train`, `heldout`, `test`.

Reading goes client by client with one query per split, ordered by client id,
which SQLite answers from the (split_name, client_id) index, so memory holds
one client at a time whatever the file size (StackOverflow has 135 million
training examples).
"""

from __future__ import annotations

import lzma
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jaxfl.data.errors import DataFileError
from jaxfl.data.formats._common import CHUNK_BYTES, one_line, require_file
from jaxfl.data.formats._sqlite import SqliteReader, connect_readonly, tables
from jaxfl.data.formats.tf_example import Feature, parse_example

__all__ = ["TffSqlite", "decompress_lzma"]

_KIND = "TFF SQLite"
_EXAMPLE_COLUMNS = {"split_name", "client_id", "serialized_example_proto"}
_METADATA_COLUMNS = {"client_id", "split_name", "num_examples"}
# Rows fetched per round trip while iterating: large enough to amortize the
# Python overhead, small enough to keep memory flat.
_FETCH_ROWS = 1024


def decompress_lzma(
    source: str | os.PathLike[str], target: str | os.PathLike[str], *, progress: Any = None
) -> Path:
    """Decompresses an `.lzma` (or `.xz`) file to `target`, atomically.

    The data is streamed into a temporary file next to `target`, which is
    renamed to `target` only once complete, so an interrupted run never leaves
    a partial `target` behind and an existing `target` is always complete.

    Args:
      source: the compressed file.
      target: where the decompressed copy goes (its directory is created).
      progress: an optional tqdm-like object; `update(n)` is called with the
        number of compressed bytes consumed (total: the size of `source`).

    Returns:
      `target` as a Path.

    Raises:
      DataFileError: `source` is missing, not LZMA, corrupt or truncated, or
        `target` cannot be written.
    """
    source = require_file(source)
    target = Path(target)
    tmp = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".partial")
        with open(source, "rb") as raw, os.fdopen(fd, "wb") as out:
            # FORMAT_AUTO accepts both the legacy .lzma ("alone") and the .xz container.
            with lzma.LZMAFile(raw) as stream:
                consumed = 0
                while chunk := stream.read(CHUNK_BYTES):
                    out.write(chunk)
                    if progress is not None:
                        position = raw.tell()
                        progress.update(position - consumed)
                        consumed = position
        # mkstemp creates the file private (0600); the copy is a plain data file.
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
        tmp = None
    except EOFError:
        raise DataFileError(f"{source}: truncated (the LZMA stream ends before its end marker)") from None
    except lzma.LZMAError as err:
        raise DataFileError(f"{source}: not a valid LZMA file ({one_line(err)})") from None
    except OSError as err:
        raise DataFileError(
            f"{target}: cannot write the decompressed copy of {source.name} ({one_line(err.strerror or err)})"
        ) from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return target


class TffSqlite(SqliteReader):
    """A TFF SQLite file (`emnist_all.sqlite`, `stackoverflow.sqlite`, ...), read client by client.

    The format is described in this module's docstring; it was checked
    against google-parfait/tensorflow-federated
    `tensorflow_federated/python/simulation/datasets/sql_client_data.py`.

    Use as a context manager, or call `close()`.

    Attributes:
      path: the (decompressed) SQLite file being read.
      source: the file that was given (the `.lzma` one where it was compressed).
    """

    _kind = _KIND

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        work_dir: str | os.PathLike[str] | None = None,
        progress: Any = None,
    ):
        """Opens a `.sqlite` file, or a `.sqlite.lzma` one after decompressing it once.

        Args:
          path: the `.sqlite` or `.sqlite.lzma` file.
          work_dir: where the decompressed copy of a `.lzma` file goes
            (default: next to it). An existing copy there is reused unless the
            `.lzma` file is newer.
          progress: tqdm-like object updated with compressed bytes while
            decompressing (see `decompress_lzma`).

        Raises:
          DataFileError: missing, truncated, not SQLite, or not TFF's schema.
        """
        self.source = require_file(path)
        if self.source.suffix in (".lzma", ".xz"):
            directory = Path(work_dir) if work_dir is not None else self.source.parent
            target = directory / self.source.stem
            fresh = target.is_file() and target.stat().st_mtime_ns >= self.source.stat().st_mtime_ns
            self.path = target if fresh else decompress_lzma(self.source, target, progress=progress)
        else:
            self.path = self.source
        try:
            self._connection = connect_readonly(self.path, _KIND)
        except DataFileError as err:
            if self.path == self.source:
                raise
            hint = f"decompressed from {self.source.name}; delete it to decompress again"
            raise DataFileError(f"{err} ({hint})") from None
        try:
            self._has_metadata = self._check_schema()
        except BaseException:
            self._connection.close()
            raise

    def _check_schema(self) -> bool:
        found = self._guard(lambda: tables(self._connection))
        if "examples" not in found:
            raise DataFileError(f"{self.path}: not a {_KIND} file (no table 'examples')")
        missing = _EXAMPLE_COLUMNS - found["examples"]
        if missing:
            raise DataFileError(
                f"{self.path}: not a {_KIND} file (table 'examples' lacks {', '.join(sorted(missing))})"
            )
        if "client_metadata" not in found:
            return False
        missing = _METADATA_COLUMNS - found["client_metadata"]
        if missing:
            raise DataFileError(f"{self.path}: table 'client_metadata' lacks {', '.join(sorted(missing))}")
        return True

    def _rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        return self._guard(lambda: self._connection.execute(sql, params).fetchall())

    def splits(self) -> list[str]:
        """The split names, sorted (e.g. `['all_test', 'all_train', ...]`)."""
        table = "client_metadata" if self._has_metadata else "examples"
        return [row[0] for row in self._rows(f"SELECT DISTINCT split_name FROM {table} ORDER BY split_name")]

    def _check_split(self, split: str) -> None:
        splits = self.splits()
        if split not in splits:
            raise DataFileError(f"{self.path}: no split {split!r} (splits: {', '.join(splits) or 'none'})")

    def client_counts(self, split: str) -> list[tuple[str, int]]:
        """(client id, number of examples) of every client of `split`, ordered by client id.

        Read from `client_metadata` (no example is touched), or counted from
        `examples` where a file lacks that table.
        """
        self._check_split(split)
        if self._has_metadata:
            sql = (
                "SELECT client_id, num_examples FROM client_metadata WHERE split_name = ? ORDER BY client_id"
            )
        else:
            sql = (
                "SELECT client_id, COUNT(*) FROM examples WHERE split_name = ? "
                "GROUP BY client_id ORDER BY client_id"
            )
        return [(self._client_id(cid), int(n)) for cid, n in self._rows(sql, (split,))]

    def iter_clients(self, split: str) -> Iterator[tuple[str, list[dict[str, Feature]]]]:
        """Yields (client id, its parsed examples) for every client of `split`, by client id.

        One query reads the split in (client_id, rowid) order, so each client's
        examples come in the order they were written. Where `client_metadata`
        exists, each client's number of examples is checked against it.

        Raises:
          DataFileError: the split does not exist, a blob is not an Example, the
            file is damaged, or the counts disagree with `client_metadata`.
        """
        expected = None
        if self._has_metadata:
            expected = dict(self.client_counts(split))
        else:
            self._check_split(split)
        cursor = self._guard(
            lambda: self._connection.execute(
                "SELECT client_id, serialized_example_proto FROM examples WHERE split_name = ? "
                "ORDER BY client_id",
                (split,),
            )
        )
        seen: set[str] = set()
        try:
            current: str | None = None
            examples: list[dict[str, Feature]] = []
            while rows := self._guard(lambda: cursor.fetchmany(_FETCH_ROWS)):
                for raw_cid, blob in rows:
                    cid = self._client_id(raw_cid)
                    if cid != current:
                        if current is not None:
                            self._check_count(split, current, len(examples), expected)
                            seen.add(current)
                            yield current, examples
                        current, examples = cid, []
                    where = f"{self.path}: split {split!r} client {cid!r} example {len(examples)}"
                    examples.append(parse_example(blob, where=where))
            if current is not None:
                self._check_count(split, current, len(examples), expected)
                seen.add(current)
                yield current, examples
        finally:
            cursor.close()
        if expected is not None and len(seen) != len(expected):
            absent = sorted(set(expected) - seen)
            raise DataFileError(
                f"{self.path}: split {split!r}: client_metadata lists {len(expected)} clients "
                f"but only {len(seen)} have examples (e.g. {absent[0]!r} has none)"
            )

    def _check_count(self, split: str, cid: str, count: int, expected: dict[str, int] | None) -> None:
        if expected is None:
            return
        if cid not in expected:
            raise DataFileError(
                f"{self.path}: split {split!r}: client {cid!r} has examples but no client_metadata row"
            )
        if expected[cid] != count:
            raise DataFileError(
                f"{self.path}: split {split!r}: client {cid!r} has {count} examples, "
                f"client_metadata says {expected[cid]}"
            )
