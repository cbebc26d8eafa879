"""`fashion-mnist`, `mnist`, `cifar10`, `cifar100`: centralized images dealt over clients, end to end.

IDX and CIFAR files are written by `tests/data/writers.py` in `tmp_path`
with distinct random images, so every example a loader returns can be
traced back to the row it came from: the tests check that a partition covers
the split exactly once, with each image's own label. CIFAR-100 from TFF's
files keeps TFF's clients. Fashion-MNIST is also read from Debian's
`/usr/share/datasets/fashion-mnist` where it is installed.
"""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from data.datasets.checks import (
    assert_no_staging,
    assert_same_dataset,
    check_message,
    clients_of,
    conversions,
    entries,
)
from data.writers import (
    cifar100_like,
    cifar_images,
    compress_lzma,
    encode_example,
    examples_of,
    make_tar_gz,
    truncated_copy,
    write_cifar10_binary,
    write_cifar10_python,
    write_cifar100_python,
    write_idx,
    write_tff_hdf5,
    write_tff_sqlite,
)

from jaxfl.data import dataset_options, load_dataset
from jaxfl.data.datasets import images as images_module
from jaxfl.data.datasets.centralized import PARTITION_DEFAULTS
from jaxfl.data.errors import DataFileError, MissingDataError

DEBIAN = Path("/usr/share/datasets/fashion-mnist")
IDX = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def make_split(rng, n, shape, classes):
    return rng.integers(0, 256, (n, *shape)).astype(np.uint8), rng.integers(0, classes, n).astype(np.uint8)


def write_mnist_like(directory, seed=0, n_train=200, n_test=50):
    rng = np.random.default_rng(seed)
    train, test = make_split(rng, n_train, (28, 28), 10), make_split(rng, n_test, (28, 28), 10)
    directory.mkdir(parents=True, exist_ok=True)
    for split, (images, labels) in (("train", train), ("test", test)):
        write_idx(directory / IDX[f"{split}_images"], images)
        write_idx(directory / IDX[f"{split}_labels"], labels)
    return train, test


def trace(population, images, labels):
    """Per client, the row of `images` each example is; checks pixels (x = image / 255) and labels."""
    index = {row.tobytes(): i for i, row in enumerate(images)}
    assert len(index) == len(images)  # Distinct images: rows can be traced.
    rows = {}
    for name, client in clients_of(population).items():
        x = client["x"]
        assert x.dtype == np.float32 and x.shape[1:] == images.shape[1:3] + (x.shape[-1],)
        pixels = np.rint(x * 255).astype(np.uint8).reshape(len(x), *images.shape[1:])
        found = np.array([index[p.tobytes()] for p in pixels])
        want = images[found].astype(np.float32) / np.float32(255)
        np.testing.assert_array_equal(x, want.reshape(x.shape))
        np.testing.assert_array_equal(client["y"], labels[found].astype(np.int32))
        assert client["y"].dtype == np.int32
        rows[name] = found
    return rows


def assert_covers_once(rows, n):
    every = np.concatenate(list(rows.values()))
    assert every.size == n and np.array_equal(np.sort(every), np.arange(n))


# ---------------------------------------------------------------------------
# MNIST, Fashion-MNIST (IDX files).


@pytest.mark.parametrize("dataset", ["mnist", "fashion-mnist"])
def test_idx_round_trip_default_dirichlet(tmp_path, dataset):
    train, test = write_mnist_like(tmp_path)
    data = load_dataset(dataset, data_dir=tmp_path, num_clients=5, num_test_clients=3)
    assert data.num_classes == 10 and data.input_shape == (28, 28, 1)
    assert data.train.num_clients == 5 and data.test.num_clients == 3
    assert data.train.client_names() == [f"train_{i}" for i in range(5)]
    assert int(data.train.counts.min()) >= 10  # min_size
    assert_covers_once(trace(data.train, *train), 200)
    # test="unseen": the official test split over new clients, each example once.
    assert_covers_once(trace(data.test, *test), 50)


@pytest.mark.parametrize("partition", ["iid", "shards", "lognormal", "dirichlet-mixture", "dirichlet"])
def test_every_partition_covers_the_training_split_once(tmp_path, partition):
    train, test = write_mnist_like(tmp_path, seed=1)
    data = load_dataset("mnist", data_dir=tmp_path, partition=partition, num_clients=7, num_test_clients=3,
                        min_size=5)
    assert_covers_once(trace(data.train, *train), 200)
    assert_covers_once(trace(data.test, *test), 50)
    assert data.train.num_clients <= 7
    if partition in ("iid", "dirichlet-mixture"):
        assert int(data.train.counts.max()) - int(data.train.counts.min()) <= 1


