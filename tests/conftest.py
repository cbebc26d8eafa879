"""Test configuration shared by the whole suite.

Converted real datasets are cached in a directory of this session. Tests
marked `gpu` are skipped unless the backend is a GPU.
Eight virtual CPU devices exist so that sharded strategies are tested on a
real mesh; this must happen before JAX initializes its backends. Rank
promotion is an error so that broadcasting slips fail loudly.
"""

import os
import shutil
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Converted datasets go to a cache of this test session, never the user's.
os.environ["JAXFL_CACHE_DIR"] = tempfile.mkdtemp(prefix="jaxfl-test-cache-")
# Compiled programs persist for the session in one directory, shared by the
# xdist workers (they inherit it from the controller, whose conftest runs
# before it starts them) and by the CLI processes tests start: many tests
# compile the same programs. A cold cache took tests/experiment/
# test_cli_algorithms.py and test_sweep.py from 39 s to 32 s on 2 cores.
_COMPILE_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _COMPILE_CACHE = tempfile.mkdtemp(prefix="jaxfl-test-compile-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _COMPILE_CACHE
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_enable_x64", False)
jax.config.update("jax_disable_most_optimizations", True)


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` run only where JAX's backend is a GPU.

    On the GPU machine: `JAX_PLATFORMS=cuda pytest -m gpu` (the suite
    defaults to the CPU above).
    """
    import pytest

    if jax.default_backend() == "gpu":
        return
    skip = pytest.mark.skip(reason="needs a GPU (JAX_PLATFORMS=cuda on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_sessionfinish(session, exitstatus):
    """The process that made the compile cache (not a worker) removes it."""
    if _COMPILE_CACHE is not None:
        shutil.rmtree(_COMPILE_CACHE, ignore_errors=True)
