"""`synthetic --data-dir`: FedProx's / LEAF's published Synthetic JSON, read as published."""

from __future__ import annotations

import numpy as np
import pytest
from data.datasets.checks import check_message, clients_of
from data.writers import write_leaf_dir

from jaxfl.data import load_dataset
from jaxfl.data.errors import DataFileError


def _users(rng, sizes, dim=6, classes=4):
    return [
        (
            f"f_{i:05d}",
            rng.normal(size=(n, dim)).round(4).tolist(),
            rng.integers(0, classes, n).tolist(),
            None,
        )
        for i, n in enumerate(sizes)
    ]


def _fedprox_dir(tmp_path, rng):
    train, test = _users(rng, [5, 9, 3]), _users(rng, [1, 2, 1])
    root = tmp_path / "synthetic_1_1" / "data"
    write_leaf_dir(root / "train", train, per_file=10, prefix="mytrain")
    write_leaf_dir(root / "test", test, per_file=10, prefix="mytest")
    return tmp_path / "synthetic_1_1", train, test


@pytest.mark.parametrize("name", ["synthetic", "synthetic-iid"])
def test_published_json_is_read_user_by_user(tmp_path, name):
    root, train, test = _fedprox_dir(tmp_path, np.random.default_rng(0))
    data = load_dataset(name, data_dir=str(root))
    assert data.input_shape == (6,) and data.num_classes >= 2
    for population, users in (("train", train), ("test", test)):
        got = clients_of(getattr(data, population))
        assert list(got) == [u for u, _, _, _ in users]
        for user, x, y, _ in users:
            np.testing.assert_array_equal(got[user]["x"], np.asarray(x, np.float32))
            np.testing.assert_array_equal(got[user]["y"], np.asarray(y, np.int32))


def test_files_take_no_generator_options_and_missing_files_are_refused(tmp_path):
    root, _, _ = _fedprox_dir(tmp_path, np.random.default_rng(1))
    with pytest.raises(ValueError, match="takes no options .*num_clients"):
        load_dataset("synthetic", data_dir=str(root), num_clients=5)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataFileError) as excinfo:
        load_dataset("synthetic", data_dir=str(empty))
    check_message(excinfo, "synthetic", "LEAF")
