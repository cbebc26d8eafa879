"""The private-optimizers Fashion-MNIST script on tiny data: every method builds, trains and is scored."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from real_data_files import write_mnist
from reference import imported_script, slow_after

# The scripts' and benchmarks' harnesses run in the end-to-end tier (`pytest -m slow`).
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "private_optimizers_fashion_mnist.py"


@pytest.fixture(scope="module")
def script():
    with imported_script(SCRIPT) as module:
        yield module


@pytest.mark.parametrize(
    "method", slow_after(["dp-sgd", "adadps (rmsprop)", "dp-adam", "dp-rmsprop", "adadps (adam)"], keep=2)
)
def test_every_method_trains_and_is_scored_on_the_test_examples(script, method):
    rng = np.random.default_rng(0)
    x = rng.random((192, 784), np.float32)
    y = (x[:, 0] > 0.5).astype(np.int32)  # A learnable label.
    data = tuple(jnp.asarray(a) for a in (x[:128], y[:128], x[128:160], y[128:160], x[160:], y[160:]))
    accuracy = float(jax.jit(lambda lr: script.train(method, 0.5, lr, jax.random.key(0), data))(0.05))
    assert 0.0 <= accuracy <= 1.0 and np.isfinite(accuracy)
    assert set(script.LEARNING_RATES) >= {method}


def test_mnist_files_give_the_flat_digits(script, tmp_path):
    write_mnist(tmp_path, np.random.default_rng(0), np.arange(30) % 10, np.arange(10) % 10)
    train_x, train_y, test_x, test_y = script.examples(str(tmp_path), "mnist")
    assert train_x.shape == (30, 784) and test_x.shape == (10, 784)
    assert sorted(train_y.tolist()) == sorted((np.arange(30) % 10).tolist())


@pytest.mark.slow
def test_the_protocol_runs_on_the_users_mnist(script, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(script, "EPOCHS", 1)
    write_mnist(tmp_path, np.random.default_rng(0), np.arange(400) % 10, np.arange(50) % 10)
    script.main(["--dataset", "mnist", "--data-dir", str(tmp_path), "--seeds", "0"])
    out = capsys.readouterr().out
    assert "396 private mnist examples; 4 public" in out and out.count("| adadps") == 2 and "nan" not in out
