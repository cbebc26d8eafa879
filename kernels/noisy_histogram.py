"""Pallas kernel: the clients' noisy hierarchical histograms and their secure sum.

The hot path of `jaxfl.primitives.dp_quantile` (Pillutla et al. 2023,
Algorithm 2, lines 1-3): every client i one-hot encodes its level-0 bin in
the 2b - 2 nodes of the tree, scales by c, adds its discrete Gaussian noise
and reduces modulo M; the secure sum adds the n messages modulo M. The
reference materializes the [n, 2b - 2] messages; the kernel builds each
block of clients' messages on chip and writes one partial modular sum per
block (the wrapper adds the partial sums), so only the noise is read from
memory. Sampling the noise stays outside (the discrete Gaussian sampler is a
rejection loop, and Pallas PRNG is TPU-only).

`noisy_histogram_sum_kernel` is the kernel body, `noisy_histogram_sum` the
jitted wrapper (with `interpret=True` it runs on CPU), and
`noisy_histogram_sum_reference` the pure-jnp reference with the same
signature. `jaxfl.primitives` does not call this kernel (see
docs/primitives.md: no accelerator measurement exists yet).

References:
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from jaxfl.primitives._validation import check_power_of_two
from jaxfl.primitives.dp_quantile import (
    MAX_MODULUS,
    add_mod,
    check_modulus,
    mod_signed,
    node_indices,
    sum_mod,
    tree_size,
)
from jaxfl.primitives.histogram import num_levels


def _level_offsets(num_bins: int) -> list[int]:
    sizes = [num_bins >> r for r in range(num_levels(num_bins))]
    return [int(v) for v in np.concatenate([[0], np.cumsum(sizes)[:-1]])]


def _block_sum_mod(rows: jax.Array, modulus: int) -> jax.Array:
    """Sum of a [rows, width] block of residues along rows, modulo M.

    Only sums, shifts and modular additions (no slicing, no 64-bit words), so
    that it lowers to Triton: with m = hi 2^16 + lo, the column sums of hi and
    of lo fit in uint32 for up to 2^16 rows, and
    (S_hi 2^16 + S_lo) mod M = 16 modular doublings of S_hi mod M, plus S_lo.
    """
    if modulus & (modulus - 1) == 0:
        total = jnp.sum(rows, axis=0, dtype=jnp.uint32)
        return total if modulus == MAX_MODULUS else total & jnp.uint32(modulus - 1)
    m = jnp.uint32(modulus)
    low = jnp.sum(rows & jnp.uint32(0xFFFF), axis=0, dtype=jnp.uint32)
    high = jnp.sum(rows >> 16, axis=0, dtype=jnp.uint32) % m
    for _ in range(16):
        high = add_mod(high, high, modulus)
    return add_mod(high, low % m, modulus)


def noisy_histogram_sum_kernel(
    bins_ref, noise_ref, scale_ref, out_ref, *, num_bins: int, modulus: int
):
    """One block of clients: out = sum_i ((c x_i + xi_i) mod M) mod M.

    Refs: bins [block] int32 (-1 = no data), noise [block, width] int32,
    scale [1] uint32 (c mod M), out [1, width] uint32: this block's partial
    sum (width = 2b, a power of two; the padding columns carry zeros). Each
    grid step writes its own row, so the steps may run in parallel (GPU); the
    wrapper adds the rows modulo M.
    """
    bins = bins_ref[...]  # [block]
    noise = noise_ref[...]  # [block, width]
    block, width = noise.shape
    column = lax.broadcasted_iota(jnp.int32, (block, width), 1)
    has_value = (bins >= 0)[:, None]
    one_hot = jnp.zeros((block, width), jnp.uint32)
    for level, offset in enumerate(_level_offsets(num_bins)):
        node = offset + (bins >> level)  # [block]
        one_hot += (has_value & (column == node[:, None])).astype(jnp.uint32)
    scaled = one_hot * scale_ref[0]  # c x_i mod M: x_i is 0/1 and c < M
    messages = add_mod(scaled, mod_signed(noise, modulus), modulus)
    out_ref[...] = _block_sum_mod(messages, modulus)[None, :]


def _scale_residue(scale, modulus: int) -> jax.Array:
    scale = jnp.asarray(scale)
    if jnp.issubdtype(scale.dtype, jnp.floating):
        scale = jnp.round(scale)
    scale = scale.astype(jnp.uint32)
    if modulus != MAX_MODULUS:
        scale = scale % jnp.uint32(modulus)
    return scale.reshape(1)


def _validate(bins, noise, num_bins, modulus):
    num_bins = check_power_of_two(num_bins, "num_bins")
    modulus = check_modulus(modulus)
    if bins.ndim != 1 or noise.shape != (bins.shape[0], tree_size(num_bins)):
        raise ValueError(
            f"bins must be [n] and noise [n, 2b - 2] = [n, {tree_size(num_bins)}], "
            f"got {bins.shape} and {noise.shape}"
        )
    return num_bins, modulus


@functools.partial(
    jax.jit, static_argnames=("num_bins", "modulus", "block_clients", "interpret")
)
def noisy_histogram_sum(
    bins,
    noise,
    scale,
    *,
    num_bins: int,
    modulus: int,
    block_clients: int = 128,
    interpret: bool = False,
) -> jax.Array:
    """Secure sum of the clients' noisy scaled trees, by a Pallas kernel.

    Args:
      bins: [n] int32 level-0 bin per client (`histogram.bin_index`); a
        negative bin means no data (only noise is sent).
      noise: [n, 2b - 2] int32 per-client discrete Gaussian noise.
      scale: the integer scale c (scalar; rounded if float).
      num_bins: b, a power of two >= 2 (static).
      modulus: M in [2, 2^32] (static).
      block_clients: clients per grid step (static power of two).
      interpret: run the kernel in the Pallas interpreter (needed on CPU).

    Returns:
      [2b - 2] uint32 residues: (sum_i (c x_i + xi_i)) mod M.

    Raises:
      ValueError: bad shapes, `num_bins`, `modulus` or `block_clients`.
    """
    bins = jnp.asarray(bins, jnp.int32)
    noise = jnp.asarray(noise, jnp.int32)
    num_bins, modulus = _validate(bins, noise, num_bins, modulus)
    check_power_of_two(block_clients, "block_clients", minimum=1)
    if block_clients > 2**16:
        raise ValueError(f"block_clients must be <= 2^16, got {block_clients}")
    n = bins.shape[0]
    size = tree_size(num_bins)
    width = 2 * num_bins  # power-of-two block width (GPU block shapes)
    padded_n = -(-n // block_clients) * block_clients
    # Padding clients: no data and zero noise, so they add 0 modulo M.
    bins = jnp.pad(bins, (0, padded_n - n), constant_values=-1)
    noise = jnp.pad(noise, ((0, padded_n - n), (0, width - size)))
    kernel = functools.partial(
        noisy_histogram_sum_kernel, num_bins=num_bins, modulus=modulus
    )
    num_blocks = padded_n // block_clients
    partial_sums = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((num_blocks, width), jnp.uint32),
        grid=(num_blocks,),
        in_specs=[
            pl.BlockSpec((block_clients,), lambda i: (i,)),
            pl.BlockSpec((block_clients, width), lambda i: (i, 0)),
            pl.BlockSpec((1,), lambda i: (0,)),
        ],
        out_specs=pl.BlockSpec((1, width), lambda i: (i, 0)),
        interpret=interpret,
    )(bins, noise, _scale_residue(scale, modulus))
    out = sum_mod(partial_sums, modulus, axis=0)  # [width], across blocks
    return out[:size]


@functools.partial(
    jax.jit, static_argnames=("num_bins", "modulus", "block_clients", "interpret")
)
def noisy_histogram_sum_reference(
    bins,
    noise,
    scale,
    *,
    num_bins: int,
    modulus: int,
    block_clients: int = 128,
    interpret: bool = False,
) -> jax.Array:
    """Pure-jnp reference of `noisy_histogram_sum` (same signature).

    Materializes the [n, 2b - 2] one-hot trees and messages, then the
    modular sum (`block_clients` and `interpret` are accepted and ignored).
    """
    del block_clients, interpret  # Unused: no kernel here.
    bins = jnp.asarray(bins, jnp.int32)
    noise = jnp.asarray(noise, jnp.int32)
    num_bins, modulus = _validate(bins, noise, num_bins, modulus)
    size = tree_size(num_bins)
    nodes = node_indices(bins, num_bins)  # [n, log2 b]
    column = jnp.arange(size, dtype=jnp.int32)[None, :]
    one_hot = jnp.zeros((bins.shape[0], size), jnp.uint32)
    for level in range(nodes.shape[-1]):
        hit = (bins >= 0)[:, None] & (column == nodes[:, level : level + 1])
        one_hot = one_hot + hit.astype(jnp.uint32)
    scaled = one_hot * _scale_residue(scale, modulus)[0]
    messages = add_mod(scaled, mod_signed(noise, modulus), modulus)
    return sum_mod(messages, modulus, axis=0)
