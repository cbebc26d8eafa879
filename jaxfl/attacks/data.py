"""Data attacks: the corrupted clients' training examples are poisoned once per run.

Li's thesis (CMU-CS-23-127, Section 5.3.1, attack A1 "label poisoning")
poisons the corrupted devices' training labels once, when the data is
loaded (`litian96/ditto : flearn/trainers_global/fedavg.py`); the corrupted
devices then run the normal algorithm. Poisoning once is the same law as
drawing poisoned labels every round with each example's label then kept
fixed. RFA (Pillutla, Kakade, Harchaoui, IEEE TSP 2022, Section 5;
`krishnap25/RFA : models/utils/main_utils.py`, `corrupt_one_client_data`)
also corrupts the inputs (FEMNIST pixels p -> 1 - p). Test examples are
never poisoned: apply `poison_features` to the training population only.

Attacks (y the integer targets, C = `num_classes`, x the inputs):

* `random-labels`: y <- U{0, ..., C-1}, i.i.d. per example (and per
  position for sequence targets `[E, T]`) (thesis A1 for multi-class tasks:
  FEMNIST U{0..61}, Fashion-MNIST U{0..9}, Shakespeare U{0..79}).
* `label-flip`: y <- C - 1 - y. For C = 2 this is y <- 1 - y, the thesis'
  A1 for binary tasks (CelebA; Vehicle's y -> -y on labels in {-1, 1}).
  For C > 2 it is the reversal of the class order, a fixed permutation
  (jaxfl's choice; it has a fixed point y = (C-1)/2 when C is odd).
* `label-shift-7`: y <- (7y + 1) mod C, RFA's rule for FEMNIST digits
  (C = 10; RFA also swaps the case of FEMNIST letters, which is not
  provided). A permutation only when 7 does not divide C (ValueError
  otherwise); for even C it has no fixed point.
* `negate-inputs`: x <- -x, the analogue of RFA's 1 - p for standardized
  (zero-mean) inputs.
* `invert-inputs`: x <- 1 - x, RFA's rule, for inputs scaled to [0, 1]
  (jaxfl's image datasets divide pixels by 255).

With `pad_id` = p (sequence targets whose padding target is p, which the
loss ignores), the label attacks act on the C - 1 real classes: positions
with y = p are left alone, random labels are drawn uniformly from the C - 1
ids other than p, and `label-flip` / `label-shift-7` are applied to the rank
r = y - [y > p] of y among the real ids, with C - 1 classes, and mapped back
(r -> r + [r >= p]), so no real target becomes padding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp

from jaxfl.types import Key

LABEL_ATTACKS = ("random-labels", "label-flip", "label-shift-7")
INPUT_ATTACKS = ("negate-inputs", "invert-inputs")
DATA_ATTACKS = LABEL_ATTACKS + INPUT_ATTACKS


def _check_label_attack(attack: str, targets, num_classes, pad_id) -> int:
    """Validates a label attack's static arguments; returns the number of real classes."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"{attack} needs num_classes, an int >= 2, got {num_classes!r}")
    if pad_id is not None and (isinstance(pad_id, bool) or not isinstance(pad_id, int)
                               or not 0 <= pad_id < num_classes):
        raise ValueError(f"pad_id must be None or an int in [0, {num_classes}), got {pad_id!r}")
    real = num_classes - (pad_id is not None)
    if real < 2:
        raise ValueError(f"{attack} needs at least 2 real classes, got num_classes={num_classes} with pad_id")
    dtype = jnp.dtype(targets.dtype)
    if not jnp.issubdtype(dtype, jnp.integer) or targets.ndim not in (1, 2):
        raise ValueError(
            f"{attack} needs integer class ids [E] or int32 token ids [E, T], got {dtype} {targets.shape}"
        )
    if targets.ndim == 2 and dtype != jnp.int32:
        raise ValueError(
            f"{attack}: {dtype} targets {targets.shape} are multi-label indicators (jaxfl's sequence "
            "targets are int32), which label attacks do not support"
        )
    if attack == "label-shift-7" and math.gcd(7, real) != 1:
        raise ValueError(f"label-shift-7 is not a permutation of {real} classes (7 divides it)")
    return real


def _rows(mask: jax.Array, x: jax.Array) -> jax.Array:
    """`[E]` mask reshaped to broadcast against `x` `[E, ...]`."""
    return mask.reshape(mask.shape + (1,) * (x.ndim - 1))


