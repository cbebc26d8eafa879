"""Checkpoints of a training loop with orbax-checkpoint.

A checkpoint is everything a loop needs to go on exactly where it stopped:
the carried state (the server state, with the algorithm's and the server
optimizer's state and the round counter, and the run's health flags) as
arrays, and a JSON record (the round, the evaluation history, the resolved
config, the privacy spent so far). Since every round draws its randomness
from `fold_in(run_key, state.round)` and the run key from the seed, the
restored loop continues bit for bit as the uninterrupted one.

Orbax writes each checkpoint into a temporary folder and renames it when
complete, so a checkpoint on disk is whole even after `kill -9`; it keeps
the last `keep` ones. The arrays are saved as a flat list of leaves
(`leaf_00000`, ...) and put back into the structure of a template (the
loop's initial state), which also checks that the checkpoint belongs to the
same algorithm and model: a mismatch is a one-line error.

Layout of one checkpoint, `checkpoints/<round>/`: `state/` (orbax
`StandardSave` of the leaves) and `meta/` (orbax `JsonSave`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxfl.experiment.config import ConfigError


def _is_key(leaf: Any) -> bool:
    return hasattr(leaf, "dtype") and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def flatten_leaves(tree: Any) -> dict[str, np.ndarray]:
    """The tree's leaves as host copies, named by position (typed keys as their data).

    Copies, not views: the device buffers are donated to the next round
    while orbax may still be writing.
    """
    leaves = jax.tree.leaves(tree)
    return {
        f"leaf_{i:05d}": np.array(jax.random.key_data(leaf) if _is_key(leaf) else leaf, copy=True)
        for i, leaf in enumerate(leaves)
    }


def unflatten_leaves(template: Any, leaves: dict[str, np.ndarray]) -> Any:
    """Puts saved leaves back into `template`'s structure, checking shapes and dtypes."""
    template_leaves, treedef = jax.tree.flatten(template)
    if len(leaves) != len(template_leaves):
        raise ConfigError(
            f"the checkpoint holds {len(leaves)} arrays and this run's state {len(template_leaves)}: "
            "it was written by another algorithm, model or jaxfl version"
        )
    restored = []
    for i, like in enumerate(template_leaves):
        value = leaves[f"leaf_{i:05d}"]
        if _is_key(like):
            expected = jax.random.key_data(like)
            value = np.asarray(value)
            if value.shape != expected.shape or value.dtype != expected.dtype:
                raise ConfigError(f"the checkpoint's array {i} does not fit this run's state")
            restored.append(jax.random.wrap_key_data(value, impl=jax.random.key_impl(like)))
            continue
        shape, dtype = np.shape(like), np.dtype(like.dtype)
        if value.shape != shape or value.dtype != dtype:
            raise ConfigError(
                f"the checkpoint's array {i} is {value.dtype}{list(value.shape)} and this run's state "
                f"needs {dtype}{list(shape)}: it was written by another algorithm, model or settings"
            )
        restored.append(value)
    return jax.tree.unflatten(treedef, restored)


class RunCheckpoints:
    """The checkpoints of one training loop, in `directory`.

    Args:
      directory: where they go (created).
      keep: how many of the latest are kept.
    """

    def __init__(self, directory: str | os.PathLike, *, keep: int = 2):
        self.directory = Path(directory).absolute()
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        )

    def save(self, round_index: int, tree: Any, meta: dict[str, Any]) -> None:
        """Saves `tree` (any pytree of arrays) and the JSON-able `meta` as of `round_index`.

        Returns once the arrays are copied to the host; orbax writes them
        in the background (`wait` blocks until it has). `meta` is copied
        first: orbax serializes it in that background thread, by when the
        caller may have appended to it (a later evaluation's record).
        """
        meta = json.loads(json.dumps({**meta, "round": round_index}))
        self._manager.save(
            round_index,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(flatten_leaves(tree)),
                meta=ocp.args.JsonSave(meta),
            ),
            force=True,
        )

    def latest_round(self) -> int | None:
        return self._manager.latest_step()

    def restore(self, template: Any) -> tuple[int, Any, dict[str, Any]] | None:
        """(round, tree shaped as `template`, meta) of the latest readable checkpoint, or None.

        A checkpoint that cannot be read (damaged on disk) is skipped for the
        one before it, and deleted once that one is restored: the resumed run
        saves its own at that round; orbax's unfinished temporary folders are
        never seen.
        """
        like = _template_leaves(template)
        damaged, damaged_steps = [], []
        for step in sorted(self._manager.all_steps(), reverse=True):
            try:
                restored = self._manager.restore(
                    step,
                    args=ocp.args.Composite(
                        state=ocp.args.StandardRestore(like), meta=ocp.args.JsonRestore()
                    ),
                )
            except (KeyError, ValueError, OSError) as error:
                damaged.append(f"{step} ({type(error).__name__})")
                damaged_steps.append(step)
                continue
            leaves = {name: np.asarray(value) for name, value in restored["state"].items()}
            for later in damaged_steps:
                self._manager.delete(later)
            return step, unflatten_leaves(template, leaves), dict(restored["meta"])
        if damaged:
            raise ConfigError(f"no checkpoint in {self.directory} can be read: {', '.join(damaged)}")
        return None

    def wait(self) -> None:
        """Blocks until every checkpoint saved so far is on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def _template_leaves(template: Any) -> dict[str, np.ndarray]:
    """Zero host arrays shaped as the saved leaves (orbax restores into their types)."""
    leaves = jax.tree.leaves(template)
    out = {}
    for i, leaf in enumerate(leaves):
        shaped = jax.eval_shape(jax.random.key_data, leaf) if _is_key(leaf) else leaf
        out[f"leaf_{i:05d}"] = np.zeros(np.shape(shaped), shaped.dtype)
    return out