def test_shards_give_each_client_few_labels(tmp_path):
    train, _ = write_mnist_like(tmp_path, seed=2)
    data = load_dataset("mnist", data_dir=tmp_path, partition="shards", shards_per_client=1, num_clients=10,
                        num_test_clients=5)
    for client in clients_of(data.train).values():
        assert len(np.unique(client["y"])) <= 2  # One sorted shard: one label, or two at a boundary.


def test_held_out_test_clients_are_the_training_clients(tmp_path):
    train, test = write_mnist_like(tmp_path, seed=3)
    data = load_dataset("mnist", data_dir=tmp_path, num_clients=6, test="held-out", test_fraction=0.25)
    kept, held = trace(data.train, *train), trace(data.test, *train)
    # Training and test examples are the training split, each once; the official test split is unused.
    assert_covers_once({**kept, **held}, 200)
    test_index = {row.tobytes() for row in test[0]}
    assert not any((np.rint(x * 255).astype(np.uint8)[..., 0].tobytes() in test_index)
                   for x in data.test.features["x"])
    assert data.test.client_names() == [f"test_{i}" for i in range(6)]
    for i in range(6):
        n = kept[f"train_{i}"].size + held[f"test_{i}"].size
        assert held[f"test_{i}"].size == min(max(int(np.floor(0.25 * n + 0.5)), 1), n - 1)


def test_num_clients_and_seed(tmp_path):
    write_mnist_like(tmp_path, seed=4)
    options = {"partition": "iid", "num_test_clients": 5}
    a = load_dataset("mnist", data_dir=tmp_path, num_clients=4, seed=1, **options)
    b = load_dataset("mnist", data_dir=tmp_path, num_clients=4, seed=1, **options)
    c = load_dataset("mnist", data_dir=tmp_path, num_clients=4, seed=2, **options)
    d = load_dataset("mnist", data_dir=tmp_path, num_clients=8, seed=1, **options)
    assert_same_dataset(a, b)
    assert not np.array_equal(a.train.features["y"], c.train.features["y"])
    assert a.train.num_clients == 4 and d.train.num_clients == 8
    assert len(entries("mnist")) == 3


@pytest.mark.parametrize("loader", [images_module.mnist, images_module.cifar10, images_module.cifar100,
                                    images_module.fashion_mnist])
def test_the_partition_keywords_are_declared_once_and_checked(tmp_path, loader):
    # `**partition: Unpack[PartitionOptions]`: a misspelt keyword is refused before files are read,
    # and the registry lists every partition option with its default.
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['num_client'\]"):
        loader(data_dir=tmp_path, num_client=4)
    name = {"fashion_mnist": "fashion-mnist"}.get(loader.__name__, loader.__name__)
    options = dataset_options(name)
    expected = {**PARTITION_DEFAULTS, **({"num_clients": None} if name == "fashion-mnist" else {})}
    assert {key: options[key] for key in PARTITION_DEFAULTS} == expected


def test_a_loader_may_take_no_other_kwargs(monkeypatch):
    # A bare `**kwargs` would hide a loader's options from `dataset_options` and `--dataset-option`.
    from jaxfl.data.registry import DATASETS, DatasetSpec

    def loader(*, seed: int = 0, **kwargs):
        raise AssertionError("not called")

    monkeypatch.setitem(DATASETS, "bare-kwargs", DatasetSpec(generator=loader, summary="test"))
    with pytest.raises(AssertionError, match=r"\*\*kwargs lists no options"):
        dataset_options("bare-kwargs")


def test_files_may_be_gzipped_and_in_a_subdirectory(tmp_path):
    train, _ = write_mnist_like(tmp_path / "raw", seed=5)
    for name in IDX.values():
        (tmp_path / "gz").mkdir(exist_ok=True)
        (tmp_path / "gz" / "mnist").mkdir(exist_ok=True)
        # Names that are not the published ones: no checksum applies.
        (tmp_path / "gz" / "mnist" / name).write_bytes(gzip.compress((tmp_path / "raw" / name).read_bytes()))
    options = {"num_clients": 3, "num_test_clients": 3, "partition": "iid"}
    assert_same_dataset(load_dataset("mnist", data_dir=tmp_path / "gz", **options),
                        load_dataset("mnist", data_dir=tmp_path / "raw", **options))


# ---------------------------------------------------------------------------
# CIFAR-10 / CIFAR-100.


