"""Tilted ERM at the client level (Li, Beirami, Sanjabi, Smith 2021; Li 2023 (thesis), ch. 7).

Objective (thesis eq. 7.82 with tau -> 0, the group-level tilt with the
clients as groups; thesis Section 7.7.2.2, which tilts "at the device level"):
minimize the tilted risk (1/t) log sum_k alpha_k exp(t F_k(w)) / sum_k alpha_k
of the client losses; t > 0 focuses on the clients of large loss (fairness),
t < 0 on those of small loss (robustness), and t -> 0 is FedAvg's objective.

Round (the normalized form of the server rule of thesis Section 7.7.2.2, which
re-weights "the accumulated local model updates from each selected device"):
each sampled client computes F_k = F_k(w_t) on all its data before local
training, trains as in FedAvg, and the server averages the updates with the
tilted weights

    pi_k = alpha_k exp(t F_k) / sum_{j in S} alpha_j exp(t F_j)

(`jaxfl.primitives.tilted_risk_weights`, softmax(t F + log alpha)), the
gradient weights of the tilted risk over the cohort. The data weights alpha
(the run's client weighting) inside the softmax give the group-size-weighted
objective of eq. 7.82 (the thesis does not say whether the device tilt
includes them; with uniform weighting it is the plain softmax(t F)). This is
the normalized form, without the running normalizer of the authors' code
(litian96/TERM, which only rescales the step). At t = 0, pi = alpha /
sum(alpha): FedAvg.

Hierarchical tilting (thesis eqs. 7.82-7.85, groups = clients): with a
sample tilt tau (`sample_tilt`) each client's loss is its
tau-tilted risk R_k(tau) = (1/tau) log mean_x exp(tau f_x) over its examples
instead of the mean F_k, both in the server's weights pi_k (computed from
R_k(tau) at w_t) and in local training (each step descends the minibatch's
tau-tilted risk, the stochastic within-group tilt of Algorithm 16). The
round then descends J(t, tau) = (1/t) log sum_k alpha_k exp(t R_k(tau)) /
sum_k alpha_k: tau < 0 discounts each client's outlying examples (noisy
labels), tau > 0 its hardest ones, while t tilts across clients. tau = t
with uniform client weights and sizes is sample-level TERM over all
examples (Lemma 32); tau = 0 is the client-level tilt above (to float
rounding: the clients' mean losses may be summed in another order). Its
round metrics 'cohort_loss' and 'train_loss' are then tilted risks, not
the mean losses other algorithms report.

References:
  [Li et al. 2021] Tilted Empirical Risk Minimization. ICLR 2021.
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks.
"""

from __future__ import annotations

from typing import Unpack

from jaxfl.algorithms import stages
from jaxfl.algorithms.base import FederatedAlgorithm, ServerState
from jaxfl.primitives import tilted_risk_weights
from jaxfl.training.cohort import CohortResults
from jaxfl.training.local import LocalTraining, Task
from jaxfl.types import Key


def term(
    task: Task,
    local: LocalTraining,
    clients_per_round: int,
    *,
    sample_tilt: float | None = None,
    **options: Unpack[stages.RoundOptions],
) -> FederatedAlgorithm:
    """Client-level tilted ERM (see the module docstring).

    Numeric hyperparameters: the local ones, 'tilt' (t, any real; default
    1) and, when hierarchical, 'sample_tilt' (tau, any real).

    Args:
      task, local, clients_per_round, **options: as `jaxfl.algorithms.stages.compose_round` takes them.
      sample_tilt: None: client-level tilting, each client's loss its mean
        (the round of the module docstring's first part, which the fused
        local-training kernel can run). A number: hierarchical tilting, tau
        a traced hyperparameter ('sample_tilt', sweepable) with this default.

    Returns:
      The `FederatedAlgorithm`.
    """

    def reweight(results: CohortResults, alpha, state: ServerState, key: Key):
        del key  # Unused.
        weights = tilted_risk_weights(
            results.initial_loss, state.hparams["tilt"], alpha
        )
        return weights, state.extra, {}

    return stages.compose_round(
        "term",
        task,
        clients_per_round,
        client_update=stages.ClientUpdateStage(
            local=local, reports_initial_loss=True,
            sample_tilt=None if sample_tilt is None else "sample_tilt",
            hparam_defaults={} if sample_tilt is None else {"sample_tilt": float(sample_tilt)},
        ),
        aggregate=stages.AggregateStage(reweight=reweight, hparam_defaults={"tilt": 1.0}),
        **options,
    )
