"""q-FFL by q-FedAvg and q-FedSGD (Li et al. 2020; Li 2023 (thesis), chapter 4).

Objective (thesis eq. 4.1): minimize sum_k p_k F_k(w)^(q+1) / (q + 1),
q >= 0; larger q weights the clients of larger loss more, q = 0 is FedAvg's
objective and q -> infinity tends to AFL's minimax.

q-FedAvg (thesis Algorithm 4, Section 4.2.2): every sampled client k
computes F_k = F_k(w_t) on all its local data *before* training, runs the
usual local SGD from w_t to w_k, and with L = 1 / lr (lr: this round's local
learning rate; the step size tuned at q = 0, thesis Section 4.2.2, Lemma 1)
and Delta w_k = L (w_t - w_k):

    Delta_k = F_k^q Delta w_k,
    h_k     = q F_k^(q-1) ||Delta w_k||^2 + L F_k^q
            = q F_k^(q-1) L^2 ||w_t - w_k||^2 + L F_k^q,
    w_{t+1} = w_t - sum_k alpha_k Delta_k / sum_k alpha_k h_k,

with F_k + 1e-10 in place of F_k (the authors' code, litian96/fair_flearn).

q-FedSGD (thesis Algorithm 3): the same with Delta w_k = grad F_k(w_t), the
full-local-data gradient (thesis Section 4.3.4 runs q-FedSGD as "gradient
descent with the local training data"; the authors' code uses a minibatch). It
is q-FedAvg whose local training is FedSGD's single full-batch step
(`jaxfl.algorithms.fedsgd`): then L (w_t - w_k) = grad F_k(w_t) exactly.

Sampling and weights: the thesis samples clients with probability p_k (in
its experiments proportional to n_k) and sums uniformly over them. The
engine samples uniformly, so the data weights alpha_k (the run's client
weighting) multiply both sums instead: with `client_weighting='uniform'`
this is exactly the thesis's algorithm under uniform sampling, and for
every weighting q = 0 gives h_k = L and w_{t+1} = w_t + sum alpha_k (w_k -
w_t) / sum alpha_k, FedAvg with the same weights. The update goes through
the server optimizer as -Delta, like FedAvg's (SGD with learning rate 1 is
the thesis's rule).

"AFL as q-FFL with large q" (Pillutla et al. 2023, Section 7.2 and Appendix
C.2: q = 10, "more stable convergence with similar performance" than AFL) is
the registry entry 'afl-qffl': this algorithm with q = 10 by default.

References:
  [Li et al. 2020] Fair Resource Allocation in Federated Learning. ICLR 2020.
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks.
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Unpack

import jax
import jax.numpy as jnp

from jaxfl.algorithms import stages
from jaxfl.algorithms.base import FederatedAlgorithm, ServerState, local_learning_rate
from jaxfl.algorithms.fedsgd import full_batch_step
from jaxfl.algorithms.registry import Engine
from jaxfl.training.cohort import CohortResults
from jaxfl.training.local import LocalTraining, Task
from jaxfl.types import Key, Params

VARIANTS = ("fedavg", "fedsgd")
# Added to F_k so that F_k^(q-1) stays finite at F_k = 0 (the authors' code).
LOSS_OFFSET = 1e-10


def per_client_sq_norm(deltas: Params) -> jax.Array:
    """`[M]` ||delta_k||^2 of stacked per-client pytrees."""
    leaves = jax.tree.leaves(deltas)
    return sum(jnp.sum(jnp.reshape(x, (x.shape[0], -1)) ** 2, axis=1) for x in leaves)


def qffl_coefficients(losses, sq_norms, alpha, q, lipschitz):
    """Coefficients c_k with w_{t+1} - w_t = sum_k c_k (w_k - w_t).

    c_k = alpha_k L F_k^q / sum_j alpha_j h_j, h_j = q F_j^(q-1) L^2
    ||w_j - w_t||^2 + L F_j^q (thesis Algorithm 4, see the module docstring).

    Args:
      losses: `[M]` F_k(w_t).
      sq_norms: `[M]` ||w_k - w_t||^2.
      alpha: `[M]` data weights.
      q: q >= 0.
      lipschitz: L = 1 / lr.

    Returns:
      `[M]` coefficients (they need not sum to 1).
    """
    shifted = losses + LOSS_OFFSET
    powered = shifted**q  # F^q
    h = q * (powered / shifted) * lipschitz**2 * sq_norms + lipschitz * powered
    return alpha * lipschitz * powered / jnp.sum(alpha * h)


def qffl_update(
    deltas: Params, losses: jax.Array, alpha: jax.Array, state: ServerState
) -> stages.Aggregation:
    """The q-FFL step sum_k c_k delta_k from per-client updates and losses, as an `Aggregation`.

    c = `qffl_coefficients` with q = `state.hparams['q']` and L = 1 / this
    round's local learning rate; the weights reported are c, and the metric
    'step_scale' is sum_k c_k.
    """
    lipschitz = 1.0 / local_learning_rate(state.hparams, state.round)
    coefficients = qffl_coefficients(losses, per_client_sq_norm(deltas), alpha, state.hparams["q"], lipschitz)
    mean_delta = jax.tree.map(lambda x: jnp.tensordot(coefficients, x, axes=(0, 0)).astype(x.dtype), deltas)
    return stages.Aggregation(mean_delta, coefficients, state.extra, {"step_scale": jnp.sum(coefficients)})


def qffl_aggregate(losses: Callable[[CohortResults, stages.Cohort], jax.Array]) -> stages.Aggregate:
    """The aggregate stage's rule `qffl_update`, the per-client losses being `losses(results, cohort)`.

    q-FFL weighs the losses F_k(w_t) read before training
    (`cohort.initial_loss`); q-MAML those of the adapted models
    (`jaxfl.algorithms.qmaml`).
    """

    def aggregate(
        results: CohortResults, cohort: stages.Cohort, plan: stages.ClientPlan, state: ServerState, key: Key
    ) -> stages.Aggregation:
        del plan, key  # Unused.
        return qffl_update(results.deltas, losses(results, cohort), cohort.alpha, state)

    return aggregate


def qffl(
    task: Task,
    local: LocalTraining,
    clients_per_round: int,
    *,
    variant: str = "fedavg",
    q: float = 1.0,
    name: str = "qffl",
    **options: Unpack[stages.RoundOptions],
) -> FederatedAlgorithm:
    """q-FedAvg or q-FedSGD (see the module docstring).

    Numeric hyperparameters: the local ones and 'q' >= 0 (default `q`).

    Args:
      task, local, clients_per_round, **options: as `jaxfl.algorithms.stages.compose_round` takes them
        (q-FedSGD's local step is one full-batch step).
      variant: 'fedavg' (q-FedAvg, thesis Algorithm 4) or 'fedsgd'
        (q-FedSGD, Algorithm 3).
      q: the default of the hyperparameter q.
      name: registry name.

    Returns:
      The `FederatedAlgorithm`.

    Raises:
      ValueError: an unknown variant or a negative q.
    """
    if variant not in VARIANTS:
        raise ValueError(
            f"qffl_variant must be one of {', '.join(VARIANTS)}, got {variant!r}"
        )
    if not q >= 0:
        raise ValueError(f"q must be >= 0, got {q}")

    return stages.compose_round(
        name,
        task,
        clients_per_round,
        client_update=stages.ClientUpdateStage(
            local=full_batch_step if variant == "fedsgd" else local, reports_initial_loss=True
        ),
        aggregate=stages.AggregateStage(
            aggregate=qffl_aggregate(lambda results, cohort: cohort.initial_loss), hparam_defaults={"q": q}
        ),
        **options,
    )


# The q of "AFL as q-FFL with large q" (Pillutla et al. 2023, Section 7.2, Appendix C.2).
AFL_QFFL_Q = 10.0


def from_engine(engine: Engine, options: Mapping[str, Any]) -> FederatedAlgorithm:
    """q-FFL as the registry builds it for a run."""
    return qffl(
        engine.task, engine.local, engine.clients_per_round, variant=options["qffl_variant"],
        **engine.round_options(),
    )


def afl_from_engine(engine: Engine, options: Mapping[str, Any]) -> FederatedAlgorithm:
    """AFL as q-FFL with q = `AFL_QFFL_Q`, as the registry builds it for a run."""
    return qffl(
        engine.task, engine.local, engine.clients_per_round, variant=options["qffl_variant"], q=AFL_QFFL_Q,
        name="afl-qffl", **engine.round_options(),
    )
