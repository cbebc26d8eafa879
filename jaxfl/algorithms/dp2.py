"""DP^2 in federated learning: DP-FedAvg whose clients precondition with a delayed second moment.

DP^2 (Li et al. 2023; Li 2023, Algorithm 11) alternates a private SGD phase of
s1 steps and a private RMSProp phase of s2 steps; each RMSProp phase divides
the gradients, *before* they are clipped and noised, by sqrt(v) + eps, v
refreshed from the privatized gradients of the SGD phase just ended. Here
a step is a round of DP-FedAvg (`jaxfl.algorithms.dp_fedavg`), and the
preconditioner is applied where AdaDPS-FL applies its side information
(`jaxfl.algorithms.adadps`, Li 2023, Algorithm 10): to every local gradient.
Round t, phase p = t mod (s1 + s2):

* SGD phase (p < s1): DP-FedAvg with local learning rate lr and clip C;
* RMSProp phase (p >= s1): every local step is w <- w - lr2 g / (sqrt(v) + eps),
  and the update is clipped to C2 (the thesis tunes the two phases' rates
  and clips apart). lr2 is constant (`--lr-decay` schedules lr only), and
  an l2 term's decay (1 - lr lambda) w keeps the SGD phase's rate lr;
* after round t the server adds the round's pseudo-gradient
  g~_t = -Delta~_t / lr_t (the released mean update over the round's local
  learning rate: the clients' summed local gradients, averaged and noised) to
  G; before a round with p = s1 it sets v <- refresh(v, G / s1) and G <- 0,
  before one with p = 0, G <- 0. refresh is `jaxfl.privacy.optimizers.
  delayed_second_moment` (rmsprop, adagrad or yogi).

v and G are functions of the released updates only (post-processing), so the
privacy is DP-FedAvg's with the same z: the run calibrates and accounts as
for `dp-fedavg` (`jaxfl.privacy.budget.DP_FEDAVG_BUDGET`). s1 and s2 are
rounded to integers and must be >= 1 (the command line refuses others).

Numeric hyperparameters (`state.hparams`, traced: sweepable): 'dp2_sgd_rounds'
s1, 'dp2_rmsprop_rounds' s2, 'dp2_beta', 'dp2_eps', 'dp2_lr' lr2,
'dp2_clip_norm' C2, besides DP-FedAvg's. Static option: the variant. The
state (`state.extra`): v and G, each a tree like the parameters.

Round metrics beyond DP-FedAvg's: 'dp2_rmsprop_phase' (1 in an RMSProp round).

References:
  [Li et al. 2023] T. Li, M. Zaheer, K. Liu, S. J. Reddi, H. B. McMahan, V. Smith. Differentially
    Private Adaptive Optimization with Delayed Preconditioners. ICLR 2023.
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks (thesis), Algorithms 10-11,
    Section 6.14.
  [Zaheer et al. 2018] Adaptive Methods for Nonconvex Optimization. NeurIPS 2018.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, Unpack

import jax
import jax.numpy as jnp

from jaxfl.algorithms import stages
from jaxfl.algorithms.base import FederatedAlgorithm, ServerState, local_learning_rate
from jaxfl.algorithms.dp_fedavg import (
    DP_HPARAM_DEFAULTS,
    private_averaging,
    private_mean,
    private_round_options,
)
from jaxfl.algorithms.registry import Engine
from jaxfl.privacy.optimizers import DP2_VARIANTS, delayed_second_moment
from jaxfl.training.local import LocalTraining, Task
from jaxfl.types import Params
from jaxfl.validation import check_choice

DP2_HPARAM_DEFAULTS = {
    **DP_HPARAM_DEFAULTS,
    "dp2_sgd_rounds": 10.0,
    "dp2_rmsprop_rounds": 10.0,
    "dp2_beta": 0.9,
    "dp2_eps": 1e-3,
    "dp2_lr": 0.01,
    "dp2_clip_norm": 1.0,
}


class Dp2Moments(NamedTuple):
    """The server's delayed second moment v and the pseudo-gradients G summed since its last reset."""

    second: Params
    accumulated: Params


