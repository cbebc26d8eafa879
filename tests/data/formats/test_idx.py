"""`read_idx`: MNIST-style IDX files, raw and gzipped, against an independent writer."""

import gzip
from pathlib import Path

import numpy as np
import pytest
from data.writers import check_error, idx_bytes, truncated_copy, write_idx

from jaxfl.data.errors import DataFileError, MissingDataError
from jaxfl.data.formats import read_idx

DEBIAN_FMNIST = Path("/usr/share/datasets/fashion-mnist")


@pytest.mark.parametrize("gz", [True, False], ids=["gz", "raw"])
def test_images_and_labels_round_trip(tmp_path, gz):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (7, 28, 28)).astype(np.uint8)
    labels = rng.integers(0, 10, 7).astype(np.uint8)
    suffix = ".gz" if gz else ""
    got_images = read_idx(write_idx(tmp_path / f"train-images-idx3-ubyte{suffix}", images, gz=gz))
    got_labels = read_idx(write_idx(tmp_path / f"train-labels-idx1-ubyte{suffix}", labels, gz=gz))
    assert got_images.dtype == np.uint8 and got_images.shape == (7, 28, 28)
    np.testing.assert_array_equal(got_images, images)
    np.testing.assert_array_equal(got_labels, labels)
    assert got_images.flags.writeable


@pytest.mark.parametrize("dtype", ["i1", "i2", "i4", "f4", "f8"])
def test_other_value_types_come_back_native_endian(tmp_path, dtype):
    values = (np.arange(24).reshape(2, 3, 4) - 11).astype(dtype)
    got = read_idx(write_idx(tmp_path / "values.idx", values, gz=False))
    assert got.dtype == np.dtype(dtype) and got.dtype.isnative
    np.testing.assert_array_equal(got, values)


def test_gzip_is_detected_by_content_not_name(tmp_path):
    labels = np.arange(5, dtype=np.uint8)
    path = write_idx(tmp_path / "labels-without-suffix", labels, gz=True)
    np.testing.assert_array_equal(read_idx(path), labels)


def test_one_image(tmp_path):
    image = np.full((1, 28, 28), 255, np.uint8)
    np.testing.assert_array_equal(read_idx(write_idx(tmp_path / "one.gz", image)), image)


def test_truncated_raw_file_says_how_much(tmp_path):
    images = np.zeros((10, 28, 28), np.uint8)
    cut = truncated_copy(write_idx(tmp_path / "train-images-idx3-ubyte", images, gz=False))
    with pytest.raises(DataFileError) as excinfo:
        read_idx(cut)
    got = cut.stat().st_size - 16
    check_error(excinfo, cut, f"truncated (expected 7840 bytes of pixels, got {got})")


def test_truncated_gzip(tmp_path):
    rng = np.random.default_rng(1)
    cut = truncated_copy(
        write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", rng.integers(0, 256, (50, 28, 28), dtype=np.uint8))
    )
    with pytest.raises(DataFileError) as excinfo:
        read_idx(cut)
    check_error(excinfo, cut, "truncated")


def test_gzip_of_a_short_idx(tmp_path):
    # A complete gzip stream of an IDX file that is itself cut short.
    path = tmp_path / "short.gz"
    path.write_bytes(gzip.compress(idx_bytes(np.zeros((4, 28, 28), np.uint8))[:-100]))
    with pytest.raises(DataFileError) as excinfo:
        read_idx(path)
    check_error(excinfo, path, "expected 3136 bytes of pixels, got 3036")


def test_corrupt_gzip(tmp_path):
    rng = np.random.default_rng(2)
    path = write_idx(tmp_path / "train-labels-idx1-ubyte.gz", rng.integers(0, 10, 5000, dtype=np.uint8))
    data = bytearray(path.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 20] = bytes(20)
    path.write_bytes(bytes(data))
    with pytest.raises(DataFileError) as excinfo:
        read_idx(path)
    check_error(excinfo, path)


def test_longer_than_the_header_says(tmp_path):
    path = tmp_path / "labels"
    path.write_bytes(idx_bytes(np.arange(3, dtype=np.uint8)) + b"\x00")
    with pytest.raises(DataFileError) as excinfo:
        read_idx(path)
    check_error(excinfo, path, "longer than its header says")


@pytest.mark.parametrize(
    "content", [b"hello world, not idx", b"", b"\x00\x00\x07\x01"], ids=["text", "empty", "type"]
)
def test_wrong_format(tmp_path, content):
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(content)
    with pytest.raises(DataFileError) as excinfo:
        read_idx(path)
    check_error(excinfo, path, "not an IDX file")


def test_missing_file(tmp_path):
    with pytest.raises(MissingDataError) as excinfo:
        read_idx(tmp_path / "t10k-labels-idx1-ubyte.gz")
    check_error(excinfo, "t10k-labels-idx1-ubyte.gz", "no such file")


@pytest.mark.skipif(not DEBIAN_FMNIST.is_dir(), reason="Debian package dataset-fashion-mnist not installed")
def test_debian_fashion_mnist_labels():
    train = read_idx(DEBIAN_FMNIST / "train-labels-idx1-ubyte.gz")
    test = read_idx(DEBIAN_FMNIST / "t10k-labels-idx1-ubyte.gz")
    assert np.bincount(train).tolist() == [6000] * 10
    assert np.bincount(test).tolist() == [1000] * 10
