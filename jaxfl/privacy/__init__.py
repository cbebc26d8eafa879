"""Differential privacy for federated training: clipping, noise, accounting.

* `clipping`: per-client updates clipped to l2 norm C;
* `noise`: the Gaussian sum mechanism on the clipped updates;
* `accounting`: the per-round DP event (sampling without replacement, the
  Gaussian update, the DP quantile of Pillutla et al. 2023, Theorem 6)
  composed over rounds with Google's dp-accounting; epsilon spent and noise
  calibration;
* `budget`: from a run's privacy settings to calibrated noise and back to
  the epsilon spent (what the runner and the CLI use).

See docs/privacy.md.

References:
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
"""

from jaxfl.privacy.accounting import (
    Sampling,
    epsilon_spent,
    noise_multiplier_for,
    quantile_epsilon_for,
    sum_sensitivity,
)
from jaxfl.privacy.budget import DpBudget, max_noise_multiplier
from jaxfl.privacy.clipping import clip_update, clip_updates
from jaxfl.privacy.noise import gaussian_noise_like, noisy_clipped_sum

__all__ = [
    "DpBudget",
    "Sampling",
    "clip_update",
    "clip_updates",
    "epsilon_spent",
    "gaussian_noise_like",
    "max_noise_multiplier",
    "noise_multiplier_for",
    "noisy_clipped_sum",
    "quantile_epsilon_for",
    "sum_sensitivity",
]
