"""Attacks by corrupted clients, as pure functions.

* `corruption`: which clients are corrupted, chosen once per run on the host
  (`corrupted_clients`: a fraction of the clients, or of the examples);
* `data`: data attacks, applied once to the corrupted clients' training
  examples (`poison_features`: random labels, label flipping, inputs);
* `updates`: update attacks, applied inside the compiled round to the
  cohort's updates (`attack_updates`: random updates, model replacement,
  sign flipping, Gaussian, omniscient, ALIE, IPM);
* `registry`: the names (`ATTACKS`, `DATA_ATTACKS`, `UPDATE_ATTACKS`), the
  thesis presets A1-A3 and `attack_options`.

See docs/attacks.md.
"""

from jaxfl.attacks.corruption import corrupted_clients
from jaxfl.attacks.data import DATA_ATTACKS, poison_features
from jaxfl.attacks.registry import ATTACKS, THESIS_PRESETS, attack_options
from jaxfl.attacks.updates import UPDATE_ATTACKS, alie_z, attack_updates

__all__ = [
    "ATTACKS",
    "DATA_ATTACKS",
    "THESIS_PRESETS",
    "UPDATE_ATTACKS",
    "alie_z",
    "attack_options",
    "attack_updates",
    "corrupted_clients",
    "poison_features",
]
