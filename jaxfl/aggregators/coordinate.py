"""Coordinate-wise aggregators: the weighted mean, median and trimmed mean.

Each coordinate of the output depends only on the same coordinate of the
clients' updates. The median and the trimmed mean sort along the client axis
only (`lax.sort` of the values with their weights).

References:
  [Li 2023] T. Li. Scalable and Trustworthy Learning in Heterogeneous
    Networks. PhD thesis, Carnegie Mellon University (CMU-CS-23-127), 2023.
    Section 5.3.3 and Appendix 5.7.4 (the robust aggregation baselines of
    its chapter 5: the median; the trimmed mean, a standard definition, is
    not among them).
  [ByzFL] The ByzFL library (github.com/LPD-EPFL/byzfl), whose standard set
    of robust aggregators includes the median and the trimmed mean.
  D. Yin, Y. Chen, K. Ramchandran, P. Bartlett. Byzantine-Robust
    Distributed Learning: Towards Optimal Statistical Rates. ICML 2018.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from jaxfl.aggregators import base
from jaxfl.aggregators.base import Aggregator
from jaxfl.training.cohort import weighted_mean
from jaxfl.validation import check_number


def mean() -> Aggregator:
    """The weighted mean, sum_i w_i x_i / sum_i w_i (FedAvg's aggregation).

    Exactly `jaxfl.training.cohort.weighted_mean(updates, weights)`, bit for
    bit; zero total weight gives zeros. Unlike every other aggregator it does
    not drop non-finite updates: a NaN or inf in any client's update (even one
    with weight 0, since 0 * NaN = NaN) propagates to the output, where the
    run's divergence check reports it. Stateless.

    Metrics: `aggregated_clients` = #{i : w_i > 0}; `dropped_nonfinite` = 0
    (it drops nothing).

    References:
      [Li 2023], Section 3.2.1, Algorithm 1 (FedAvg) and Section 5.3.3.
    """

    def aggregate(updates, weights, state, losses=None):
        del losses  # Unused.
        base.num_clients(updates, weights)
        update = weighted_mean(updates, weights)
        metrics = {
            "aggregated_clients": jnp.sum(weights > 0, dtype=jnp.int32),
            "dropped_nonfinite": jnp.zeros((), jnp.int32),
        }
        return update, state, metrics

    return Aggregator("mean", base.stateless_init, aggregate, uses_losses=False)


def _sorted_with_weights(x: jax.Array, cohort: base.SanitizedUpdates) -> tuple[jax.Array, jax.Array]:
    """A leaf `[M, ...]` sorted along the clients, with the weights following.

    Non-participants sort last (their values become +inf, their weight is 0);
    ties keep the client order (stable sort).
    """
    values = jnp.where(base.per_client(cohort.participating, x), x, jnp.inf)
    weights = jnp.broadcast_to(base.per_client(cohort.weights.astype(x.dtype), x), x.shape)
    return lax.sort((values, weights), dimension=0, is_stable=True, num_keys=1)


def _take(sorted_values: jax.Array, index: jax.Array) -> jax.Array:
    index = jnp.clip(index, 0, sorted_values.shape[0] - 1)
    return jnp.take_along_axis(sorted_values, index[None], axis=0)[0]


def median() -> Aggregator:
    """Coordinate-wise weighted median of the participating clients.

    Per coordinate, with the participants' values sorted, x_(1) <= ... <=
    x_(n), their weights w_(k) and cumulative weights C_k = sum_{l<=k} w_(l),
    C_n = W:

        lower = x_(k) for the smallest k with C_k >= W / 2,
        upper = x_(k) for the smallest k with C_k > W / 2,
        median = (lower + upper) / 2.

    With equal weights this is `np.median` (the middle value, or the midpoint
    of the two middle values). Weights are divided by the largest one first,
    so equal weights are exactly 1 and the comparison with W / 2 is exact.
    Stateless. Metrics: `aggregated_clients` = n (all participants determine
    the median).

    References:
      [Li 2023], Appendix 5.7.4 ("'median' means coordinate-wise
        median"); Yin et al. 2018.
    """

    def rule(cohort, state):
        largest = jnp.max(cohort.weights)
        cohort = cohort._replace(
            weights=cohort.weights / jnp.where(largest > 0, largest, jnp.ones((), largest.dtype))
        )

        def leaf_median(x):
            values, sorted_weights = _sorted_with_weights(x, cohort)
            cumulative = jnp.cumsum(sorted_weights, axis=0)
            total = cumulative[-1:]
            lower = jnp.sum(2 * cumulative < total, axis=0, dtype=jnp.int32)
            upper = jnp.sum(2 * cumulative <= total, axis=0, dtype=jnp.int32)
            middle = (_take(values, lower) + _take(values, upper)) / 2
            return jnp.where(cohort.count > 0, middle, jnp.zeros((), x.dtype))

        update = jax.tree.map(leaf_median, cohort.updates)
        return update, state, base.metrics(cohort, cohort.count)

    return base.sanitized_aggregator("median", rule)


def trimmed_mean(beta: float = 0.1) -> Aggregator:
    """Coordinate-wise beta-trimmed weighted mean of the participating clients.

    Per coordinate, with the n participants' values sorted, x_(1) <= ... <=
    x_(n), and k = floor(beta n) (n is traced; k is read from a table built
    for n = 0..M in float64 Python arithmetic):

        trimmed_mean = sum_{l=k+1}^{n-k} w_(l) x_(l) / sum_{l=k+1}^{n-k} w_(l),

    i.e. drop the k smallest and the k largest values and take the weighted
    mean of the rest. Since beta < 1/2, at least one value remains whenever
    n >= 1. With equal weights this is `scipy.stats.trim_mean(x, beta)`.
    Equal values are ordered by client index (the later client counts as
    larger), which matters only with unequal weights. Stateless. Metrics:
    `aggregated_clients` = n - 2k.

    Args:
      beta: fraction trimmed at each end, in [0, 0.5). Default 0.1.

    Raises:
      ValueError: beta outside [0, 0.5).

    References:
      Not in [Li 2023]: the standard definition (per coordinate, drop the
        floor(beta K) largest and smallest values and average the rest);
        [ByzFL]; Yin et al. 2018.
    """
    beta = check_number("trimmed-mean option beta", beta, low=0.0, high=0.5, high_open=True)

    def rule(cohort, state):
        m = cohort.weights.shape[0]
        trims = jnp.asarray([math.floor(beta * n) for n in range(m + 1)], jnp.int32)
        trim = trims[cohort.count]
        kept = cohort.count - 2 * trim

        def leaf_trimmed_mean(x):
            values, sorted_weights = _sorted_with_weights(x, cohort)
            position = base.per_client(jnp.arange(m, dtype=jnp.int32), x)
            keep = (position >= trim) & (position < trim + kept)
            zero = jnp.zeros((), x.dtype)
            total = jnp.sum(jnp.where(keep, sorted_weights, zero), axis=0)
            weighted = jnp.sum(jnp.where(keep, sorted_weights * jnp.where(keep, values, zero), zero), axis=0)
            return jnp.where(total > 0, weighted / jnp.where(total > 0, total, 1), zero)

        update = jax.tree.map(leaf_trimmed_mean, cohort.updates)
        return update, state, base.metrics(cohort, kept)

    return base.sanitized_aggregator("trimmed-mean", rule)
