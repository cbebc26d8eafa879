"""`read_cifar`: CIFAR-10/100 python pickles, binary records and archives, against independent writers."""

import pickle

import numpy as np
import pytest
from data.writers import (
    check_error,
    cifar_images,
    make_tar_gz,
    malicious_pickle,
    python2_pickle,
    truncated_copy,
    write_cifar10_binary,
    write_cifar10_python,
    write_cifar100_binary,
    write_cifar100_python,
)

from jaxfl.data.errors import DataFileError, MissingDataError
from jaxfl.data.formats import read_cifar

CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def cifar10_data(seed=0, n_train=12, n_test=4):
    rng = np.random.default_rng(seed)
    return (
        (cifar_images(rng, n_train), rng.integers(0, 10, n_train)),
        (cifar_images(rng, n_test), rng.integers(0, 10, n_test)),
    )


def cifar100_data(seed=0, n_train=6, n_test=3):
    rng = np.random.default_rng(seed)
    return tuple(
        (cifar_images(rng, n), rng.integers(0, 100, n), rng.integers(0, 20, n)) for n in (n_train, n_test)
    )


def assert_cifar10(data, train, test, names=CIFAR10_NAMES):
    assert data.name == "cifar10" and data.num_classes == 10
    assert data.train_images.dtype == np.uint8 and data.train_images.shape == (len(train[0]), 32, 32, 3)
    assert data.train_images.flags.c_contiguous
    np.testing.assert_array_equal(data.train_images, train[0])
    np.testing.assert_array_equal(data.train_labels, train[1])
    np.testing.assert_array_equal(data.test_images, test[0])
    np.testing.assert_array_equal(data.test_labels, test[1])
    assert data.train_labels.dtype == np.int64
    assert data.label_names == names
    assert data.train_coarse_labels is None


def test_hwc_layout_from_rgb_planes(tmp_path):
    # One image whose red plane is 1, green 2, blue 3: every pixel must read (1, 2, 3).
    image = np.zeros((1, 32, 32, 3), np.uint8) + np.array([1, 2, 3], np.uint8)
    root = write_cifar10_python(tmp_path, (np.repeat(image, 5, axis=0), np.arange(5)), (image, np.array([9])))
    assert python2_pickle({b"data": np.zeros((1, 3072), np.uint8)}).count(b"numpy.core.multiarray") == 1
    data = read_cifar(root)
    assert (data.test_images[0] == [1, 2, 3]).all()


@pytest.mark.parametrize(
    "encode",
    [python2_pickle, lambda d: pickle.dumps(d, protocol=2), lambda d: pickle.dumps(d, protocol=5)],
    ids=["python2-layout", "python3-protocol-2", "python3-protocol-5"],
)
def test_cifar10_python_round_trip(tmp_path, encode):
    train, test = cifar10_data()
    root = write_cifar10_python(tmp_path, train, test, encode=encode)
    assert_cifar10(read_cifar(root), train, test)
    # The parent directory works too (e.g. Keras' ~/.keras/datasets).
    assert_cifar10(read_cifar(tmp_path), train, test)


def test_cifar10_without_meta_has_no_names(tmp_path):
    train, test = cifar10_data(1)
    root = write_cifar10_python(tmp_path, train, test, meta=False)
    assert_cifar10(read_cifar(root), train, test, names=None)


def test_cifar10_binary_round_trip(tmp_path):
    train, test = cifar10_data(2)
    assert_cifar10(read_cifar(write_cifar10_binary(tmp_path, train, test)), train, test)


@pytest.mark.parametrize("writer", [write_cifar100_python, write_cifar100_binary], ids=["python", "binary"])
def test_cifar100_fine_and_coarse(tmp_path, writer):
    train, test = cifar100_data(3)
    root = writer(tmp_path, train, test)
    fine = read_cifar(root)
    assert fine.name == "cifar100" and fine.num_classes == 100 and fine.label == "fine"
    np.testing.assert_array_equal(fine.train_images, train[0])
    np.testing.assert_array_equal(fine.train_labels, train[1])
    np.testing.assert_array_equal(fine.test_labels, test[1])
    np.testing.assert_array_equal(fine.train_coarse_labels, train[2])
    np.testing.assert_array_equal(fine.test_coarse_labels, test[2])
    assert fine.label_names == [f"fine_{i}" for i in range(100)]
    assert fine.coarse_label_names == [f"coarse_{i}" for i in range(20)]
    coarse = read_cifar(root, label="coarse")
    assert coarse.num_classes == 20 and coarse.label_names == fine.coarse_label_names
    np.testing.assert_array_equal(coarse.train_labels, train[2])


