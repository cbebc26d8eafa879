"""The noisy hierarchical histogram kernel against its references.

Its pure-jnp reference and (c h + sum_i xi_i) mod M in Python integers; the
kernel runs in the Pallas interpreter on CPU and natively on an accelerator.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jaxfl.kernels.noisy_histogram import (
    noisy_histogram_sum,
    noisy_histogram_sum_reference,
)

NUM_BINS = 8
SIZE = 2 * NUM_BINS - 2

# Natively compiled on an accelerator, the Pallas interpreter on CPU.
INTERPRET = jax.default_backend() == "cpu"
# JAX >= 0.11 warns that Pallas' Triton backend (used natively on GPU) is
# deprecated in favour of Mosaic GPU; see docs/primitives.md.
pytestmark = pytest.mark.filterwarnings(
    "ignore:The Pallas Triton backend is deprecated:DeprecationWarning"
)


def _inputs(seed, n, noise_bound):
    rng = np.random.default_rng(seed)
    bins = rng.integers(-1, NUM_BINS, size=n).astype(np.int32)  # -1: no data
    noise = rng.integers(-noise_bound, noise_bound, size=(n, SIZE), endpoint=True)
    return bins, noise.astype(np.int32)


def python_sum(bins, noise, scale, modulus):
    """(sum_i (c x_i + xi_i)) mod M with arbitrary-precision integers."""
    totals = [0] * SIZE
    offsets = [0, 8, 12]
    for i, bin_ in enumerate(bins.tolist()):
        for node in range(SIZE):
            totals[node] += int(noise[i, node])
        if bin_ >= 0:
            for level, offset in enumerate(offsets):
                totals[offset + (bin_ >> level)] += scale
    return [t % modulus for t in totals]


@pytest.mark.parametrize(
    "modulus,noise_bound",
    [(2**10, 40), (1000, 40), (2**32, 2**31 - 1), (2**32 - 5, 2**31 - 1)],
)
def test_kernel_matches_reference_and_python_ints(modulus, noise_bound):
    bins, noise = _inputs(modulus % 97, 37, noise_bound)  # 37: padded to 48
    if noise_bound > 40:  # the int32 extremes
        noise[0, :3] = [-(2**31), 2**31 - 1, -1]
    scale = 5
    got = noisy_histogram_sum(
        bins,
        noise,
        scale,
        num_bins=NUM_BINS,
        modulus=modulus,
        block_clients=16,
        interpret=INTERPRET,
    )
    reference = noisy_histogram_sum_reference(
        bins, noise, scale, num_bins=NUM_BINS, modulus=modulus
    )
    np.testing.assert_array_equal(got, reference)
    assert got.dtype == np.uint32
    np.testing.assert_array_equal(
        np.asarray(got).astype(np.int64), python_sum(bins, noise, scale, modulus)
    )


def test_kernel_wraps_at_bit_width_10():
    # 64 clients in one bin with c = 16: the counts 1024 wrap to 0 modulo 2^10.
    bins = np.zeros(64, np.int32)
    noise = np.zeros((64, SIZE), np.int32)
    got = np.asarray(
        noisy_histogram_sum(
            bins,
            noise,
            16,
            num_bins=NUM_BINS,
            modulus=2**10,
            block_clients=16,
            interpret=INTERPRET,
        )
    )
    np.testing.assert_array_equal(got, np.zeros(SIZE))


def test_kernel_shape_errors():
    bins, noise = _inputs(0, 8, 3)
    with pytest.raises(ValueError, match="noise"):
        noisy_histogram_sum(
            bins, noise[:, :-1], 1, num_bins=NUM_BINS, modulus=64, interpret=INTERPRET
        )
    with pytest.raises(ValueError, match="modulus"):
        noisy_histogram_sum(
            bins, noise, 1, num_bins=NUM_BINS, modulus=2**33, interpret=INTERPRET
        )
