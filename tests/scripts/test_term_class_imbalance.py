"""The class-imbalance script on tiny data: the draw has the asked share, the TERM solvers train and are
scored."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import imported_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "term_class_imbalance.py"


@pytest.fixture(scope="module")
def script():
    with imported_script(SCRIPT) as module:
        module.NUM_TRAIN, module.STEPS, module.BATCH, module.CONTINUATION = 200, 4, 16, 2
        yield module


def test_the_draw_has_the_share_and_no_repeats(script):
    y = np.array([0] * 500 + [1] * 100)
    x = np.arange(600, dtype=np.float32)[:, None]
    drawn_x, drawn_y = script.imbalanced(x, y, 0.05, seed=0)
    assert len(drawn_y) == 200 and drawn_y.sum() == 10
    assert len(np.unique(drawn_x)) == 200


# The two that run the library's solvers (the others are a few lines of the script itself).
@pytest.mark.parametrize("method", ["TERM t=100 (Alg. 16)", "TERM t=100 (Alg. 15 per batch)"])
def test_every_method_trains_and_is_scored(script, method):
    assert method in script.METHODS
    rng = np.random.default_rng(0)
    x = rng.random((200, 784), np.float32)
    y = (np.arange(200) < 20).astype(np.int32)
    params = jax.jit(lambda key: script.train(method, key, jnp.asarray(x), jnp.asarray(y)))(jax.random.key(0))
    assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(params))
    assert 0.0 <= script.balanced_accuracy(params, x, y) <= 1.0