def test_cifar10_python_and_binary_versions(tmp_path):
    rng = np.random.default_rng(0)
    train = (cifar_images(rng, 60), rng.integers(0, 10, 60))
    test = (cifar_images(rng, 20), rng.integers(0, 10, 20))
    write_cifar10_python(tmp_path / "py", train, test)
    write_cifar10_binary(tmp_path / "bin", train, test)
    options = {"num_clients": 4, "num_test_clients": 2, "min_size": 5}
    data = load_dataset("cifar10", data_dir=tmp_path / "py", **options)
    assert data.num_classes == 10 and data.input_shape == (32, 32, 3)
    assert_covers_once(trace(data.train, *train), 60)
    assert_covers_once(trace(data.test, *test), 20)
    assert_same_dataset(load_dataset("cifar10", data_dir=tmp_path / "bin", **options), data)


@pytest.mark.parametrize("label, classes", [("fine", 100), ("coarse", 20)])
def test_cifar100_partitioned(tmp_path, label, classes):
    rng = np.random.default_rng(1)
    train = (cifar_images(rng, 60), rng.integers(0, 100, 60), rng.integers(0, 20, 60))
    test = (cifar_images(rng, 20), rng.integers(0, 100, 20), rng.integers(0, 20, 20))
    write_cifar100_python(tmp_path, train, test)
    column = 1 if label == "fine" else 2
    data = load_dataset("cifar100", data_dir=tmp_path, label=label, partition="iid", num_clients=3,
                        num_test_clients=2)
    assert data.num_classes == classes
    assert_covers_once(trace(data.train, train[0], train[column]), 60)
    assert_covers_once(trace(data.test, test[0], test[column]), 20)


def write_tff_cifar100(directory, fmt, train, test):
    directory.mkdir(parents=True, exist_ok=True)
    if fmt == "tff-hdf5":
        write_tff_hdf5(directory / "fed_cifar100_train.h5", train)
        write_tff_hdf5(directory / "fed_cifar100_test.h5", test, label_unit_dim=True)
        return directory / "fed_cifar100_train.h5"

    def blobs(clients):
        return {cid: [encode_example(e) for e in examples_of(arrays)] for cid, arrays in clients.items()}

    path = write_tff_sqlite(directory / "cifar100.sqlite", {"train": blobs(train), "test": blobs(test)})
    if fmt == "tff-sqlite-lzma":
        compressed = compress_lzma(path)
        path.unlink()
        return compressed
    return path


@pytest.mark.parametrize("fmt", ["tff-hdf5", "tff-sqlite", "tff-sqlite-lzma"])
def test_cifar100_from_tff_keeps_tffs_clients(tmp_path, fmt):
    rng = np.random.default_rng(2)
    train = cifar100_like(rng, [3, 5, 2, 4])
    test = {str(10 + int(k)): v for k, v in cifar100_like(rng, [2, 3]).items()}
    write_tff_cifar100(tmp_path, fmt, train, test)
    for label, key, classes in (("fine", "label", 100), ("coarse", "coarse_label", 20)):
        # Partition options do not apply to TFF's own clients.
        data = load_dataset("cifar100", data_dir=tmp_path, label=label, num_clients=2, partition="iid")
        assert data.num_classes == classes and data.input_shape == (32, 32, 3)
        for population, clients in ((data.train, train), (data.test, test)):
            assert population.client_names() == sorted(clients)
            for name, got in clients_of(population).items():
                want = clients[name]
                np.testing.assert_array_equal(got["x"], want["image"].astype(np.float32) / np.float32(255))
                np.testing.assert_array_equal(got["y"], want[key].astype(np.int32))
                assert got["x"].dtype == np.float32 and got["y"].dtype == np.int32


# ---------------------------------------------------------------------------
# Built in: Debian's Fashion-MNIST.


def read_idx_gz(path, header):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), np.uint8, offset=header)


@pytest.mark.skipif(not DEBIAN.is_dir(), reason=f"{DEBIAN} is absent (apt-get install dataset-fashion-mnist)")
def test_debian_fashion_mnist_default_partition():
    data = load_dataset("fashion-mnist")
    assert data.num_classes == 10 and data.input_shape == (28, 28, 1)
    assert data.train.num_clients == 100 and data.test.num_clients == 100
    assert data.train.num_examples == 60_000 and data.test.num_examples == 10_000
    labels = read_idx_gz(DEBIAN / "train-labels-idx1-ubyte.gz", 8).astype(np.int32)
    images = read_idx_gz(DEBIAN / "train-images-idx3-ubyte.gz", 16).reshape(60_000, 784)
    x = np.asarray(data.train.features["x"]).reshape(60_000, 784)
    assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0 and x.dtype == np.float32
    y = np.asarray(data.train.features["y"])
    assert sorted(np.unique(y).tolist()) == list(range(10))
    # Covered exactly once: the multiset of (image, label) rows is the training split's.
    def records(pixels, classes):
        table = np.concatenate([pixels, classes.astype(np.uint8)[:, None]], axis=1)
        return np.sort(np.ascontiguousarray(table).view(np.dtype((np.void, 785)))[:, 0])

    got = records(np.rint(x * 255).astype(np.uint8), y)
    assert np.array_equal(got, records(images, labels))
    np.testing.assert_array_equal(np.bincount(y, minlength=10), np.full(10, 6000))


