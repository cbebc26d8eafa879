"""RunCheckpoints: exact round trips, the last N kept, and what a killed write leaves behind."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfl.experiment.checkpoints import RunCheckpoints, flatten_leaves, unflatten_leaves
from jaxfl.experiment.config import ConfigError


def _tree(scale=1.0):
    return {
        "params": {"w": jnp.arange(6.0).reshape(2, 3) * scale, "b": jnp.float32(scale)},
        "round": jnp.int32(7),
        "key": jax.random.key(3),
        "empty": (),
        "extra": (jnp.ones(2, jnp.bfloat16),),
    }


def _assert_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        assert np.asarray(x).dtype == np.asarray(y).dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_round_trip_is_exact_and_keeps_the_last_ones(tmp_path):
    checkpoints = RunCheckpoints(tmp_path / "ck", keep=2)
    for round_index in (2, 4, 6):
        checkpoints.save(round_index, _tree(round_index), {"history": [{"round": round_index}]})
    checkpoints.wait()
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["4", "6"]
    round_index, tree, meta = checkpoints.restore(_tree())
    assert round_index == 6 and meta == {"history": [{"round": 6}], "round": 6}
    _assert_equal(tree, _tree(6))
    checkpoints.close()


def test_meta_is_saved_as_it_was_when_save_was_called(tmp_path, monkeypatch):
    # Orbax serializes the JSON in its background thread; a run appends its next evaluation to the
    # history list it passed. The write is held back here until after that append.
    checkpoints = RunCheckpoints(tmp_path / "ck")
    held = []
    monkeypatch.setattr(checkpoints._manager, "save", lambda *args, **kwargs: held.append((args, kwargs)))
    history = [{"round": 2}]
    checkpoints.save(2, _tree(), {"history": history})
    history.append({"round": 4})
    monkeypatch.undo()
    args, kwargs = held[0]
    checkpoints._manager.save(*args, **kwargs)
    checkpoints.wait()
    assert checkpoints.restore(_tree())[2] == {"history": [{"round": 2}], "round": 2}
    checkpoints.close()


def test_leaves_are_copies_not_views_of_the_donated_buffers():
    x = jnp.arange(4.0)
    leaves = flatten_leaves({"x": x})
    assert leaves["leaf_00000"].flags.owndata


def test_a_checkpoint_of_another_model_is_refused_in_one_line():
    leaves = flatten_leaves(_tree())
    other = _tree()
    other["params"]["w"] = jnp.zeros((3, 3))
    with pytest.raises(ConfigError, match=r"array [0-9] is float32\[2, 3\].*needs float32\[3, 3\]"):
        unflatten_leaves(other, leaves)
    with pytest.raises(ConfigError, match="holds 5 arrays"):
        unflatten_leaves({**_tree(), "more": jnp.ones(1)}, leaves)


def test_unfinished_and_damaged_checkpoints_are_skipped(tmp_path):
    checkpoints = RunCheckpoints(tmp_path / "ck", keep=3)
    checkpoints.save(1, _tree(1), {})
    checkpoints.save(2, _tree(2), {})
    checkpoints.wait()
    # What kill -9 leaves mid-write: orbax's temporary folder, never a step.
    os.makedirs(tmp_path / "ck" / "3.orbax-checkpoint-tmp-1234" / "state")
    assert checkpoints.latest_round() == 2
    # A step folder damaged on disk: the one before it is restored.
    os.makedirs(tmp_path / "ck" / "5" / "state")
    round_index, tree, _ = checkpoints.restore(_tree())
    assert round_index == 2
    _assert_equal(tree, _tree(2))
    checkpoints.close()


def test_no_checkpoint_restores_nothing(tmp_path):
    assert RunCheckpoints(tmp_path / "ck").restore(_tree()) is None
