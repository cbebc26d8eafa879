"""Samples of the discrete Gaussian distribution N_Z(0, sigma^2).

References:
  [CKS20] The Discrete Gaussian for Differential Privacy. NeurIPS 2020 (arXiv:2004.00010), Algorithms 2-3.
  [Pillutla et al. 2023] K. Pillutla, Y. Laguel, J. Malick, Z. Harchaoui.
    Federated Learning with Superquantile Aggregation for Heterogeneous
    Data. Machine Learning, 2023, Appendix B.1 (definition).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxfl.primitives import _validation

# The fraction of proposals accepted is at least 0.3045 (its minimum, near sigma = 0.3)
# (computed in tests/primitives/test_discrete_gaussian.py); each pool of
# proposals is sized for this floor, with a margin of about six standard
# deviations, so that one pool nearly always suffices.
_ACCEPTANCE_FLOOR = 0.3

# Pools drawn at most: each holds over 1 / 0.3 proposals per sample, so a
# sample is still unfilled after this many with probability far below 1e-150;
# the cap only guarantees termination.
_MAX_POOLS = 100

_FLOAT32_GRID = 2.0**-23  # float32 uniforms from the top 23 bits: {k 2^-23, k < 2^23}


def _pool_size(num_samples: int) -> int:
    """Proposals per pool: their expected accepted count exceeds `num_samples` by about 6 deviations."""
    return int(np.ceil((num_samples + 6 * np.sqrt(num_samples) + 8) / _ACCEPTANCE_FLOOR))


def _multiply_wide(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The 64-bit product of uint32 `a` and `b` as (high, low) uint32 words (16-bit limbs)."""
    mask = jnp.uint32(0xFFFF)
    a_low, a_high = a & mask, a >> 16
    b_low, b_high = b & mask, b >> 16
    low_low, high_low, low_high = a_low * b_low, a_high * b_low, a_low * b_high
    middle = (low_low >> 16) + (high_low & mask) + (low_high & mask)
    high = a_high * b_high + (high_low >> 16) + (low_high >> 16) + (middle >> 16)
    return high, a * b