@pytest.mark.parametrize(
    "writer, archive",
    [(write_cifar10_python, "cifar-10-python.tar.gz"), (write_cifar10_binary, "cifar-10-binary.tar.gz")],
    ids=["python", "binary"],
)
def test_cifar10_archive_is_read_without_extracting(tmp_path, writer, archive):
    train, test = cifar10_data(4)
    root = writer(tmp_path / "src", train, test)
    path = make_tar_gz(root, tmp_path / archive)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert_cifar10(read_cifar(path), train, test)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_cifar100_archive(tmp_path):
    train, test = cifar100_data(5)
    path = make_tar_gz(
        write_cifar100_python(tmp_path / "src", train, test), tmp_path / "cifar-100-python.tar.gz"
    )
    data = read_cifar(path, label="coarse")
    np.testing.assert_array_equal(data.test_labels, test[2])


def test_refuses_pickles_that_would_run_code(tmp_path):
    train, test = cifar10_data(6)
    root = write_cifar10_python(tmp_path, train, test)
    marker = tmp_path / "pwned"
    (root / "data_batch_3").write_bytes(malicious_pickle(marker))
    with pytest.raises(DataFileError) as excinfo:
        read_cifar(root)
    check_error(excinfo, "data_batch_3", "refused to load global os.system")
    assert not marker.exists()


def test_truncated_pickle(tmp_path):
    train, test = cifar10_data(7)
    root = write_cifar10_python(tmp_path, train, test)
    (root / "test_batch").write_bytes((root / "test_batch").read_bytes()[:5000])
    with pytest.raises(DataFileError) as excinfo:
        read_cifar(root)
    check_error(excinfo, "test_batch")


def test_pickle_of_the_wrong_content(tmp_path):
    train, test = cifar10_data(8)
    root = write_cifar10_python(tmp_path, train, test)
    (root / "data_batch_1").write_bytes(
        pickle.dumps({b"data": np.zeros((2, 10), np.uint8), b"labels": [0, 1]})
    )
    with pytest.raises(DataFileError) as excinfo:
        read_cifar(root)
    check_error(excinfo, "data_batch_1", "'data' is not a uint8 array")
    (root / "data_batch_1").write_bytes(
        pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]})
    )
    with pytest.raises(DataFileError) as excinfo:
        read_cifar(root)
    check_error(excinfo, "data_batch_1", "outside 0..9")


def test_truncated_binary_batch(tmp_path):
    train, test = cifar10_data(9)
    root = write_cifar10_binary(tmp_path, train, test)
    cut = truncated_copy(root / "test_batch.bin", fraction=0.3)
    cut.replace(root / "test_batch.bin")
    with pytest.raises(DataFileError) as excinfo:
        read_cifar(root)
    check_error(excinfo, "test_batch.bin", "not a whole number of 3073-byte records")


def test_truncated_archive(tmp_path):
    train, test = cifar10_data(10)
    path = make_tar_gz(
        write_cifar10_python(tmp_path / "src", train, test), tmp_path / "cifar-10-python.tar.gz"
    )
    cut = truncated_copy(path)
    with pytest.raises(DataFileError) as excinfo:
        read_cifar(cut)
    check_error(excinfo, cut)


def test_archive_that_is_not_a_tar(tmp_path):
    path = tmp_path / "cifar-10-python.tar.gz"
    path.write_bytes(b"<html>not found</html>")
    with pytest.raises(DataFileError) as excinfo:
        read_cifar(path)
    check_error(excinfo, path, "not a readable tar archive")


def test_missing_batch_and_missing_path(tmp_path):
    train, test = cifar10_data(11)
    root = write_cifar10_python(tmp_path, train, test)
    (root / "data_batch_4").unlink()
    with pytest.raises(MissingDataError) as excinfo:
        read_cifar(root)
    check_error(excinfo, "data_batch_4", "missing")
    with pytest.raises(MissingDataError) as excinfo:
        read_cifar(tmp_path / "cifar-10-python.tar.gz")
    check_error(excinfo, "cifar-10-python.tar.gz", "no such file")
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingDataError) as excinfo:
        read_cifar(tmp_path / "empty")
    check_error(excinfo, "empty", "no CIFAR data")


def test_coarse_labels_of_cifar10_and_bad_label_option(tmp_path):
    train, test = cifar10_data(12)
    root = write_cifar10_binary(tmp_path, train, test)
    with pytest.raises(DataFileError, match="no coarse labels"):
        read_cifar(root, label="coarse")
    with pytest.raises(ValueError, match="label must be"):
        read_cifar(root, label="superclass")
