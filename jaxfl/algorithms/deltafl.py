"""Delta-FL: federated learning of the superquantile of the client losses.

Objective (Pillutla et al. 2023, eq. 6; Laguel et al. 2020, eq. 1-2 with
data weights alpha_i): minimize the (1 - theta)-superquantile of the losses
F_1(w), ..., F_N(w), i.e. the worst mixture of the clients' distributions
with weights pi_i <= alpha_i / theta (Pillutla et al. 2023, Property 1;
Laguel et al. 2020, Section 3).

One round (Pillutla et al. 2023, Algorithms 1 and 3; Laguel et al. 2020,
Algorithms 2 and 3):

1. sample m clients uniformly without replacement;
2. each sampled client computes F_i(w_t) on all its data (before training);
3. the server turns the losses into aggregation weights pi, by one of
   (`reweighting`):

   * 'threshold' (Pillutla et al. 2023, Algorithm 1 lines 3-5, eq. 10;
     Laguel et al. 2020, Algorithm 2 lines 5-6): Q = the weighted
     (1 - theta)-quantile of the cohort's losses, pi_i ∝ alpha_i 1[F_i >= Q].
     Which quantile: the largest loss Q whose clients at or above it carry at
     least theta of the weight (`filter_threshold`). When theta m is an
     integer the minimizers eta of Laguel et al. 2020, eq. 2 form an interval,
     and this is its upper end: the filter then keeps exactly the theta m
     largest losses (uniform alpha, no ties) and Algorithm 1 equals
     Algorithm 3, as Pillutla et al. 2023, Proposition 3(c) states; the lower
     end (`tail_threshold`, inf{eta : P(Z > eta) <= theta}) would keep one
     client more. Otherwise both ends coincide: ceil(theta m) clients;
   * 'exact' (Pillutla et al. 2023, Algorithm 3 line 3, eq. 9): pi = argmax of
     sum_i pi_i F_i over the simplex with pi_i <= alpha_i / (theta sum_S
     alpha) (`superquantile_weights`), which gives the boundary client its
     fractional weight;
   * 'dp' (Pillutla et al. 2023, Algorithm 2): as 'threshold', with Q the
     differentially private quantile of the losses clipped to [0, B]
     (`dp_quantile`: a hierarchical histogram of b bins, discrete Gaussian
     noise sigma, scaling c, secure sum modulo 2^bits). The histogram counts
     clients, so this Q is the quantile of the *unweighted* cohort losses; the
     aggregation weights are still alpha_i 1[F_i >= Q];
   * 'smoothed' (Pillutla et al. 2023, eq. 14-15): pi = argmax of
     sum_i pi_i F_i - nu KL(pi || alpha) over the same set
     (`smoothed_superquantile_weights`; with uniform alpha the KL is the
     D_S(pi) of Pillutla et al. 2023), which gives every client positive
     weight;

4. the clients with pi_i > 0 run local SGD from w_t; the others have no
   weight and do not train (Laguel et al. 2020, Algorithm 2 line 7 trains
   only S'_t; Pillutla et al. 2023, Algorithm 1 lets everyone train and
   multiplies by 0, which gives the same model);
5. w_{t+1} = w_t + sum_i pi_i (w_i - w_t) / sum_i pi_i, through the server
   optimizer like FedAvg.

With theta = 1 every reweighting except 'dp' gives pi = alpha / sum(alpha):
Delta-FL is FedAvg. With uniform alpha, distinct losses and theta m an
integer, 'threshold' and 'exact' coincide (Pillutla et al. 2023,
Proposition 3(c)).

Threshold period T_eta (Laguel et al. 2020, Algorithm 1 and Appendix C.3,
Figures 17-18): for 'threshold' and 'dp', Q is recomputed at rounds t with
t mod T_eta = 0 and reused in between (it is kept in
`state.extra['threshold']`); every round's clients still compare their own
current loss F_i(w_t) with it, and when none reaches it the round makes no
update (`clients_with_weight` = 0). T_eta = 1 is Laguel et al. 2020,
Algorithm 2.

Filtering (Laguel et al. 2020, Appendix B.1, Algorithm 3): with 'server',
the server sees the losses and computes the weights (Laguel et al. 2020,
Algorithm 2 line 6); with 'client', it only broadcasts Q, and each client
decides alone, from its own loss, whether it passes (F_i >= Q: train and
return weight alpha_i) or not (return weight 0 without training), so the
server learns the weights only through the secure aggregate. The output is
identical. (Laguel et al. 2020 compute Q for this protocol by secure
aggregation with majorization-minimization, `jaxfl.primitives.mm_quantile`;
here Q is the same as with 'server' filtering, so that the two protocols can
be compared exactly.)

Metrics: `clients_with_weight` (Laguel et al. 2020, Figure 16: clients
that survive the filter), and for 'threshold'/'dp' the `threshold` Q used
this round.

References:
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
  [Laguel et al. 2020] Device Heterogeneity in Federated Learning: A Superquantile Approach.
"""

