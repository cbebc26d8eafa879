"""Compressed client updates in the round: what each client sends, and what the server decodes.

`UpdateCompression` names a compressor of `jaxfl.primitives.compression` and
its options; `compress_updates` applies it to a cohort's updates, vmapped over
clients, inside the compiled round. Client i of the round flattens its update
Delta_i to a vector x_i in R^d and sends

    C(x_i)                      without error feedback,
    C(x_i + e_i), e_i <- x_i + e_i - C(x_i + e_i)   with it

(Karimireddy et al. 2019, Algorithm 2), e_i its residual row, zero at the
start, kept between the rounds it takes part in. With `rotation`, C(v) is
R^-1 C'(R v) with R the randomized Hadamard rotation (Suresh et al. 2017,
Section 4), which the server undoes; the code is then of the padded size d'.
Client i's draws (signs, rounding, kept coordinates) come from
`fold_in(compression key, client id)`; the server holds the same key (rand-k's
indices are therefore not sent).

Unbiased compressors (qsgd, rand-k, with or without rotation) keep E C(x) = x,
so the mean of the decoded updates is an unbiased estimate of the mean update;
top-k is biased and meant for error feedback.

Error feedback needs a contraction, E ||C(x) - x||^2 <= (1 - delta) ||x||^2
(the delta-approximate compressors of Karimireddy et al. 2019): top-k is one
(delta = k / d); an unbiased compressor of variance omega ||x||^2 is not when
omega >= 1 (rand-k's d / k - 1: the residual would grow each round), but
C / (1 + omega) is, with delta = 1 / (1 + omega). So with error feedback
rand-k sends its k coordinates unscaled (the memory SGD of Stich et al. 2018)
and qsgd's decoded values are divided by 1 + omega, omega = min(b / s^2,
sqrt(b) / s) for buckets of b coordinates and s levels (Alistarh et al. 2017,
Lemma 3.1).

Only the clients that upload compress: a client the plan left out keeps its
update (zero) and its residual.

References:
  [Alistarh et al. 2017] D. Alistarh, D. Grubic, J. Li, R. Tomioka, M. Vojnovic. QSGD:
    Communication-Efficient SGD via Gradient Quantization and Encoding. NeurIPS 2017.
  [Stich et al. 2018] S. U. Stich, J.-B. Cordonnier, M. Jaggi. Sparsified SGD with Memory.
    NeurIPS 2018.
  [Suresh et al. 2017] A. T. Suresh, F. X. Yu, S. Kumar, H. B. McMahan. Distributed Mean
    Estimation with Limited Communication. ICML 2017.
  [Karimireddy et al. 2019] S. P. Karimireddy, Q. Rebjock, S. U. Stich, M. Jaggi. Error
    Feedback Fixes SignSGD and other Gradient Compression Problems. ICML 2019.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from jaxfl.models.networks import count_parameters
from jaxfl.primitives import compression as codes
from jaxfl.types import Key, Params

COMPRESSORS = ("qsgd", "rand-k", "top-k")
UNBIASED = ("qsgd", "rand-k")


@dataclasses.dataclass(frozen=True)
class UpdateCompression:
    """How clients compress their updates (static: it fixes the code's size).

    Attributes:
      name: 'qsgd' (stochastic quantization), 'rand-k' or 'top-k'.
      bits: qsgd's bits per level, 1..16 (2^bits - 1 levels).
      fraction: rand-k and top-k: the share of coordinates kept, k =
        ceil(fraction * d) (d the sent vector's size), in (0, 1].
      bucket_size: qsgd: quantize buckets of this many coordinates, each with
        its own norm (Alistarh et al. 2017, Section 3.1, "bucketing"), or
        None: the whole vector is one bucket.
      rotation: apply the randomized Hadamard rotation first.
      error_feedback: keep a residual row per client (needs `num_clients`).
      num_clients: N, the training clients (one residual row each).
    """

    name: str
    bits: int = 4
    fraction: float = 0.01
    bucket_size: int | None = None
    rotation: bool = False
    error_feedback: bool = False
    num_clients: int | None = None

    def __post_init__(self):
        if self.name not in COMPRESSORS:
            raise ValueError(f"compression must be one of {', '.join(COMPRESSORS)}; got {self.name!r}")
        if isinstance(self.bits, bool) or not isinstance(self.bits, int) or not 1 <= self.bits <= 16:
            raise ValueError(f"compression bits must be an int in [1, 16], got {self.bits!r}")
        if not (isinstance(self.fraction, (int, float)) and 0.0 < self.fraction <= 1.0):
            raise ValueError(f"compression fraction must be in (0, 1], got {self.fraction!r}")
        bucket = self.bucket_size
        if bucket is not None and (isinstance(bucket, bool) or not isinstance(bucket, int) or bucket < 1):
            raise ValueError(f"compression bucket_size must be an int >= 1 or None, got {bucket!r}")
        if bucket is not None and self.name != "qsgd":
            raise ValueError(f"bucket_size is qsgd's option; {self.name} does not quantize")
        if self.error_feedback and (self.num_clients is None or self.num_clients < 1):
            raise ValueError("error feedback keeps one residual row per client: give num_clients >= 1")

    @property
    def unbiased(self) -> bool:
        """E C(x) = x for every x (not with error feedback, which uses a contraction instead)."""
        return self.name in UNBIASED and not self.error_feedback

    def variance_factor(self, dimension: int) -> float:
        """omega: E ||C(x) - x||^2 <= omega ||x||^2 for the unbiased compressor of a `[dimension]` update."""
        size = self.sent_size(dimension)
        if self.name == "rand-k":
            return size / self.kept(dimension) - 1.0
        if self.name == "qsgd":
            bucket = size if self.bucket_size is None else min(self.bucket_size, size)
            levels = 2**self.bits - 1
            return min(bucket / levels**2, math.sqrt(bucket) / levels)
        raise ValueError(f"{self.name} is not unbiased")

    def sent_size(self, dimension: int) -> int:
        """The size of the vector the client encodes: d, or the rotation's padded d'."""
        return codes.rotated_size(dimension) if self.rotation else dimension

    def kept(self, dimension: int) -> int:
        """rand-k's and top-k's k for a `[dimension]` update."""
        size = self.sent_size(dimension)
        return min(size, max(1, math.ceil(self.fraction * size)))

    def encoded_bits(self, dimension: int) -> int:
        """Bits one client sends for a `[dimension]` update."""
        size = self.sent_size(dimension)
        if self.name == "qsgd":
            bucket = size if self.bucket_size is None else min(self.bucket_size, size)
            buckets = -(-size // bucket)
            return buckets * codes.FLOAT_BITS + size * (1 + self.bits)
        return codes.sparse_bits(size, self.kept(dimension), indices=self.name == "top-k")

    def compress(self, x: jax.Array, key: Key) -> jax.Array:
        """What the server decodes from client vector `x` (`[d]`), drawn with the client's `key`."""
        rotation_key, code_key = jax.random.split(key)
        dimension = x.shape[0]
        sent = codes.hadamard_rotation(x, rotation_key) if self.rotation else x
        if self.name == "qsgd":
            sent = self._quantize(sent, code_key)
            if self.error_feedback:  # A contraction (see the module docstring).
                sent = sent / (1.0 + self.variance_factor(dimension))
        elif self.name == "rand-k":
            sent = codes.random_k(sent, code_key, self.kept(dimension))
            if self.error_feedback:  # Unscaled: a contraction.
                sent = sent * (self.kept(dimension) / self.sent_size(dimension))
        else:
            sent = codes.top_k(sent, self.kept(dimension))
        if self.rotation:
            sent = codes.inverse_hadamard_rotation(sent, rotation_key, dimension)
        return sent

    def _quantize(self, x: jax.Array, key: Key) -> jax.Array:
        size = x.shape[0]
        bucket = size if self.bucket_size is None else min(self.bucket_size, size)
        if bucket == size:
            return codes.stochastic_quantize(x, key, self.bits)
        buckets = -(-size // bucket)
        # Zero padding changes no bucket's norm; the padded coordinates are cut off again.
        padded = jnp.zeros(buckets * bucket, x.dtype).at[:size].set(x).reshape(buckets, bucket)
        keys = jax.random.split(key, buckets)
        quantized = jax.vmap(codes.stochastic_quantize, in_axes=(0, 0, None))(padded, keys, self.bits)
        return quantized.reshape(-1)[:size]


def initial_residuals(params: Params) -> jax.Array:
    """One client's residual row: `[d]` zeros (float32), d the model's entries."""
    return jnp.zeros(count_parameters(params), jnp.float32)


def compress_updates(
    compression: UpdateCompression,
    deltas: Params,
    client_ids: jax.Array,
    key: Key,
    uploading: jax.Array,
    residuals: jax.Array | None = None,
) -> tuple[Params, jax.Array | None]:
    """(the decoded updates, the cohort's new residual rows) of a cohort's updates.

    Args:
      compression: the compressor.
      deltas: the cohort's updates, leaves `[M, ...]`.
      client_ids: `[M]` their client ids (client i draws with `fold_in(key, i)`).
      key: the round's compression key.
      uploading: `[M]` bool, the clients that send their update; the others
        keep theirs and their residual.
      residuals: `[M, d]` the cohort's residual rows (with error feedback), or None.

    Returns:
      The decoded updates, shaped and typed like `deltas`, and the new
      `[M, d]` residual rows (None without error feedback).
    """
    if compression.error_feedback and residuals is None:
        raise ValueError("error feedback needs the cohort's residual rows")
    _, unravel = ravel_pytree(jax.tree.map(lambda leaf: leaf[0], deltas))
    flat = jax.vmap(lambda tree: ravel_pytree(tree)[0])(deltas)
    dtype = flat.dtype
    flat = flat.astype(jnp.float32)
    keys = jax.vmap(lambda client: jax.random.fold_in(key, client))(client_ids)

    def one_client(x, client_key, residual, uploads):
        corrected = x if residual is None else x + residual
        sent = compression.compress(corrected, client_key)
        decoded = jnp.where(uploads, sent, x)
        if residual is None:
            return decoded, None
        return decoded, jnp.where(uploads, corrected - sent, residual)

    decoded, new_residuals = jax.vmap(one_client)(flat, keys, residuals, uploading)
    return jax.vmap(unravel)(decoded.astype(dtype)), new_residuals
