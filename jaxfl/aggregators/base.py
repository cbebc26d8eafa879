"""The aggregator contract and the steps every robust aggregator shares.

An `Aggregator` turns the cohort's per-client updates (each leaf `[M, ...]`,
client axis first) and their weights `[M]` into one update shaped like a
single client's, the way `optax.experimental`'s aggregators turn per-example
gradients into one. It is a pair of pure functions:

* `init(params) -> state`: the aggregator's state (`()` when stateless);
* `aggregate(updates, weights, state, losses=None) -> (update, state, metrics)`.

Conventions shared by every aggregator (docs/aggregators.md):

* Weights are `[M]` float32 >= 0 and finite. A client with weight 0 takes no
  part (filtered out, or it did not train): its update, whatever it holds,
  never reaches the output.
* Every aggregator but `mean` first drops the clients whose update is not
  finite: a NaN or +-inf entry, or a squared global L2 norm that overflows
  float32 (an entry beyond about 1.8e19). A dropped client gets weight 0 and
  its values are replaced by 0 before any arithmetic, so nothing non-finite
  reaches the output. Metric `dropped_nonfinite` (int32) counts them, among
  the clients with positive weight.
* With no client left the update is zeros, never NaN.
* Metric `aggregated_clients` (int32) counts the clients that contributed to
  the output with nonzero weight.
* Norms and distances are global: over all leaves of the pytree.
* Ties (equal values, norms, scores or losses) are broken by client index: of
  two equal clients the later one counts as the larger.

Everything is plain `jnp`/`lax`: no Python control flow on traced values, so
an aggregator works under `jit`, `vmap` (a sweep stacks rounds) and with the
client axis sharded over devices (GSPMD partitions the ordinary ops).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxfl.training.cohort import weighted_mean
from jaxfl.types import Metrics, Params, PyTree


class Aggregator(NamedTuple):
    """A server aggregation rule as pure functions (see the module docstring).

    Attributes:
      name: registry name (`jaxfl.aggregators.AGGREGATORS`).
      init: `(params) -> state`: the state from the global params; `()` for
        stateless aggregators.
      aggregate: `(updates, weights, state, losses=None) -> (update, state,
        metrics)`. `updates`: pytree of float32 leaves `[M, ...]`;
        `weights`: `[M]` float32 >= 0 (0: the client takes no part);
        `losses`: `[M]` float32 per-client training losses, or None (only
        k-loss needs them). `update` has the leaves `[...]` of one client;
        `metrics` maps names to scalar arrays.
      uses_losses: True when `aggregate` needs `losses` (k-loss only).
    """

    name: str
    init: Callable[[Params], PyTree]
    aggregate: Callable[..., tuple[Params, PyTree, Metrics]]
    uses_losses: bool


def stateless_init(params: Params) -> PyTree:
    """The state of a stateless aggregator: `()`."""
    del params  # Unused.
    return ()


class SanitizedUpdates(NamedTuple):
    """The cohort's updates after the non-finite clients are dropped.

    Attributes:
      updates: leaves `[M, ...]`; the rows of non-participating clients are 0.
      weights: `[M]` the weights, 0 for non-participating clients.
      participating: `[M]` bool, weight > 0 and a finite update.
      count: int32 [], number of participating clients (n).
      dropped: int32 [], clients with weight > 0 dropped as non-finite.
      sq_norms: `[M]` squared global L2 norms of `updates` (0 when not
        participating).
    """

    updates: Params
    weights: jax.Array
    participating: jax.Array
    count: jax.Array
    dropped: jax.Array
    sq_norms: jax.Array


def num_clients(updates: Params, weights: jax.Array) -> int:
    """M, checking that every leaf and the weights share the client axis."""
    leaves = jax.tree.leaves(updates)
    if not leaves:
        raise ValueError("updates has no leaves")
    if weights.ndim != 1:
        raise ValueError(f"weights must be [M], got shape {weights.shape}")
    m = weights.shape[0]
    bad = [leaf.shape for leaf in leaves if leaf.ndim < 1 or leaf.shape[0] != m]
    if bad:
        raise ValueError(f"every update leaf must be [M={m}, ...] like the weights, got shapes {bad}")
    return m


def per_client(mask: jax.Array, leaf: jax.Array) -> jax.Array:
    """`[M]` reshaped to `[M, 1, ..., 1]` to broadcast against a `[M, ...]` leaf."""
    return mask.reshape(mask.shape + (1,) * (leaf.ndim - 1))


def sq_global_norms(updates: Params) -> jax.Array:
    """`[M]` sum over leaves and coordinates of x_i^2 (NaN or inf if any entry is)."""
    return sum(jnp.sum(jnp.square(x), axis=tuple(range(1, x.ndim))) for x in jax.tree.leaves(updates))


def sanitize(updates: Params, weights: jax.Array, finite: jax.Array | None = None) -> SanitizedUpdates:
    """Drops non-finite clients: weight 0 and values 0 (module docstring).

    Args:
      updates: leaves `[M, ...]`.
      weights: `[M]` >= 0.
      finite: optional `[M]` bool, more per-client finiteness (k-loss: the
        losses) that a client must also pass.

    Returns:
      The `SanitizedUpdates`.
    """
    num_clients(updates, weights)
    sq = sq_global_norms(updates)
    ok = jnp.isfinite(sq)
    if finite is not None:
        ok = ok & finite
    taking_part = weights > 0
    participating = taking_part & ok
    cleaned = jax.tree.map(
        lambda x: jnp.where(per_client(participating, x), x, jnp.zeros((), x.dtype)), updates
    )
    return SanitizedUpdates(
        updates=cleaned,
        weights=jnp.where(participating, weights, jnp.zeros((), weights.dtype)),
        participating=participating,
        count=jnp.sum(participating, dtype=jnp.int32),
        dropped=jnp.sum(taking_part & ~ok, dtype=jnp.int32),
        sq_norms=jnp.where(participating, sq, jnp.zeros((), sq.dtype)),
    )


def sanitized_aggregator(
    name: str,
    rule: Callable[[SanitizedUpdates, PyTree], tuple[Params, PyTree, Metrics]],
    init: Callable[[Params], PyTree] = stateless_init,
) -> Aggregator:
    """The `Aggregator` of a rule that reads no losses, on the cohort `sanitize` leaves.

    Its `aggregate(updates, weights, state, losses=None)` drops the
    non-finite clients (module docstring) and returns `rule(cohort, state)`,
    `(update, state, metrics)`; the losses are not read.
    """

    def aggregate(updates, weights, state, losses=None):
        del losses  # Unused.
        return rule(sanitize(updates, weights), state)

    return Aggregator(name, init, aggregate, uses_losses=False)


def zeros_like_client(updates: Params) -> Params:
    """Zeros shaped like one client's update (leaves `[...]`)."""
    return jax.tree.map(lambda x: jnp.zeros(x.shape[1:], x.dtype), updates)


