"""`tfds:NAME`: a prepared TFDS dataset by its natural clients or partitioned, end to end.

The dataset is `jaxfl_tiny`, prepared offline by `tests/data/tfds_writer.py`
(array_record, no TensorFlow); the expected clients are computed here from
the examples it wrote.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

pytest.importorskip(
    "tensorflow_datasets", reason="tensorflow-datasets is not installed (the optional `data` extra)"
)
pytest.importorskip("array_record", reason="array_record is not installed (needed for TFDS random access)")
pytest.importorskip("PIL", reason="Pillow is not installed (decodes TFDS Image features without TensorFlow)")
pytest.importorskip(
    "importlib_resources", reason="importlib_resources is not installed (TFDS writes need it)"
)

from data.datasets.checks import (  # noqa: E402
    assert_no_staging,
    assert_same_dataset,
    check_message,
    clients_of,
    conversions,
    entries,
)
from data.tfds_writer import IMAGE_SHAPE, NAME, NUM_CLASSES, write_tiny_tfds  # noqa: E402
from data.writers import truncated_copy  # noqa: E402

from jaxfl.data import load_dataset  # noqa: E402
from jaxfl.data.datasets import tfds as tfds_module  # noqa: E402
from jaxfl.data.errors import DataFileError, MissingDataError  # noqa: E402

DATASET = f"tfds:{NAME}"
ENTRY = f"tfds-{NAME}"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import tensorflow_datasets as tfds

    tfds.disable_progress_bar()
    return write_tiny_tfds(tmp_path_factory.mktemp("tfds"), sizes={"train": 40, "test": 12}, num_shards=2)


@pytest.fixture
def tiny_copy(tiny, tmp_path):
    """A private copy of the prepared dataset, for tests that change its files."""
    shutil.copytree(tiny.data_dir / NAME, tmp_path / "tfds" / NAME)
    return tmp_path / "tfds", tmp_path / "tfds" / NAME / "1.0.0"


def inputs(split):
    return (split["image"].astype(np.float32) / np.float32(255)).reshape(-1, *IMAGE_SHAPE)


def by_user(split, key="user"):
    """Client name -> its examples, in the split's order (clients sorted by name)."""
    names = np.array([str(v) for v in split[key]])
    x, y = inputs(split), split["label"].astype(np.int32)
    return {name: {"x": x[names == name], "y": y[names == name]} for name in sorted(set(names))}


def assert_clients(population, expected):
    assert population.client_names() == list(expected)
    got = clients_of(population)
    for name, want in expected.items():
        assert got[name]["x"].dtype == np.float32 and got[name]["y"].dtype == np.int32
        np.testing.assert_array_equal(got[name]["x"], want["x"], err_msg=name)
        np.testing.assert_array_equal(got[name]["y"], want["y"], err_msg=name)


def trace(population, split):
    """The split rows each client holds (images are random, so rows are traceable); checks labels."""
    x = inputs(split)
    index = {row.tobytes(): i for i, row in enumerate(x)}
    assert len(index) == len(x)
    rows = {}
    for name, client in clients_of(population).items():
        found = np.array([index[row.tobytes()] for row in client["x"]])
        np.testing.assert_array_equal(client["y"], split["label"][found])
        rows[name] = found
    return rows


def assert_covers_once(rows, n):
    every = np.concatenate(list(rows.values()))
    assert np.array_equal(np.sort(every), np.arange(n))


# ---------------------------------------------------------------------------
# Natural clients.


def test_natural_clients_by_user(tiny):
    data = load_dataset(DATASET, data_dir=tiny.data_dir)
    assert data.num_classes == NUM_CLASSES and data.input_shape == IMAGE_SHAPE
    assert data.validation is None
    assert_clients(data.train, by_user(tiny.splits["train"]))
    # The test clients are the test split's own users.
    assert_clients(data.test, by_user(tiny.splits["test"]))
    assert "clients by 'user'" in data.description


