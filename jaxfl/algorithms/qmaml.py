"""q-MAML (Li 2023 (thesis), Appendix 4.6.2, Algorithm 5): q-FFL's fair weighting of MAML's meta-gradients.

The thesis's q-FFL applied to meta-learning: the clients are tasks, and the
meta-objective sum_k p_k F_k(w - eta grad F_k(w))^(q+1) / (q + 1) weights the
tasks whose adapted model still does badly more. One round:

1. sample M of the N training clients;
2. each client k deals its examples, in its round's random order, into a
   training half D_k (positions 0, 2, 4, ...) and a test half D'_k (1, 3,
   ...), adapts w_k = w_t - eta grad F_k(w_t; D_k) and computes, on D'_k,
   F_k = F_k(w_k; D'_k) and the meta-gradient grad F_k(w_k; D'_k) (first
   order: the adaptation's Jacobian is left out, as in first-order MAML);
3. with L = 1 / lr (lr: the local learning rate),

       Delta_k = F_k^q grad F_k(w_k),  h_k = q F_k^(q-1) ||grad F_k(w_k)||^2 + L F_k^q,
       w_{t+1} = w_t - sum_k alpha_k Delta_k / sum_k alpha_k h_k,

   q-FedSGD's update (`jaxfl.algorithms.qffl`) with the adapted losses and
   meta-gradients in place of F_k(w_t) and grad F_k(w_t); q = 0 is
   first-order MAML with step lr. The data weights alpha_k multiply both
   sums, as in q-FFL (the thesis samples tasks with probability p_k).

A client's step uses all its examples (the run's batch size and epochs are
not used, like FedSGD's). The adaptation step eta is the hyperparameter
'perfedavg_alpha' (the same adaptation step as Per-FedAvg's); q is 'q'.
Personal models are the run's fine-tuning baseline (`--finetune-epochs`:
the thesis personalizes with 5 steps of minibatch SGD at meta-test).

References:
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks.
  [Finn et al. 2017] Model-Agnostic Meta-Learning for Fast Adaptation of Deep Networks. ICML 2017.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Unpack

import jax
import jax.numpy as jnp

from jaxfl.algorithms import stages
from jaxfl.algorithms.base import FederatedAlgorithm
from jaxfl.algorithms.fedsgd import full_batch_step
from jaxfl.algorithms.qffl import qffl_aggregate
from jaxfl.training.local import LocalHParams, LocalStep, Task, minibatch_loss, sgd_update
from jaxfl.types import Params

QMAML_HPARAM_DEFAULTS = {"q": 1.0, "perfedavg_alpha": 0.01}


def meta_step(task: Task, hparams: LocalHParams, eta: jax.Array) -> LocalStep:
    """One first-order MAML step on a client's examples dealt into two halves (module docstring)."""

    def step(params: Params, batch, valid, key):
        position = jnp.arange(valid.shape[0])
        train, test = valid & (position % 2 == 0), valid & (position % 2 == 1)
        gradient = jax.grad(minibatch_loss, argnums=1)(task, params, batch, train, key)
        adapted = jax.tree.map(lambda w, g: w - eta * g, params, gradient)
        loss, meta_gradient = jax.value_and_grad(minibatch_loss, argnums=1)(task, adapted, batch, test, key)
        return sgd_update(params, meta_gradient, hparams), loss

    return step


def qmaml(
    task: Task,
    clients_per_round: int,
    **options: Unpack[stages.RoundOptions],
) -> FederatedAlgorithm:
    """q-MAML (see the module docstring)."""

    def local_step(hparams: LocalHParams, state_hparams: Mapping[str, jax.Array]) -> LocalStep:
        return meta_step(task, hparams, state_hparams["perfedavg_alpha"])

    return stages.compose_round(
        "qmaml",
        task,
        clients_per_round,
        client_update=stages.ClientUpdateStage(
            local=full_batch_step, step=local_step, hparam_defaults=QMAML_HPARAM_DEFAULTS
        ),
        # The adapted model's loss on D'_k is the step's reported loss.
        aggregate=stages.AggregateStage(
            aggregate=qffl_aggregate(lambda results, cohort: results.mean_batch_loss)
        ),
        **options,
    )