def _poison_labels(key: Key, y: jax.Array, attack: str, num_real: int, pad_id: int | None) -> jax.Array:
    ids = y.astype(jnp.int32)
    # Rank among the real (non-pad) ids: the attacks act on 0..num_real-1.
    rank = ids if pad_id is None else ids - (ids > pad_id)
    if attack == "random-labels":
        new_rank = jax.random.randint(key, ids.shape, 0, num_real, dtype=jnp.int32)
    elif attack == "label-flip":
        new_rank = num_real - 1 - rank
    else:  # label-shift-7
        new_rank = jnp.mod(7 * rank + 1, num_real)
    new = new_rank if pad_id is None else new_rank + (new_rank >= pad_id)
    return new.astype(y.dtype)


def poison_features(
    key: Key,
    features: Mapping[str, jax.Array],
    example_is_corrupted: jax.Array,
    attack: str,
    *,
    num_classes: int | None = None,
    target_key: str = "y",
    input_key: str = "x",
    pad_id: int | None = None,
) -> dict[str, jax.Array]:
    """The features with the corrupted examples' targets or inputs poisoned.

    For each example e with `example_is_corrupted[e]` (C = `num_classes`):

    * `random-labels`: y_e <- U{0, ..., C-1} i.i.d. (per position for `[E, T]`);
    * `label-flip`: y_e <- C - 1 - y_e (1 - y_e for binary tasks);
    * `label-shift-7`: y_e <- (7 y_e + 1) mod C;
    * `negate-inputs`: x_e <- -x_e;
    * `invert-inputs`: x_e <- 1 - x_e.

    Uncorrupted examples, and features other than the attacked one, are
    returned unchanged (the same arrays). Sources: Li's thesis Section 5.3.1
    (A1) and RFA (Pillutla et al. 2022, Section 5); see the module docstring,
    also for `pad_id`. Pure `jnp`: jit it with `attack`, `num_classes`, the
    keys and `pad_id` static.

    Args:
      key: PRNG key (only `random-labels` uses it: one draw for the whole
        target array, so an example's label depends on its row).
      features: feature name -> `[E, ...]` array (a population's packed
        training features, e.g. `ClientPopulation.features`).
      example_is_corrupted: `[E]` bool, e.g. `corrupted[population.example_client_ids]`.
      attack: one of `DATA_ATTACKS`.
      num_classes: C, required by the label attacks. Targets must lie in
        [0, C) (not checked: they may be traced).
      target_key: the feature holding integer targets `[E]` or int32 `[E, T]`.
      input_key: the feature holding float inputs `[E, ...]`.
      pad_id: the padding target of sequence targets, or None.

    Returns:
      A new dict with the same keys.

    Raises:
      ValueError: an unknown attack, a missing feature, a mask that is not
        `[E]`, targets that are not integer ids (multi-label indicators
        included), integer inputs for an input attack, or a bad
        `num_classes` / `pad_id`.
    """
    if attack not in DATA_ATTACKS:
        raise ValueError(f"unknown data attack {attack!r}; data attacks are {DATA_ATTACKS}")
    name = target_key if attack in LABEL_ATTACKS else input_key
    if name not in features:
        raise ValueError(f"{attack} poisons feature {name!r}, which is not among {sorted(features)}")
    values = jnp.asarray(features[name])
    mask = jnp.asarray(example_is_corrupted)
    if mask.dtype != jnp.bool_ or mask.ndim != 1 or values.ndim < 1 or mask.shape[0] != values.shape[0]:
        raise ValueError(
            f"example_is_corrupted must be bool [E] with E = {values.shape[0] if values.ndim else None} "
            f"(the rows of {name!r}), got {mask.dtype} {mask.shape}"
        )
    if attack in LABEL_ATTACKS:
        num_real = _check_label_attack(attack, values, num_classes, pad_id)
        poisoned = _poison_labels(key, values, attack, num_real, pad_id)
        change = _rows(mask, values)
        if pad_id is not None:
            change = change & (values != pad_id)
    else:
        if not jnp.issubdtype(values.dtype, jnp.floating):
            raise ValueError(f"{attack} needs float inputs, got {values.dtype} {name!r} (token ids?)")
        poisoned = -values if attack == "negate-inputs" else (1 - values).astype(values.dtype)
        change = _rows(mask, values)
    out = dict(features)
    out[name] = jnp.where(change, poisoned, values)
    return out
