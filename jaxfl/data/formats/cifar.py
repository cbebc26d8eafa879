"""CIFAR-10 and CIFAR-100 as distributed by their authors.

Python version (`cifar-10-python.tar.gz` -> `cifar-10-batches-py/` with
`data_batch_1..5`, `test_batch`, `batches.meta`; `cifar-100-python.tar.gz` ->
`cifar-100-python/` with `train`, `test`, `meta`): each file is a Python 2
pickle of a dict with `b"data"`, a uint8 array [N, 3072], and the labels
(`b"labels"` for CIFAR-10, `b"fine_labels"` and `b"coarse_labels"` for
CIFAR-100), plus file names and a batch label. Keras
(`keras/src/datasets/cifar.py`) and torchvision read them the same way.

Binary version (`cifar-10-binary.tar.gz` -> `cifar-10-batches-bin/` with
`data_batch_{1..5}.bin`, `test_batch.bin`, `batches.meta.txt`, the files
tensorflow-datasets prepares CIFAR-10 from; `cifar-100-binary.tar.gz` ->
`cifar-100-binary/` with `train.bin`, `test.bin`, `{fine,coarse}_label_names.txt`):
fixed records of 1 label byte (CIFAR-100: coarse then fine label) and 3,072
pixel bytes.

Both store each image as three 32x32 planes, R then G then B; this module
returns uint8 [N, 32, 32, 3] (HWC). Archives are read in one pass without
extracting anything to disk.

Unpickling runs code named by the file, so a pickle from an untrusted source
could execute anything. The real batches need exactly these globals to
rebuild their `data` array: `numpy.core.multiarray._reconstruct` (written as
`numpy._core.multiarray._reconstruct` by NumPy 2), `numpy.ndarray` and
`numpy.dtype`. Copies re-pickled by Python 3 may also use
`_codecs.encode(text, "latin1")` for bytes (protocol 2) or
`numpy._core.numeric._frombuffer` (protocol 5). The unpickler here resolves
only those names, to the objects directly (`_codecs.encode` only with the
latin-1 codec), and refuses every other global.
"""

from __future__ import annotations

import codecs
import dataclasses
import io
import os
import pickle
import tarfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from jaxfl.data.errors import DataFileError, MissingDataError
from jaxfl.data.formats._common import one_line

__all__ = ["CifarData", "read_cifar"]

_PIXELS = 3 * 32 * 32


def _latin1_encode(text: str, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    # Python 3 pickles bytes at protocol 2 as _codecs.encode(text, "latin1").
    if encoding not in ("latin1", "latin-1", "iso-8859-1"):
        raise pickle.UnpicklingError(f"refused _codecs.encode with encoding {encoding!r}")
    return codecs.encode(text, encoding, errors)


# NumPy's own reconstructors, taken from what it pickles with, whatever module NumPy keeps them in
# (importing numpy.core by name warns under NumPy 2).
_RECONSTRUCT = np.zeros(1).__reduce__()[0]
_FROMBUFFER = np.zeros(1).__reduce_ex__(5)[0]
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy.core.numeric", "_frombuffer"): _FROMBUFFER,
    ("numpy._core.numeric", "_frombuffer"): _FROMBUFFER,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _latin1_encode,
}


