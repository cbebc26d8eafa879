"""The geometric median of the updates by smoothed Weiszfeld iterations (RFA).

References:
  [RFA] K. Pillutla, S. M. Kakade, Z. Harchaoui. Robust Aggregation for
    Federated Learning. IEEE Transactions on Signal Processing, 2022
    (code: github.com/krishnap25/RFA, with RFA's defaults and stopping
    rule).
  [RFA-TFF] The TensorFlow Federated port of RFA
    (github.com/google-research/federated, robust_aggregation).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxfl.aggregators import base
from jaxfl.aggregators.base import Aggregator
from jaxfl.training.cohort import weighted_mean
from jaxfl.types import Params
from jaxfl.validation import check_int, check_number


def _distances(updates: Params, center: Params) -> jax.Array:
    """`[M]` global L2 distances ||center - x_i||."""
    differences = jax.tree.map(lambda x, c: x - c[None], updates, center)
    return jnp.sqrt(base.sq_global_norms(differences))


def geometric_median(nu: float = 1e-6, max_iterations: int = 4, ftol: float = 1e-6) -> Aggregator:
    """Weighted geometric median, argmin_v sum_k alpha_k ||v - x_k||, by smoothed Weiszfeld.

    With alpha = the weights of the participating clients and global L2 norms
    over all leaves:

        v_0 = sum_k alpha_k x_k / sum_k alpha_k              (the weighted mean),
        beta_k = alpha_k / max(nu, ||v_t - x_k||),
        v_{t+1} = sum_k beta_k x_k / sum_k beta_k,
        g(v) = sum_k alpha_k ||v - x_k||,

    stopping after the first step with |g(v_t) - g(v_{t+1})| <= ftol
    g(v_{t+1}), or after `max_iterations` steps (a `lax.while_loop`). RFA
    stops on a strict `<`; `<=` also stops an exact fit (g = 0, e.g. one
    client) at once. Each step lowers the smoothed objective; nu keeps a step
    finite when v lands on a client. Stateless.

    Metrics: `aggregated_clients` = n; `geometric_median_iterations` (int32)
    = Weiszfeld steps taken (0 when nobody takes part).

    Args:
      nu: smoothing nu > 0. Default 1e-6 (the TFF port of RFA; RFA's own code
        uses 1e-5).
      max_iterations: int >= 1. Default 4 (RFA's default; its scripts use 2).
      ftol: relative tolerance >= 0. Default 1e-6 (RFA).

    Raises:
      ValueError: nu not > 0, max_iterations not an int >= 1, ftol not >= 0.

    References:
      [RFA] Pillutla, Kakade, Harchaoui 2022, the smoothed Weiszfeld
        algorithm; [RFA-TFF].
    """
    nu = check_number("geometric-median option nu", nu, low=0.0, low_open=True)
    max_iterations = check_int("geometric-median option max_iterations", max_iterations, minimum=1)
    ftol = check_number("geometric-median option ftol", ftol, low=0.0)

    def rule(cohort, state):
        alpha = cohort.weights

        def objective(distances):
            return jnp.sum(alpha * distances)

        start = weighted_mean(cohort.updates, alpha)
        distances = _distances(cohort.updates, start)
        carry = (start, distances, objective(distances), jnp.zeros((), jnp.int32), cohort.count == 0)

        def keep_going(carry):
            _, _, _, iteration, done = carry
            return (iteration < max_iterations) & ~done

        def weiszfeld_step(carry):
            _, distances, value, iteration, _ = carry
            beta = alpha / jnp.maximum(nu, distances)
            center = weighted_mean(cohort.updates, beta)
            distances = _distances(cohort.updates, center)
            new_value = objective(distances)
            done = jnp.abs(value - new_value) <= ftol * new_value
            return center, distances, new_value, iteration + 1, done

        center, _, _, iterations, _ = lax.while_loop(keep_going, weiszfeld_step, carry)
        return (
            center,
            state,
            base.metrics(cohort, cohort.count, geometric_median_iterations=iterations),
        )

    return base.sanitized_aggregator("geometric-median", rule)
