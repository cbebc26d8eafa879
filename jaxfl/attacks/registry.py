"""The attacks' names and options, for configurations and command lines."""

from __future__ import annotations

from typing import Any

from jaxfl.attacks.data import DATA_ATTACKS
from jaxfl.attacks.updates import _DEFAULTS, UPDATE_ATTACKS

ATTACKS = DATA_ATTACKS + UPDATE_ATTACKS

# Li's thesis (CMU-CS-23-127), Section 5.3.1: A1 poisons the corrupted
# devices' labels; A2 and A3 forge their updates (and, in the authors' code,
# train them on poisoned labels too: see docs/attacks.md).
THESIS_PRESETS = {"A1": "random-labels", "A2": "random-updates", "A3": "model-replacement"}


def attack_options(name: str) -> dict[str, Any]:
    """A fresh dict of the attack's options and their defaults.

    Data attacks take no options (their arguments are `poison_features`'s
    keywords). A default of None means "computed in the round":
    `model-replacement`'s scale is then the cohort size M, `alie`'s z is
    `alie_z(n, f)` (see `jaxfl.attacks.updates`).

    Raises:
      ValueError: an unknown attack name.
    """
    if name in _DEFAULTS:
        return dict(_DEFAULTS[name])
    if name in DATA_ATTACKS:
        return {}
    raise ValueError(f"unknown attack {name!r}; attacks are {ATTACKS}")
