"""The text-task script on plays written here: genres become labels, the public plays give the vocabulary
and the side information, and the library's AdaDPS and DP^2 train on the features and are scored."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from real_data_files import write_aclimdb, write_stackoverflow
from reference import imported_script

from jaxfl.data.formats.aclimdb import read_aclimdb, top_words

# The scripts' and benchmarks' harnesses run in the end-to-end tier (`pytest -m slow`).
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "private_optimizers_text.py"
PLAY = "# {title}\n\n**{role}**  \n{line}\n\n**OTHER**  \n{other}\n"


@pytest.fixture(scope="module")
def script():
    with imported_script(SCRIPT) as module:
        module.EPOCHS, module.BATCH = 2, 4
        yield module


def write_plays(root: Path) -> Path:
    plays = {
        "comedies/merry.md": ("Merry", "JESTER", "a merry jest and a song", "we laugh and sing"),
        "tragedies/grim.md": ("Grim", "KING", "death and blood and woe", "the grave awaits"),
        "histories/chronicle.md": ("Chronicle", "LORD", "a song of death and blood", "we sing the king"),
    }
    for path, (title, role, line, other) in plays.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(PLAY.format(title=title, role=role, line=line, other=other))
    return root


def test_genres_label_the_speeches_and_the_public_play_gives_the_vocabulary(script, tmp_path):
    labelled, labels, public = script.speeches(write_plays(tmp_path))
    assert sorted(zip(labels, labelled)) == [
        (0, "a merry jest and a song"), (0, "we laugh and sing"), (1, "death and blood and woe"),
        (1, "the grave awaits"),
    ]
    assert public == ["a song of death and blood", "we sing the king"]
    vocabulary, side = script.public_side(public)
    assert set(vocabulary) == {"a", "song", "of", "death", "and", "blood", "we", "sing", "the", "king"}
    assert side.max() == 1.0 and np.all(side > 0)
    features = script.bag_of_words(labelled, vocabulary)
    assert features.shape == (4, 10) and set(np.unique(features)) <= {0.0, 1.0}


@pytest.mark.parametrize("method", ["adadps", "dp2-rmsprop"])
def test_the_library_optimizers_train_and_are_scored(script, method):
    rng = np.random.default_rng(0)
    x = (rng.random((40, 12)) < 0.3).astype(np.float32)
    y = x[:, 0].copy()
    data = tuple(jnp.asarray(a) for a in (x[:32], y[:32], x[32:], y[32:], np.full(12, 0.5, np.float32)))
    accuracy = float(jax.jit(lambda lr: script.train(method, 0.5, lr, jax.random.key(0), data))(0.1))
    assert 0.0 <= accuracy <= 1.0


def test_imdb_reviews_give_presence_ids_and_side_information_from_unsup(script, tmp_path):
    root = write_aclimdb(tmp_path, np.random.default_rng(0))
    train_x, train_y, test_x, test_y, side, source = script.imdb_task(root)
    assert train_x.dtype == np.int32 and len(train_y) == 24 and len(test_y) == 24 and train_y.sum() == 12
    words = top_words(read_aclimdb(root).train_texts)
    assert side.shape == (len(words),) and side.max() == 1.0 and source == "train/unsup"
    dense = np.asarray(script.features(jnp.asarray(test_x), len(words)))
    expected = script.bag_of_words(read_aclimdb(root).test_texts, {w: i for i, w in enumerate(words)})
    np.testing.assert_array_equal(dense, expected)  # The ids are the word-presence bag of words.
    params = {"w": jnp.arange(len(words), dtype=jnp.float32), "b": jnp.ones(())}
    logits = script.logits_of(params, jnp.asarray(test_x))
    np.testing.assert_allclose(logits, expected @ np.arange(len(words)) + 1)


def small_stackoverflow(script, monkeypatch):
    """The vocabulary and tags of the tiny files."""
    monkeypatch.setattr(script, "STACKOVERFLOW_WORDS", 40)
    monkeypatch.setattr(script, "STACKOVERFLOW_TAGS", 3)


def test_stackoverflow_posts_are_pooled_with_their_tags_and_held_out_side(script, tmp_path, monkeypatch):
    small_stackoverflow(script, monkeypatch)
    monkeypatch.setattr(script, "STACKOVERFLOW_TRAIN", 10)
    train_x, train_y, test_x, test_y, side, source = script.stackoverflow_task(
        write_stackoverflow(tmp_path, np.random.default_rng(0))
    )
    assert train_x.shape[0] == 10 and test_x.shape[0] == 7 and train_y.shape == (10, 3)
    assert side.shape == (40,) and source == "the held-out clients' posts"
    assert train_x.min() >= 0 and train_x.max() <= 40 and set(np.unique(train_y)) == {0.0, 1.0}


@pytest.mark.slow
@pytest.mark.parametrize("dataset", ["imdb", "stackoverflow"])
def test_the_protocol_runs_on_the_users_files(script, tmp_path, capsys, monkeypatch, dataset):
    small_stackoverflow(script, monkeypatch)
    rng = np.random.default_rng(0)
    if dataset == "imdb":
        directory = write_aclimdb(tmp_path, rng)
    else:
        directory = write_stackoverflow(tmp_path, rng)
    script.main(["--dataset", dataset, "--data-dir", str(directory), "--seeds", "0"])
    out = capsys.readouterr().out
    assert out.startswith(f"{dataset}: ") and out.count("| dp") == 3 and "nan" not in out
