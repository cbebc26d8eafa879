"""`emnist` (TFF HDF5, TFF SQLite[.lzma], FedJAX SQLite) and `femnist` (LEAF JSON), end to end.

The files are written by `tests/data/writers.py` (independently of the
readers) in `tmp_path`; every expectation is computed here from the arrays
written.
"""

from __future__ import annotations

import gc
import json
import os
import shutil

import numpy as np
import pytest
from data.datasets.checks import (
    assert_no_staging,
    assert_same_dataset,
    assert_truncated_file_refused,
    check_message,
    clients_of,
    conversions,
    entries,
)
from data.writers import (
    compress_lzma,
    emnist_like,
    encode_example,
    examples_of,
    femnist_users,
    truncated_copy,
    write_fedjax_sqlite,
    write_leaf_dir,
    write_tff_hdf5,
    write_tff_sqlite,
)

from jaxfl.data import load_dataset
from jaxfl.data.datasets import emnist as emnist_module
from jaxfl.data.errors import DataFileError, MissingDataError

FORMATS = ("tff-hdf5", "tff-sqlite", "tff-sqlite-lzma", "fedjax-sqlite")


def make_writers(seed: int = 0, *, digits: bool = False):
    """Four writers' training examples and the held-out examples of three of them (TFF's split)."""
    rng = np.random.default_rng(seed)
    train = emnist_like(rng, [3, 1, 4, 2])
    held = emnist_like(rng, [2, 1, 1])
    test = {name: held[f"f{i:04d}_{i:02d}"] for i, name in enumerate(sorted(train)[:3])}
    if digits:
        for clients in (train, test):
            for client in clients.values():
                client["label"] %= 10
    return train, test


def blobs(clients):
    return {cid: [encode_example(e) for e in examples_of(arrays)] for cid, arrays in clients.items()}


def write_emnist(directory, fmt, train, test, *, digits=False):
    """Writes the two splits in format `fmt` into `directory`; returns the main file."""
    directory.mkdir(parents=True, exist_ok=True)
    kind = "digitsonly_" if digits else ""
    if fmt == "tff-hdf5":
        path = write_tff_hdf5(directory / f"fed_emnist_{kind}train.h5", train)
        # TFF stores some labels as [N, 1].
        write_tff_hdf5(directory / f"fed_emnist_{kind}test.h5", test, label_unit_dim=True)
        return path
    if fmt.startswith("tff-sqlite"):
        prefix = "digits_only" if digits else "all"
        path = write_tff_sqlite(
            directory / "emnist_all.sqlite", {f"{prefix}_train": blobs(train), f"{prefix}_test": blobs(test)}
        )
        if fmt.endswith("lzma"):
            compressed = compress_lzma(path)
            path.unlink()
            return compressed
        return path
    assert fmt == "fedjax-sqlite"

    def rows(clients):
        return [(cid.encode(), clients[cid], None) for cid in sorted(clients)]

    path = write_fedjax_sqlite(directory / f"federated_emnist_{kind}train.sqlite", rows(train))
    write_fedjax_sqlite(directory / f"federated_emnist_{kind}test.sqlite", rows(test))
    return path


def expected_examples(client, pixels="tff"):
    x = np.asarray(client["pixels"], np.float32).reshape(-1, 28, 28, 1)
    if pixels == "inverted":
        x = (1.0 - x).astype(np.float32)
    return {"x": x, "y": np.asarray(client["label"]).reshape(-1).astype(np.int32)}


def assert_population(population, clients, pixels="tff", cap=None):
    assert population.client_names() == sorted(clients)
    got = clients_of(population)
    for name in sorted(clients):
        want = expected_examples(clients[name], pixels)
        if cap is not None:
            want = {k: v[:cap] for k, v in want.items()}
        assert got[name]["x"].dtype == np.float32 and got[name]["y"].dtype == np.int32
        np.testing.assert_array_equal(got[name]["x"], want["x"], err_msg=name)
        np.testing.assert_array_equal(got[name]["y"], want["y"], err_msg=name)


