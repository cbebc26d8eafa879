"""LEAF JSON directories: layouts, streaming iteration, checks, against an independent writer."""

import json

import numpy as np
import pytest
from data.writers import (
    check_error,
    femnist_users,
    sent140_users,
    shakespeare_users,
    truncated_copy,
    write_leaf_dir,
)

from jaxfl.data.errors import DataFileError, MissingDataError
from jaxfl.data.formats import (
    check_same_users,
    compare_users,
    find_leaf_splits,
    iter_leaf_users,
    leaf_json_files,
    leaf_users,
)


def assert_users_equal(got, users):
    assert [u for u, _, _ in got] == [u for u, _, _, _ in users]
    for (user, data, hierarchy), (_, x, y, h) in zip(got, users, strict=True):
        assert data == {"x": x, "y": y}, user
        assert hierarchy == h


@pytest.mark.parametrize(
    "make, hierarchies",
    [(femnist_users, False), (sent140_users, False), (shakespeare_users, True)],
    ids=["femnist", "sent140", "shakespeare"],
)
def test_round_trip_over_several_files(tmp_path, make, hierarchies):
    users = make(np.random.default_rng(0), [3, 1, 2, 4, 1])
    files = write_leaf_dir(tmp_path / "train", users, per_file=2, hierarchies=hierarchies)
    assert len(files) == 3
    assert leaf_json_files(tmp_path / "train") == files
    assert_users_equal(list(iter_leaf_users(tmp_path / "train")), users)


def test_files_are_read_in_sorted_name_order(tmp_path):
    users = femnist_users(np.random.default_rng(1), [1, 1, 1])
    write_leaf_dir(tmp_path, users[:1], per_file=1, prefix="b")
    write_leaf_dir(tmp_path, users[1:], per_file=2, prefix="a")
    (tmp_path / "notes.txt").write_text("not json")
    assert leaf_users(tmp_path) == [users[1][0], users[2][0], users[0][0]]


def test_one_user_with_one_sample(tmp_path):
    users = [("only", [[0.5, 1.0]], [3], None)]
    write_leaf_dir(tmp_path, users, per_file=100)
    assert_users_equal(list(iter_leaf_users(tmp_path)), users)


def test_leaf_by_sample_quirks_are_accepted(tmp_path):
    # split_data.py keeps dropped users in user_data (empty) and copies hierarchies unfiltered.
    data = {
        "users": ["A_KING"],
        "hierarchies": ["A", "B"],
        "num_samples": [1],
        "user_data": {"A_KING": {"x": ["x" * 80], "y": ["y"]}, "B_FOOL": {"x": [], "y": []}},
    }
    (tmp_path / "all_data_0_train_9.json").write_text(json.dumps(data))
    assert list(iter_leaf_users(tmp_path)) == [("A_KING", {"x": ["x" * 80], "y": ["y"]}, None)]


def test_numeric_user_ids_are_strings(tmp_path):
    # LEAF synthetic writes users "0", "1", ...; a file with bare numbers still finds them.
    data = {"users": [0], "num_samples": [1], "user_data": {"0": {"x": [[1.0]], "y": [1]}}}
    (tmp_path / "mytrain.json").write_text(json.dumps(data))
    assert leaf_users(tmp_path) == ["0"]


@pytest.mark.parametrize(
    "layout, expected",
    [
        (["train/a.json", "test/a.json"], {"train": "train", "test": "test"}),
        (["data/train/mytrain.json", "data/test/mytest.json"], {"train": "data/train", "test": "data/test"}),
        (["data/all_data/all_data_0.json"], {"all": "data/all_data"}),
        (
            ["all_data/all_data_0.json", "train/x.json", "test/x.json"],
            {"train": "train", "test": "test", "all": "all_data"},
        ),
        (["x.json"], {"all": "."}),
    ],
    ids=["train-test", "fedprox", "all-data", "both", "flat"],
)
def test_find_leaf_splits(tmp_path, layout, expected):
    for name in layout:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("{}")
    # pathlib drops ".", so tmp_path / "." is tmp_path.
    assert find_leaf_splits(tmp_path) == {k: tmp_path / v for k, v in expected.items()}


