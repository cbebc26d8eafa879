"""Cohort sampling: the keys of a round, and which clients take part in it."""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxfl.types import Key


class CohortKeys(NamedTuple):
    """The keys of one round, all derived from the run key and the round.

    `round_key = fold_in(run_key, round)`; sampling uses one half of
    `split(round_key)` and client i uses `fold_in(other half, i)`, so a
    client's randomness does not depend on which other clients were sampled.
    """

    sampling: Key
    clients: Key
    server: Key


def round_keys(run_key: Key, round_index: jax.Array) -> CohortKeys:
    round_key = jax.random.fold_in(run_key, round_index)
    sampling, clients, server = jax.random.split(round_key, 3)
    return CohortKeys(sampling, clients, server)


# Up to this many draws, repeated draws are found by comparing all pairs (one
# fused [M, M] comparison); above it, by one stable sort of the draws.
_PAIRWISE_MAX = 1024


def sample_without_replacement(
    key: Key, population_size: int, sample_size: int
) -> jax.Array:
    """Draws `sample_size` distinct client ids uniformly from [0, N).

    Robert Floyd's algorithm: for i = 0, ..., M-1 let L_i = N - M + i, draw
    d_i uniformly from [0, L_i], and choose d_i unless an earlier step chose
    it, in which case choose L_i. Every M-subset is equally likely, and the
    cost does not depend on N (a permutation of N would need a sort of N).

    The steps are computed all at once rather than one after another, with
    the same draws and therefore the same ids. The set chosen before step i
    is {d_j : j < i} together with {L_j : j < i, step j collided}, so step i
    collides (`seen_i`) iff d_i repeats an earlier draw, or d_i = L_p for the
    one p = d_i - (N - M) < i and step p collided:

        seen_i = repeat_i  or  (0 <= p_i < i  and  seen_{p_i}).

    Following the links p (each to an earlier step) by pointer doubling
    gives every seen_i in ceil(log2 M) vectorized steps, with no loop whose
    length is M: a device runs it as a handful of kernels.

    Reference: Jon Bentley and Bob Floyd, "Programming pearls: a sample of
    brilliance", Communications of the ACM 30(9), 1987 (Floyd's algorithm F2).

    Args:
      key: PRNG key.
      population_size: N, a Python int.
      sample_size: M, a Python int with 1 <= M <= N.

    Returns:
      `[M]` int32 distinct ids (in Floyd's order of selection, not sorted).
    """
    if not 1 <= sample_size <= population_size:
        raise ValueError(
            f"sample_size must be in [1, {population_size}], got {sample_size}"
        )
    start = population_size - sample_size
    last = jnp.arange(start, population_size, dtype=jnp.int32)
    draws = jax.random.randint(key, (sample_size,), 0, last + 1, dtype=jnp.int32)
    steps = jnp.arange(sample_size, dtype=jnp.int32)
    seen = _repeats_earlier(draws)
    link = draws - start
    link = jnp.where((link >= 0) & (link < steps), link, steps)
    for _ in range((sample_size - 1).bit_length()):
        seen = seen | seen[link]
        link = link[link]
    return jnp.where(seen, last, draws)


def _repeats_earlier(values: jax.Array) -> jax.Array:
    """`[M]` bool: values[i] equals some values[j] with j < i."""
    size = values.shape[0]
    positions = jnp.arange(size)
    if size <= _PAIRWISE_MAX:
        equal = values[:, None] == values[None, :]
        return jnp.any(equal & (positions[None, :] < positions[:, None]), axis=1)
    # A stable sort keeps equal values in position order: every one but the
    # first of a run of equal values repeats an earlier one.
    order = jnp.argsort(values, stable=True)
    ordered = values[order]
    repeat = jnp.concatenate([jnp.zeros(1, bool), ordered[1:] == ordered[:-1]])
    return jnp.zeros(size, bool).at[order].set(repeat)
