"""TFF's published archives (`*.tar.bz2`): checksum first, extracted once into the cache, then read."""

from __future__ import annotations

import tarfile

import numpy as np
import pytest
from data.datasets.checks import assert_no_staging, assert_same_dataset, check_message
from data.writers import shakespeare_like, truncated_copy, write_tff_hdf5

import jaxfl.data.formats.checksums as checksums
from jaxfl.data import load_dataset
from jaxfl.data.errors import DataFileError

OPTIONS = {"sequence_length": 5, "layout": "sequence"}


def _archive(tmp_path, clients_train, clients_test):
    """A `shakespeare.tar.bz2` laid out like TFF's (members under a folder)."""
    staging = tmp_path / "staging"
    staging.mkdir()
    write_tff_hdf5(staging / "shakespeare_train.h5", clients_train)
    write_tff_hdf5(staging / "shakespeare_test.h5", clients_test)
    data = tmp_path / "data"
    data.mkdir()
    with tarfile.open(data / "shakespeare.tar.bz2", "w:bz2") as tar:
        for name in ("shakespeare_train.h5", "shakespeare_test.h5"):
            tar.add(staging / name, arcname=f"datasets/{name}")
    return data, staging


def test_an_archive_that_is_not_the_published_one_is_refused(tmp_path):
    rng = np.random.default_rng(0)
    data, _ = _archive(tmp_path, shakespeare_like(rng, [4, 5]), shakespeare_like(rng, [2, 3]))
    with pytest.raises(DataFileError) as excinfo:
        load_dataset("shakespeare", data_dir=str(data), **OPTIONS)
    check_message(excinfo, "shakespeare", "shakespeare.tar.bz2", "sha256", "published")
    assert_no_staging()


def test_a_verified_archive_is_extracted_once_and_reads_like_its_files(tmp_path, monkeypatch):
    verified = []
    monkeypatch.setattr(checksums, "verify_published", lambda path, **kw: verified.append(path) or True)
    rng = np.random.default_rng(1)
    data, staging = _archive(tmp_path, shakespeare_like(rng, [4, 5, 6]), shakespeare_like(rng, [2, 3, 1]))
    from_archive = load_dataset("shakespeare", data_dir=str(data), **OPTIONS)
    assert [p.name for p in verified] == ["shakespeare.tar.bz2"]
    again = load_dataset("shakespeare", data_dir=str(data), **OPTIONS)
    assert len(verified) == 1  # Extracted once: the second load reads the extracted files.
    from_files = load_dataset("shakespeare", data_dir=str(staging), **OPTIONS)
    assert_same_dataset(from_archive, from_files)
    assert_same_dataset(again, from_files)
    assert_no_staging()


def test_a_truncated_archive_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(checksums, "verify_published", lambda path, **kw: True)
    rng = np.random.default_rng(2)
    data, _ = _archive(tmp_path, shakespeare_like(rng, [40, 50]), shakespeare_like(rng, [20, 30]))
    archive = data / "shakespeare.tar.bz2"
    truncated_copy(archive).replace(archive)
    with pytest.raises(DataFileError) as excinfo:
        load_dataset("shakespeare", data_dir=str(data), **OPTIONS)
    check_message(excinfo, "shakespeare", "shakespeare.tar.bz2")
    assert_no_staging()