def test_find_leaf_splits_lists_where_it_looked(tmp_path):
    (tmp_path / "train").mkdir()
    with pytest.raises(MissingDataError) as excinfo:
        find_leaf_splits(tmp_path)
    check_error(excinfo, tmp_path, "train", "all_data")


def test_train_and_test_must_list_the_same_users(tmp_path):
    users = femnist_users(np.random.default_rng(2), [2, 2, 2])
    write_leaf_dir(tmp_path / "train", users, per_file=2)
    write_leaf_dir(tmp_path / "test", users[::-1], per_file=1)
    assert check_same_users(tmp_path / "train", tmp_path / "test") == [u for u, _, _, _ in users]
    write_leaf_dir(tmp_path / "test2", users[:2], per_file=2)
    with pytest.raises(DataFileError) as excinfo:
        check_same_users(tmp_path / "train", tmp_path / "test2")
    check_error(excinfo, "train", f"user {users[2][0]!r} is not in", "test2")
    with pytest.raises(DataFileError, match="user 'z' is not in train"):
        compare_users(["a"], ["a", "z"])


@pytest.mark.parametrize(
    "content, words",
    [
        ({"users": ["a"], "user_data": {"a": {"x": [1], "y": [1]}}}, "no key 'num_samples'"),
        (
            {"users": ["a"], "num_samples": [2], "user_data": {"a": {"x": [1], "y": [1]}}},
            "num_samples says 2",
        ),
        ({"users": ["a"], "num_samples": [1], "user_data": {"a": {"x": [1, 2], "y": [1]}}}, "2 x but 1 y"),
        ({"users": ["a"], "num_samples": [1], "user_data": {}}, "user 'a' has no"),
        ({"users": ["a", "a"], "num_samples": [1, 1], "user_data": {"a": {"x": [1], "y": [1]}}}, "twice"),
        ({"users": "a", "num_samples": [], "user_data": {}}, "'users' is a str"),
        ([1, 2], "top level is a list"),
    ],
    ids=["no-num-samples", "count", "x-y", "no-user-data", "duplicate", "users-type", "top-level"],
)
def test_malformed_files(tmp_path, content, words):
    path = tmp_path / "all_data_0.json"
    path.write_text(json.dumps(content))
    with pytest.raises(DataFileError) as excinfo:
        list(iter_leaf_users(tmp_path))
    check_error(excinfo, path, words)


def test_user_in_two_files(tmp_path):
    users = femnist_users(np.random.default_rng(3), [1])
    write_leaf_dir(tmp_path, users, per_file=1, prefix="a")
    write_leaf_dir(tmp_path, users, per_file=1, prefix="b")
    with pytest.raises(DataFileError) as excinfo:
        list(iter_leaf_users(tmp_path))
    check_error(excinfo, "b_0.json", "is also in a_0.json")


def test_truncated_json(tmp_path):
    (path,) = write_leaf_dir(tmp_path / "full", femnist_users(np.random.default_rng(4), [3]), per_file=5)
    cut = truncated_copy(path)
    with pytest.raises(DataFileError) as excinfo:
        list(iter_leaf_users(cut.parent))
    check_error(excinfo, cut, "not valid JSON")


def test_not_utf8(tmp_path):
    path = tmp_path / "x.json"
    path.write_bytes(b'{"users": ["\xff"]}')
    with pytest.raises(DataFileError) as excinfo:
        list(iter_leaf_users(tmp_path))
    check_error(excinfo, path)


def test_missing_and_empty_directories(tmp_path):
    with pytest.raises(MissingDataError) as excinfo:
        list(iter_leaf_users(tmp_path / "train"))
    check_error(excinfo, "train", "no such directory")
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingDataError) as excinfo:
        list(iter_leaf_users(tmp_path / "empty"))
    check_error(excinfo, "empty", "no *.json files")
