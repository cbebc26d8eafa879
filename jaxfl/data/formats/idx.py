"""IDX files: MNIST, Fashion-MNIST and EMNIST (`gzip.zip`), raw or gzipped.

The format (LeCun's MNIST page; also what tensorflow-datasets'
`image_classification/mnist.py` parses): a 4-byte big-endian magic
`0x00 0x00 <type> <ndim>`, then `ndim` big-endian uint32 dimensions, then the
values in C order, big-endian. Type codes: 0x08 uint8, 0x09 int8, 0x0B int16,
0x0C int32, 0x0D float32, 0x0E float64. Images are `0x00000803` (uint8,
[N, rows, cols]) and labels `0x00000801` (uint8, [N]). EMNIST's images are
stored transposed (each image column-major); this reader returns what the file
holds and leaves the transpose to the caller.

Whether a file is gzipped is decided by its first two bytes (1f 8b), not its name.
"""

from __future__ import annotations

import gzip
import math
import os
import zlib
from pathlib import Path

import numpy as np

from jaxfl.data.errors import DataFileError
from jaxfl.data.formats._common import CHUNK_BYTES, one_line, require_file

__all__ = ["read_idx"]

_TYPES = {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
# A header claiming more than this is corrupt, not a dataset (EMNIST's largest
# file is under 600 MB); refusing early avoids a huge allocation.
_MAX_BYTES = 1 << 34


def _what(type_code: int, ndim: int) -> str:
    return {(0x08, 3): "pixels", (0x08, 1): "labels"}.get((type_code, ndim), "data")


def _read_exactly(stream, out: np.ndarray) -> int:
    """Fills `out` (uint8) from `stream`; returns how many bytes arrived (less at end of stream)."""
    view = memoryview(out).cast("B")
    done = 0
    while done < len(view):
        n = stream.readinto(view[done : done + CHUNK_BYTES])
        if not n:
            break
        done += n
    return done


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Reads an IDX file (gzipped or raw) into an array of its dimensions, in native byte order.

    The format is described in this module's docstring; it was checked
    against tensorflow-datasets `image_classification/mnist.py` (which reads
    the same files).

    Args:
      path: e.g. `train-images-idx3-ubyte.gz`, `t10k-labels-idx1-ubyte`.

    Returns:
      A writeable array, e.g. uint8 [60000, 28, 28] or uint8 [60000].

    Raises:
      DataFileError: missing, not IDX (bad magic or type), truncated (the
        message says how many bytes of data were expected and found), longer
        than its header says, or a corrupt gzip stream.
    """
    path = require_file(path)
    try:
        with open(path, "rb") as raw:
            gzipped = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            stream = gzip.GzipFile(fileobj=raw, mode="rb") if gzipped else raw
            with stream:
                return _read(path, stream, gzipped)
    except EOFError:
        raise DataFileError(f"{path}: truncated (the gzip stream ends early)") from None
    except (gzip.BadGzipFile, zlib.error) as err:
        raise DataFileError(f"{path}: corrupt gzip data ({one_line(err)})") from None
    except OSError as err:
        raise DataFileError(f"{path}: cannot read ({one_line(err.strerror or err)})") from None


def _read(path: Path, stream, gzipped: bool) -> np.ndarray:
    magic = stream.read(4)
    if len(magic) < 4 or magic[:2] != b"\x00\x00" or magic[2] not in _TYPES or magic[3] == 0:
        kind = "gzip data" if gzipped else "file"
        found = magic.hex() or "missing"
        raise DataFileError(f"{path}: not an IDX {kind} (magic {found}, expected 0000080N)")
    type_code, ndim = magic[2], magic[3]
    header = stream.read(4 * ndim)
    if len(header) < 4 * ndim:
        raise DataFileError(f"{path}: truncated (IDX header of {ndim} dimensions ends early)")
    dims = [int.from_bytes(header[4 * i : 4 * i + 4], "big") for i in range(ndim)]
    dtype = np.dtype(_TYPES[type_code])
    expected = math.prod(dims) * dtype.itemsize
    what = _what(type_code, ndim)
    if expected > _MAX_BYTES:
        raise DataFileError(f"{path}: implausible IDX dimensions {dims} ({expected} bytes of {what})")
    if not gzipped:
        actual = path.stat().st_size - 4 - 4 * ndim
        if actual != expected:
            problem = "truncated" if actual < expected else "longer than its header says"
            raise DataFileError(f"{path}: {problem} (expected {expected} bytes of {what}, got {actual})")
    buffer = np.empty(expected, np.uint8)
    got = _read_exactly(stream, buffer)
    if got < expected:
        raise DataFileError(f"{path}: truncated (expected {expected} bytes of {what}, got {got})")
    if stream.read(1):
        raise DataFileError(f"{path}: longer than its header says (more than {expected} bytes of {what})")
    values = buffer.view(dtype).reshape(dims)
    return values if dtype.byteorder in "=|" else values.astype(dtype.newbyteorder("="))