def _phase(state: ServerState, round_index: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(p, s1) of a round: its place in the cycle of s1 + s2 rounds."""
    sgd_rounds = jnp.round(state.hparams["dp2_sgd_rounds"]).astype(jnp.int32)
    cycle = sgd_rounds + jnp.round(state.hparams["dp2_rmsprop_rounds"]).astype(jnp.int32)
    return round_index % jnp.maximum(cycle, 1), sgd_rounds


def _in_rmsprop_phase(state: ServerState) -> jax.Array:
    phase, sgd_rounds = _phase(state, state.round)
    return phase >= sgd_rounds


def dp2(
    task: Task,
    local: LocalTraining,
    clients_per_round: int,
    *,
    dp2_variant: str = "rmsprop",
    **options: Unpack[stages.RoundOptions],
) -> FederatedAlgorithm:
    """DP^2-FL (see the module docstring).

    Args:
      task, local, clients_per_round, **options: as `jaxfl.algorithms.stages.compose_round` takes them,
        client weighting left out: every client counts equally, as in DP-FedAvg.
      dp2_variant: how v is refreshed: 'rmsprop', 'adagrad' or 'yogi'.

    Returns:
      The `FederatedAlgorithm`.

    Raises:
      ValueError: an unknown variant.
    """
    check_choice("dp2_variant", dp2_variant, DP2_VARIANTS)

    def init(params: Params) -> Dp2Moments:
        # Two trees of their own: the state is donated, and one buffer cannot be donated twice.
        return Dp2Moments(*(jax.tree.map(jnp.zeros_like, params) for _ in range(2)))

    def preconditioner(state: ServerState) -> Params:
        # w - lr g / A = w - lr2 g / (sqrt(v) + eps) in the RMSProp phase; A = 1 in the SGD phase.
        lr = local_learning_rate(state.hparams, state.round)
        scale = lr / state.hparams["dp2_lr"]
        rmsprop = _in_rmsprop_phase(state)
        return jax.tree.map(
            lambda v: jnp.where(rmsprop, (jnp.sqrt(v) + state.hparams["dp2_eps"]) * scale, 1.0),
            state.extra.second,
        )

    def aggregate(results, cohort, plan, state, key) -> stages.Aggregation:
        del cohort, plan  # Unused: every sampled client contributes.
        rmsprop = _in_rmsprop_phase(state)
        clip_norm = jnp.where(rmsprop, state.hparams["dp2_clip_norm"], state.hparams["clip_norm"])
        aggregation = private_mean(results, state, key, clients_per_round, clip_norm)
        lr = local_learning_rate(state.hparams, state.round)
        accumulated = jax.tree.map(
            lambda g, delta: g - delta / lr, state.extra.accumulated, aggregation.mean_delta
        )
        # What the next round starts with: a refreshed v at the RMSProp phase's start, G reset.
        next_phase, sgd_rounds = _phase(state, state.round + 1)
        refresh = next_phase == sgd_rounds
        beta = state.hparams["dp2_beta"]
        second = jax.tree.map(
            lambda v, g: jnp.where(refresh, delayed_second_moment(dp2_variant, beta, v, g / sgd_rounds), v),
            state.extra.second,
            accumulated,
        )
        reset = refresh | (next_phase == 0)
        accumulated = jax.tree.map(lambda g: jnp.where(reset, 0.0, g), accumulated)
        metrics = {**aggregation.metrics, "dp2_rmsprop_phase": rmsprop.astype(jnp.float32)}
        return aggregation._replace(extra=Dp2Moments(second, accumulated), metrics=metrics)

    return private_averaging(
        "dp2", task, local, clients_per_round, preconditioner=preconditioner, aggregate=aggregate,
        hparam_defaults=DP2_HPARAM_DEFAULTS, init=init, **options,
    )

def from_engine(engine: Engine, options: Mapping[str, Any]) -> FederatedAlgorithm:
    """DP^2-FL as the registry builds it for a run (uniform weights, as DP-FedAvg)."""
    return dp2(
        engine.task, engine.local, engine.clients_per_round,
        dp2_variant=options["dp2_variant"], **private_round_options(engine),
    )
