"""FedAvg (McMahan et al. 2017).

One round (Pillutla et al. 2023, Section 3.2; Li 2023 (thesis), Algorithm 1
with the weighting of its experiments, Sections 3.4.1 and 3.7.2):

1. sample M of the N training clients uniformly without replacement;
2. each runs local minibatch SGD from w_t (`jaxfl.training.local`);
3. the server averages the updates with weights alpha_i (number of
   examples by default, or uniform): Delta = sum_i alpha_i (w_i - w_t) /
   sum_i alpha_i;
4. a server optimizer takes -Delta as its gradient (SGD with learning rate
   1 gives w_{t+1} = w_t + Delta, plain FedAvg).

With `stragglers` > 0 (systems heterogeneity, thesis Section 3.4.2): that
fraction of the cohort are stragglers, and FedAvg *drops* them: they do not
train and get zero weight (FedProx keeps their partial work,
`jaxfl.algorithms.fedprox`). With `stragglers` = 0 (the default) none of this
is in the compiled round.

Composed of the round's stages (`jaxfl.algorithms.stages`): the straggler
plan as its select stage, plain local SGD, the weighted mean.

References:
  [McMahan et al. 2017] Communication-Efficient Learning of Deep Networks from Decentralized Data.
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks.
"""

from __future__ import annotations

from typing import Unpack

import jax
import jax.numpy as jnp

from jaxfl.algorithms import stages
from jaxfl.algorithms.base import FederatedAlgorithm, ServerState
from jaxfl.algorithms.plans import (
    check_straggler_epochs,
    draw_stragglers,
    num_stragglers,
    random_subset_mask,
)
from jaxfl.training.local import LocalTraining, Task
from jaxfl.types import Key

__all__ = ["fedavg", "straggler_plan", "straggler_select"]


def straggler_plan(
    clients_per_round: int, stragglers: float, max_epochs: int, *, keep: bool
) -> stages.Plan | None:
    """The plan of a cohort with stragglers, or None without any.

    Args:
      clients_per_round: M.
      stragglers: fraction in [0, 1) of the cohort that straggles.
      max_epochs: E.
      keep: True (FedProx) keeps the stragglers' partial work, run for their
        drawn epochs; False (FedAvg) drops them: they do not train.

    Returns:
      The plan, or None when no client straggles (nothing is compiled in).

    Raises:
      ValueError: stragglers outside [0, 1), or kept stragglers with num_epochs < 2.
    """
    count = num_stragglers(clients_per_round, stragglers)
    if count == 0:
        return None
    if keep:
        check_straggler_epochs(count, max_epochs)

    def plan(cohort: stages.Cohort, state: ServerState, key: Key) -> stages.ClientPlan:
        del state  # Unused.
        if keep:
            drawn = draw_stragglers(key, cohort.client_ids, count, max_epochs)
            is_straggler = drawn.is_straggler
            client_plan = stages.ClientPlan(num_epochs=drawn.num_epochs)
        else:
            # The same choice of stragglers as `draw_stragglers` with this key.
            choice_key, _ = jax.random.split(key)
            is_straggler = random_subset_mask(choice_key, cohort.client_ids, count)
            client_plan = stages.ClientPlan(active=~is_straggler)
        metrics = {"stragglers": jnp.sum(is_straggler).astype(jnp.int32)}
        return client_plan._replace(metrics=metrics)

    return plan


def straggler_select(
    clients_per_round: int, stragglers: float, local: LocalTraining, *, keep: bool
) -> stages.SelectStage:
    """The select stage of a round with stragglers: `straggler_plan` over `local`'s epochs.

    FedAvg drops its stragglers (`keep=False`); FedProx and FedNova keep their
    partial work (`keep=True`).
    """
    return stages.SelectStage(plan=straggler_plan(clients_per_round, stragglers, local.num_epochs, keep=keep))


def fedavg(
    task: Task,
    local: LocalTraining,
    clients_per_round: int,
    *,
    stragglers: float = 0.0,
    **options: Unpack[stages.RoundOptions],
) -> FederatedAlgorithm:
    """Federated averaging (see the module docstring).

    Args:
      task, local, clients_per_round, **options: as `jaxfl.algorithms.stages.compose_round` takes them.
      stragglers: fraction of each cohort that straggles and is dropped
        (static; 0 compiles plain FedAvg).

    Returns:
      The `FederatedAlgorithm`.
    """
    return stages.compose_round(
        "fedavg",
        task,
        clients_per_round,
        select=straggler_select(clients_per_round, stragglers, local, keep=False),
        client_update=stages.ClientUpdateStage(local=local),
        **options,
    )
