"""The text-task script on plays written here: genres become labels, the public plays give the vocabulary
and the side information, and the library's AdaDPS and DP^2 train on the features and are scored."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import imported_script

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