def test_client_key_option(tiny):
    data = load_dataset(DATASET, data_dir=tiny.data_dir, client_key="text")
    assert_clients(data.train, by_user(tiny.splits["train"], key="text"))
    assert int(data.train.counts.max()) == 1


def test_min_examples_drops_small_clients(tiny):
    counts = {name: len(ex["y"]) for name, ex in by_user(tiny.splits["train"]).items()}
    test_counts = {name: len(ex["y"]) for name, ex in by_user(tiny.splits["test"]).items()}
    threshold = 4
    assert min(test_counts.values()) < threshold <= max(test_counts.values())
    data = load_dataset(DATASET, data_dir=tiny.data_dir, min_examples=threshold)
    assert data.train.client_names() == sorted(n for n, c in counts.items() if c >= threshold)
    assert data.test.client_names() == sorted(n for n, c in test_counts.items() if c >= threshold)
    # The cache entry's statistics are the kept clients' sizes.
    (entry,) = entries(ENTRY)
    statistics = json.loads((entry / "metadata.json").read_text())["statistics"]
    kept = sorted(c for c in counts.values() if c >= threshold)
    assert statistics["train"] == {
        "clients": len(kept), "examples": sum(kept), "min": kept[0], "median": int(np.median(kept)),
        "max": kept[-1],
    }


def test_split_slices(tiny):
    data = load_dataset(DATASET, data_dir=tiny.data_dir, train_split="train[:10]", test_split="train[30:]")
    first = {k: v[:10] for k, v in tiny.splits["train"].items()}
    last = {k: v[30:] for k, v in tiny.splits["train"].items()}
    assert_clients(data.train, by_user(first))
    assert_clients(data.test, by_user(last))


def test_default_data_dir_is_tfds_data_dir(tiny, monkeypatch):
    monkeypatch.setenv("TFDS_DATA_DIR", str(tiny.data_dir))
    assert_clients(load_dataset(DATASET).train, by_user(tiny.splits["train"]))


# ---------------------------------------------------------------------------
# Partitioned (no client key).


@pytest.mark.parametrize("partition", ["dirichlet", "iid", "shards"])
def test_partitioned_covers_each_split_once(tiny, partition):
    data = load_dataset(DATASET, data_dir=tiny.data_dir, client_key="none", partition=partition,
                        num_clients=4, num_test_clients=3, min_size=2, shards_per_client=1)
    assert data.train.client_names() == [f"train_{i}" for i in range(data.train.num_clients)]
    assert data.train.num_clients == 4
    assert_covers_once(trace(data.train, tiny.splits["train"]), 40)
    assert_covers_once(trace(data.test, tiny.splits["test"]), 12)
    assert "clients by" not in data.description


def test_partitioned_held_out(tiny):
    data = load_dataset(DATASET, data_dir=tiny.data_dir, client_key="none", partition="iid", num_clients=4,
                        test="held-out", test_fraction=0.25)
    kept, held = trace(data.train, tiny.splits["train"]), trace(data.test, tiny.splits["train"])
    assert_covers_once({**kept, **held}, 40)
    assert data.test.client_names() == [f"test_{i}" for i in range(4)]
    np.testing.assert_array_equal(data.test.counts, [3, 3, 3, 3])  # 10 each, a quarter held out (rounded).


def test_partition_options_change_the_clients(tiny):
    options = {"data_dir": tiny.data_dir, "client_key": "none", "num_test_clients": 2, "min_size": 1}
    a = load_dataset(DATASET, num_clients=3, seed=0, **options)
    b = load_dataset(DATASET, num_clients=3, seed=1, **options)
    c = load_dataset(DATASET, num_clients=5, seed=0, **options)
    assert not np.array_equal(a.train.counts, b.train.counts) or not np.array_equal(
        a.train.features["y"], b.train.features["y"]
    )
    assert c.train.num_clients == 5
    assert len(entries(ENTRY)) == 3


# ---------------------------------------------------------------------------
# Errors.