from __future__ import annotations

from typing import Unpack

import jax
import jax.numpy as jnp

from jaxfl.algorithms import stages
from jaxfl.algorithms.base import FederatedAlgorithm, ServerState
from jaxfl.primitives import (
    dp_quantile,
    smoothed_superquantile_weights,
    superquantile_weights,
    tail_threshold,
)
from jaxfl.training.local import LocalTraining, Task
from jaxfl.types import Key

REWEIGHTINGS = ("threshold", "exact", "dp", "smoothed")
FILTERINGS = ("server", "client")
# Reweightings that filter on a threshold Q (the others have no threshold to
# reuse or to broadcast).
THRESHOLD_REWEIGHTINGS = ("threshold", "dp")


def filter_threshold(losses: jax.Array, theta, weights: jax.Array) -> jax.Array:
    """Q of Algorithm 1: the largest loss with alpha-mass of {F >= Q} >= theta.

    Q = max { a_i : sum_{j: a_j >= a_i} w_j >= theta sum_j w_j }, the upper
    weighted (1 - theta)-quantile, so that {F_i >= Q} is the smallest set of
    top losses carrying theta of the weight (see the module docstring for
    why not the lower quantile `tail_threshold`). Computed with the primitive
    as -tail_threshold(-losses, 1 - theta, weights): that is
    -inf { e : mass(-a > e) <= (1 - theta) W } = sup { b : mass(a >= b) >=
    theta W }. At theta = 1 it is the smallest loss (1 - theta is floored at
    a tiny positive number, where `tail_threshold` gives the largest of
    -losses).

    Args:
      losses: `[M]` F_i(w_t).
      theta: tail fraction in (0, 1], may be traced.
      weights: `[M]` alpha_i >= 0.

    Returns:
      The scalar threshold (one of the losses).
    """
    complement = jnp.maximum(1.0 - theta, jnp.finfo(jnp.float32).tiny)
    return -tail_threshold(-losses, complement, weights)


def client_passes(loss: jax.Array, alpha: jax.Array, threshold: jax.Array):
    """One client's own decision under self-filtering (Laguel et al. 2020, Algorithm 3 l. 10-15).

    Args:
      loss: its F_i(w_t) (a scalar it computed itself).
      alpha: its data weight.
      threshold: the broadcast Q.

    Returns:
      (weight it returns, whether it trains): (alpha, True) if F_i >= Q,
      else (0, False).
    """
    passes = loss >= threshold
    return jnp.where(passes, alpha, 0.0), passes


def deltafl(
    task: Task,
    local: LocalTraining,
    clients_per_round: int,
    *,
    reweighting: str = "exact",
    filtering: str = "server",
    dp_bins: int = 32,
    dp_bits: int = 32,
    **options: Unpack[stages.RoundOptions],
) -> FederatedAlgorithm:
    """Delta-FL (see the module docstring).

    Numeric hyperparameters (`state.hparams`), besides the local ones:

    * 'theta': tail fraction in (0, 1] (default 0.5);
    * 'threshold_period': T_eta >= 1 (default 1), for 'threshold' and 'dp';
    * 'smoothing': nu > 0 (default 0.1), for 'smoothed';
    * 'dp_loss_bound' B > 0 (default 3), 'dp_sigma' >= 0 (default 1) and
      'dp_scale' c >= 1 (default 10, rounded to an integer), for 'dp'.

    Args:
      task, local, clients_per_round, **options: as `jaxfl.algorithms.stages.compose_round` takes them.
      reweighting: 'threshold', 'exact', 'dp' or 'smoothed' (static).
      filtering: 'server' or 'client' (client self-filtering; needs a
        threshold: 'threshold' or 'dp').
      dp_bins: b, number of histogram bins for 'dp', a power of two >= 2.
      dp_bits: the secure sum works modulo 2^dp_bits, 2 <= dp_bits <= 32.

    Returns:
      The `FederatedAlgorithm`.

    Raises:
      ValueError: an unknown reweighting or filtering, client filtering
        without a threshold, or invalid dp_bins/dp_bits.
    """
    return stages.compose_round(
        "deltafl",
        task,
        clients_per_round,
        select=tail_selection(reweighting, filtering, dp_bins, dp_bits),
        client_update=stages.ClientUpdateStage(local=local),
        **options,
    )


