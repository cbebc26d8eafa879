"""FedProx (Li et al. 2020; Li 2023 (thesis), chapter 3) with systems heterogeneity.

Each sampled client k inexactly minimizes the proximal local objective
h_k(w; w_t) = F_k(w) + (mu / 2) ||w - w_t||^2 (thesis eq. 3.2) by local
minibatch SGD, w <- (1 - lr l2) w - lr (grad F_k(w; batch) + mu (w - w_t))
(the authors' code, litian96/FedProx, `flearn/optimizer/pgd.py`), and the
server averages the local models with weights alpha_k (number of examples:
the thesis's experiments, Sections 3.4.1 and 3.7.2).

Systems heterogeneity (thesis Section 3.4.2): a fraction `stragglers` of every
cohort, re-drawn each round, are stragglers that run x local epochs with x
uniform on {1, ..., E - 1} (the authors' code `np.random.randint(1, E)`; the
thesis text says [1, E]), the others run E. FedProx *keeps* the stragglers'
partial solutions (a variable amount of local work is its gamma-inexactness);
FedAvg with the same `stragglers` drops them (`jaxfl.algorithms.fedavg`). Both
draw the stragglers from the same keys, so at the same seed they see the same
stragglers, as the thesis's comparison requires. With mu = 0 and no stragglers
FedProx is FedAvg.

References:
  [Li et al. 2020] T. Li, A. K. Sahu, M. Zaheer, M. Sanjabi, A. Talwalkar,
    V. Smith. Federated Optimization in Heterogeneous Networks. MLSys 2020.
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks.
"""

from __future__ import annotations

from typing import Unpack

from jaxfl.algorithms import stages
from jaxfl.algorithms.base import FederatedAlgorithm
from jaxfl.algorithms.fedavg import straggler_select
from jaxfl.training.local import LocalTraining, Task


def fedprox(
    task: Task,
    local: LocalTraining,
    clients_per_round: int,
    *,
    stragglers: float = 0.0,
    **options: Unpack[stages.RoundOptions],
) -> FederatedAlgorithm:
    """FedProx (see the module docstring).

    Numeric hyperparameters (`state.hparams`): the local ones and 'mu'
    (proximal weight >= 0, default 0.01).

    Args:
      task, local, clients_per_round, **options: as `jaxfl.algorithms.stages.compose_round` takes them.
      stragglers: fraction in [0, 1) of each cohort that straggles (static).

    Returns:
      The `FederatedAlgorithm`.

    Raises:
      ValueError: stragglers outside [0, 1), or stragglers > 0 with fewer
        than 2 local epochs (a straggler runs 1 to num_epochs - 1 epochs).
    """
    return stages.compose_round(
        "fedprox",
        task,
        clients_per_round,
        select=straggler_select(clients_per_round, stragglers, local, keep=True),
        client_update=stages.ClientUpdateStage(local=local, proximal="mu", hparam_defaults={"mu": 0.01}),
        **options,
    )
