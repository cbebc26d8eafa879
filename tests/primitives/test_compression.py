"""Compressors of client updates against NumPy and SciPy: grids, unbiasedness, orthogonality, bits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from jaxfl.primitives.compression import (
    error_feedback,
    hadamard_rotation,
    inverse_hadamard_rotation,
    quantized_bits,
    random_k,
    rotated_size,
    sparse_bits,
    stochastic_quantize,
    top_k,
)

X = np.random.default_rng(0).normal(size=37).astype(np.float32)
DRAWS = 4000
KEYS = jax.random.split(jax.random.key(5), DRAWS)
QUANTIZE = jax.jit(jax.vmap(stochastic_quantize, in_axes=(None, 0, None)), static_argnums=2)
RANDOM_K = jax.jit(jax.vmap(random_k, in_axes=(None, 0, None)), static_argnums=2)


def _assert_unbiased(draws, x, variance):
    # Each coordinate's mean over the draws within 5 standard errors of x (per-coordinate variance given).
    stderr = np.sqrt(np.maximum(variance, 1e-12) / draws.shape[0])
    np.testing.assert_array_less(np.abs(draws.mean(axis=0) - x), 5 * stderr + 1e-6)


@pytest.mark.parametrize("bits", [1, 3])
def test_quantization_is_unbiased_on_its_grid_with_the_bernoulli_variance(bits):
    draws = np.asarray(QUANTIZE(jnp.asarray(X), KEYS, bits), np.float64)
    norm, levels = np.linalg.norm(X.astype(np.float64)), 2**bits - 1
    # Every value is sign(x_i) * norm * (floor or ceil of levels |x_i| / norm) / levels.
    scaled = levels * np.abs(X) / norm
    low = np.sign(X) * norm * np.floor(scaled) / levels
    high = np.sign(X) * norm * np.ceil(scaled) / levels
    on_grid = np.isclose(draws, low, rtol=1e-5, atol=1e-6) | np.isclose(draws, high, rtol=1e-5, atol=1e-6)
    assert on_grid.all()
    fraction = scaled - np.floor(scaled)
    variance = (norm / levels) ** 2 * fraction * (1 - fraction)
    _assert_unbiased(draws, X, variance)
    # Alistarh et al. 2017, Lemma 3.1: E||Q(x) - x||^2 <= min(d / s^2, sqrt(d) / s) ||x||^2.
    bound = min(X.size / levels**2, np.sqrt(X.size) / levels) * norm**2
    assert np.mean(np.sum((draws - X) ** 2, axis=1)) <= bound
    assert quantized_bits(X.size, bits) == 32 + X.size * (1 + bits)


def test_random_k_keeps_k_uniform_coordinates_scaled_to_be_unbiased():
    k = 5
    draws = np.asarray(RANDOM_K(jnp.asarray(X), KEYS, k), np.float64)
    kept = draws != 0
    assert (kept.sum(axis=1) == k).all()
    np.testing.assert_allclose(draws[kept], (X * X.size / k)[np.nonzero(kept)[1]], rtol=1e-6)
    # Each coordinate kept with probability k/d (5 standard deviations over the draws).
    p = k / X.size
    np.testing.assert_array_less(np.abs(kept.mean(axis=0) - p), 5 * np.sqrt(p * (1 - p) / DRAWS))
    _assert_unbiased(draws, X, X.astype(np.float64) ** 2 * (X.size / k - 1))
    assert sparse_bits(X.size, k, indices=False) == 32 * k


def test_top_k_keeps_the_largest_magnitudes():
    for k in (1, 4, X.size):
        got = np.asarray(jax.jit(top_k, static_argnums=1)(jnp.asarray(X), k))
        keep = np.argsort(-np.abs(X), kind="stable")[:k]
        want = np.zeros_like(X)
        want[keep] = X[keep]
        np.testing.assert_array_equal(got, want)
    assert sparse_bits(37, 4, indices=True) == 4 * (32 + 6)


@pytest.mark.parametrize("dimension", [1, 8, 37])
def test_the_rotation_is_the_scaled_hadamard_matrix_times_signs_and_is_undone(dimension):
    x = jnp.asarray(X[:dimension])
    key = jax.random.key(dimension)
    rotated = jax.jit(hadamard_rotation)(x, key)
    size = rotated_size(dimension)
    assert rotated.shape == (size,) and size >= dimension and size & (size - 1) == 0
    signs = np.where(np.asarray(jax.random.bernoulli(key, 0.5, (size,))), 1.0, -1.0)
    padded = np.zeros(size)
    padded[:dimension] = X[:dimension]
    want = scipy.linalg.hadamard(size) @ (signs * padded) / np.sqrt(size)
    np.testing.assert_allclose(rotated, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(rotated), np.linalg.norm(X[:dimension]), rtol=1e-5)
    back = jax.jit(inverse_hadamard_rotation, static_argnums=2)(rotated, key, dimension)
    np.testing.assert_allclose(back, X[:dimension], rtol=1e-5, atol=1e-6)


def test_error_feedback_sends_what_was_dropped_later():
    # Karimireddy et al. 2019, Algorithm 2, as a plain loop: e_{t+1} = x_t + e_t - C(x_t + e_t).
    rng = np.random.default_rng(3)
    updates = rng.normal(size=(6, 37)).astype(np.float32)
    compress = lambda v: top_k(v, 3)  # noqa: E731
    step = jax.jit(lambda x, e: error_feedback(compress, x, e))
    residual, sent_total = jnp.zeros(37), np.zeros(37)
    want_residual = np.zeros(37)
    for x in updates:
        sent, residual = step(jnp.asarray(x), residual)
        corrected = x + want_residual
        keep = np.argsort(-np.abs(corrected), kind="stable")[:3]
        want_sent = np.zeros(37)
        want_sent[keep] = corrected[keep]
        want_residual = corrected - want_sent
        np.testing.assert_allclose(sent, want_sent, rtol=1e-6, atol=1e-6)
        sent_total += np.asarray(sent)
    # Nothing is lost: what was sent plus what is left is what there was to send.
    np.testing.assert_allclose(sent_total + np.asarray(residual), updates.sum(axis=0), rtol=1e-5, atol=1e-5)


def test_zero_nan_and_bad_sizes():
    zero = jnp.zeros(5)
    key = jax.random.key(0)
    np.testing.assert_array_equal(stochastic_quantize(zero, key, 2), zero)
    nan = jnp.asarray([1.0, np.nan, 2.0])
    assert np.isnan(np.asarray(stochastic_quantize(nan, key, 2))).all()  # The norm is read by all.
    assert np.isnan(np.asarray(top_k(nan, 1)))[1]  # A NaN ranks first: kept, so it shows.
    with pytest.raises(ValueError, match="bits must be a Python int >= 1 <= 16"):
        stochastic_quantize(zero, key, 0)
    with pytest.raises(ValueError, match="k must be a Python int >= 1 <= 5"):
        random_k(zero, key, 6)
    with pytest.raises(ValueError, match="flat vector"):
        top_k(jnp.zeros((2, 2)), 1)
    with pytest.raises(ValueError, match="a rotated \\[5\\] vector has 8 entries"):
        inverse_hadamard_rotation(jnp.zeros(4), key, 5)