def tail_selection(
    reweighting: str = "exact", filtering: str = "server", dp_bins: int = 32, dp_bits: int = 32
) -> stages.SelectStage:
    """Delta-FL's select stage: the cohort's losses F_i(w_t), read before training, weight its tail.

    Args and numeric hyperparameters: `deltafl`'s.

    Raises:
      ValueError: an unknown reweighting or filtering, client filtering
        without a threshold, or invalid dp_bins/dp_bits.
    """
    _check_tail_settings(reweighting, filtering, dp_bins, dp_bits)
    uses_threshold = reweighting in THRESHOLD_REWEIGHTINGS

    defaults = {"theta": 0.5}
    if uses_threshold:
        defaults["threshold_period"] = 1.0
    if reweighting == "smoothed":
        defaults["smoothing"] = 0.1
    if reweighting == "dp":
        defaults.update(dp_loss_bound=3.0, dp_sigma=1.0, dp_scale=10.0)

    def fresh_threshold(losses, alpha, hparams, key):
        theta = hparams["theta"]
        if reweighting == "threshold":
            return filter_threshold(losses, theta, alpha)
        bound = hparams["dp_loss_bound"]
        return dp_quantile(
            key,
            jnp.clip(losses, 0.0, bound),
            theta,
            num_bins=dp_bins,
            upper=bound,
            sigma=hparams["dp_sigma"],
            scale=hparams["dp_scale"],
            modulus=2**dp_bits,
        )

    def plan(cohort: stages.Cohort, state: ServerState, key: Key) -> stages.ClientPlan:
        losses, alpha, hparams = cohort.initial_loss, cohort.alpha, state.hparams
        if reweighting == "exact":
            weights = superquantile_weights(losses, hparams["theta"], alpha)
            return stages.ClientPlan(weights=weights, active=weights > 0)
        if reweighting == "smoothed":
            weights = smoothed_superquantile_weights(
                losses, hparams["theta"], hparams["smoothing"], alpha
            )
            return stages.ClientPlan(weights=weights, active=weights > 0)
        # Threshold rules: recompute Q every T_eta rounds, else reuse it.
        period = jnp.maximum(hparams["threshold_period"], 1.0).astype(jnp.int32)
        recompute = jnp.mod(state.round, period) == 0
        threshold = jnp.where(
            recompute,
            fresh_threshold(losses, alpha, hparams, key),
            state.extra["threshold"],
        )
        if filtering == "server":
            weights = jnp.where(losses >= threshold, alpha, 0.0)
            active = weights > 0
        else:
            # The server broadcasts Q; each client decides from its own loss.
            weights, active = jax.vmap(client_passes, in_axes=(0, 0, None))(
                losses, alpha, threshold
            )
        return stages.ClientPlan(
            weights=weights,
            active=active,
            extra={"threshold": threshold},
            metrics={"threshold": threshold, "threshold_recomputed": recompute},
        )

    return stages.SelectStage(
        plan=plan,
        reads_initial_loss=True,
        weights_only=True,
        hparam_defaults=defaults,
        init=initial_threshold if uses_threshold else stages.SelectStage().init,
    )


def _check_tail_settings(reweighting: str, filtering: str, dp_bins: int, dp_bits: int) -> None:
    if reweighting not in REWEIGHTINGS:
        raise ValueError(
            f"reweighting must be one of {', '.join(REWEIGHTINGS)}, got {reweighting!r}"
        )
    if filtering not in FILTERINGS:
        raise ValueError(
            f"filtering must be one of {', '.join(FILTERINGS)}, got {filtering!r}"
        )
    if filtering == "client" and reweighting not in THRESHOLD_REWEIGHTINGS:
        raise ValueError(
            "filtering 'client' broadcasts a threshold: it needs reweighting "
            f"threshold or dp, got {reweighting!r}"
        )
    if reweighting == "dp":
        if dp_bins < 2 or dp_bins & (dp_bins - 1):
            raise ValueError(f"dp_bins must be a power of two >= 2, got {dp_bins}")
        if not 2 <= dp_bits <= 32:
            raise ValueError(f"dp_bits must be in [2, 32], got {dp_bits}")


def initial_threshold(params) -> dict:
    """No threshold yet (NaN): the first round computes one."""
    del params  # Unused.
    return {"threshold": jnp.full((), jnp.nan, jnp.float32)}
