"""Assertions shared by the dataset-loader tests (imported as `data.datasets.checks`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from jaxfl.data.cache import cache_root
from jaxfl.data.errors import DataFileError


def check_message(excinfo, dataset: str, *words: object, kind: type = DataFileError) -> str:
    """A raised error of `kind`, one line, starting with the dataset's name and holding `words`."""
    error = excinfo.value
    assert isinstance(error, kind), (type(error), error)
    assert isinstance(error, ValueError)
    message = str(error)
    assert "\n" not in message, message
    assert message.startswith(f"dataset {dataset!r}"), message
    for word in words:
        assert str(word) in message, (word, message)
    return message


def entries(dataset: str) -> list[Path]:
    """The finished cache entries of `dataset` (staging directories excluded)."""
    directory = cache_root() / dataset
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.is_dir() and ".tmp-" not in p.name)


def assert_no_staging() -> None:
    """No half-written entry (`<key>.tmp-*`) anywhere in the cache."""
    root = cache_root()
    left = [p for p in root.rglob("*.tmp-*")] if root.exists() else []
    assert not left, left


def assert_same_population(got, want) -> None:
    """Two populations hold the same clients (names, order, counts) and examples."""
    assert got.client_names() == want.client_names()
    np.testing.assert_array_equal(got.counts, want.counts)
    assert set(got.features) == set(want.features)
    for name, array in want.features.items():
        assert got.features[name].dtype == array.dtype, name
        np.testing.assert_array_equal(np.asarray(got.features[name]), np.asarray(array), err_msg=name)


def assert_same_dataset(got, want) -> None:
    for population in ("train", "test", "validation"):
        a, b = getattr(got, population), getattr(want, population)
        assert (a is None) == (b is None), population
        if a is not None:
            assert_same_population(a, b)
    assert got.num_classes == want.num_classes
    assert got.input_shape == want.input_shape
    assert got.input_vocab_size == want.input_vocab_size


def clients_of(population) -> dict[str, dict[str, np.ndarray]]:
    """Client name -> its examples."""
    return {name: population.client(i) for i, name in enumerate(population.client_names())}


def conversions(monkeypatch, module, name: str) -> list[int]:
    """Counts calls of `module.name` (a function every conversion of the loader calls)."""
    calls: list[int] = []
    original: Callable = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def assert_truncated_file_refused(dataset: str, path: Path, fraction: float, **options) -> None:
    """`path` cut to `fraction` (its partner files beside it) fails in one line naming it, caching nothing."""
    import shutil

    import pytest
    from data.writers import truncated_copy

    from jaxfl.data import load_dataset

    cut = truncated_copy(path, fraction)
    for partner in path.parent.iterdir():
        if partner.is_file() and partner != path:
            shutil.copy(partner, cut.parent / partner.name)
    with pytest.raises(DataFileError) as excinfo:
        load_dataset(dataset, data_dir=cut.parent, **options)
    check_message(excinfo, dataset, cut)
    assert entries(dataset) == []
    assert_no_staging()
