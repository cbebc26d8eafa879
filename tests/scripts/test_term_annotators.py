"""The annotators script on tiny data: hammers keep the labels, spammers do not, and TERM's solver trains."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from real_data_files import write_cifar10
from reference import imported_script

from jaxfl.data.formats import read_cifar

# The scripts' and benchmarks' harnesses run in the end-to-end tier (`pytest -m slow`).
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "term_annotators.py"


@pytest.fixture(scope="module")
def script():
    with imported_script(SCRIPT) as module:
        module.STEPS, module.BATCH, module.CONTINUATION = 4, 16, 2
        yield module


def test_hammers_keep_the_true_labels_and_spammers_draw_at_random(script):
    y = np.arange(20000, dtype=np.int32) % 10
    annotator, given = script.annotate(y, seed=1)
    hammers = annotator < script.HAMMERS
    assert 0.15 < hammers.mean() < 0.25
    np.testing.assert_array_equal(given[hammers], y[hammers])
    # A spammer's label is uniform: right one time in ten.
    assert abs(np.mean(given[~hammers] == y[~hammers]) - 0.1) < 0.02


def test_term_trains_and_is_scored(script):
    rng = np.random.default_rng(0)
    x = rng.random((300, 784), np.float32)
    y = rng.integers(0, 10, 300).astype(np.int32)
    annotator, given = script.annotate(y, seed=0)
    arrays = tuple(jnp.asarray(a) for a in (x, given, annotator))
    params = jax.jit(lambda key: script.train("TERM t=-2 (annotators)", key, *arrays))(jax.random.key(0))
    assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(params))
    assert 0.0 <= script.accuracy(params, x, y) <= 1.0


def test_cifar10_files_give_flat_images_and_the_clean_test_set(script, tmp_path):
    write_cifar10(tmp_path, np.random.default_rng(0), 50, 20)
    train_x, train_y, test_x, test_y = script.images(str(tmp_path), "cifar10")
    reference = read_cifar(tmp_path)
    assert train_x.shape == (50, 3072) and test_x.shape == (20, 3072)
    expected = reference.train_images.reshape(50, -1).astype(np.float32) / np.float32(255)
    assert sorted(map(tuple, train_x)) == sorted(map(tuple, expected))
    np.testing.assert_array_equal(np.sort(train_y), np.sort(reference.train_labels))


@pytest.mark.slow
def test_the_protocol_runs_on_the_users_cifar10(script, tmp_path, capsys):
    write_cifar10(tmp_path, np.random.default_rng(0), 300, 20)
    script.main(["--dataset", "cifar10", "--data-dir", str(tmp_path), "--seeds", "0"])
    out = capsys.readouterr().out
    assert out.startswith("cifar10: clean test accuracy") and out.count("| ") >= 4 and "nan" not in out
