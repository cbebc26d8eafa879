"""`TffHdf5`: TFF's legacy HDF5 files against an independent h5py writer."""

import numpy as np
import pytest
from data.writers import (
    check_error,
    cifar100_like,
    emnist_like,
    shakespeare_like,
    stackoverflow_like,
    truncated_copy,
    write_tff_hdf5,
    write_tff_sqlite,
)

h5py = pytest.importorskip("h5py")

from jaxfl.data.errors import DataFileError, MissingDataError  # noqa: E402
from jaxfl.data.formats import TffHdf5  # noqa: E402


def assert_clients_equal(got, clients):
    assert [cid for cid, _ in got] == sorted(clients)
    for cid, arrays in got:
        want = clients[cid]
        assert arrays.keys() == want.keys()
        for name, values in want.items():
            assert arrays[name].shape == values.shape, name
            assert arrays[name].dtype == values.dtype, name
            if values.dtype == object:
                assert all(isinstance(v, bytes) for v in arrays[name])
                assert arrays[name].tolist() == values.tolist()
            else:
                np.testing.assert_array_equal(arrays[name], values)


@pytest.mark.parametrize(
    "make",
    [emnist_like, shakespeare_like, stackoverflow_like, cifar100_like],
    ids=["emnist", "shakespeare", "stackoverflow", "cifar100"],
)
def test_round_trip(tmp_path, make):
    clients = make(np.random.default_rng(0), [3, 1, 2])
    path = write_tff_hdf5(tmp_path / "data_train.h5", clients)
    with TffHdf5(path) as data:
        assert data.features() == sorted(next(iter(clients.values())))
        assert data.client_ids() == sorted(clients)
        counts = [(cid, len(next(iter(clients[cid].values())))) for cid in sorted(clients)]
        assert data.client_counts() == counts
        assert_clients_equal(list(data.iter_clients()), clients)


def test_labels_with_a_trailing_unit_dimension_become_1d(tmp_path):
    clients = emnist_like(np.random.default_rng(1), [2, 3])
    path = write_tff_hdf5(tmp_path / "fed_emnist_test.h5", clients, label_unit_dim=True)
    with h5py.File(path) as f:
        assert f["examples"][next(iter(clients))]["label"].shape == (2, 1)
    with TffHdf5(path) as data:
        assert_clients_equal(list(data.iter_clients()), clients)


def test_one_client_with_one_example_and_empty_unicode_snippets(tmp_path):
    clients = {
        "THE_TEMPEST_ARIEL": {"snippets": np.array(["Où çà? ’tis".encode()], dtype=object)},
        "THE_TEMPEST_X": {"snippets": np.array([b""], dtype=object)},
    }
    path = write_tff_hdf5(tmp_path / "shakespeare_test.h5", clients)
    with TffHdf5(path) as data:
        assert data.client_counts() == [("THE_TEMPEST_ARIEL", 1), ("THE_TEMPEST_X", 1)]
        assert_clients_equal(list(data.iter_clients()), clients)


def test_fixed_length_strings_come_back_as_bytes_objects(tmp_path):
    path = tmp_path / "fixed.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("examples/c1/type", data=np.array([b"question", b"answer"]))
    with TffHdf5(path) as data:
        ((_, arrays),) = data.iter_clients()
    assert arrays["type"].dtype == object and arrays["type"].tolist() == [b"question", b"answer"]


def test_features_of_different_lengths(tmp_path):
    clients = {"c": {"pixels": np.zeros((3, 28, 28), np.float32), "label": np.zeros(2, np.int32)}}
    path = write_tff_hdf5(tmp_path / "fed_emnist_train.h5", clients)
    with TffHdf5(path) as data, pytest.raises(DataFileError) as excinfo:
        list(data.iter_clients())
    check_error(excinfo, path, "different lengths")


def test_clients_with_different_features(tmp_path):
    clients = {"a": {"label": np.zeros(2, np.int32)}, "b": {"y": np.zeros(2, np.int32)}}
    path = write_tff_hdf5(tmp_path / "odd.h5", clients)
    with TffHdf5(path) as data, pytest.raises(DataFileError) as excinfo:
        list(data.iter_clients())
    check_error(excinfo, path, "client 'b' has features ['y']")


def test_missing_file(tmp_path):
    with pytest.raises(MissingDataError) as excinfo:
        TffHdf5(tmp_path / "fed_emnist_train.h5")
    check_error(excinfo, "fed_emnist_train.h5", "no such file")


def test_truncated_file(tmp_path):
    path = write_tff_hdf5(
        tmp_path / "fed_cifar100_train.h5", cifar100_like(np.random.default_rng(2), [20, 20])
    )
    cut = truncated_copy(path)
    with pytest.raises(DataFileError) as excinfo:
        TffHdf5(cut)
    check_error(excinfo, cut, "truncated")


def test_sqlite_file_is_not_hdf5(tmp_path):
    path = write_tff_sqlite(tmp_path / "fed_emnist_train.h5", {"train": {"a": [b""]}})
    with pytest.raises(DataFileError) as excinfo:
        TffHdf5(path)
    check_error(excinfo, path, "not an HDF5 file")


def test_hdf5_without_examples_group(tmp_path):
    path = tmp_path / "other.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=np.arange(3))
    with pytest.raises(DataFileError) as excinfo:
        TffHdf5(path)
    check_error(excinfo, path, "no group 'examples'")
