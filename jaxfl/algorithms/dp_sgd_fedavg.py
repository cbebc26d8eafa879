"""FedAvg whose clients train by DP-SGD: example-level differential privacy.

One round, as FedAvg (`jaxfl.algorithms.fedavg`) but for the local step:

1. sample m of the n training clients uniformly without replacement;
2. each runs local DP-SGD from w_t (Abadi et al. 2016, Algorithm 1, with the
   shuffled batches of `jaxfl.training.local`): every step's gradient is

       g~ = (1 / B) (sum_{j in batch} clip(grad f_j(w), C) + N(0, (z 2C)^2 I)),

   f_j one example's loss, clip to l2 norm C per example, the noise fresh
   per step from the client's key (`jaxfl.training.local.
   example_private_gradient`);
3. the server averages the updates with weights alpha_i and takes its
   optimizer step, as FedAvg.

The unit of privacy is one example of one client: two training populations
are neighbours when one example of one client is replaced by another (every
client's number of examples public). Replacing it moves one step's clipped
sum by at most 2C, so each step is the Gaussian mechanism of multiplier z;
an example is in one batch per epoch, so a client's round composes E =
`local.num_epochs` of them for each of its examples, and everything the
client sends is their post-processing. The server, the other clients and
anyone who sees the models learn about an example only through those noisy
steps: no secure aggregation or trusted server is assumed. The run's
epsilon comes from `jaxfl.privacy.budget.EXAMPLE_DP_BUDGET` (the accounting
and its two trust models: `jaxfl.privacy.accounting.example_level_event`).

Numeric hyperparameters (`state.hparams`): 'example_clip_norm' C > 0 and
'dp_noise_multiplier' z >= 0, besides the local ones. As in DP-FedAvg, z
defaults to NaN when built directly, so that a forgotten calibration cannot
train silently; z = 0 with C = inf is FedAvg up to the divisor of a short
last batch (B, not its count) and float reassociation.

The round's metrics (the cohort's training loss, local steps) are computed
from private data and are not DP releases (`jaxfl.privacy.budget.
not_private_outputs`).

References:
  [Abadi et al. 2016] Deep Learning with Differential Privacy. CCS 2016.
  [McMahan et al. 2017] Communication-Efficient Learning of Deep Networks from Decentralized Data.
"""

from __future__ import annotations

import math
from typing import Unpack

from jaxfl.algorithms import stages
from jaxfl.algorithms.base import FederatedAlgorithm
from jaxfl.privacy.budget import NOISE_MULTIPLIER
from jaxfl.training.local import LocalTraining, Task

__all__ = ["dp_sgd_fedavg"]

EXAMPLE_CLIP_NORM = "example_clip_norm"
EXAMPLE_DP_HPARAM_DEFAULTS = {EXAMPLE_CLIP_NORM: 1.0, NOISE_MULTIPLIER: math.nan}


def dp_sgd_fedavg(
    task: Task,
    local: LocalTraining,
    clients_per_round: int,
    **options: Unpack[stages.RoundOptions],
) -> FederatedAlgorithm:
    """FedAvg with local DP-SGD (see the module docstring).

    Args:
      task, local, clients_per_round, **options: as `jaxfl.algorithms.stages.compose_round` takes them.

    Returns:
      The `FederatedAlgorithm`.
    """
    return stages.compose_round(
        "dp-sgd-fedavg",
        task,
        clients_per_round,
        client_update=stages.ClientUpdateStage(
            local=local,
            example_privacy=(EXAMPLE_CLIP_NORM, NOISE_MULTIPLIER),
            hparam_defaults=EXAMPLE_DP_HPARAM_DEFAULTS,
        ),
        **options,
    )

