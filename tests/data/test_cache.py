"""The on-disk cache of converted datasets: round trip, conversion once, atomicity, damage."""

import os

import numpy as np
import pytest

from jaxfl.data.cache import (
    PopulationWriter,
    cache_key,
    cache_root,
    cached_dataset,
    file_fingerprint,
    read_entry,
)
from jaxfl.data.errors import DataFileError
from jaxfl.data.host import HostPopulation


def _clients(seed=0, num_clients=5):
    rng = np.random.default_rng(seed)
    return [
        (
            f"client-{i}",
            {"x": rng.normal(size=(n, 2, 3)).astype(np.float32), "y": rng.integers(0, 9, n).astype(np.int32)},
        )
        for i, n in enumerate(rng.integers(1, 6, num_clients))
    ]


def _build(clients, calls):
    def build(builder):
        calls.append(1)
        for population in ("train", "test"):
            writer = builder.population(population)
            for name, features in clients:
                writer.add(name, features)
        return {"num_classes": 9, "input_shape": [2, 3]}

    return build


def test_round_trip_memory_mapped(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXFL_CACHE_DIR", str(tmp_path))
    assert cache_root() == tmp_path
    clients = _clients()
    metadata, populations = cached_dataset("toy", {"a": 1}, _build(clients, []))
    assert metadata["num_classes"] == 9 and metadata["populations"]["train"]["num_clients"] == 5
    train = populations["train"]
    assert isinstance(train, HostPopulation) and isinstance(train.features["x"], np.memmap)
    assert not train.features["x"].flags.writeable
    assert train.client_names() == [name for name, _ in clients]
    for i, (_, features) in enumerate(clients):
        for key, value in features.items():
            np.testing.assert_array_equal(train.client(i)[key], value)
    np.testing.assert_array_equal(train.counts, [len(f["y"]) for _, f in clients])


def test_converts_once_and_again_when_the_key_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXFL_CACHE_DIR", str(tmp_path))
    calls = []
    build = _build(_clients(), calls)
    cached_dataset("toy", {"a": 1}, build)
    cached_dataset("toy", {"a": 1}, build)
    assert len(calls) == 1
    cached_dataset("toy", {"a": 2}, build)
    assert len(calls) == 2
    assert cache_key({"a": 1}) != cache_key({"a": 2})


def test_fingerprint_follows_the_files(tmp_path):
    source = tmp_path / "data.bin"
    source.write_bytes(b"1234")
    first = file_fingerprint([source])
    os.utime(source, ns=(1, 1))
    assert file_fingerprint([source]) != first
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a").write_bytes(b"x")
    assert [entry[0] for entry in file_fingerprint([tmp_path / "sub"])] == [
        str((tmp_path / "sub" / "a").resolve())
    ]


def test_a_failed_conversion_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXFL_CACHE_DIR", str(tmp_path))

    def broken(builder):
        builder.population("train").add("c", {"x": np.zeros((2, 1), np.float32)})
        raise DataFileError("source.h5: truncated")

    with pytest.raises(DataFileError, match="truncated"):
        cached_dataset("toy", {}, broken)
    assert list((tmp_path / "toy").iterdir()) == []
    calls = []
    cached_dataset("toy", {}, _build(_clients(), calls))
    assert len(calls) == 1


def test_a_damaged_entry_is_converted_again(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("JAXFL_CACHE_DIR", str(tmp_path))
    calls = []
    build = _build(_clients(), calls)
    cached_dataset("toy", {}, build)
    (entry,) = (tmp_path / "toy").iterdir()
    feature = entry / "train" / "x.bin"
    feature.write_bytes(feature.read_bytes()[:10])
    assert read_entry(entry) is None
    assert "damaged" in capsys.readouterr().err
    _, populations = cached_dataset("toy", {}, build)
    assert len(calls) == 2
    assert populations["train"].num_examples == sum(len(f["y"]) for _, f in _clients())


def test_writer_refuses_inconsistent_clients(tmp_path):
    writer = PopulationWriter(tmp_path / "p")
    writer.add("a", {"x": np.zeros((2, 3), np.float32)})
    with pytest.raises(ValueError, match="features"):
        writer.add("b", {"z": np.zeros((2, 3), np.float32)})
    with pytest.raises(ValueError, match="float64"):
        writer.add("b", {"x": np.zeros((2, 3))})
    with pytest.raises(ValueError, match="no examples"):
        writer.add("b", {"x": np.zeros((0, 3), np.float32)})
    with pytest.raises(ValueError, match="different numbers"):
        writer.add("b", {"x": np.zeros((2, 3), np.float32), "y": np.zeros(3)})
    writer.abort()
