"""The class-imbalance script on tiny data: the draw has the asked share, the TERM solvers train and are
scored."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from real_data_files import write_hiv1, write_mnist
from reference import imported_script

from jaxfl.data.formats import read_hiv1_cleavage

# The scripts' and benchmarks' harnesses run in the end-to-end tier (`pytest -m slow`).
pytestmark = pytest.mark.slow

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


def test_mnist_and_hiv1_files_give_the_thesis_classes(script, tmp_path):
    rng = np.random.default_rng(0)
    write_mnist(tmp_path / "mnist", rng, np.arange(100) % 10, np.arange(40) % 10)
    train_x, train_y, test_x, test_y = script.two_classes(str(tmp_path / "mnist"), "mnist")
    assert train_x.shape == (20, 784) and test_x.shape == (8, 784)
    assert 0 <= train_x.min() <= train_x.max() <= 1
    assert train_y.sum() == 10 and test_y.sum() == 4  # The 4s are the rare class, the 9s the common one.
    write_hiv1(tmp_path / "hiv1", rng)
    x, y, _ = read_hiv1_cleavage(tmp_path / "hiv1")
    train_x, train_y, test_x, test_y = script.two_classes(str(tmp_path / "hiv1"), "hiv1")
    assert train_x.shape == (240, 160) and test_x.shape == (30, 160)
    assert train_y.sum() + test_y.sum() <= y.sum() and set(np.unique(train_y)) == {0, 1}
    shares = script.DATASETS["hiv1"][2]
    num_train = script.training_size(train_y, shares)
    assert num_train <= (train_y == 0).sum() / (1 - min(shares)) and num_train * max(shares) <= train_y.sum()
    drawn_x, drawn_y = script.imbalanced(train_x, train_y, shares[0], 0, num_train)
    assert len(drawn_y) == num_train and drawn_y.sum() == round(shares[0] * num_train)
    with pytest.raises(ValueError, match="needs --data-dir"):
        script.two_classes(None, "hiv1")


@pytest.mark.slow
@pytest.mark.parametrize("dataset", ["mnist", "hiv1"])
def test_the_protocol_runs_on_the_users_files(script, tmp_path, capsys, dataset):
    rng = np.random.default_rng(0)
    if dataset == "mnist":
        write_mnist(tmp_path, rng, np.arange(2000) % 10, np.arange(40) % 10)
    else:
        write_hiv1(tmp_path, rng)
    script.main(["--dataset", dataset, "--data-dir", str(tmp_path), "--seeds", "0"])
    out = capsys.readouterr().out
    assert out.startswith(f"{dataset}: balanced test accuracy")
    assert out.count("| TERM") == 2 and "nan" not in out
