"""DP-FedAvg: FedAvg with client-level differential privacy (McMahan et al. 2018).

One round (McMahan, Ramage, Talwar, Zhang, Learning Differentially Private
Recurrent Language Models, ICLR 2018, with fixed-size cohorts; Li 2023
(thesis), Algorithm 10 with A = 1 (`jaxfl.algorithms.adadps` for any A),
Section 6.4.2 and Appendix 6.6; the
baseline of Pillutla et al. 2023, Section 7.7 and Appendix D.2):

1. sample m of the n training clients uniformly without replacement;
2. each runs local SGD from w_t (the engine's local training) and clips its
   update to l2 norm C: delta_i = clip(w_i - w_t, C) (`jaxfl.privacy.
   clipping`);
3. the secure aggregate releases s_t = sum_i delta_i + N(0, sigma^2 I),
   sigma = z 2C, 2C being the sum's sensitivity to replacing one client's
   data (`jaxfl.privacy.noise`, `jaxfl.privacy.accounting`);
4. the server divides by the public cohort size m (every client counts
   equally: weights must be bounded for the sensitivity to hold, so the
   run's client weighting is not used) and takes its optimizer step with
   -s_t / m as the gradient (SGD with learning rate 1: w_{t+1} = w_t +
   s_t / m).

Numeric hyperparameters (`state.hparams`): 'clip_norm' C > 0 and
'dp_noise_multiplier' z >= 0, besides the local ones. z has no meaningful
default: the runner sets it from the target epsilon
(`jaxfl.privacy.budget.DpBudget.calibrate`); built directly, the algorithm
defaults it to NaN so that a forgotten calibration cannot train silently.
z = 0 with C = inf is FedAvg with uniform client weights, exactly.

Keys: the noise comes from the aggregation key `split(round_keys(key,
t).server)[1]` (`jaxfl.algorithms.fedavg`), fresh every round.

Round metrics beyond FedAvg's: 'clipped_fraction' (clients whose update was
scaled down) and 'mean_update_norm' (before clipping), useful to choose C;
like FedAvg's 'train_loss' they are computed from private data and are
simulation diagnostics, not DP releases.

References:
  [McMahan et al. 2018] Learning Differentially Private Recurrent Language Models. ICLR 2018.
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks.
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Unpack

import jax
import jax.numpy as jnp

from jaxfl.algorithms import stages
from jaxfl.algorithms.base import FederatedAlgorithm, ServerState
from jaxfl.algorithms.registry import Engine
from jaxfl.privacy.budget import NOISE_MULTIPLIER
from jaxfl.privacy.noise import noisy_clipped_sum
from jaxfl.training.cohort import CohortResults
from jaxfl.training.local import LocalTraining, Task
from jaxfl.types import Key, Params

DP_HPARAM_DEFAULTS = {"clip_norm": 1.0, NOISE_MULTIPLIER: math.nan}


def dp_fedavg(
    task: Task,
    local: LocalTraining,
    clients_per_round: int,
    **options: Unpack[stages.RoundOptions],
) -> FederatedAlgorithm:
    """DP-FedAvg (see the module docstring).

    Args:
      task, local, clients_per_round: as `jaxfl.algorithms.stages.compose_round` takes them.

    Returns:
      The `FederatedAlgorithm`.
    """

    return private_averaging("dp-fedavg", task, local, clients_per_round, **options)


def private_averaging(
    name: str,
    task: Task,
    local: LocalTraining,
    clients_per_round: int,
    *,
    preconditioner: Callable[[ServerState], Params] | None = None,
    aggregate: stages.Aggregate | None = None,
    hparam_defaults: Mapping[str, float] = DP_HPARAM_DEFAULTS,
    init: Callable[[Params], Any] | None = None,
    **options: Unpack[stages.RoundOptions],
) -> FederatedAlgorithm:
    """DP-FedAvg's round with the local gradients divided by `preconditioner(state)` (AdaDPS-FL, DP^2-FL).

    Args:
      name: the algorithm's name.
      task, local, clients_per_round: as `dp_fedavg`'s.
      preconditioner: `state -> ` the divisor of every local gradient, from the
        server's state alone (`stages.ClientUpdateStage.preconditioner`), or None.
      aggregate: the aggregate stage's rule, by default `private_mean` with C =
        'clip_norm'; another must release what `private_mean` releases.
      hparam_defaults: the numeric hyperparameters, DP-FedAvg's among them.
      init: `params -> ` the algorithm's state (`state.extra`), or None.

    Returns:
      The `FederatedAlgorithm`, client weights uniform.
    """

    def released_mean(results, cohort, plan, state, key) -> stages.Aggregation:
        del cohort, plan  # Unused: every sampled client contributes.
        return private_mean(results, state, key, clients_per_round, state.hparams["clip_norm"])

    state_init = {} if init is None else {"init": init}
    return stages.compose_round(
        name,
        task,
        clients_per_round,
        client_update=stages.ClientUpdateStage(local=local, preconditioner=preconditioner),
        aggregate=stages.AggregateStage(
            aggregate=aggregate or released_mean, hparam_defaults=hparam_defaults, **state_init
        ),
        **stages.uniform_weights(name, options),
    )


def private_mean(
    results: CohortResults,
    state: ServerState,
    key: Key,
    clients_per_round: int,
    clip_norm: jax.Array,
) -> stages.Aggregation:
    """Steps 2-4 of the module docstring: the clipped noisy sum of the cohort's updates over m.

    Args:
      results: the cohort's updates.
      state: the server state (its hparams' noise multiplier; its extra is passed on).
      key: the noise key.
      clients_per_round: m, the public denominator.
      clip_norm: C (a traced scalar).

    Returns:
      The `Aggregation`: the released mean, unit weights and the clipping diagnostics.
    """
    everyone = jnp.ones(results.client_ids.shape, bool)
    released = noisy_clipped_sum(
        key,
        results.deltas,
        everyone,
        clip_norm=clip_norm,
        noise_multiplier=state.hparams[NOISE_MULTIPLIER],
    )
    # The public denominator m (a Python int), not a data-dependent count.
    mean_delta = jax.tree.map(lambda x: x / clients_per_round, released.total)
    metrics = {
        "clipped_fraction": jnp.mean(released.clipped.astype(jnp.float32)),
        "mean_update_norm": jnp.mean(released.update_norms),
    }
    return stages.Aggregation(mean_delta, everyone.astype(jnp.float32), state.extra, metrics)


def private_round_options(engine: Engine) -> dict[str, Any]:
    """The engine's round options but the client weighting: a DP sum counts every client once."""
    return {name: value for name, value in engine.round_options().items() if name != "client_weighting"}


def from_engine(engine: Engine, options: Mapping[str, Any]) -> FederatedAlgorithm:
    """DP-FedAvg as the registry builds it for a run (uniform weights: no client weighting)."""
    del options  # None.
    return dp_fedavg(engine.task, engine.local, engine.clients_per_round, **private_round_options(engine))


def dp_fedadam_from_engine(engine: Engine, options: Mapping[str, Any]) -> FederatedAlgorithm:
    """DP-FedAdam: DP-FedAvg on an engine whose server optimizer the registry made adam
    (`AlgorithmSpec.server_optimizer`)."""
    del options  # None.
    return private_averaging(
        "dp-fedadam", engine.task, engine.local, engine.clients_per_round, **private_round_options(engine)
    )
