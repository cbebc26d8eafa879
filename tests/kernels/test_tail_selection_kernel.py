"""The sort-free tail selection kernel against the sort-based primitives.

Its reference is the primitives vmapped over rows; the edge grid covers ties,
zero weights, theta = 1, tiny theta, infinities and every NaN case.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jaxfl.kernels.tail_selection import (
    float_to_key,
    key_to_float,
    tail_selection,
    tail_selection_reference,
)

N = 13  # padded to 16 inside the kernel

# Natively compiled on an accelerator, the Pallas interpreter on CPU.
INTERPRET = jax.default_backend() == "cpu"
# JAX >= 0.11 warns that Pallas' Triton backend (used natively on GPU) is
# deprecated in favour of Mosaic GPU; see docs/primitives.md.
pytestmark = pytest.mark.filterwarnings(
    "ignore:The Pallas Triton backend is deprecated:DeprecationWarning"
)


def _batch():
    rng = np.random.default_rng(0)
    losses = rng.normal(size=(12, N)).astype(np.float32)
    weights = rng.uniform(0.1, 2.0, size=(12, N)).astype(np.float32)
    theta = np.full(12, 0.3, np.float32)
    losses[1, :6] = 1.5  # ties at the boundary
    weights[2] = 1.0
    theta[2] = 4 / N  # theta n integer
    theta[3] = 1.0
    theta[4] = 1e-4
    weights[5, ::2] = 0.0
    losses[5, ::2] = np.nan  # zero weight: ignored
    losses[6, 3] = np.inf
    losses[6, 4] = -np.inf
    losses[7, 5] = np.nan  # positive weight: NaN row
    weights[8] = 0.0  # empty row
    weights[9, 2] = -1.0  # bad weights
    theta[10] = 1.5  # bad theta
    losses[11] = np.round(losses[11])  # many ties, integer weights
    weights[11] = np.round(weights[11] * 3) + 1
    return losses, weights, theta


@pytest.mark.parametrize("block_rows", [4, 8])
def test_kernel_matches_sort_based_reference(block_rows):
    losses, weights, theta = _batch()
    threshold, pi = tail_selection(
        losses, weights, theta, block_rows=block_rows, interpret=INTERPRET
    )
    threshold, pi = np.asarray(threshold), np.asarray(pi)
    ref_threshold, ref_pi = tail_selection_reference(losses, weights, theta)
    np.testing.assert_array_equal(threshold, ref_threshold)  # NaN == NaN here
    np.testing.assert_allclose(pi, ref_pi, rtol=1e-6, atol=1e-7, equal_nan=True)
    assert np.all(np.isnan(threshold[[7, 8, 9, 10]]))
    assert np.all(pi[8] == 0)


def test_key_mapping_is_monotone_and_invertible():
    values = np.array(
        [-np.inf, -3e38, -1.0, -1e-45, -0.0, 0.0, 1e-45, 1.0, 3e38, np.inf], np.float32
    )
    keys = np.asarray(float_to_key(values)).astype(np.int64)
    assert np.all(np.diff(keys) > 0)
    back = np.asarray(key_to_float(float_to_key(values)))
    np.testing.assert_array_equal(back.view(np.uint32), values.view(np.uint32))


def test_uniform_weights_and_scalar_theta():
    losses = np.random.default_rng(1).permutation(40).astype(np.float32).reshape(2, 20)
    threshold, pi = tail_selection(losses, None, 0.25, interpret=INTERPRET)
    ref_threshold, ref_pi = tail_selection_reference(losses, None, 0.25)
    np.testing.assert_array_equal(threshold, ref_threshold)
    np.testing.assert_allclose(pi, ref_pi, atol=1e-7)
    assert np.count_nonzero(np.asarray(pi)[0]) == 5
