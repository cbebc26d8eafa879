"""`fashion-mnist` with `partition=ditto`: the devices of Ditto's experiments (thesis Table 5.4).

The allocation is checked against the authors' `data/fmnist/create_dataset.py`
(litian96/ditto) written out again below with NumPy's global legacy
generator, as they ran it; the partition itself on Debian's Fashion-MNIST
(`/usr/share/datasets/fashion-mnist`), where it is installed.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from jaxfl.data import load_dataset
from jaxfl.data.datasets.images import (
    ditto_allocation,
    ditto_partition,
    ditto_split_sizes,
)

DEBIAN = Path("/usr/share/datasets/fashion-mnist")
needs_debian = pytest.mark.skipif(
    not DEBIAN.is_dir(), reason=f"{DEBIAN} is absent (apt-get install dataset-fashion-mnist)"
)


def authors_allocation(num_user=500):
    """The script's loop (its draws and arithmetic, verbatim), with its pools replaced by counts."""
    state = np.random.get_state()
    try:
        np.random.seed(233)
        num_samples = np.random.lognormal(3, 1, num_user) + 10
        num_samples = 60000 * num_samples / sum(num_samples)
        class_per_user = np.ones(num_user) * 5
        allocation = []
        for user in range(num_user):
            props = np.random.lognormal(1, 1, int(class_per_user[user]))
            props = props / sum(props)
            for j in range(int(class_per_user[user])):
                class_id = (user + j) % 10
                train_sample_this_class = int(props[j] * num_samples[user]) + 1
                test_sample_this_class = int(props[j] * num_samples[user] / 6) + 1
                allocation.append((user, class_id, train_sample_this_class, test_sample_this_class))
        return allocation
    finally:
        np.random.set_state(state)


def authors_rows(labels, allocation_counts, num_user):
    """The script's sequential draws from per-class pools, wrapping around (rows instead of images)."""
    pools = [np.where(labels == i)[0].tolist() for i in range(10)]
    idx = np.zeros(10, dtype=np.int64)
    rows = [[] for _ in range(num_user)]
    for user, class_id, count in allocation_counts:
        if idx[class_id] + count > len(pools[class_id]):
            idx[class_id] = 0
        rows[user] += pools[class_id][idx[class_id] : idx[class_id] + count]
        idx[class_id] += count
    return [np.asarray(r) for r in rows]


def test_allocation_is_the_authors_scripts():
    classes, train_counts, test_counts = ditto_allocation()
    reference = np.asarray(authors_allocation())
    assert classes.shape == train_counts.shape == test_counts.shape == (500, 5)
    np.testing.assert_array_equal(classes.ravel(), reference[:, 1])
    np.testing.assert_array_equal(train_counts.ravel(), reference[:, 2])
    np.testing.assert_array_equal(test_counts.ravel(), reference[:, 3])
    k = np.arange(500)[:, None]
    np.testing.assert_array_equal(classes, (k + np.arange(5)) % 10)
    assert train_counts.min() >= 1 and test_counts.min() >= 1
    # Sizes normalized to 60,000 before the truncations and the +1 per class.
    assert 60_000 - 2_500 < train_counts.sum() <= 60_000 + 2_500
    assert 60_000 / 6 - 2_500 < test_counts.sum() <= 60_000 / 6 + 2_500
    # Deterministic, whatever NumPy's global generator was doing.
    np.random.seed(1)
    again = ditto_allocation()
    for a, b in zip(again, (classes, train_counts, test_counts), strict=True):
        np.testing.assert_array_equal(a, b)


def test_pools_are_drawn_in_file_order_and_wrap_around():
    rng = np.random.default_rng(0)
    train_labels, test_labels = rng.integers(0, 10, 60_000), rng.integers(0, 10, 10_000)
    num_user = 500
    train_rows, test_rows = ditto_partition(train_labels, test_labels, num_user)
    allocation = authors_allocation(num_user)
    want_train = authors_rows(train_labels, [(u, c, n) for u, c, n, _ in allocation], num_user)
    want_test = authors_rows(test_labels, [(u, c, n) for u, c, _, n in allocation], num_user)
    for got, want in ((train_rows, want_train), (test_rows, want_test)):
        assert len(got) == num_user
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
    # The draws (+1 per class) exceed the splits: pools wrapped around.
    assert sum(r.size for r in train_rows) > 60_000 and sum(r.size for r in test_rows) > 10_000
    for rows in train_rows:
        assert np.unique(rows).size == rows.size  # Never twice in one device.


@pytest.mark.parametrize("size", [3, 4, 10, 31, 36, 100, 137, 1_000, 1_536])
def test_split_sizes_are_72_8_20(size):
    train, validation, test = ditto_split_sizes(size)
    assert train + validation + test == size and min(train, validation, test) >= 1
    assert abs(validation - 0.08 * size) <= 0.5 or validation == 1
    assert abs(test - 0.2 * size) <= 0.5 or test == 1
    with pytest.raises(ValueError):
        ditto_split_sizes(2)


@pytest.mark.parametrize("option", [{"test": "held-out"}, {"num_test_clients": 7}, {"test_fraction": 0.3}])
def test_test_split_options_do_not_apply(option):
    with pytest.raises(ValueError, match="does not apply to partition='ditto'"):
        load_dataset("fashion-mnist", partition="ditto", **option)


