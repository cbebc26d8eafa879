"""The private-step benchmark times steps that compute the same update (its ratios compare one computation).

Speed is never asserted.
"""

from pathlib import Path

import jax
import numpy as np
import pytest
from reference import imported_script

# The scripts' and benchmarks' harnesses run in the end-to-end tier (`pytest -m slow`).
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "private_step.py"


@pytest.fixture(scope="module")
def benchmark():
    with imported_script(SCRIPT) as module:
        yield module


def test_the_vmapped_and_looped_private_steps_are_one_computation(benchmark):
    key = jax.random.key(0)
    params = benchmark.init(key)
    x = jax.random.normal(key, (benchmark.BATCH, benchmark.SIZES[0]))
    y = jax.random.randint(key, (benchmark.BATCH,), 0, benchmark.CLASSES)
    settings = benchmark.steps(params)
    after = {name: step(params, state, x, y)[0] for name, (step, state) in settings.items()}
    vmapped, looped = jax.tree.leaves(after["dp-sgd (vmap)"]), jax.tree.leaves(after["dp-sgd (loop)"])
    for leaf_vmap, leaf_loop in zip(vmapped, looped, strict=True):
        np.testing.assert_allclose(np.asarray(leaf_vmap), np.asarray(leaf_loop), rtol=1e-4, atol=1e-6)
    # The private step moves the parameters differently from the plain one (clipping and noise).
    assert not np.allclose(np.asarray(after["sgd"]["w0"]), np.asarray(after["dp-sgd (vmap)"]["w0"]))


@pytest.mark.slow
def test_the_benchmark_runs_and_reports_every_setting(benchmark, tmp_path):
    result = benchmark.main(["--repeats", "1", "--steps", "2", "--json", str(tmp_path / "out.json")])
    assert set(result["settings"]) == {"sgd", "dp-sgd (vmap)", "dp-sgd (loop)", "adadps (vmap)"}
    assert result["settings"]["sgd"]["ratio_to_sgd"] == 1.0
