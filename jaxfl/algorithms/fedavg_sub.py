"""FedAvg-Sub: FedAvg on a random fraction theta of each cohort (Pillutla et al. 2023, Section 7.2).

Delta-FL's weights are sparse: about theta m of the m sampled clients get a
nonzero weight (Pillutla et al. 2023, Theorem 3, Remark 1). FedAvg-Sub is the
baseline with the same number of effective clients: of the m sampled clients,
a uniformly random subset of k = max(1, round(theta m)) trains and is averaged
with weights alpha_i (Pillutla et al. 2023, Section 7.2; "FedAvg, theta" of
its Appendix C.2); the other m - k are inactive and run no local step.
Rounding is half to even (Python's and NumPy's `round`). The subset is chosen
from the round's keys (`jaxfl.algorithms.plans.random_subset_mask`), and theta
is a traced hyperparameter, so sweeps over theta share one compiled round.

In distribution this is FedAvg with k clients per round (a uniform subset of
a uniform subset is uniform).

References:
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
"""

from __future__ import annotations

import jax.numpy as jnp
import optax

from jaxfl.algorithms.base import FederatedAlgorithm, ServerState
from jaxfl.algorithms.plans import random_subset_mask
from jaxfl.algorithms.round_template import ClientPlan, Cohort, Robustness, weighted_averaging_algorithm
from jaxfl.training.local import LocalTraining, Task
from jaxfl.training.strategies import ClientStrategy
from jaxfl.types import Key


def subcohort_size(theta, clients_per_round: int):
    """The sub-cohort size k = max(1, round(theta m)), traced if theta is."""
    return jnp.maximum(jnp.round(theta * clients_per_round), 1).astype(jnp.int32)


def fedavg_sub(
    task: Task,
    local: LocalTraining,
    clients_per_round: int,
    *,
    strategy: ClientStrategy,
    robustness: Robustness | None = None,
    server_tx: optax.GradientTransformation | None = None,
    client_weighting: str = "num_examples",
) -> FederatedAlgorithm:
    """FedAvg-Sub (see the module docstring).

    Numeric hyperparameters: the local ones and 'theta' in (0, 1] (default
    0.5), the fraction of the cohort that trains.

    Args:
      task: model and loss.
      local: static local-training shape.
      clients_per_round: M, clients sampled per round.
      strategy: how clients are laid out on the hardware.
      robustness: the run's update attack and aggregator, or None.
      server_tx: server optimizer (default: SGD with learning rate 1).
      client_weighting: 'num_examples' or 'uniform' data weights alpha_i.

    Returns:
      The `FederatedAlgorithm`.
    """

    def plan(cohort: Cohort, state: ServerState, key: Key) -> ClientPlan:
        size = subcohort_size(state.hparams["theta"], clients_per_round)
        return ClientPlan(active=random_subset_mask(key, cohort.client_ids, size))

    return weighted_averaging_algorithm(
        "fedavg-sub",
        task,
        local,
        clients_per_round,
        strategy=strategy,
        server_tx=server_tx,
        client_weighting=client_weighting,
        plan=plan,
        extra_hparam_defaults={"theta": 0.5},
        robustness=robustness,
    )
