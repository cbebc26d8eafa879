"""Checksums: streaming SHA-256 and the table of published hashes."""

import hashlib
import re
from pathlib import Path

import pytest
from data.writers import check_error

from jaxfl.data.errors import DataFileError, MissingDataError
from jaxfl.data.formats import PUBLISHED_SHA256, published_datasets, sha256_file, verify_published

DEBIAN_FMNIST = Path("/usr/share/datasets/fashion-mnist")


class Bar:
    def __init__(self):
        self.total = 0

    def update(self, n):
        self.total += n


def test_sha256_file_streams_with_progress(tmp_path, monkeypatch):
    import jaxfl.data.formats.checksums as checksums

    monkeypatch.setattr(checksums, "CHUNK_BYTES", 1000)
    data = bytes(range(256)) * 50
    path = tmp_path / "blob"
    path.write_bytes(data)
    bar = Bar()
    assert sha256_file(path, progress=bar) == hashlib.sha256(data).hexdigest()
    assert bar.total == len(data)


def test_table_holds_full_lowercase_hashes_with_sources():
    assert published_datasets() == sorted(PUBLISHED_SHA256)
    for files in PUBLISHED_SHA256.values():
        for name, entries in files.items():
            assert entries, name
            for entry in entries:
                assert re.fullmatch(r"[0-9a-f]{64}", entry.sha256), name
                assert entry.source
    assert PUBLISHED_SHA256["emnist"]["fed_emnist.tar.bz2"][0].sha256.startswith("fe1ed5a502cea3a9")


def test_unknown_names_pass_unchecked(tmp_path):
    path = tmp_path / "my_data.tar.gz"
    path.write_bytes(b"anything")
    assert verify_published(path, what="my data") is False


def test_wrong_hash_is_refused_with_the_publisher(tmp_path):
    path = tmp_path / "fed_emnist.tar.bz2"
    path.write_bytes(b"half a download")
    with pytest.raises(DataFileError) as excinfo:
        verify_published(path, what="TFF fed_emnist.tar.bz2")
    digest = hashlib.sha256(b"half a download").hexdigest()
    check_error(
        excinfo,
        path,
        f"sha256 {digest[:12]}",
        "does not match the published checksum",
        "TFF fed_emnist.tar.bz2",
        "corrupt or a different version",
    )


def test_shared_names_are_narrowed_by_dataset(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(b"not mnist")
    with pytest.raises(DataFileError) as excinfo:
        verify_published(path, what="MNIST train-images-idx3-ubyte.gz")
    message = check_error(excinfo, path, "tensorflow-datasets mnist")
    assert "fashion" not in message
    with pytest.raises(DataFileError) as excinfo:
        verify_published(path, what="Fashion-MNIST train images")
    check_error(excinfo, path, "tensorflow-datasets fashion_mnist", "Debian dataset-fashion-mnist")
    with pytest.raises(DataFileError) as excinfo:
        verify_published(path, what="images", dataset="fashion_mnist")
    message = check_error(excinfo, path, "Debian")
    assert "tensorflow-datasets mnist;" not in message
    with pytest.raises(ValueError, match="unknown dataset"):
        verify_published(path, what="x", dataset="imagenet")


def test_missing_file(tmp_path):
    with pytest.raises(MissingDataError) as excinfo:
        verify_published(tmp_path / "cifar-10-python.tar.gz", what="CIFAR-10 archive")
    check_error(excinfo, "cifar-10-python.tar.gz", "no such file")


@pytest.mark.skipif(not DEBIAN_FMNIST.is_dir(), reason="Debian package dataset-fashion-mnist not installed")
def test_debian_fashion_mnist_files_verify():
    for name in ("train-labels-idx1-ubyte.gz", "t10k-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz"):
        assert verify_published(DEBIAN_FMNIST / name, what=f"Fashion-MNIST {name}") is True
    # The same bytes are not MNIST's.
    with pytest.raises(DataFileError, match="tensorflow-datasets mnist"):
        verify_published(DEBIAN_FMNIST / "t10k-labels-idx1-ubyte.gz", what="MNIST t10k-labels-idx1-ubyte.gz")
