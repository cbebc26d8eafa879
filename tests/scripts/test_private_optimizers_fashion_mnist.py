"""The private-optimizers Fashion-MNIST script on tiny data: every method builds, trains and is scored."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import imported_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "private_optimizers_fashion_mnist.py"


@pytest.fixture(scope="module")
def script():
    with imported_script(SCRIPT) as module:
        yield module


@pytest.mark.parametrize("method", ["dp-sgd", "dp-adam", "dp-rmsprop", "adadps (rmsprop)", "adadps (adam)"])
def test_every_method_trains_and_is_scored_on_the_test_examples(script, method):
    rng = np.random.default_rng(0)
    x = rng.random((192, 784), np.float32)
    y = (x[:, 0] > 0.5).astype(np.int32)  # A learnable label.
    data = tuple(jnp.asarray(a) for a in (x[:128], y[:128], x[128:160], y[128:160], x[160:], y[160:]))
    accuracy = float(jax.jit(lambda lr: script.train(method, 0.5, lr, jax.random.key(0), data))(0.05))
    assert 0.0 <= accuracy <= 1.0 and np.isfinite(accuracy)
    assert set(script.LEARNING_RATES) >= {method}
