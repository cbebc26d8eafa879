"""Cohort sampling: which clients take part in a round."""

import jax
import jax.numpy as jnp

from jaxfl.types import Key


def sample_without_replacement(
    key: Key, population_size: int, sample_size: int
) -> jax.Array:
    """Draws `sample_size` distinct client ids uniformly from [0, N).

    Robert Floyd's algorithm: for j = N-M, ..., N-1 draw t uniformly from
    [0, j]; keep t unless it was already chosen, in which case keep j. Every
    M-subset is equally likely. The cost is O(M^2) comparisons and does not
    depend on N, so a round costs the same for a population of 1e3 or 1e6
    clients (a permutation of N would need a sort of N, which XLA:CPU does
    slowly; see `shared/notes/jax-on-this-machine.md`).

    Args:
      key: PRNG key.
      population_size: N, a Python int.
      sample_size: M, a Python int with 1 <= M <= N.

    Returns:
      `[M]` int32 distinct ids (in order of selection, not sorted).
    """
    if not 1 <= sample_size <= population_size:
        raise ValueError(
            f"sample_size must be in [1, {population_size}], got {sample_size}"
        )
    last = jnp.arange(population_size - sample_size, population_size, dtype=jnp.int32)
    draws = jax.random.randint(key, (sample_size,), 0, last + 1, dtype=jnp.int32)
    positions = jnp.arange(sample_size)

    def choose(i, chosen):
        seen = jnp.any((chosen == draws[i]) & (positions < i))
        return chosen.at[i].set(jnp.where(seen, last[i], draws[i]))

    return jax.lax.fori_loop(
        0, sample_size, choose, jnp.zeros(sample_size, jnp.int32)
    )
