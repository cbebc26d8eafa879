"""Test configuration shared by the whole suite.

Converted real datasets are cached in a directory of this session.
Eight virtual CPU devices exist so that sharded strategies are tested on a
real mesh; this must happen before JAX initializes its backends. Rank
promotion is an error so that broadcasting slips fail loudly.
"""

import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Converted datasets go to a cache of this test session, never the user's.
os.environ["JAXFL_CACHE_DIR"] = tempfile.mkdtemp(prefix="jaxfl-test-cache-")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_enable_x64", False)
jax.config.update("jax_disable_most_optimizations", True)
