"""FedDane (Li et al. 2019): DANE's gradient-corrected local problems, solved locally by part of the clients.

One round, with w_t the server model (Li et al. 2019, Algorithm 1; Li 2023
(thesis), Section 3.6 compares it with FedProx):

1. sample M of the N training clients;
2. each sampled client k computes grad F_k(w_t) on all its data, and the
   server averages them: g_t = sum_k alpha_k grad F_k(w_t) / sum_k alpha_k;
3. each sampled client approximately solves, by the run's local SGD,

       min_w F_k(w) + <g_t - grad F_k(w_t), w> + mu/2 ||w - w_t||^2,

   i.e. every step's gradient is corrected by g_t - grad F_k(w_t) (the DANE
   correction of Shamir et al. 2014) and pulled toward w_t (FedProx's term);
4. the server averages the local models (the weighted mean, the run's
   aggregator and update attack apply) and takes a server optimizer step.

FedDane as published draws the clients of step 2 and of step 3 as two
independent samples (two exchanges per round); here the same cohort serves
both, so a round costs one exchange more than FedProx's, not two. The l2
term, where set, is in every step and cancels out of the correction.
Hyperparameters: the local ones and 'mu'.

References:
  [Li et al. 2019] T. Li, A. K. Sahu, M. Zaheer, M. Sanjabi, A. Talwalkar,
    V. Smith. FedDANE: A Federated Newton-Type Method. Asilomar Conference
    on Signals, Systems, and Computers, 2019.
  [Shamir et al. 2014] O. Shamir, N. Srebro, T. Zhang. Communication-
    Efficient Distributed Optimization using an Approximate Newton-type
    Method. ICML 2014.
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks.
"""

from __future__ import annotations

from typing import Unpack

import jax

from jaxfl.algorithms import stages
from jaxfl.algorithms.base import FederatedAlgorithm, ServerState
from jaxfl.training.cohort import CohortData, cohort_gradients, weighted_mean
from jaxfl.training.local import LocalTraining, Task
from jaxfl.types import Params


def feddane(
    task: Task,
    local: LocalTraining,
    clients_per_round: int,
    **options: Unpack[stages.RoundOptions],
) -> FederatedAlgorithm:
    """FedDane (see the module docstring)."""
    strategy = options["strategy"]

    def correction(state: ServerState, rows, cohort: stages.Cohort, data: CohortData) -> Params:
        del rows  # FedDane keeps no per-client state.
        gradients = cohort_gradients(task, strategy, state.params, data)
        mean = weighted_mean(gradients, cohort.alpha)
        return jax.tree.map(lambda g, g_k: g[None] - g_k, mean, gradients)

    return stages.compose_round(
        "feddane",
        task,
        clients_per_round,
        client_update=stages.ClientUpdateStage(
            local=local, proximal="mu", correction=correction, hparam_defaults={"mu": 0.01},
            side_messages=1,  # Each client's gradient at w_t up, their mean down.
        ),
        **options,
    )


__all__ = ["feddane"]
