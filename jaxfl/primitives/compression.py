"""Compressed client updates: stochastic quantization, sparsification, a random rotation, error feedback.

Each compressor maps a flat float vector x in R^d (a client's update,
`jax.flatten_util.ravel_pytree` of it) to the vector the server would
decode, and says how many bits the client would send. All are pure, work
under `jit` and `vmap` (vmap over clients, each with its own key), and take
`bits`/`k` as static Python ints (they fix the code's size).

* `stochastic_quantize` (QSGD, Alistarh et al. 2017, Section 3.1): with
  s = 2^bits - 1 levels and l = floor(s |x_i| / ||x||_2), coordinate i becomes
  sign(x_i) ||x||_2 (l + b_i) / s, b_i ~ Bernoulli(s |x_i| / ||x||_2 - l).
  Unbiased (E Q(x) = x) with E ||Q(x) - x||^2 <= min(d / s^2, sqrt(d) / s)
  ||x||^2 (their Lemma 3.1). Sent: the norm (32 bits) and per coordinate a
  sign and a level of `bits` bits (a fixed-length code; their Elias coding
  is shorter for sparse levels).
* `random_k` (rand-k; Stich et al. 2018): k coordinates drawn uniformly
  without replacement, scaled by d / k (unbiased). Sent: k values; the
  indices follow from a key the server shares, so only the values count.
* `top_k` (Stich et al. 2018; Aji and Heafield 2017): the k largest
  magnitudes, unscaled (biased: use it with error feedback). Sent: k values
  and k indices of ceil(log2 d) bits.
* `hadamard_rotation` / `inverse_hadamard_rotation` (Suresh et al. 2017,
  Section 4): x -> H D x / sqrt(d') with D random signs and H the Walsh-
  Hadamard matrix of the next power of two d' >= d (x zero-padded): an
  orthogonal map that spreads a vector's mass over its coordinates, so that
  quantizing the rotated vector loses less; the server undoes it.
* `error_feedback` (Seide et al. 2014; Karimireddy et al. 2019, Algorithm
  2): the client compresses x + e and keeps e' = x + e - C(x + e), its
  per-client state row, so what biased compression drops is sent later.

NaN and inf: a non-finite coordinate makes the compressed vector NaN where it
reads the norm (quantization: every coordinate) or that coordinate (sparsifiers
keep or drop it; `top_k` ranks NaN first), so a diverged client stays visible.
A zero vector compresses to zero.

References:
  [Alistarh et al. 2017] D. Alistarh, D. Grubic, J. Li, R. Tomioka, M. Vojnovic. QSGD:
    Communication-Efficient SGD via Gradient Quantization and Encoding. NeurIPS 2017.
  [Stich et al. 2018] S. U. Stich, J.-B. Cordonnier, M. Jaggi. Sparsified SGD with Memory.
    NeurIPS 2018.
  [Aji and Heafield 2017] A. F. Aji, K. Heafield. Sparse Communication for Distributed
    Gradient Descent. EMNLP 2017.
  [Suresh et al. 2017] A. T. Suresh, F. X. Yu, S. Kumar, H. B. McMahan. Distributed Mean
    Estimation with Limited Communication. ICML 2017.
  [Seide et al. 2014] F. Seide, H. Fu, J. Droppo, G. Li, D. Yu. 1-Bit Stochastic Gradient
    Descent and its Application to Data-Parallel Distributed Training of Speech DNNs.
    Interspeech 2014.
  [Karimireddy et al. 2019] S. P. Karimireddy, Q. Rebjock, S. U. Stich, M. Jaggi. Error
    Feedback Fixes SignSGD and other Gradient Compression Problems. ICML 2019.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

FLOAT_BITS = 32


def _check_vector(x: jax.Array) -> None:
    if x.ndim != 1:
        raise ValueError(f"compressors take a flat vector (ravel_pytree the update), got shape {x.shape}")


def _check_positive_int(name: str, value: int, high: int | None = None) -> None:
    too_large = high is not None and isinstance(value, int) and value > high
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or too_large:
        bound = f" <= {high}" if high is not None else ""
        raise ValueError(f"{name} must be a Python int >= 1{bound} (it fixes the code's size), got {value!r}")


def stochastic_quantize(x: jax.Array, key: jax.Array, bits: int) -> jax.Array:
    """QSGD's unbiased quantization of `x` to 2^bits - 1 levels of |x_i| / ||x||_2.

    Q(x)_i = sign(x_i) ||x||_2 (l_i + b_i) / s, s = 2^bits - 1,
    l_i = floor(s |x_i| / ||x||_2), b_i ~ Bernoulli(s |x_i| / ||x||_2 - l_i)
    (Alistarh et al. 2017, Section 3.1); E Q(x) = x. `quantized_bits(d, bits)`
    is what it costs to send.

    Args:
      x: `[d]` float vector.
      key: the draw's key (the client's own).
      bits: bits per level, 1..16 (static).

    Returns:
      `[d]`, x's dtype.
    """
    _check_vector(x)
    _check_positive_int("bits", bits, 16)
    levels = float(2**bits - 1)
    norm = jnp.linalg.norm(x)
    scaled = jnp.where(norm > 0, jnp.abs(x) / jnp.where(norm > 0, norm, 1.0), 0.0) * levels
    lower = jnp.floor(scaled)
    up = jax.random.uniform(key, x.shape, x.dtype) < scaled - lower
    return jnp.sign(x) * norm * (lower + up) / levels


def quantized_bits(dimension: int, bits: int) -> int:
    """Bits `stochastic_quantize` sends for a `[dimension]` vector: the norm, then a sign and a level each."""
    return FLOAT_BITS + dimension * (1 + bits)


def random_k(x: jax.Array, key: jax.Array, k: int) -> jax.Array:
    """Random-k: k coordinates of `x` drawn uniformly without replacement, scaled by d / k; zeros elsewhere.

    Unbiased: E random_k(x) = x.

    Args:
      x: `[d]` float vector.
      key: the draw's key; the server holds it too, so the indices are not sent.
      k: coordinates kept, 1..d (static).
    """
    _check_vector(x)
    dimension = x.shape[0]
    _check_positive_int("k", k, dimension)
    # The k smallest of d uniform keys: a uniformly random k-subset (top_k, no full sort).
    _, kept = jax.lax.top_k(-jax.random.uniform(key, (dimension,)), k)
    return jnp.zeros_like(x).at[kept].set(x[kept] * (dimension / k))


def top_k(x: jax.Array, k: int) -> jax.Array:
    """The k coordinates of `x` of largest magnitude (ties: the lower index), zeros elsewhere; biased.

    Args:
      x: `[d]` float vector.
      k: coordinates kept, 1..d (static).
    """
    _check_vector(x)
    dimension = x.shape[0]
    _check_positive_int("k", k, dimension)
    magnitude = jnp.where(jnp.isnan(x), jnp.inf, jnp.abs(x))
    _, kept = jax.lax.top_k(magnitude, k)
    return jnp.zeros_like(x).at[kept].set(x[kept])


def sparse_bits(dimension: int, k: int, *, indices: bool) -> int:
    """Bits of k float32 values, with their indices (ceil(log2 d) bits each) when `indices`."""
    index_bits = max(1, math.ceil(math.log2(dimension))) if indices else 0
    return k * (FLOAT_BITS + index_bits)


def _walsh_hadamard(x: jax.Array) -> jax.Array:
    """H x for the Sylvester Hadamard matrix of size len(x), a power of two: log2(d) butterflies."""
    dimension = x.shape[0]
    y = x
    half = 1
    while half < dimension:
        pairs = y.reshape(-1, 2, half)
        y = jnp.stack([pairs[:, 0] + pairs[:, 1], pairs[:, 0] - pairs[:, 1]], axis=1).reshape(dimension)
        half *= 2
    return y


def rotated_size(dimension: int) -> int:
    """d', the power of two `hadamard_rotation` pads a `[dimension]` vector to."""
    return 1 << max(0, (dimension - 1).bit_length())