def select_client(updates: Params, index: jax.Array, valid: jax.Array) -> Params:
    """Client `index`'s update, or zeros where `valid` is False."""
    return jax.tree.map(lambda x: jnp.where(valid, x[index], jnp.zeros((), x.dtype)), updates)


def rank_ascending(keys: jax.Array) -> jax.Array:
    """`[M]` int32 rank of each key in a stable ascending sort (ties: lower index first)."""
    order = jnp.argsort(keys, stable=True)
    return jnp.zeros(keys.shape, jnp.int32).at[order].set(jnp.arange(keys.shape[0], dtype=jnp.int32))


def pairwise_sq_distances(cohort: SanitizedUpdates) -> jax.Array:
    """`[M, M]` squared global L2 distances ||x_i - x_j||^2 between participants.

    Computed from the Gram matrix of the flattened clients summed over leaves,
    ||x_i||^2 + ||x_j||^2 - 2 <x_i, x_j>, after centering on the participants'
    mean (distances do not change; the cancellation error shrinks when the
    updates share a large common part). The matrix is symmetrized and clamped
    at 0. Entries involving a non-participant, and the diagonal, are +inf.
    """
    center = weighted_mean(cohort.updates, cohort.participating.astype(cohort.weights.dtype))
    m = cohort.weights.shape[0]
    gram = jnp.zeros((m, m), jnp.float32)
    for x, c in zip(jax.tree.leaves(cohort.updates), jax.tree.leaves(center), strict=True):
        flat = (x - c[None]).reshape(m, -1).astype(jnp.float32)
        gram = gram + jnp.matmul(flat, flat.T, precision=lax.Precision.HIGHEST)
    gram = 0.5 * (gram + gram.T)
    diag = jnp.diagonal(gram)
    dist = jnp.maximum(diag[:, None] + diag[None, :] - 2.0 * gram, 0.0)
    pair = cohort.participating[:, None] & cohort.participating[None, :] & ~jnp.eye(m, dtype=bool)
    # inf - inf on overflow would be NaN: such a pair is simply far apart.
    return jnp.where(pair & ~jnp.isnan(dist), dist, jnp.inf)


def metrics(cohort: SanitizedUpdates, aggregated: jax.Array, **extra: jax.Array) -> Metrics:
    """The metrics every aggregator reports, plus `extra`."""
    out = {
        "aggregated_clients": jnp.asarray(aggregated, jnp.int32),
        "dropped_nonfinite": cohort.dropped,
    }
    out.update(extra)
    return out