def test_fashion_mnist_without_files(tmp_path, monkeypatch):
    monkeypatch.setattr(images_module, "DEBIAN_FASHION_MNIST", str(tmp_path / "absent"))
    with pytest.raises(MissingDataError) as excinfo:
        load_dataset("fashion-mnist")
    check_message(excinfo, "fashion-mnist", "train-images-idx3-ubyte", kind=MissingDataError)


# ---------------------------------------------------------------------------
# Errors.


@pytest.mark.parametrize("dataset", ["mnist", "fashion-mnist", "cifar10", "cifar100"])
def test_empty_or_missing_data_dir(tmp_path, dataset):
    with pytest.raises(MissingDataError) as excinfo:
        load_dataset(dataset, data_dir=tmp_path)
    check_message(excinfo, dataset, tmp_path, kind=MissingDataError)
    with pytest.raises(MissingDataError) as excinfo:
        load_dataset(dataset, data_dir=tmp_path / "nowhere")
    check_message(excinfo, dataset, "does not exist", kind=MissingDataError)


@pytest.mark.parametrize("dataset", ["mnist", "cifar10", "cifar100"])
def test_no_data_dir(dataset):
    with pytest.raises(MissingDataError) as excinfo:
        load_dataset(dataset)
    check_message(excinfo, dataset, "--data-dir", kind=MissingDataError)


@pytest.mark.parametrize("which", list(IDX))
def test_truncated_idx_file_fails_and_leaves_no_cache_entry(tmp_path, which):
    write_mnist_like(tmp_path / "data")
    path = tmp_path / "data" / IDX[which]
    path.write_bytes(truncated_copy(path, 0.7).read_bytes())
    with pytest.raises(DataFileError) as excinfo:
        load_dataset("mnist", data_dir=tmp_path / "data", num_clients=4, num_test_clients=4)
    check_message(excinfo, "mnist", path)
    assert entries("mnist") == []
    assert_no_staging()
    write_mnist_like(tmp_path / "data")
    assert load_dataset("mnist", data_dir=tmp_path / "data", num_clients=4,
                        num_test_clients=4).train.num_examples == 200
    assert len(entries("mnist")) == 1


def test_idx_file_of_another_format(tmp_path):
    write_mnist_like(tmp_path)
    path = tmp_path / IDX["train_labels"]
    path.write_text("0,1,2,3\n")
    with pytest.raises(DataFileError) as excinfo:
        load_dataset("mnist", data_dir=tmp_path)
    check_message(excinfo, "mnist", path)
    assert_no_staging()


def test_images_and_labels_that_do_not_match(tmp_path):
    write_mnist_like(tmp_path)
    write_idx(tmp_path / IDX["test_labels"], np.zeros(49, np.uint8))
    with pytest.raises(DataFileError) as excinfo:
        load_dataset("mnist", data_dir=tmp_path)
    check_message(excinfo, "mnist", IDX["test_images"], IDX["test_labels"], "50 images", "49 labels")
    assert entries("mnist") == []
    assert_no_staging()


def test_published_file_name_with_other_content(tmp_path):
    write_mnist_like(tmp_path)
    for name in IDX.values():
        (tmp_path / f"{name}.gz").write_bytes(gzip.compress((tmp_path / name).read_bytes()))
    with pytest.raises(DataFileError) as excinfo:
        load_dataset("fashion-mnist", data_dir=tmp_path)
    check_message(excinfo, "fashion-mnist", "train-images-idx3-ubyte.gz", "sha256", "published checksum")
    assert_no_staging()