def hadamard_rotation(x: jax.Array, key: jax.Array) -> jax.Array:
    """H D x / sqrt(d'): `[d]` zero-padded to `[d']` (`rotated_size`), D random signs from `key`.

    Orthogonal: norms and inner products are kept; `inverse_hadamard_rotation`
    with the same key undoes it (Suresh et al. 2017, Section 4).
    """
    _check_vector(x)
    size = rotated_size(x.shape[0])
    signs = jnp.where(jax.random.bernoulli(key, 0.5, (size,)), 1.0, -1.0).astype(x.dtype)
    padded = jnp.zeros(size, x.dtype).at[: x.shape[0]].set(x)
    return _walsh_hadamard(signs * padded) / jnp.sqrt(jnp.asarray(size, x.dtype))


def inverse_hadamard_rotation(y: jax.Array, key: jax.Array, dimension: int) -> jax.Array:
    """The `[dimension]` vector x with `hadamard_rotation(x, key) == y`: D H y / sqrt(d'), cut to d."""
    _check_vector(y)
    size = y.shape[0]
    if size != rotated_size(dimension):
        raise ValueError(f"a rotated [{dimension}] vector has {rotated_size(dimension)} entries, got {size}")
    signs = jnp.where(jax.random.bernoulli(key, 0.5, (size,)), 1.0, -1.0).astype(y.dtype)
    return (signs * _walsh_hadamard(y) / jnp.sqrt(jnp.asarray(size, y.dtype)))[:dimension]


def error_feedback(
    compress: Callable[[jax.Array], jax.Array], x: jax.Array, residual: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """(C(x + e), x + e - C(x + e)): what is sent, and the client's next residual e.

    Karimireddy et al. 2019, Algorithm 2 (EF-SGD), with `compress` any of the
    compressors above closed over its key and size (`lambda v:
    top_k(v, k)`). The residual starts at zero and is the client's own state.
    """
    corrected = x + residual
    sent = compress(corrected)
    return sent, corrected - sent
