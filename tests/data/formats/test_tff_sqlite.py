"""`TffSqlite`: TFF's SQLite files (and .lzma) against an independent writer."""

import os
import sqlite3

import numpy as np
import pytest
from data.writers import (
    check_error,
    cifar100_like,
    compress_lzma,
    emnist_like,
    encode_example,
    examples_of,
    shakespeare_like,
    stackoverflow_like,
    truncated_copy,
    write_fedjax_sqlite,
    write_tff_hdf5,
    write_tff_sqlite,
)

from jaxfl.data.errors import DataFileError, MissingDataError
from jaxfl.data.formats import TffSqlite


def blobs(clients):
    return {cid: [encode_example(e) for e in examples_of(arrays)] for cid, arrays in clients.items()}


def assert_clients_equal(got, clients):
    assert [cid for cid, _ in got] == sorted(clients)
    for cid, examples in got:
        expected = examples_of(clients[cid])
        assert len(examples) == len(expected)
        for parsed, want in zip(examples, expected, strict=True):
            assert parsed.keys() == want.keys()
            for name, value in want.items():
                if isinstance(value, list):
                    assert parsed[name] == value
                else:
                    assert parsed[name].dtype == value.dtype
                    np.testing.assert_array_equal(parsed[name], value)


@pytest.fixture
def emnist_file(tmp_path):
    rng = np.random.default_rng(0)
    train = emnist_like(rng, [3, 1, 4])
    test = emnist_like(rng, [2, 1, 1])
    path = write_tff_sqlite(
        tmp_path / "emnist_all.sqlite", {"all_train": blobs(train), "all_test": blobs(test)}
    )
    return path, train, test


def test_emnist_round_trip(emnist_file):
    path, train, test = emnist_file
    with TffSqlite(path) as data:
        assert data.splits() == ["all_test", "all_train"]
        assert data.client_counts("all_train") == sorted((cid, len(c["label"])) for cid, c in train.items())
        assert_clients_equal(list(data.iter_clients("all_train")), train)
        assert_clients_equal(list(data.iter_clients("all_test")), test)


@pytest.mark.parametrize(
    "make, split",
    [(stackoverflow_like, "heldout"), (cifar100_like, "train"), (shakespeare_like, "test")],
    ids=["stackoverflow", "cifar100", "shakespeare"],
)
def test_dataset_shapes_round_trip(tmp_path, make, split):
    clients = make(np.random.default_rng(1), [2, 3, 1])
    path = write_tff_sqlite(tmp_path / "x.sqlite", {split: blobs(clients)})
    with TffSqlite(path) as data:
        assert_clients_equal(list(data.iter_clients(split)), clients)


def test_one_client_with_one_example(tmp_path):
    clients = shakespeare_like(np.random.default_rng(2), [1])
    path = write_tff_sqlite(tmp_path / "one.sqlite", {"train": blobs(clients)})
    with TffSqlite(path) as data:
        assert data.client_counts("train") == [(next(iter(clients)), 1)]
        assert_clients_equal(list(data.iter_clients("train")), clients)


def test_without_client_metadata_counts_from_examples(tmp_path):
    clients = emnist_like(np.random.default_rng(3), [2, 5])
    path = write_tff_sqlite(tmp_path / "nometa.sqlite", {"train": blobs(clients)}, metadata=False)
    with TffSqlite(path) as data:
        assert data.splits() == ["train"]
        assert data.client_counts("train") == [(cid, len(c["label"])) for cid, c in sorted(clients.items())]
        assert_clients_equal(list(data.iter_clients("train")), clients)


@pytest.mark.parametrize("fmt", ["alone", "xz"])
def test_lzma_is_decompressed_once_atomically(tmp_path, fmt):
    clients = emnist_like(np.random.default_rng(4), [2, 2])
    plain = write_tff_sqlite(tmp_path / "emnist_all.sqlite", {"all_train": blobs(clients)})
    packed = compress_lzma(plain, fmt=fmt)
    plain.unlink()
    work = tmp_path / "cache"

    class Bar:
        total = 0

        def update(self, n):
            self.total += n

    bar = Bar()
    with TffSqlite(packed, work_dir=work, progress=bar) as data:
        assert data.path == work / "emnist_all.sqlite"
        assert_clients_equal(list(data.iter_clients("all_train")), clients)
    assert bar.total == packed.stat().st_size
    assert sorted(p.name for p in work.iterdir()) == ["emnist_all.sqlite"]
    stamp = (work / "emnist_all.sqlite").stat().st_mtime_ns

    # Reused, not decompressed again.
    with TffSqlite(packed, work_dir=work, progress=bar) as data:
        assert data.client_counts("all_train")
    assert (work / "emnist_all.sqlite").stat().st_mtime_ns == stamp
    assert bar.total == packed.stat().st_size

    # A newer .lzma replaces the copy.
    os.utime(packed, ns=(stamp + 10**9, stamp + 10**9))
    with TffSqlite(packed, work_dir=work) as data:
        assert_clients_equal(list(data.iter_clients("all_train")), clients)
    assert (work / "emnist_all.sqlite").stat().st_mtime_ns != stamp


