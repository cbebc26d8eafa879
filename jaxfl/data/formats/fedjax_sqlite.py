"""FedJAX's SQLite format (data-sources.md 2(b)).

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
"""

from __future__ import annotations

import os
import sqlite3
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from jaxfl.data.errors import DataFileError
from jaxfl.data.formats._common import missing_dependency, one_line, require_file
from jaxfl.data.formats._sqlite import connect_readonly, tables

__all__ = ["FedjaxSqlite", "decode_fedjax_blob"]

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

    The format is described in data-sources.md 2(b); it was checked against
    google/fedjax `fedjax/core/serialization.py` and `sqlite_federated_data.py`.

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


class FedjaxSqlite:
    """A FedJAX SQLite file (e.g. `federated_emnist_train.sqlite`), read client by client.

    The format is described in data-sources.md 2(b) and in this module's
    docstring; it was checked against google/fedjax
    `fedjax/core/sqlite_federated_data.py` @ c57ee1970fcd.

    Use as a context manager, or call `close()`.

    Attributes:
      path: the file.
    """

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

    def _guard(self, fn):
        try:
            return fn()
        except sqlite3.Error as err:
            raise DataFileError(f"{self.path}: damaged {_KIND} file ({one_line(err)})") from None

    def close(self) -> None:
        """Closes the database."""
        self._connection.close()

    def __enter__(self) -> FedjaxSqlite:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _client_id(self, cid: Any) -> str:
        if isinstance(cid, str):
            return cid
        if isinstance(cid, bytes):
            try:
                return cid.decode("utf-8")
            except UnicodeDecodeError:
                pass
        raise DataFileError(f"{self.path}: client id {cid!r} is not UTF-8 text")

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