def test_not_prepared_or_missing(tmp_path):
    with pytest.raises(MissingDataError) as excinfo:
        load_dataset(DATASET, data_dir=tmp_path)
    check_message(excinfo, DATASET, NAME, "not prepared", str(tmp_path), kind=MissingDataError)
    with pytest.raises(MissingDataError) as excinfo:
        load_dataset(DATASET, data_dir=tmp_path / "nowhere")
    check_message(excinfo, DATASET, tmp_path / "nowhere", "does not exist", kind=MissingDataError)


def test_name_is_required():
    with pytest.raises(ValueError, match="needs a TFDS dataset name"):
        load_dataset("tfds:")


def test_truncated_shard_fails_and_leaves_no_cache_entry(tiny_copy):
    data_dir, dataset_dir = tiny_copy
    shard = sorted(dataset_dir.glob(f"{NAME}-test.array_record-*"))[-1]
    shard.write_bytes(truncated_copy(shard, 0.3).read_bytes())
    shutil.rmtree(shard.parent / "cut")
    with pytest.raises(DataFileError) as excinfo:
        load_dataset(DATASET, data_dir=data_dir)
    check_message(excinfo, DATASET, shard)
    assert entries(ENTRY) == []
    assert_no_staging()


def test_metadata_of_another_format(tiny_copy):
    data_dir, dataset_dir = tiny_copy
    (dataset_dir / "dataset_info.json").write_text("name: jaxfl_tiny\n")
    with pytest.raises(DataFileError) as excinfo:
        load_dataset(DATASET, data_dir=data_dir)
    check_message(excinfo, DATASET, "TFDS metadata", dataset_dir)


def test_unknown_split(tiny):
    with pytest.raises(DataFileError) as excinfo:
        load_dataset(DATASET, data_dir=tiny.data_dir, test_split="validation")
    check_message(excinfo, DATASET, "no split 'validation'", "train (40 examples)")
    assert_no_staging()


def test_no_client_left(tiny):
    with pytest.raises(DataFileError) as excinfo:
        load_dataset(DATASET, data_dir=tiny.data_dir, min_examples=41)
    check_message(excinfo, DATASET, "41 examples")
    assert entries(ENTRY) == []
    assert_no_staging()


@pytest.mark.parametrize(
    "option, value",
    [
        ("client_key", "writer"),
        ("min_examples", 0),
        ("partition", "by-user"),
        ("test", "seen"),
        ("num_clients", 0),
        ("num_clients", 41),
        ("test_fraction", 1.5),
    ],
)
def test_bad_option_value(tiny, option, value):
    options = {option: value}
    if option != "client_key" and option != "min_examples":
        options["client_key"] = "none"  # Partition options apply without a client key.
    with pytest.raises(ValueError) as excinfo:
        load_dataset(DATASET, data_dir=tiny.data_dir, **options)
    check_message(excinfo, DATASET, option, kind=ValueError)
    assert entries(ENTRY) == []


# ---------------------------------------------------------------------------
# The cache.


def test_cache_converts_once_per_files_and_options(tiny_copy, monkeypatch):
    data_dir, dataset_dir = tiny_copy
    calls = conversions(monkeypatch, tfds_module, "read_tfds")
    first = load_dataset(DATASET, data_dir=data_dir)
    assert len(calls) == 2  # The train and test splits.
    (entry,) = entries(ENTRY)
    again = load_dataset(DATASET, data_dir=data_dir)
    assert len(calls) == 2 and entries(ENTRY) == [entry]
    assert_same_dataset(again, first)
    load_dataset(DATASET, data_dir=data_dir, min_examples=2)
    assert len(calls) == 4 and len(entries(ENTRY)) == 2
    shard = sorted(dataset_dir.glob(f"{NAME}-train.array_record-*"))[0]
    newer = shard.stat().st_mtime_ns + 10**9
    os.utime(shard, ns=(newer, newer))
    load_dataset(DATASET, data_dir=data_dir)
    assert len(calls) == 6 and len(entries(ENTRY)) == 3
    assert_no_staging()
