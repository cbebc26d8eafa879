"""MovieLens-100k: the u.data reader against a plain parse of tiny files (and its refusals), one private
method trained on tiny ratings, and the whole protocol on a user's tiny ml-100k folder (slow)."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import imported_script

from jaxfl.data.errors import DataFileError, MissingDataError
from jaxfl.data.formats.movielens import read_movielens_100k

# The scripts' and benchmarks' harnesses run in the end-to-end tier (`pytest -m slow`).
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "private_optimizers_movielens.py"


@pytest.fixture(scope="module")
def script():
    with imported_script(SCRIPT) as module:
        yield module


def write_ml100k(folder: Path, rng, num_ratings=400, num_users=12, num_items=20) -> np.ndarray:
    """`folder/ml-100k/u.data` of random ratings; returns its rows (1-based ids, as written)."""
    rows = np.stack([
        rng.integers(1, num_users + 1, num_ratings), rng.integers(1, num_items + 1, num_ratings),
        rng.integers(1, 6, num_ratings), rng.integers(874_724_710, 893_286_638, num_ratings),
    ], axis=1)  # fmt: skip
    (folder / "ml-100k").mkdir(parents=True)
    (folder / "ml-100k" / "u.data").write_text("".join("\t".join(map(str, row)) + "\n" for row in rows))
    return rows


def test_the_reader_equals_a_plain_parse(tmp_path):
    rows = write_ml100k(tmp_path, np.random.default_rng(0))
    for given in (tmp_path, tmp_path / "ml-100k", tmp_path / "ml-100k" / "u.data"):
        data = read_movielens_100k(given)
        text = (tmp_path / "ml-100k" / "u.data").read_text()
        expected = [[int(f) for f in line.split()] for line in text.splitlines()]
        np.testing.assert_array_equal(data.users, [r[0] - 1 for r in expected])
        np.testing.assert_array_equal(data.items, [r[1] - 1 for r in expected])
        np.testing.assert_array_equal(data.ratings, [r[2] for r in expected])
        np.testing.assert_array_equal(data.timestamps, rows[:, 3])
        assert data.num_users == rows[:, 0].max() and data.num_items == rows[:, 1].max()


@pytest.mark.parametrize(
    "text, words",
    [
        ("1\t2\t3\n", ["u.data:1", "separated by tabs"]),
        ("1\t2\t3\t4\n1 2 3 4\n", ["u.data:2", "separated by tabs"]),
        ("0\t2\t3\t4\n", ["u.data:1", "ratings are 1..5"]),
        ("1\t2\t6\t4\n", ["ratings are 1..5"]),
        ("\n\n", ["no ratings"]),
    ],
)
def test_malformed_files_are_refused_in_one_line(tmp_path, text, words):
    (tmp_path / "u.data").write_text(text)
    with pytest.raises(DataFileError) as error:
        read_movielens_100k(tmp_path)
    message = str(error.value)
    assert "\n" not in message and all(word in message for word in words), message
    with pytest.raises(MissingDataError, match="ml-100k"):
        read_movielens_100k(tmp_path / "absent")


def test_a_private_method_trains_and_is_scored_on_the_test_ratings(script):
    rng = np.random.default_rng(0)
    users, items = rng.integers(0, 6, 256).astype(np.int32), rng.integers(0, 9, 256).astype(np.int32)
    ratings = rng.integers(1, 6, 256).astype(np.float32)
    side = script.side_information(users[:8], items[:8], 6, 9)
    assert side["users"].shape == (6, script.EMBEDDING) and side["users"].max() == 1.0
    arrays = (users[:192], items[:192], ratings[:192], users[192:], items[192:], ratings[192:])
    data = (*(jnp.asarray(a) for a in arrays), {k: jnp.asarray(v) for k, v in side.items()})
    run = jax.jit(lambda lr: script.train("dp2-rmsprop", 0.5, lr, jax.random.key(0), data, epochs=2))
    mse = float(run(0.1))
    assert np.isfinite(mse) and mse > 0


@pytest.mark.slow
def test_the_protocol_runs_on_the_users_ml100k(script, tmp_path, capsys):
    write_ml100k(tmp_path, np.random.default_rng(1), num_ratings=1000)
    script.main(["--dataset", "movielens", "--data-dir", str(tmp_path), "--seeds", "0", "--epochs", "1"])
    out = capsys.readouterr().out
    assert "MovieLens-100k: 1000 ratings" in out and out.count("\n| ") == 6 and "nan" not in out
