"""Differential privacy for federated training: clipping, noise, accounting.

* `clipping`: per-client updates clipped to l2 norm C;
* `noise`: the Gaussian sum mechanism on the clipped updates;
* `accounting`: the per-round DP event (sampling without replacement, the
  Gaussian update, the DP quantile of Pillutla et al. 2023, Theorem 6)
  composed over rounds with Google's dp-accounting; epsilon spent and noise
  calibration;
* `budget`: from a run's privacy settings to calibrated noise and back to
  the epsilon spent (what the runner and the CLI use);
* `optimizers`: example-level private optimizers as optax transformations
  (DP-SGD, DP-Adam, DP-RMSProp, AdaDPS, DP^2) and their accounting;
* `example_accounting`: example-level DP in federated rounds (clients that
  train by DP-SGD), against the server and against an observer.

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
from jaxfl.privacy.budget import DpBudget, ExampleDpBudget, max_noise_multiplier
from jaxfl.privacy.clipping import clip_update, clip_updates
from jaxfl.privacy.example_accounting import example_level_epsilon, example_level_noise_multiplier
from jaxfl.privacy.noise import gaussian_noise_like, noisy_clipped_sum
from jaxfl.privacy.optimizers import (
    dp2,
    dp_adam,
    dp_rmsprop,
    dp_sgd_epsilon,
    dp_sgd_noise_multiplier,
    privatize,
    scale_by_public_moments,
    scale_by_side_information,
)

__all__ = [
    "DpBudget",
    "ExampleDpBudget",
    "Sampling",
    "clip_update",
    "clip_updates",
    "dp2",
    "dp_adam",
    "dp_rmsprop",
    "dp_sgd_epsilon",
    "dp_sgd_noise_multiplier",
    "epsilon_spent",
    "example_level_epsilon",
    "example_level_noise_multiplier",
    "gaussian_noise_like",
    "max_noise_multiplier",
    "noise_multiplier_for",
    "noisy_clipped_sum",
    "privatize",
    "quantile_epsilon_for",
    "scale_by_public_moments",
    "scale_by_side_information",
    "sum_sensitivity",
]
