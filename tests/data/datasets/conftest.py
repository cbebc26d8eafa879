"""Every test of the dataset loaders gets its own, empty conversion cache."""

import pytest


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """`$JAXFL_CACHE_DIR` of this test: entries can be counted and nothing leaks between tests."""
    root = tmp_path / "cache"
    monkeypatch.setenv("JAXFL_CACHE_DIR", str(root))
    return root