# ---------------------------------------------------------------------------
# EMNIST: round trips.


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_keeps_writers_and_the_published_split(tmp_path, fmt):
    train, test = make_writers()
    write_emnist(tmp_path / "data", fmt, train, test)
    data = load_dataset("emnist", data_dir=tmp_path / "data")
    assert data.num_classes == 62 and data.input_shape == (28, 28, 1)
    assert data.input_vocab_size is None and data.validation is None
    assert_population(data.train, train)
    # The test clients are the training writers' held-out examples (TFF's split), not new writers.
    assert_population(data.test, test)
    assert set(data.test.client_names()) < set(data.train.client_names())
    np.testing.assert_array_equal(data.train.counts, [3, 1, 4, 2])
    np.testing.assert_array_equal(data.test.counts, [2, 1, 1])
    # The cache entry records each population's sizes (`common.write_population`, as every loader's).
    (entry,) = entries("emnist")
    statistics = json.loads((entry / "metadata.json").read_text())["statistics"]
    assert statistics["train"] == {"clients": 4, "examples": 10, "min": 1, "median": 2, "max": 4}
    assert statistics["test"] == {"clients": 3, "examples": 4, "min": 1, "median": 1, "max": 2}


@pytest.mark.parametrize("fmt", FORMATS[1:])
def test_every_format_gives_the_same_dataset(tmp_path, fmt):
    train, test = make_writers(seed=3)
    write_emnist(tmp_path / "h5", "tff-hdf5", train, test)
    write_emnist(tmp_path / "other", fmt, train, test)
    reference = load_dataset("emnist", data_dir=tmp_path / "h5", pixels="inverted")
    assert_same_dataset(load_dataset("emnist", data_dir=tmp_path / "other", pixels="inverted"), reference)


def test_pixels_inverted_is_one_minus_the_stored_pixels(tmp_path):
    train, test = make_writers(seed=1)
    write_emnist(tmp_path, "tff-hdf5", train, test)
    stored = load_dataset("emnist", data_dir=tmp_path)
    inverted = load_dataset("emnist", data_dir=tmp_path, pixels="inverted")
    assert_population(inverted.train, train, pixels="inverted")
    assert_population(inverted.test, test, pixels="inverted")
    np.testing.assert_allclose(inverted.train.features["x"], 1.0 - stored.train.features["x"], rtol=0, atol=0)
    np.testing.assert_array_equal(inverted.train.features["y"], stored.train.features["y"])


@pytest.mark.parametrize("cap", [1, 2])
def test_max_examples_per_client_keeps_each_writers_first_examples(tmp_path, cap):
    train, test = make_writers(seed=2)
    write_emnist(tmp_path, "tff-sqlite", train, test)
    data = load_dataset("emnist", data_dir=tmp_path, max_examples_per_client=cap)
    np.testing.assert_array_equal(data.train.counts, np.minimum([3, 1, 4, 2], cap))
    np.testing.assert_array_equal(data.test.counts, np.minimum([2, 1, 1], cap))
    assert_population(data.train, train, cap=cap)
    assert_population(data.test, test, cap=cap)


@pytest.mark.parametrize("fmt", ["tff-hdf5", "tff-sqlite", "fedjax-sqlite"])
def test_only_digits_reads_the_digits_files(tmp_path, fmt):
    train, test = make_writers(seed=4, digits=True)
    write_emnist(tmp_path, fmt, train, test, digits=True)
    data = load_dataset("emnist", data_dir=tmp_path, only_digits=True)
    assert data.num_classes == 10
    assert_population(data.train, train)
    assert_population(data.test, test)
    if fmt != "tff-sqlite":
        # Only the digits files are there: the 62-class version is missing.
        with pytest.raises(MissingDataError) as excinfo:
            load_dataset("emnist", data_dir=tmp_path)
        check_message(excinfo, "emnist", "fed_emnist_{train,test}.h5", tmp_path, kind=MissingDataError)


def test_files_in_a_subdirectory_are_found(tmp_path):
    train, test = make_writers()
    write_emnist(tmp_path / "fed_emnist", "tff-hdf5", train, test)
    assert_population(load_dataset("emnist", data_dir=tmp_path).train, train)


def test_lzma_files_of_the_same_name_in_two_directories_are_not_mixed_up(tmp_path):
    # Two releases of emnist_all.sqlite.lzma, both older than any decompressed copy: each
    # must be read from its own file, not from the other's decompressed copy.
    first, second = make_writers(seed=5), make_writers(seed=6)
    write_emnist(tmp_path / "a", "tff-sqlite-lzma", *first)
    b = write_emnist(tmp_path / "b", "tff-sqlite-lzma", *second)
    old = b.stat().st_mtime_ns - 10**10
    os.utime(b, ns=(old, old))
    assert_population(load_dataset("emnist", data_dir=tmp_path / "a").train, first[0])
    assert_population(load_dataset("emnist", data_dir=tmp_path / "b").train, second[0])


