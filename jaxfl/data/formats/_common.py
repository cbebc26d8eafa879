"""Helpers shared by the format readers: file checks, one-line messages, the context-manager protocol."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Self

from jaxfl.data.errors import DataFileError, MissingDataError

# Reads of raw files and of decompression streams go in chunks of this size,
# so that memory stays flat whatever the file size.
CHUNK_BYTES = 1 << 20


def one_line(text: object) -> str:
    """`str(text)` folded onto one line (library messages sometimes span several)."""
    return " ".join(str(text).split())


def require_file(path: str | os.PathLike[str]) -> Path:
    """`path` as a Path, or MissingDataError / DataFileError if it is not a readable file."""
    path = Path(path)
    if not path.exists():
        raise MissingDataError(f"{path}: no such file")
    if path.is_dir():
        raise DataFileError(f"{path}: is a directory, expected a file")
    if not os.access(path, os.R_OK):
        raise DataFileError(f"{path}: not readable (permission denied)")
    return path


def require_dir(path: str | os.PathLike[str]) -> Path:
    """`path` as a Path, or MissingDataError / DataFileError if it is not a directory."""
    path = Path(path)
    if not path.exists():
        raise MissingDataError(f"{path}: no such directory")
    if not path.is_dir():
        raise DataFileError(f"{path}: is a file, expected a directory")
    return path


def missing_dependency(path: Path, what: str, package: str) -> DataFileError:
    """The error for an optional package that reading `path` needs."""
    return DataFileError(
        f"{path}: reading {what} needs the Python package '{package}' (pip install {package})"
    )


class ClosingReader:
    """A reader that holds a file open: `with Reader(...) as r:` calls `r.close()` on leaving."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