def test_lzma_defaults_to_its_own_directory(tmp_path):
    clients = emnist_like(np.random.default_rng(5), [1])
    plain = write_tff_sqlite(tmp_path / "cifar100.sqlite", {"train": blobs(clients)})
    packed = compress_lzma(plain)
    plain.unlink()
    with TffSqlite(packed) as data:
        assert data.path == tmp_path / "cifar100.sqlite"
        assert data.source == packed


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_bad_lzma_is_an_error_and_leaves_nothing(tmp_path, damage):
    clients = emnist_like(np.random.default_rng(6), [3])
    plain = write_tff_sqlite(tmp_path / "shakespeare.sqlite", {"train": blobs(clients)})
    packed = compress_lzma(plain)
    if damage == "truncated":
        packed = truncated_copy(packed)
    else:
        packed.write_bytes(b"this is not lzma at all" * 10)
    work = tmp_path / "work"
    with pytest.raises(DataFileError) as excinfo:
        TffSqlite(packed, work_dir=work)
    check_error(excinfo, packed, "truncated" if damage == "truncated" else "not a valid LZMA file")
    assert list(work.iterdir()) == []


def test_missing_file(tmp_path):
    with pytest.raises(MissingDataError) as excinfo:
        TffSqlite(tmp_path / "emnist_all.sqlite")
    check_error(excinfo, "emnist_all.sqlite", "no such file")


def test_truncated_file(emnist_file):
    cut = truncated_copy(emnist_file[0])
    with pytest.raises(DataFileError) as excinfo:
        TffSqlite(cut)
    check_error(excinfo, cut, "truncated")


def test_hdf5_file_is_not_sqlite(tmp_path):
    path = write_tff_hdf5(tmp_path / "fed_emnist_train.h5", emnist_like(np.random.default_rng(7), [1]))
    with pytest.raises(DataFileError) as excinfo:
        TffSqlite(path)
    check_error(excinfo, path, "not an SQLite file")


def test_fedjax_file_has_the_wrong_schema(tmp_path):
    path = write_fedjax_sqlite(tmp_path / "emnist_all.sqlite", [(b"a", {"x": np.zeros(2)}, None)])
    with pytest.raises(DataFileError) as excinfo:
        TffSqlite(path)
    check_error(excinfo, path, "not a TFF SQLite file (no table 'examples')")


def test_unknown_split_lists_the_splits(emnist_file):
    with TffSqlite(emnist_file[0]) as data, pytest.raises(DataFileError) as excinfo:
        data.client_counts("train")
    check_error(excinfo, emnist_file[0], "no split 'train'", "all_test, all_train")


def test_metadata_disagreeing_with_examples(emnist_file):
    path = emnist_file[0]
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE client_metadata SET num_examples = 9 WHERE split_name = 'all_test'")
    connection.close()
    with TffSqlite(path) as data, pytest.raises(DataFileError) as excinfo:
        list(data.iter_clients("all_test"))
    check_error(excinfo, path, "client_metadata says 9")


def test_corrupt_example_names_the_client(tmp_path):
    path = write_tff_sqlite(tmp_path / "stackoverflow.sqlite", {"train": {"u1": [b"\x0a\x09garbage"]}})
    with TffSqlite(path) as data, pytest.raises(DataFileError) as excinfo:
        list(data.iter_clients("train"))
    check_error(excinfo, path, "client 'u1' example 0", "not a valid tf.train.Example")


def test_damaged_decompressed_copy_says_how_to_recover(tmp_path):
    clients = emnist_like(np.random.default_rng(8), [30, 30])
    plain = write_tff_sqlite(tmp_path / "emnist_all.sqlite", {"train": blobs(clients)})
    packed = compress_lzma(plain)
    work = tmp_path / "work"
    work.mkdir()
    (work / plain.name).write_bytes(plain.read_bytes()[: plain.stat().st_size // 2])
    plain.unlink()
    with pytest.raises(DataFileError) as excinfo:
        TffSqlite(packed, work_dir=work)
    check_error(excinfo, plain.name, "truncated", "delete it to decompress again")


def test_iteration_uses_the_split_client_index(emnist_file):
    with TffSqlite(emnist_file[0]) as data:
        plan = data._connection.execute(
            "EXPLAIN QUERY PLAN SELECT client_id, serialized_example_proto FROM examples "
            "WHERE split_name = ? ORDER BY client_id",
            ("all_train",),
        ).fetchall()
    details = " ".join(row[-1] for row in plan)
    assert "idx_examples_split_client" in details and "TEMP B-TREE" not in details
