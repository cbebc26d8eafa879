"""Test configuration shared by the whole suite.

Converted real datasets are cached in a directory of this session. Tests
marked `gpu` are skipped unless the backend is a GPU.
Eight virtual CPU devices exist so that sharded strategies are tested on a
real mesh; this must happen before JAX initializes its backends. Rank
promotion is an error so that broadcasting slips fail loudly.
"""

import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Converted datasets go to a cache of this test session, never the user's.
os.environ["JAXFL_CACHE_DIR"] = tempfile.mkdtemp(prefix="jaxfl-test-cache-")
# Compiled programs are shared by the processes of this test run (its xdist workers and the runs
# they start): many tests compile the same small round, and compilation dominates the suite.
# A cache directory the user chose is used as it is, and never removed.
_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
_OWN_XLA_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _OWN_XLA_CACHE = os.path.join(tempfile.gettempdir(), f"jaxfl-test-xla-{_RUN}")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_XLA_CACHE
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.3")  # Writing tiny ones costs more.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_enable_x64", False)
jax.config.update("jax_disable_most_optimizations", True)


def pytest_sessionfinish(session, exitstatus):
    """The run's compilation cache goes with it (the controller removes it, after its workers)."""
    import shutil

    if _OWN_XLA_CACHE is not None and not hasattr(session.config, "workerinput"):
        shutil.rmtree(_OWN_XLA_CACHE, ignore_errors=True)


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