def test_truncated_or_foreign_cifar_files(tmp_path):
    rng = np.random.default_rng(3)
    train = (cifar_images(rng, 30), rng.integers(0, 10, 30))
    test = (cifar_images(rng, 10), rng.integers(0, 10, 10))
    root = write_cifar10_python(tmp_path / "py", train, test)
    batch = root / "data_batch_2"
    batch.write_bytes(truncated_copy(batch, 0.5).read_bytes())
    shutil.rmtree(root / "cut")
    with pytest.raises(DataFileError) as excinfo:
        load_dataset("cifar10", data_dir=tmp_path / "py", num_clients=3)
    check_message(excinfo, "cifar10", "data_batch_2")
    assert entries("cifar10") == []
    assert_no_staging()
    # An archive under the published name with other content.
    root = write_cifar10_python(tmp_path / "tar", train, test)
    archive = make_tar_gz(root, tmp_path / "tar" / "cifar-10-python.tar.gz")
    shutil.rmtree(root)
    with pytest.raises(DataFileError) as excinfo:
        load_dataset("cifar10", data_dir=tmp_path / "tar", num_clients=3)
    check_message(excinfo, "cifar10", archive, "sha256")
    # TFF's CIFAR-100 file, truncated.
    tff = write_tff_cifar100(tmp_path / "tff", "tff-hdf5", cifar100_like(rng, [2, 2]),
                             cifar100_like(rng, [1]))
    tff.write_bytes(truncated_copy(tff, 0.5).read_bytes())
    with pytest.raises(DataFileError) as excinfo:
        load_dataset("cifar100", data_dir=tmp_path / "tff")
    check_message(excinfo, "cifar100", tff)


@pytest.mark.parametrize(
    "option, value",
    [
        ("partition", "by-writer"),
        ("test", "seen"),
        ("num_clients", 0),
        ("num_test_clients", -1),
        ("test_fraction", 1.0),
        ("seed", -1),
        ("alpha", 0.0),
        ("min_size", 41),
        ("num_clients", 201),
        ("num_test_clients", 51),
    ],
)
def test_bad_option_value(tmp_path, option, value):
    write_mnist_like(tmp_path)
    options = {"num_clients": 5, "num_test_clients": 5, option: value}
    with pytest.raises(ValueError) as excinfo:
        load_dataset("mnist", data_dir=tmp_path, **options)
    check_message(excinfo, "mnist", option, kind=ValueError)
    assert entries("mnist") == []
    assert_no_staging()


def test_cifar100_bad_label(tmp_path):
    with pytest.raises(ValueError) as excinfo:
        load_dataset("cifar100", data_dir=tmp_path, label="superclass")
    check_message(excinfo, "cifar100", "label", "'superclass'", kind=ValueError)


# ---------------------------------------------------------------------------
# The cache.


def test_cache_converts_once_per_files_and_options(tmp_path, monkeypatch):
    write_mnist_like(tmp_path)
    calls = conversions(monkeypatch, images_module, "write_partitioned")
    first = load_dataset("fashion-mnist", data_dir=tmp_path, num_clients=5, num_test_clients=2)
    (entry,) = entries("fashion-mnist")
    again = load_dataset("fashion-mnist", data_dir=tmp_path, num_clients=5, num_test_clients=2)
    assert len(calls) == 1 and entries("fashion-mnist") == [entry]
    assert_same_dataset(again, first)
    load_dataset("fashion-mnist", data_dir=tmp_path, num_clients=5, num_test_clients=2, alpha=0.1)
    assert len(calls) == 2 and len(entries("fashion-mnist")) == 2
    path = tmp_path / IDX["test_labels"]
    newer = path.stat().st_mtime_ns + 10**9
    os.utime(path, ns=(newer, newer))
    load_dataset("fashion-mnist", data_dir=tmp_path, num_clients=5, num_test_clients=2)
    assert len(calls) == 3 and len(entries("fashion-mnist")) == 3
    # MNIST and Fashion-MNIST from the same files are two datasets.
    load_dataset("mnist", data_dir=tmp_path, num_clients=5, num_test_clients=2)
    assert len(calls) == 4 and len(entries("mnist")) == 1
    assert_no_staging()


def test_missing_fashion_mnist_says_how_to_install_it(tmp_path, monkeypatch):
    images = images_module
    empty = tmp_path / "fashion-mnist"
    empty.mkdir()
    monkeypatch.setattr(images, "DEBIAN_FASHION_MNIST", str(empty))
    with pytest.raises(MissingDataError, match="apt-get install dataset-fashion-mnist, or --data-dir"):
        images._find_idx("fashion-mnist", None, [str(empty)])
    # A directory of the user's own: where to read about the files, not a package to install.
    with pytest.raises(MissingDataError, match="see docs/datasets.md") as excinfo:
        images._find_idx("fashion-mnist", empty, [str(empty)])
    assert "apt-get" not in str(excinfo.value)
