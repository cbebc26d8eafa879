"""Opening SQLite files read-only, with their damage found before the first query.

sqlite3 opens any file without complaint and only fails at the first query
("file is not a database"), or, for a truncated file, when a query first
touches a missing page, possibly deep into an iteration. The 100-byte header
(https://www.sqlite.org/fileformat.html, section 1.3) lets both be caught up
front: bytes 0-15 are the magic string, 16-17 the page size (1 means 65536),
28-31 the number of pages. That page count is valid when bytes 92-95 (the
"version-valid-for" number) equal bytes 24-27 (the change counter), which
every SQLite since 3.7.0 writes.

`SqliteReader` is what the FedJAX and TFF SQLite readers share.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from jaxfl.data.errors import DataFileError
from jaxfl.data.formats._common import ClosingReader, one_line

_MAGIC = b"SQLite format 3\x00"


def check_header(path: Path, kind: str) -> None:
    """Raises DataFileError if `path` is not an SQLite file or is shorter than its header says."""
    try:
        with open(path, "rb") as f:
            header = f.read(100)
    except OSError as err:
        raise DataFileError(f"{path}: cannot read ({one_line(err.strerror or err)})") from None
    if len(header) < 100 or not header.startswith(_MAGIC):
        raise DataFileError(f"{path}: not an SQLite file (expected a {kind} file)")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    if header[92:96] == header[24:28] and pages:
        expected = page_size * pages
        actual = path.stat().st_size
        if actual < expected:
            raise DataFileError(f"{path}: truncated (header says {expected} bytes, file has {actual})")


def connect_readonly(path: Path, kind: str) -> sqlite3.Connection:
    """Opens `path` read-only after `check_header`."""
    check_header(path, kind)
    uri = path.resolve().as_uri() + "?mode=ro"
    connection = None
    try:
        connection = sqlite3.connect(uri, uri=True)
        # Touch the schema now so that an unreadable file fails here.
        connection.execute("SELECT name FROM sqlite_master").fetchall()
    except sqlite3.Error as err:
        if connection is not None:
            connection.close()
        raise DataFileError(f"{path}: not a readable {kind} file ({one_line(err)})") from None
    return connection


def tables(connection: sqlite3.Connection) -> dict[str, set[str]]:
    """Table name -> its column names."""
    names = [row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    return {
        name: {row[1] for row in connection.execute(f"PRAGMA table_info('{name}')")}
        for name in names
        if "'" not in name
    }


class SqliteReader(ClosingReader):
    """A reader of one SQLite file, open read-only as `_connection`.

    Subclasses set `path` and `_connection` when they open the file, and
    `_kind`, the format's name in messages.
    """

    _kind: str
    path: Path
    _connection: sqlite3.Connection

    def _guard(self, fn):
        """Runs `fn`, turning SQLite errors (a damaged file) into DataFileError."""
        try:
            return fn()
        except sqlite3.Error as err:
            raise DataFileError(f"{self.path}: damaged {self._kind} file ({one_line(err)})") from None

    def _client_id(self, cid: Any) -> str:
        """A client id as stored (TEXT or BLOB) as str: bytes are decoded as UTF-8."""
        if isinstance(cid, str):
            return cid
        if isinstance(cid, bytes):
            try:
                return cid.decode("utf-8")
            except UnicodeDecodeError:
                pass
        raise DataFileError(f"{self.path}: client id {cid!r} is not UTF-8 text")

    def close(self) -> None:
        """Closes the database."""
        self._connection.close()