def _uniform_below(words: jax.Array, bound: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Uniform integers on {0, ..., bound - 1} from uint32 words, and whether each draw is kept.

    Lemire's multiply-shift: floor(w bound / 2^32), rejected when the low word
    of w bound is below 2^32 mod bound, which leaves exactly floor(2^32 /
    bound) words per value: the kept draws are exactly uniform (bound < 2^32).
    """
    high, low = _multiply_wide(words, bound)
    threshold = (jnp.uint32(0) - bound) % bound  # 2^32 mod bound
    return high, low >= threshold


def _unit_uniform(words: jax.Array) -> jax.Array:
    """float32 uniforms on {k 2^-23} from the top 23 bits of uint32 words (`jax.random.uniform`'s grid)."""
    return (words >> 9).astype(jnp.float32) * jnp.float32(_FLOAT32_GRID)


# The largest sigma the sampler takes: proposals U + t V (t = floor(sigma) + 1,
# V <= 16 from float32 exponentials) and the acceptance test's |Y| - sigma^2 / t
# stay exact float32 integers (below 2^24) only up to about this sigma.
# Larger sigmas are refused by the run settings (`dp_sigma`,
# `dp_quantile_sigma`) and by this function for Python values.
MAX_SIGMA = 1e6


def discrete_gaussian(key, sigma, shape, dtype=jnp.int32) -> jax.Array:
    r"""I.i.d. samples of the discrete Gaussian N_Z(0, sigma^2).

    P(k) = exp(-k^2 / (2 sigma^2)) / sum_{z in Z} exp(-z^2 / (2 sigma^2)),
    k in Z (Pillutla et al. 2023, Appendix B.1; CKS20 Definition 1). Its mean
    is 0, its variance is slightly below sigma^2 and it is sub-Gaussian with
    variance proxy sigma^2.

    Sampler: CKS20 Algorithm 3, rejection from the discrete Laplace
    distribution with scale t = floor(sigma) + 1: a proposal Y is accepted
    with probability exp(-(|Y| - sigma^2 / t)^2 / (2 sigma^2)), exactly the
    ratio of the two pmfs up to a constant. The discrete Laplace proposal is
    CKS20 Algorithm 2's: |Y| = U + t V with U uniform on {0, ..., t - 1}
    (Lemire's multiply-shift of 32 random bits, with its rejection: exactly
    uniform) kept with probability exp(-U / t), and V = floor(E), E ~ Exp(1),
    geometric with ratio e^-1; a random sign is drawn and -0 is rejected. So
    P(|Y| = y) is proportional to exp(-y / t) with every integer reachable at
    every sigma (a proposal floor(t E) would leave integers out once t
    exceeds the float32 uniforms' 2^23 grid points per unit of E).

    Vectorized as pools: a pool is a batch of proposals sized so that its
    accepted ones nearly always outnumber the samples asked for; accepted
    proposals are i.i.d. N_Z samples whatever their positions, so they fill
    the output in order, and a `lax.while_loop` draws another pool while any
    sample is unfilled. The work is about 1 / 0.3 proposals per sample,
    where rejecting element by element until all are accepted would repeat
    every element as many times as its slowest one needs.

    The samples are exact up to the float32 evaluation of the two acceptance
    probabilities and of V (uniforms with 2^-23 resolution; docs/privacy.md,
    "The discrete Gaussian sampler is a simulation sampler", gives the total
    variation); exactness in the sense of CKS20's rational arithmetic is not
    attempted.

    Args:
      key: a JAX PRNG key.
      sigma: scalar sigma >= 0 (may be traced; batch with vmap). sigma = 0
        gives zeros. At most `MAX_SIGMA` = 1e6 (float32 integers).
      shape: static output shape.
      dtype: integer output dtype (int32 by default).

    Returns:
      Integer array of `shape`.

    Raises:
      ValueError: a Python/NumPy sigma that is negative, not finite or above
        `MAX_SIGMA`, or a non-integer `dtype`.

    Edge cases: a traced sigma <= 0 or NaN gives zeros (the point mass at 0,
    the limit sigma -> 0). With probability below 1e-150 a sample is still
    unfilled after `_MAX_POOLS` pools and is returned as 0.
    """
    _validation.check_nonnegative(sigma, "sigma")
    if _validation.is_static_number(sigma) and np.any(np.asarray(sigma, np.float64) > MAX_SIGMA):
        raise ValueError(
            f"sigma must be <= {MAX_SIGMA:g} (the sampler's float32 integers are exact up to it), "
            f"got {sigma!r}"
        )
    if not jnp.issubdtype(dtype, jnp.integer):
        raise ValueError(f"dtype must be an integer dtype, got {dtype}")
    shape = tuple(int(size) for size in shape)
    sigma = _validation.as_compute_scalar(sigma, jnp.float32)
    positive = sigma > 0
    safe_sigma = jnp.where(positive, sigma, 1.0)
    scale = jnp.floor(safe_sigma) + 1  # t of the discrete Laplace proposal
    variance = safe_sigma**2
    shift = variance / scale

    num_samples = int(np.prod(shape, dtype=np.int64))
    pool = _pool_size(num_samples)
    bound = scale.astype(jnp.uint32)

    def propose(pool_key):
        # One threefry pass for all of a pool's randomness: four words per proposal.
        words = jax.random.bits(pool_key, (4, pool), jnp.uint32)
        remainder_words, keep_words, whole_words, accept_words = words
        remainder, remainder_uniform = _uniform_below(remainder_words, bound)
        remainder = remainder.astype(jnp.float32)
        remainder_ok = remainder_uniform & (_unit_uniform(keep_words) < jnp.exp(-remainder / scale))
        whole = jnp.floor(-jnp.log1p(-_unit_uniform(whole_words)))  # floor(E), E ~ Exp(1)
        magnitude = remainder + scale * whole
        negative = (accept_words & 1) == 1  # the low bit: independent of the uniform's top 23
        # Rejecting -0 makes the signed geometric exactly discrete Laplace.
        laplace_ok = remainder_ok & ~(negative & (magnitude == 0))
        accept_probability = jnp.exp(-((magnitude - shift) ** 2) / (2 * variance))
        gauss_ok = _unit_uniform(accept_words) < accept_probability
        value = jnp.where(negative, -magnitude, magnitude).astype(dtype)
        return value, laplace_ok & gauss_ok

    def cond(state):
        pool_index, filled, _ = state
        return (pool_index < _MAX_POOLS) & (filled < num_samples)

    def body(state):
        # Accepted proposals are i.i.d. N_Z samples whatever their positions, so the
        # next unfilled slots take a pool's accepted values in order.
        pool_index, filled, samples = state
        value, accepted = propose(jax.random.fold_in(key, pool_index))
        slot = filled + jnp.cumsum(accepted.astype(jnp.int32)) - 1
        slot = jnp.where(accepted, slot, num_samples)  # out of range: dropped
        samples = samples.at[slot].set(value, mode="drop")
        filled = jnp.minimum(filled + jnp.sum(accepted, dtype=jnp.int32), num_samples)
        return pool_index + 1, filled, samples

    init = (jnp.int32(0), jnp.int32(0), jnp.zeros(num_samples, dtype))
    _, _, samples = lax.while_loop(cond, body, init)
    return jnp.where(positive, samples, jnp.zeros((), dtype)).reshape(shape)