# ---------------------------------------------------------------------------
# EMNIST: errors.


def test_empty_data_dir(tmp_path):
    with pytest.raises(MissingDataError) as excinfo:
        load_dataset("emnist", data_dir=tmp_path)
    check_message(excinfo, "emnist", str(tmp_path), "fed_emnist_{train,test}.h5", "emnist_all.sqlite",
                  "federated_emnist_{train,test}.sqlite", kind=MissingDataError)


def test_data_dir_that_does_not_exist(tmp_path):
    with pytest.raises(MissingDataError) as excinfo:
        load_dataset("emnist", data_dir=tmp_path / "nowhere")
    check_message(excinfo, "emnist", tmp_path / "nowhere", "does not exist", kind=MissingDataError)


def test_data_dir_that_is_a_file(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(MissingDataError) as excinfo:
        load_dataset("emnist", data_dir=tmp_path / "file")
    check_message(excinfo, "emnist", "not a directory", kind=MissingDataError)


def test_no_data_dir():
    with pytest.raises(MissingDataError) as excinfo:
        load_dataset("emnist")
    check_message(excinfo, "emnist", "--data-dir", kind=MissingDataError)


def test_one_file_of_a_pair_is_not_enough(tmp_path):
    train, test = make_writers()
    write_emnist(tmp_path, "tff-hdf5", train, test)
    (tmp_path / "fed_emnist_test.h5").unlink()
    with pytest.raises(MissingDataError) as excinfo:
        load_dataset("emnist", data_dir=tmp_path)
    check_message(excinfo, "emnist", "fed_emnist_{train,test}.h5", kind=MissingDataError)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("fraction", [0.3, 0.9])
def test_truncated_file(tmp_path, fmt, fraction):
    train, test = make_writers()
    path = write_emnist(tmp_path / "data", fmt, train, test)
    assert_truncated_file_refused("emnist", path, fraction)


@pytest.mark.parametrize("fmt", FORMATS)
def test_file_of_another_format_under_the_expected_name(tmp_path, fmt):
    train, test = make_writers()
    path = write_emnist(tmp_path, fmt, train, test)
    path.write_text("writer,label\nf0000_00,3\n")
    with pytest.raises(DataFileError) as excinfo:
        load_dataset("emnist", data_dir=tmp_path)
    check_message(excinfo, "emnist", path)


def failed_load_message(dataset, **options) -> str:
    """The one-line message of a load that must fail with a DataFileError.

    The exception (and its traceback, which holds the loader's suspended
    file readers open) is dropped on return, as when a command exits.
    """
    with pytest.raises(DataFileError) as excinfo:
        load_dataset(dataset, **options)
    message = check_message(excinfo, dataset)
    del excinfo
    gc.collect()
    return message


def test_labels_outside_the_classes_fail_and_leave_no_cache_entry(tmp_path):
    train, test = make_writers(seed=7, digits=True)
    test[sorted(test)[1]]["label"][0] = 12  # Not a digit: the test file is bad.
    write_emnist(tmp_path, "tff-hdf5", train, test, digits=True)
    message = failed_load_message("emnist", data_dir=tmp_path, only_digits=True)
    for word in ("fed_emnist_digitsonly_test.h5", sorted(test)[1], "labels outside [0, 10)"):
        assert word in message, message
    assert entries("emnist") == []
    assert_no_staging()
    # Once the file is fixed, the next load converts and works.
    test[sorted(test)[1]]["label"][0] = 2
    write_emnist(tmp_path, "tff-hdf5", train, test, digits=True)
    assert_population(load_dataset("emnist", data_dir=tmp_path, only_digits=True).test, test)
    assert len(entries("emnist")) == 1
    assert_no_staging()


@pytest.mark.parametrize(
    "option, value",
    [
        ("pixels", "raw"),
        ("max_examples_per_client", 0),
        ("max_examples_per_client", 2.5),
        ("only_digits", "yes"),
    ],
)
def test_bad_option_value(tmp_path, option, value):
    train, test = make_writers()
    write_emnist(tmp_path, "tff-hdf5", train, test)
    with pytest.raises(ValueError) as excinfo:
        load_dataset("emnist", data_dir=tmp_path, **{option: value})
    check_message(excinfo, "emnist", option, repr(value), kind=ValueError)
    assert entries("emnist") == []


def test_unknown_option(tmp_path):
    with pytest.raises(ValueError) as excinfo:
        load_dataset("emnist", data_dir=tmp_path, split="users")
    check_message(excinfo, "emnist", "no option 'split'", "pixels", kind=ValueError)


# ---------------------------------------------------------------------------
# EMNIST: the cache.


def test_cache_converts_once_per_files_and_options(tmp_path, monkeypatch):
    train, test = make_writers()
    path = write_emnist(tmp_path, "tff-hdf5", train, test)
    calls = conversions(monkeypatch, emnist_module, "_featurize")
    first = load_dataset("emnist", data_dir=tmp_path)
    converted = len(calls)
    assert converted == len(train) + len(test)
    (entry,) = entries("emnist")
    stamp = entry.stat().st_mtime_ns

    again = load_dataset("emnist", data_dir=tmp_path)
    assert len(calls) == converted  # Read from the cache, not converted again.
    assert entries("emnist") == [entry] and entry.stat().st_mtime_ns == stamp
    assert_same_dataset(again, first)

    load_dataset("emnist", data_dir=tmp_path, max_examples_per_client=1)  # Another option value.
    assert len(calls) == 2 * converted
    assert len(entries("emnist")) == 2

    newer = path.stat().st_mtime_ns + 10**9
    os.utime(path, ns=(newer, newer))  # The same bytes, touched.
    load_dataset("emnist", data_dir=tmp_path)
    assert len(calls) == 3 * converted
    assert len(entries("emnist")) == 3
    assert_no_staging()


# ---------------------------------------------------------------------------
# FEMNIST (LEAF JSON).


def leaf_expected(x, y, pixels="tff"):
    images = np.asarray(x, np.float32).reshape(-1, 28, 28, 1)
    if pixels == "inverted":
        images = (1.0 - images).astype(np.float32)
    return {"x": images, "y": np.asarray(y, np.int32)}


def assert_leaf_population(population, users, pixels="tff"):
    """`users`: name -> (x list, y list), in the expected client order."""
    assert population.client_names() == list(users)
    got = clients_of(population)
    for name, (x, y) in users.items():
        want = leaf_expected(x, y, pixels)
        np.testing.assert_array_equal(got[name]["x"], want["x"], err_msg=name)
        np.testing.assert_array_equal(got[name]["y"], want["y"], err_msg=name)


@pytest.fixture
def leaf_by_sample(tmp_path):
    """LEAF `-t sample`: every writer in train/ and test/ (first examples train, the rest test)."""
    users = femnist_users(np.random.default_rng(0), [5, 2, 6, 3, 4])
    train = [(u, x[:-1], y[:-1], h) for u, x, y, h in users]
    test = [(u, x[-1:], y[-1:], h) for u, x, y, h in users]
    root = tmp_path / "femnist"
    write_leaf_dir(root / "data" / "train", train, per_file=2)
    write_leaf_dir(root / "data" / "test", test, per_file=3)
    return root, users


def test_femnist_published_split(leaf_by_sample):
    root, users = leaf_by_sample
    data = load_dataset("femnist", data_dir=root)
    assert data.num_classes == 62 and data.input_shape == (28, 28, 1)
    assert_leaf_population(data.train, {u: (x[:-1], y[:-1]) for u, x, y, _ in users})
    assert_leaf_population(data.test, {u: (x[-1:], y[-1:]) for u, x, y, _ in users})
    inverted = load_dataset("femnist", data_dir=root / "data", pixels="inverted")
    assert_leaf_population(inverted.train, {u: (x[:-1], y[:-1]) for u, x, y, _ in users}, pixels="inverted")


def test_femnist_min_examples_drops_writers_from_both_splits(leaf_by_sample):
    root, users = leaf_by_sample
    data = load_dataset("femnist", data_dir=root, min_examples=4)
    kept = [u for u, _, y, _ in users if len(y) - 1 >= 4]
    assert kept and len(kept) < len(users)
    assert data.train.client_names() == kept
    assert data.test.client_names() == kept


def test_femnist_published_split_by_writer(tmp_path):
    # LEAF `-t user`: train/ and test/ hold different writers (the Delta-FL setup).
    users = femnist_users(np.random.default_rng(1), [3, 1, 4, 2, 5])
    write_leaf_dir(tmp_path / "train", users[:3], per_file=2)
    write_leaf_dir(tmp_path / "test", users[3:], per_file=2)
    data = load_dataset("femnist", data_dir=tmp_path)
    assert_leaf_population(data.train, {u: (x, y) for u, x, y, _ in users[:3]})
    assert_leaf_population(data.test, {u: (x, y) for u, x, y, _ in users[3:]})
    # Test-only writers need min_examples examples of their own.
    data = load_dataset("femnist", data_dir=tmp_path, min_examples=3)
    assert data.train.client_names() == [users[0][0], users[2][0]]
    assert data.test.client_names() == [users[4][0]]


@pytest.mark.parametrize("test_fraction, seed", [(0.4, 0), (0.2, 3)])
def test_femnist_split_by_users(leaf_by_sample, test_fraction, seed):
    root, users = leaf_by_sample
    data = load_dataset("femnist", data_dir=root, split="users", test_fraction=test_fraction, seed=seed)
    train, test = data.train.client_names(), data.test.client_names()
    assert not set(train) & set(test)
    assert sorted(train + test) == sorted(u for u, _, _, _ in users)
    assert len(test) == round(test_fraction * len(users))
    # Whole writers: train/ and test/ examples joined, in that order.
    everything = {u: (x, y) for u, x, y, _ in users}
    assert_leaf_population(data.train, {u: everything[u] for u in train})
    assert_leaf_population(data.test, {u: everything[u] for u in test})


def test_femnist_split_by_examples(leaf_by_sample):
    root, users = leaf_by_sample
    data = load_dataset("femnist", data_dir=root, split="examples", test_fraction=0.25)
    train, test = {}, {}
    for u, x, y, _ in sorted(users):
        held = min(max(round(0.25 * len(y)), 1), len(y) - 1)
        train[u] = (x[: len(y) - held], y[: len(y) - held])
        test[u] = (x[len(y) - held :], y[len(y) - held :])
    assert_leaf_population(data.train, train)
    assert_leaf_population(data.test, test)


def test_femnist_unsplit_data_needs_a_split(tmp_path):
    users = femnist_users(np.random.default_rng(2), [2, 3, 2])
    write_leaf_dir(tmp_path / "all_data", users, per_file=2)
    with pytest.raises(ValueError) as excinfo:
        load_dataset("femnist", data_dir=tmp_path)
    check_message(excinfo, "femnist", "split=users", kind=ValueError)
    data = load_dataset("femnist", data_dir=tmp_path, split="users", test_fraction=0.3)
    assert data.train.num_clients == 2 and data.test.num_clients == 1


def test_femnist_errors(tmp_path, leaf_by_sample):
    root, _ = leaf_by_sample
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(MissingDataError) as excinfo:
        load_dataset("femnist", data_dir=empty)
    check_message(excinfo, "femnist", empty, kind=MissingDataError)
    with pytest.raises(MissingDataError) as excinfo:
        load_dataset("femnist", data_dir=tmp_path / "nowhere")
    check_message(excinfo, "femnist", "does not exist", kind=MissingDataError)

    bad = sorted((root / "data" / "test").glob("*.json"))[0]
    cut = truncated_copy(bad, 0.5)
    shutil.move(cut, bad)
    with pytest.raises(DataFileError) as excinfo:
        load_dataset("femnist", data_dir=root)
    check_message(excinfo, "femnist", bad, "not valid JSON")
    assert entries("femnist") == []
    assert_no_staging()

    bad.write_text(json.dumps({"writers": ["f0000_00"]}))
    with pytest.raises(DataFileError) as excinfo:
        load_dataset("femnist", data_dir=root)
    check_message(excinfo, "femnist", bad, "not a LEAF file")
    assert_no_staging()


@pytest.mark.parametrize(
    "option, value",
    [("split", "writers"), ("pixels", "white"), ("min_examples", 0), ("test_fraction", 1.5), ("seed", -1)],
)
def test_femnist_bad_option_value(leaf_by_sample, option, value):
    root, _ = leaf_by_sample
    with pytest.raises(ValueError) as excinfo:
        load_dataset("femnist", data_dir=root, **{option: value})
    check_message(excinfo, "femnist", option, repr(value), kind=ValueError)
