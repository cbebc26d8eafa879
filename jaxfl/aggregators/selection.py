"""Aggregators that select clients: Krum, multi-Krum, k-norm and k-loss.

`byzantine` (f) is the number of malicious clients per round the server
assumes; the thesis (Li 2023, Section 5.3.3 and Appendix 5.7.4) sets it to
the expected number, int(K * N_mal / N) in its code, K clients per round
out of N with N_mal malicious. It is a Python int fixed when the aggregator is
built; the number of participating clients n is traced, so every count below
adapts to the clients that actually take part.

References:
  [Li 2023] T. Li. Scalable and Trustworthy Learning in Heterogeneous
    Networks. PhD thesis, Carnegie Mellon University (CMU-CS-23-127), 2023.
    Section 5.3.3 and Appendix 5.7.4 (the robust aggregation baselines).
  [Krum] Machine Learning with Adversaries: Byzantine Tolerant Gradient Descent. NeurIPS 2017.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxfl.aggregators import base
from jaxfl.aggregators.base import Aggregator
from jaxfl.training.cohort import weighted_mean
from jaxfl.validation import check_int


def krum_scores(cohort: base.SanitizedUpdates, byzantine: int) -> jax.Array:
    """`[M]` Krum scores; +inf for clients that do not participate.

    score(j) = sum of the k smallest ||x_j - x_i||^2 over participants i != j,
    k = min(max(n - f - 2, 1), n - 1) (at least one neighbour when one
    exists; a lone participant scores 0). Distances come from the Gram matrix
    (`base.pairwise_sq_distances`).
    """
    distances = base.pairwise_sq_distances(cohort)
    m = distances.shape[0]
    n = cohort.count
    neighbours = jnp.minimum(jnp.maximum(n - byzantine - 2, 1), n - 1)
    nearest = jnp.sort(distances, axis=1)
    counted = jnp.arange(m, dtype=jnp.int32)[None, :] < neighbours
    scores = jnp.sum(jnp.where(counted, nearest, 0.0), axis=1)
    return jnp.where(cohort.participating, scores, jnp.inf)


def krum(byzantine: int = 0) -> Aggregator:
    """Krum: the participating update with the smallest Krum score.

        score(j) = sum_{i in N_j} ||x_j - x_i||^2,   output x_{j*}, j* = argmin_j score(j),

    where N_j holds the n - f - 2 participants nearest to j (at least 1; all
    n - 1 others when fewer exist) and distances are global L2 over all
    leaves. Ties go to the lowest index. The weights only decide who takes
    part. Stateless. Metrics: `aggregated_clients` = 1 (0 when nobody takes
    part).

    Args:
      byzantine: f, the assumed number of malicious clients, int >= 0.
        Default 0.

    Raises:
      ValueError: byzantine not an int >= 0.

    References:
      [Li 2023], Section 5.3.3 (Krum; the thesis' code sums the k + 1
        smallest distances including the zero to itself, the same score);
        Blanchard et al. 2017.
    """
    byzantine = check_int("krum option byzantine", byzantine, minimum=0)

    def rule(cohort, state):
        best = jnp.argmin(krum_scores(cohort, byzantine))
        present = cohort.count > 0
        update = base.select_client(cohort.updates, best, present)
        return update, state, base.metrics(cohort, present.astype(jnp.int32))

    return base.sanitized_aggregator("krum", rule)


def multi_krum(byzantine: int = 0, selected: int = 0) -> Aggregator:
    """Multi-Krum: the weighted mean of the m updates with the lowest Krum scores.

        S = the m participants with the smallest score(j) (see `krum`),
        output = sum_{i in S} w_i x_i / sum_{i in S} w_i,

    with m = `selected`, or n - f when `selected` is 0, clipped to [1, n]
    (m = 1 is Krum, up to the weights). Equal scores: the lower index is
    selected first. Stateless. Metrics: `aggregated_clients` = m (0 when
    nobody takes part).

    Args:
      byzantine: f, int >= 0. Default 0.
      selected: m, int >= 0; 0 means n - f. Default 0.

    Raises:
      ValueError: an option not an int >= 0.

    References:
      [Li 2023], Section 5.3.3 (multi-Krum: the average of the m = K - f
        updates with the lowest Krum scores); Blanchard et al. 2017.
    """
    byzantine = check_int("multi-krum option byzantine", byzantine, minimum=0)
    selected = check_int("multi-krum option selected", selected, minimum=0)

    def rule(cohort, state):
        n = cohort.count
        target = n - byzantine if selected == 0 else jnp.asarray(selected, jnp.int32)
        count = jnp.minimum(jnp.maximum(target, 1), n)
        rank = base.rank_ascending(krum_scores(cohort, byzantine))
        chosen = cohort.participating & (rank < count)
        update = weighted_mean(cohort.updates, jnp.where(chosen, cohort.weights, 0.0))
        return update, state, base.metrics(cohort, jnp.sum(chosen, dtype=jnp.int32))

    return base.sanitized_aggregator("multi-krum", rule)


def k_norm(byzantine: int = 0) -> Aggregator:
    """k-norm: drop the f participating updates with the largest norms, average the rest.

        K = participants without the f largest ||x_i|| (global L2),
        output = sum_{i in K} w_i x_i / sum_{i in K} w_i.

    Equal norms: the later client counts as larger (is dropped first). With
    n <= f everything is dropped and the update is zeros. Stateless. Metrics:
    `aggregated_clients` = max(n - f, 0).

    Args:
      byzantine: f, int >= 0. Default 0.

    Raises:
      ValueError: byzantine not an int >= 0.

    References:
      [Li 2023], Appendix 5.7.4 (k-norm: "we filter out the updates with
        the k largest norms where k is set to the expected number of
        malicious devices", and average the rest; the thesis' stand-in for
        the gradient-norm based anomaly detector of its Section 2.3).
    """
    byzantine = check_int("k-norm option byzantine", byzantine, minimum=0)

    def rule(cohort, state):
        rank = base.rank_ascending(jnp.where(cohort.participating, cohort.sq_norms, jnp.inf))
        kept = cohort.participating & (rank < cohort.count - byzantine)
        update = weighted_mean(cohort.updates, jnp.where(kept, cohort.weights, 0.0))
        return update, state, base.metrics(cohort, jnp.sum(kept, dtype=jnp.int32))

    return base.sanitized_aggregator("k-norm", rule)


def k_loss(byzantine: int = 0) -> Aggregator:
    """k-loss: the update of the participant with the (f+1)-th largest training loss.

        output = x_j, j = the participant whose loss ranks f+1 from the top.

    A client whose loss is not finite is dropped like a non-finite update (and
    counted in `dropped_nonfinite`). Equal losses: the later client counts as
    larger. With n <= f there is no (f+1)-th largest loss and the update is
    zeros. The weights only decide who takes part. Stateless;
    `uses_losses` is True. Metrics: `aggregated_clients` = 1 (0 when n <= f).

    Args:
      byzantine: f, int >= 0. Default 0.

    Raises:
      ValueError: byzantine not an int >= 0 (when built); losses None or not
        `[M]` (when called).

    References:
      [Li 2023], Appendix 5.7.4 (k-loss: "we only use the model update
        with the k+1-th largest training loss", k = f).
    """
    byzantine = check_int("k-loss option byzantine", byzantine, minimum=0)

    def aggregate(updates, weights, state, losses=None):
        if losses is None:
            raise ValueError(
                "k-loss needs the clients' training losses: call aggregate(..., losses=[M] array)"
            )
        if losses.shape != weights.shape:
            raise ValueError(
                f"k-loss losses must be [M] like the weights {weights.shape}, got {losses.shape}"
            )
        cohort = base.sanitize(updates, weights, finite=jnp.isfinite(losses))
        rank = base.rank_ascending(jnp.where(cohort.participating, losses, jnp.inf))
        wanted = cohort.count - 1 - byzantine
        present = wanted >= 0
        chosen = jnp.argmax(cohort.participating & (rank == wanted))
        update = base.select_client(cohort.updates, chosen, present)
        return update, state, base.metrics(cohort, present.astype(jnp.int32))

    return Aggregator("k-loss", base.stateless_init, aggregate, uses_losses=True)