class _RestrictedUnpickler(pickle.Unpickler):
    """Resolves only the globals a CIFAR batch needs (see the module docstring)."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refused to load global {module}.{name}") from None


def _unpickle(where: str, blob: bytes) -> dict[Any, Any]:
    try:
        # encoding="bytes": Python 2 str (keys, file names, array data) comes back as bytes.
        value = _RestrictedUnpickler(io.BytesIO(blob), encoding="bytes").load()
    except pickle.UnpicklingError as err:
        message = one_line(err)
        if "refused" in message:
            raise DataFileError(
                f"{where}: {message} (CIFAR batches hold only numpy arrays and lists)"
            ) from None
        raise DataFileError(f"{where}: not a CIFAR pickle or truncated ({message})") from None
    except EOFError:
        raise DataFileError(f"{where}: truncated (the pickle ends early)") from None
    except Exception as err:  # a corrupt pickle can fail in many ways
        raise DataFileError(f"{where}: not a CIFAR pickle ({type(err).__name__}: {one_line(err)})") from None
    if not isinstance(value, dict):
        raise DataFileError(f"{where}: not a CIFAR pickle (holds a {type(value).__name__}, expected a dict)")
    return value


def _get(where: str, batch: dict[Any, Any], key: str) -> Any:
    for candidate in (key.encode(), key):
        if candidate in batch:
            return batch[candidate]
    raise DataFileError(f"{where}: not a CIFAR batch (no key {key!r})")


def _labels(where: str, values: Any, rows: int, classes: int, key: str) -> np.ndarray:
    try:
        labels = np.asarray(values)
    except Exception:  # ragged or odd objects
        labels = np.asarray([], dtype=object)
    if labels.ndim != 1 or labels.dtype.kind not in "iu" or len(labels) != rows:
        raise DataFileError(f"{where}: {key!r} is not {rows} integer labels")
    labels = labels.astype(np.int64)
    if rows and (labels.min() < 0 or labels.max() >= classes):
        raise DataFileError(f"{where}: {key!r} has labels outside 0..{classes - 1}")
    return labels


def _hwc(pixels: np.ndarray) -> np.ndarray:
    """[N, 3072] in R, G, B planes -> contiguous uint8 [N, 32, 32, 3]."""
    return np.ascontiguousarray(pixels.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))


def _pickle_batch(where: str, blob: bytes, label_keys: tuple[str, ...], classes: tuple[int, ...]):
    batch = _unpickle(where, blob)
    data = _get(where, batch, "data")
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.shape[1:] == (_PIXELS,)):
        got = f"{type(data).__name__} {getattr(data, 'dtype', '')} {getattr(data, 'shape', '')}"
        raise DataFileError(f"{where}: 'data' is not a uint8 array [N, {_PIXELS}] (got {got})")
    labels = [
        _labels(where, _get(where, batch, key), len(data), n, key)
        for key, n in zip(label_keys, classes, strict=True)
    ]
    return data, labels


def _binary_batch(where: str, blob: bytes, classes: tuple[int, ...]):
    record = len(classes) + _PIXELS
    if not blob or len(blob) % record:
        raise DataFileError(
            f"{where}: truncated or not a CIFAR binary batch ({len(blob)} bytes is not a whole number of "
            f"{record}-byte records)"
        )
    rows = np.frombuffer(blob, np.uint8).reshape(-1, record)
    labels = []
    for i, n in enumerate(classes):
        column = rows[:, i].astype(np.int64)
        if column.max() >= n:
            raise DataFileError(f"{where}: label byte {i} has values outside 0..{n - 1}")
        labels.append(column)
    return rows[:, len(classes) :], labels


@dataclasses.dataclass(frozen=True)
class _Layout:
    name: str  # "cifar10" or "cifar100"
    binary: bool
    train: tuple[str, ...]
    test: tuple[str, ...]
    label_keys: tuple[str, ...]  # pickle keys, or the order of label bytes
    classes: tuple[int, ...]
    meta: tuple[str, ...]  # files holding label names


_LAYOUTS = (
    _Layout(
        "cifar10",
        False,
        tuple(f"data_batch_{i}" for i in range(1, 6)),
        ("test_batch",),
        ("labels",),
        (10,),
        ("batches.meta",),
    ),
    _Layout("cifar100", False, ("train",), ("test",), ("fine_labels", "coarse_labels"), (100, 20), ("meta",)),
    _Layout(
        "cifar10",
        True,
        tuple(f"data_batch_{i}.bin" for i in range(1, 6)),
        ("test_batch.bin",),
        ("labels",),
        (10,),
        ("batches.meta.txt",),
    ),
    # CIFAR-100 binary records start with the coarse label, then the fine one.
    _Layout(
        "cifar100",
        True,
        ("train.bin",),
        ("test.bin",),
        ("coarse_labels", "fine_labels"),
        (20, 100),
        ("fine_label_names.txt", "coarse_label_names.txt"),
    ),
)
_DIR_NAMES = ("cifar-10-batches-py", "cifar-100-python", "cifar-10-batches-bin", "cifar-100-binary")
_MEMBER_NAMES = {name for layout in _LAYOUTS for name in (*layout.train, *layout.test, *layout.meta)}


def _detect(names: set[str]) -> _Layout | None:
    # The first training file's name identifies the layout (the four names differ).
    for layout in _LAYOUTS:
        if layout.train[0] in names:
            return layout
    return None


@dataclasses.dataclass(frozen=True)
class CifarData:
    """CIFAR-10 or CIFAR-100 train and test sets.

    Attributes:
      name: "cifar10" or "cifar100".
      label: which labels `train_labels`/`test_labels` hold: "fine" (CIFAR-10's
        only labels; CIFAR-100's 100 classes) or "coarse" (CIFAR-100's 20).
      num_classes: 10, 100 or 20, after `label`.
      train_images: uint8 [50000, 32, 32, 3] (HWC).
      train_labels: int64 [50000].
      test_images: uint8 [10000, 32, 32, 3].
      test_labels: int64 [10000].
      label_names: the classes' names, or None where the meta file is absent.
      train_coarse_labels: CIFAR-100's coarse labels (0..19) whatever `label`, else None.
      test_coarse_labels: likewise for test.
      coarse_label_names: CIFAR-100's coarse class names, else None.
    """

    name: str
    label: str
    num_classes: int
    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    label_names: list[str] | None
    train_coarse_labels: np.ndarray | None = None
    test_coarse_labels: np.ndarray | None = None
    coarse_label_names: list[str] | None = None


def _names_from_pickle(where: str, blob: bytes, key: str) -> list[str]:
    meta = _unpickle(where, blob)
    names = _get(where, meta, key)
    if not isinstance(names, list) or not all(isinstance(n, (bytes, str)) for n in names):
        raise DataFileError(f"{where}: {key!r} is not a list of names")
    return [n.decode("utf-8", "replace") if isinstance(n, bytes) else n for n in names]


def _names_from_text(where: str, blob: bytes) -> list[str]:
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError:
        raise DataFileError(f"{where}: label names are not UTF-8 text") from None
    return [line.strip() for line in text.splitlines() if line.strip()]


def _assemble(layout: _Layout, read, describe, label: str) -> CifarData:
    """Builds CifarData.

    `read(name)` returns a file's bytes or None; `describe(name)` is its name in messages.
    """
    if label == "coarse" and layout.name == "cifar10":
        raise DataFileError(f"{describe(layout.train[0])}: CIFAR-10 has no coarse labels (label='coarse')")
    parts = {}
    for split, files in (("train", layout.train), ("test", layout.test)):
        images, labels = [], [[] for _ in layout.label_keys]
        for name in files:
            blob = read(name)
            if blob is None:
                raise MissingDataError(f"{describe(name)}: missing (CIFAR {split} data)")
            if layout.binary:
                pixels, batch_labels = _binary_batch(describe(name), blob, layout.classes)
            else:
                pixels, batch_labels = _pickle_batch(describe(name), blob, layout.label_keys, layout.classes)
            images.append(pixels)
            for column, values in zip(labels, batch_labels, strict=True):
                column.append(values)
        parts[split] = (
            _hwc(np.concatenate(images)),
            {key: np.concatenate(v) for key, v in zip(layout.label_keys, labels, strict=True)},
        )
    names: dict[str, list[str] | None] = {"fine": None, "coarse": None}
    if layout.binary:
        wanted = (
            (("fine", layout.meta[0]), ("coarse", layout.meta[1]))
            if layout.name == "cifar100"
            else (("fine", layout.meta[0]),)
        )
        for kind, file in wanted:
            blob = read(file)
            if blob is not None:
                names[kind] = _names_from_text(describe(file), blob)
    else:
        blob = read(layout.meta[0])
        if blob is not None:
            if layout.name == "cifar10":
                names["fine"] = _names_from_pickle(describe(layout.meta[0]), blob, "label_names")
            else:
                names["fine"] = _names_from_pickle(describe(layout.meta[0]), blob, "fine_label_names")
                names["coarse"] = _names_from_pickle(describe(layout.meta[0]), blob, "coarse_label_names")
    key = "labels" if layout.name == "cifar10" else f"{label}_labels"
    (train_x, train_y), (test_x, test_y) = parts["train"], parts["test"]
    return CifarData(
        name=layout.name,
        label=label,
        num_classes=layout.classes[layout.label_keys.index(key)],
        train_images=train_x,
        train_labels=train_y[key],
        test_images=test_x,
        test_labels=test_y[key],
        label_names=names[label],
        train_coarse_labels=train_y.get("coarse_labels"),
        test_coarse_labels=test_y.get("coarse_labels"),
        coarse_label_names=names["coarse"],
    )


def _read_directory(directory: Path, label: str) -> CifarData:
    names = {p.name for p in directory.iterdir() if p.is_file()}
    layout = _detect(names)
    if layout is None:
        for sub in _DIR_NAMES:
            if (directory / sub).is_dir():
                return _read_directory(directory / sub, label)
        raise MissingDataError(
            f"{directory}: no CIFAR data (expected data_batch_1 / train / data_batch_1.bin / train.bin, "
            f"or a subdirectory {', '.join(_DIR_NAMES)})"
        )

    def read(name: str) -> bytes | None:
        path = directory / name
        if not path.is_file():
            return None
        try:
            return path.read_bytes()
        except OSError as err:
            raise DataFileError(f"{path}: cannot read ({one_line(err.strerror or err)})") from None

    return _assemble(layout, read, lambda name: str(directory / name), label)


def _read_archive(path: Path, label: str) -> CifarData:
    members: dict[str, dict[str, bytes]] = {}  # parent directory -> file name -> bytes
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar:
                parent, _, base = member.name.rpartition("/")
                if member.isfile() and base in _MEMBER_NAMES:
                    stream = tar.extractfile(member)
                    if stream is not None:
                        members.setdefault(parent, {})[base] = stream.read()
    except (tarfile.ReadError, tarfile.CompressionError) as err:
        reason = one_line(err)
        if "could not be opened successfully" in reason:
            reason = "neither gzip, bzip2, xz nor plain tar"
        raise DataFileError(f"{path}: not a readable tar archive ({reason})") from None
    except (EOFError, zlib.error) as err:
        reason = one_line(err) or type(err).__name__
        raise DataFileError(f"{path}: truncated or corrupt archive ({reason})") from None
    except OSError as err:
        raise DataFileError(f"{path}: cannot read ({one_line(err.strerror or err)})") from None
    for parent, files in sorted(members.items()):
        layout = _detect(set(files))
        if layout is not None:
            prefix = f"{parent}/" if parent else ""

            def describe(name: str, prefix: str = prefix) -> str:
                return f"{path} member {prefix}{name}"

            return _assemble(layout, files.get, describe, label)
    raise DataFileError(f"{path}: no CIFAR batches inside (expected {', '.join(_DIR_NAMES)})")


def read_cifar(path: str | os.PathLike[str], *, label: str = "fine") -> CifarData:
    """Reads CIFAR-10 or CIFAR-100 from the authors' python or binary version.

    The formats are described in this module's docstring; they were
    checked against the Keras loader (keras-team/keras
    `keras/src/datasets/cifar10.py`, `cifar100.py`, `cifar.py`) and the
    tensorflow-datasets CIFAR builder (`image_classification/cifar.py`,
    binary version).

    Pickles are loaded with a restricted unpickler that resolves only the
    numpy globals the real batches use (see the module docstring), so a
    tampered pickle cannot run code.

    Args:
      path: a batches directory (`cifar-10-batches-py`, `cifar-100-python`,
        `cifar-10-batches-bin`, `cifar-100-binary`), a directory containing
        one, or an archive (`cifar-10-python.tar.gz`, `cifar-100-python.tar.gz`,
        `cifar-10-binary.tar.gz`, `cifar-100-binary.tar.gz`), read without
        extracting.
      label: "fine" (default) or, for CIFAR-100 only, "coarse": which labels
        fill `train_labels` / `test_labels`.

    Returns:
      CifarData with uint8 [N, 32, 32, 3] images and int64 labels.

    Raises:
      MissingDataError: the path or a batch file is missing.
      DataFileError: a file is truncated, not CIFAR, or holds a refused pickle
        global; or `label` is "coarse" for CIFAR-10.
      ValueError: `label` is neither "fine" nor "coarse".
    """
    if label not in ("fine", "coarse"):
        raise ValueError(f"label must be 'fine' or 'coarse', got {label!r}")
    path = Path(path)
    if path.is_dir():
        return _read_directory(path, label)
    if path.is_file():
        return _read_archive(path, label)
    raise MissingDataError(f"{path}: no such file or directory (expected CIFAR-10/100 data)")
