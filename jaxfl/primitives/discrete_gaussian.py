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

# The per-round acceptance probability is at least about 0.3 for every sigma
# (computed in tests/primitives/test_discrete_gaussian.py), so an element is
# still undecided after this many rounds with probability below 0.7**1000,
# about 1e-155: the cap only guarantees termination.
_MAX_ROUNDS = 1000

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
    distribution with scale t = floor(sigma) + 1, vectorized over all
    elements: each round proposes Y for every element not yet accepted and
    accepts it with probability exp(-(|Y| - sigma^2 / t)^2 / (2 sigma^2)),
    which is exactly the ratio of the two pmfs up to a constant; a
    `lax.while_loop` runs rounds until every element is accepted. The discrete
    Laplace proposal is CKS20 Algorithm 2's: |Y| = U + t V with U uniform on
    {0, ..., t - 1} (integer random bits) kept with probability exp(-U / t),
    and V = floor(E), E ~ Exp(1), geometric with ratio e^-1; a random sign is
    drawn and -0 is rejected. So P(|Y| = y) is proportional to exp(-y / t)
    with every integer reachable at every sigma (a proposal floor(t E) would
    leave integers out once t exceeds the float32 uniforms' 2^23 grid
    points per unit of E). The samples are exact up to the float32
    evaluation of the two acceptance probabilities and of V (uniforms with
    2^-23 resolution; docs/privacy.md, "The discrete Gaussian sampler is a
    simulation sampler", gives the total variation); exactness in the sense
    of CKS20's rational arithmetic is not attempted.

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
    the limit sigma -> 0). With probability below 1e-150 per element an
    element is still unaccepted after 1000 rounds and is returned as 0.
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

    def propose(round_key):
        remainder_key, keep_key, whole_key, sign_key, accept_key = jax.random.split(round_key, 5)
        remainder = jax.random.randint(remainder_key, shape, 0, scale.astype(jnp.int32)).astype(jnp.float32)
        remainder_ok = jax.random.uniform(keep_key, shape) < jnp.exp(-remainder / scale)
        magnitude = remainder + scale * jnp.floor(jax.random.exponential(whole_key, shape))
        negative = jax.random.bernoulli(sign_key, 0.5, shape)
        # Rejecting -0 makes the signed geometric exactly discrete Laplace.
        laplace_ok = remainder_ok & ~(negative & (magnitude == 0))
        accept_probability = jnp.exp(-((magnitude - shift) ** 2) / (2 * variance))
        gauss_ok = jax.random.uniform(accept_key, shape) < accept_probability
        value = jnp.where(negative, -magnitude, magnitude).astype(dtype)
        return value, laplace_ok & gauss_ok

    def cond(state):
        round_index, _, done = state
        return (round_index < _MAX_ROUNDS) & ~jnp.all(done)

    def body(state):
        round_index, samples, done = state
        value, accepted = propose(jax.random.fold_in(key, round_index))
        take = accepted & ~done
        return round_index + 1, jnp.where(take, value, samples), done | take

    init = (jnp.int32(0), jnp.zeros(shape, dtype), jnp.zeros(shape, bool))
    _, samples, _ = lax.while_loop(cond, body, init)
    return jnp.where(positive, samples, jnp.zeros((), dtype))
