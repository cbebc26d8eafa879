"""DP Delta-FL: Delta-FL with end-to-end differential privacy (Pillutla et al. 2023, Algorithm 4).

One round (Pillutla et al. 2023, Appendix D.1, Algorithm 4):

1. sample m of the n training clients uniformly without replacement;
2. each sampled client computes its loss F_i(w_t) on all its data;
3. the (1 - theta)-quantile Q_t of the losses clipped to [0, B] is computed
   with distributed DP by Pillutla et al. 2023, Algorithm 2
   (`jaxfl.primitives.dp_quantile`: a hierarchical histogram of b bins,
   discrete Gaussian noise sigma_q per client and node, integer scale c,
   secure sum modulo 2^bits);
4. the server broadcasts Q_t; each client decides alone whether it
   contributes, p_i = 1[F_i(w_t) >= Q_t] (Algorithm 4 lines 4 and 9, as in
   the self-filtering of Laguel et al. 2020, Algorithm 3: the server never
   learns who passed), and those clients run local SGD from w_t;
5. the secure aggregate releases s_t = sum_i p_i clip(w_i - w_t, C) +
   N(0, sigma_w^2 I), sigma_w = z 2C (`jaxfl.privacy.noise`);
6. w_{t+1} = w_t + s_t / d_t through the server optimizer as -s_t / d_t
   (SGD with learning rate 1 is Algorithm 4 line 10), where the divisor d_t
   depends on `count`:
   * 'fixed' (the default, sound): d_t = theta m, public and fixed before
     the round, as DP-FedAvg divides by m. The update is post-processing of
     the accounted release s_t alone, whatever the number of clients that
     passed, and every round updates (a round in which nobody passed
     releases pure noise, as accounted).
   * 'exact' (the paper's): d_t = m_t = sum_i p_i, the exact number of
     clients that passed, treated as public as Pillutla et al. 2023,
     Appendix D assumes ("we assume the number m^(t) of selected clients is
     publicly known"). m_t
     changes by one when one client's data is replaced and is NOT covered by
     the accounting; the summary says so. When no client passes (m_t = 0)
     the round makes no update.

Differences from Algorithm 4 as printed: the noise is added to the sum, not
to the average (line 10), so that its privacy, 1 / (2 z^2) zCDP, does not
depend on m_t (`jaxfl.privacy.noise`); and the round's privacy is
accounted with the Gaussian mechanism's rho = Delta^2 / (2 sigma^2), not
Claim 20's sigma_w^2 / (2 C^2) (`jaxfl.privacy.accounting`).

Numeric hyperparameters (`state.hparams`), besides the local ones: 'theta'
in (0, 1] (default 0.5), 'dp_loss_bound' B > 0 (default 3), 'clip_norm' C >
0 (default 1), 'dp_noise_multiplier' z >= 0 and 'dp_quantile_sigma'
sigma_q >= 0 (no defaults: NaN until calibrated by `jaxfl.privacy.budget`,
which sets them from epsilon, delta and the quantile ratio r). Static: b
(`dp_bins`), the ring 2^`dp_bits` and the scale c (`dp_scale`), which
enter the accounting (Theorem 6) and so are not swept by vmap.

With z = sigma_q = 0, C = inf and uniform client weights this is Delta-FL
with `reweighting='dp'` at dp_sigma = 0 (the histogram quantile), exactly
(tested).

Keys: the quantile's noise from the plan key `split(round_keys(key,
t).server)[0]`, the update's from the aggregation key `split(...)[1]`
(`jaxfl.algorithms.fedavg`): distinct, and fresh every round.

Metrics: 'threshold' Q_t, 'clients_with_weight' m_t, and as for DP-FedAvg
'clipped_fraction' (of the contributing clients) and 'mean_update_norm'
(simulation diagnostics, not DP releases).

References:
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
  [Laguel et al. 2020] Device Heterogeneity in Federated Learning: A Superquantile Approach.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Unpack

import jax
import jax.numpy as jnp

from jaxfl.algorithms import stages
from jaxfl.algorithms.base import FederatedAlgorithm, ServerState
from jaxfl.algorithms.deltafl import client_passes
from jaxfl.algorithms.dp_fedavg import DP_HPARAM_DEFAULTS
from jaxfl.algorithms.registry import Engine
from jaxfl.primitives import dp_quantile
from jaxfl.primitives.dp_quantile import check_modulus
from jaxfl.privacy.budget import NOISE_MULTIPLIER, QUANTILE_SIGMA
from jaxfl.privacy.noise import noisy_clipped_sum
from jaxfl.training.cohort import CohortResults
from jaxfl.training.local import LocalTraining, Task
from jaxfl.types import Key

COUNTS = ("fixed", "exact")


def dp_deltafl(
    task: Task,
    local: LocalTraining,
    clients_per_round: int,
    *,
    dp_bins: int = 32,
    dp_bits: int = 32,
    dp_scale: int = 10,
    count: str = "fixed",
    **options: Unpack[stages.RoundOptions],
) -> FederatedAlgorithm:
    """DP Delta-FL, Pillutla et al. 2023, Algorithm 4 (see the module docstring).

    Args:
      task, local, clients_per_round: as `jaxfl.algorithms.stages.compose_round` takes them.
      dp_bins: b, histogram bins, a power of two >= 2.
      dp_bits: the secure sum works modulo 2^dp_bits, 2 <= dp_bits <= 32.
      dp_scale: c, the integer scale of the histograms, >= 1.
      count: the update's divisor: 'fixed' (theta m, public: sound) or
        'exact' (m_t, the paper's, assumed public and not accounted).

    Returns:
      The `FederatedAlgorithm`.

    Raises:
      ValueError: invalid dp_bins, dp_bits or dp_scale.
    """
    if count not in COUNTS:
        raise ValueError(f"count must be one of {', '.join(COUNTS)}, got {count!r}")
    if dp_bins < 2 or dp_bins & (dp_bins - 1):
        raise ValueError(f"dp_bins must be a power of two >= 2, got {dp_bins}")
    if not 2 <= dp_bits <= 32:
        raise ValueError(f"dp_bits must be in [2, 32], got {dp_bits}")
    modulus = check_modulus(2**dp_bits)
    if int(dp_scale) != dp_scale or dp_scale < 1:
        raise ValueError(f"dp_scale must be an integer >= 1, got {dp_scale}")
    scale = int(dp_scale)

    def aggregate(
        results: CohortResults,
        cohort: stages.Cohort,
        client_plan: stages.ClientPlan,
        state: ServerState,
        key: Key,
    ) -> stages.Aggregation:
        del cohort  # Unused.
        contributes = client_plan.active
        released = noisy_clipped_sum(
            key,
            results.deltas,
            contributes,
            clip_norm=state.hparams["clip_norm"],
            noise_multiplier=state.hparams[NOISE_MULTIPLIER],
        )
        selected = jnp.sum(contributes.astype(jnp.int32))
        if count == "fixed":
            # s_t / (theta m): a public divisor, so the update reveals no more than s_t.
            inverse_count = 1.0 / (state.hparams["theta"] * clients_per_round)
        else:
            # s_t / m_t, and no update when nobody passed.
            inverse_count = jnp.where(
                selected > 0, 1.0 / jnp.maximum(selected, 1).astype(jnp.float32), 0.0
            )
        mean_delta = jax.tree.map(
            lambda x: x * inverse_count.astype(x.dtype), released.total
        )
        contributing = jnp.maximum(selected, 1).astype(jnp.float32)
        metrics = {
            "clipped_fraction": jnp.sum(released.clipped.astype(jnp.float32))
            / contributing,
            "mean_update_norm": jnp.sum(
                jnp.where(contributes, released.update_norms, 0.0)
            )
            / contributing,
        }
        return stages.Aggregation(
            mean_delta, contributes.astype(jnp.float32), state.extra, metrics
        )

    defaults = {
        "theta": 0.5,
        "dp_loss_bound": 3.0,
        **DP_HPARAM_DEFAULTS,
        QUANTILE_SIGMA: math.nan,
    }
    return stages.compose_round(
        "dp-deltafl",
        task,
        clients_per_round,
        select=dp_quantile_selection(dp_bins, modulus, scale, defaults),
        client_update=stages.ClientUpdateStage(local=local),
        aggregate=stages.AggregateStage(aggregate=aggregate),
        **stages.uniform_weights("dp-deltafl", options),
    )


def dp_quantile_selection(
    dp_bins: int, modulus: int, scale: int, hparam_defaults: dict
) -> stages.SelectStage:
    """DP Delta-FL's select stage: the DP quantile Q of the cohort's losses, and the clients at or above it.

    Each client compares its own F_i(w_t), read before training, with the
    broadcast Q (Pillutla et al. 2023, Algorithm 4).
    """

    def plan(cohort: stages.Cohort, state: ServerState, key: Key) -> stages.ClientPlan:
        hparams = state.hparams
        bound = hparams["dp_loss_bound"]
        threshold = dp_quantile(
            key,
            jnp.clip(cohort.initial_loss, 0.0, bound),
            hparams["theta"],
            num_bins=dp_bins,
            upper=bound,
            sigma=hparams[QUANTILE_SIGMA],
            scale=scale,
            modulus=modulus,
        )
        # An uncalibrated (NaN) sigma must not pass for a noiseless quantile.
        threshold = jnp.where(jnp.isnan(hparams[QUANTILE_SIGMA]), jnp.nan, threshold)
        # Each client compares its own loss with the broadcast Q (weight 1:
        # the average is over m_t clients, Algorithm 4 line 10).
        weights, passes = jax.vmap(client_passes, in_axes=(0, None, None))(
            cohort.initial_loss, jnp.float32(1.0), threshold
        )
        return stages.ClientPlan(
            weights=weights,
            active=passes,
            metrics={"threshold": threshold},
        )

    return stages.SelectStage(plan=plan, reads_initial_loss=True, hparam_defaults=hparam_defaults)


def from_engine(engine: Engine, options: Mapping[str, Any]) -> FederatedAlgorithm:
    """DP Delta-FL as the registry builds it for a run (uniform weights: no client weighting)."""
    return dp_deltafl(
        engine.task, engine.local, engine.clients_per_round, strategy=engine.strategy,
        server_tx=engine.server_tx, dp_bins=options["dp_bins"], dp_bits=options["dp_bits"],
        dp_scale=options["dp_scale"], count=options["dp_count"], robustness=engine.robustness,
        compression=engine.compression, clock=engine.clock,
    )