# ---------------------------------------------------------------------------
# Debian's Fashion-MNIST.


def read_idx_gz(path, header):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), np.uint8, offset=header)


@pytest.fixture(scope="module")
def ditto(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JAXFL_CACHE_DIR", str(tmp_path_factory.mktemp("ditto-cache")))
        yield load_dataset("fashion-mnist", partition="ditto")


@pytest.fixture(scope="module")
def raw():
    train_x = read_idx_gz(DEBIAN / "train-images-idx3-ubyte.gz", 16).reshape(60_000, 784)
    test_x = read_idx_gz(DEBIAN / "t10k-images-idx3-ubyte.gz", 16).reshape(10_000, 784)
    train_y = read_idx_gz(DEBIAN / "train-labels-idx1-ubyte.gz", 8).astype(np.int32)
    test_y = read_idx_gz(DEBIAN / "t10k-labels-idx1-ubyte.gz", 8).astype(np.int32)
    return train_x, train_y, test_x, test_y


def device(data, k):
    """Device k's examples in its three populations."""
    return {name: getattr(data, name).client(k) for name in ("train", "validation", "test")}


@needs_debian
def test_ditto_partition_shape(ditto):
    assert ditto.personal_splits and ditto.validation is not None
    assert ditto.num_classes == 10 and ditto.input_shape == (28, 28, 1)
    for population in (ditto.train, ditto.validation, ditto.test):
        assert population.num_clients == 500
    assert ditto.train.client_names()[:2] == ["f_00000", "f_00001"]
    assert ditto.test.client_names() == ditto.train.client_names() == ditto.validation.client_names()
    _, train_counts, test_counts = ditto_allocation()
    sizes = train_counts.sum(1) + test_counts.sum(1)
    counts = np.stack([np.asarray(p.counts) for p in (ditto.train, ditto.validation, ditto.test)], 1)
    np.testing.assert_array_equal(counts, [ditto_split_sizes(int(n)) for n in sizes])
    shares = counts.sum(0) / counts.sum()
    np.testing.assert_allclose(shares, [0.72, 0.08, 0.20], atol=0.005)
    assert "Ditto's partition" in ditto.description


@needs_debian
def test_every_device_has_its_five_classes(ditto):
    classes, train_counts, test_counts = ditto_allocation()
    for k in range(500):
        parts = device(ditto, k)
        labels = np.concatenate([p["y"] for p in parts.values()])
        assert labels.dtype == np.int32
        assert sorted(np.unique(labels).tolist()) == sorted(classes[k].tolist()), k
        # Per class, the device holds its training plus test draws.
        np.testing.assert_array_equal(
            np.bincount(labels, minlength=10)[classes[k]], train_counts[k] + test_counts[k]
        )


@needs_debian
def test_inputs_are_z_scored_rows_of_the_devices_draws(ditto, raw):
    train_x, train_y, test_x, test_y = raw
    flat = train_x.astype(np.float32)
    mean, std = np.mean(flat, 0), np.std(flat, 0)
    train_rows, test_rows = ditto_partition(train_y, test_y)
    for k in (0, 1, 137, 499):
        z = np.concatenate([(train_x[train_rows[k]] - mean) / (std + np.float32(0.001)),
                            (test_x[test_rows[k]] - mean) / (std + np.float32(0.001))]).astype(np.float32)
        y = np.concatenate([train_y[train_rows[k]], test_y[test_rows[k]]])
        parts = device(ditto, k)
        x_got = np.concatenate([p["x"].reshape(len(p["x"]), 784) for p in parts.values()])
        y_got = np.concatenate([p["y"] for p in parts.values()])
        assert x_got.dtype == np.float32

        def records(x, labels):
            table = np.concatenate([x.view(np.uint32), labels.astype(np.uint32)[:, None]], axis=1)
            return np.sort(np.ascontiguousarray(table).view(np.dtype((np.void, 785 * 4)))[:, 0])

        assert np.array_equal(records(x_got, y_got), records(z, y)), k
    x = np.asarray(ditto.train.features["x"])
    assert abs(float(x.mean())) < 0.05 and 0.9 < float(x.std()) < 1.1


@needs_debian
@pytest.mark.slow
def test_conversion_is_deterministic_and_seed_moves_only_the_split(ditto, tmp_path, monkeypatch):
    monkeypatch.setenv("JAXFL_CACHE_DIR", str(tmp_path / "again"))
    again = load_dataset("fashion-mnist", partition="ditto")
    for name in ("train", "validation", "test"):
        a, b = getattr(ditto, name), getattr(again, name)
        np.testing.assert_array_equal(np.asarray(a.counts), np.asarray(b.counts))
        np.testing.assert_array_equal(np.asarray(a.features["y"]), np.asarray(b.features["y"]))
        np.testing.assert_array_equal(np.asarray(a.features["x"]), np.asarray(b.features["x"]))
    other = load_dataset("fashion-mnist", partition="ditto", seed=1)
    np.testing.assert_array_equal(np.asarray(other.test.counts), np.asarray(ditto.test.counts))
    assert not np.array_equal(np.asarray(other.test.features["y"]), np.asarray(ditto.test.features["y"]))
    for k in (0, 250):
        labels = [np.sort(np.concatenate([p["y"] for p in device(d, k).values()])) for d in (ditto, other)]
        np.testing.assert_array_equal(*labels)
