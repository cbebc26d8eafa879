"""`FedjaxSqlite`: FedJAX's SQLite files (zlib + msgpack) against an independent writer."""

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
