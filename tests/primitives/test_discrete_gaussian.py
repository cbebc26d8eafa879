"""Tests of the discrete Gaussian sampler against its exact pmf.

The statistical tests use fixed keys, so they are deterministic; their
thresholds are chosen so that the right distribution passes with a wide
margin and a wrong sigma (15% off) is rejected, i.e. the tests can fail.
"""

from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxfl.primitives import discrete_gaussian

# The module (its name is shadowed by the function in jaxfl.primitives).
discrete_gaussian_module = importlib.import_module("jaxfl.primitives.discrete_gaussian")

NUM_SAMPLES = 40_000
sample = jax.jit(discrete_gaussian, static_argnums=2)


def exact_pmf(sigma, support):
    support = np.asarray(support, np.float64)
    full = np.arange(-int(40 * sigma) - 40, int(40 * sigma) + 41, dtype=np.float64)
    normalizer = np.sum(np.exp(-(full**2) / (2 * sigma**2)))
    return np.exp(-(support**2) / (2 * sigma**2)) / normalizer


def exact_variance(sigma):
    k = np.arange(-int(40 * sigma) - 40, int(40 * sigma) + 41, dtype=np.float64)
    p = exact_pmf(sigma, k)
    return float(np.sum(p * k**2))


def chi_square_p_value(samples, sigma):
    """Goodness of fit against N_Z(0, sigma^2); tails merged to expected >= 5."""
    samples = np.asarray(samples)
    limit = int(np.ceil(8 * sigma)) + 1
    support = np.arange(-limit, limit + 1)
    pmf = exact_pmf(sigma, support)
    expected = pmf * samples.size
    keep = expected >= 5
    lo, hi = support[keep][0], support[keep][-1]
    observed = [np.sum(samples <= lo)]
    expect = [np.sum(exact_pmf(sigma, np.arange(-limit * 5, lo + 1))) * samples.size]
    for k in range(lo + 1, hi):
        observed.append(np.sum(samples == k))
        expect.append(exact_pmf(sigma, [k])[0] * samples.size)
    observed.append(np.sum(samples >= hi))
    expect.append(np.sum(exact_pmf(sigma, np.arange(hi, limit * 5))) * samples.size)
    observed, expect = np.array(observed, np.float64), np.array(expect)
    expect *= observed.sum() / expect.sum()  # pmf mass beyond 5*limit is < 1e-300
    return stats.chisquare(observed, expect).pvalue


@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.0, 12.5])
def test_chi_square_goodness_of_fit_and_power(sigma):
    samples = np.asarray(sample(jax.random.key(7), sigma, (NUM_SAMPLES,)))
    assert samples.dtype == np.int32
    assert chi_square_p_value(samples, sigma) > 1e-3
    # The test has power: the same samples reject a sigma 15% off.
    assert chi_square_p_value(samples, 1.15 * sigma) < 1e-6
    assert chi_square_p_value(samples, sigma / 1.15) < 1e-6


@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.0, 12.5])
def test_mean_and_variance(sigma):
    samples = np.asarray(sample(jax.random.key(11), sigma, (NUM_SAMPLES,)), np.float64)
    variance = exact_variance(sigma)
    # 5 standard errors (the fourth moment of a near-Gaussian is 3 var^2).
    assert abs(samples.mean()) < 5 * np.sqrt(variance / samples.size)
    assert abs(samples.var() - variance) < 5 * variance * np.sqrt(2 / samples.size)
    if sigma >= 3:  # the discrete variance is ~sigma^2 for sigma >~ 1
        np.testing.assert_allclose(variance, sigma**2, rtol=1e-6)


def test_acceptance_probability_per_proposal_is_above_the_pools_floor():
    # The module sizes its pools of proposals assuming acceptance >= 0.3.
    # Exact acceptance of one proposal of the CKS sampler: U uniform
    # on {0..t-1} kept with probability exp(-U / t), then the geometric
    # proposal's sign and Gaussian tests.
    for sigma in [1e-3, 0.1, 0.3, 0.5, 0.99, 1.0, 1.5, 2.0, 7.3, 100.0, 1e4]:  # the least near 0.3
        t = np.floor(sigma) + 1
        y = np.arange(0, int(60 * t) + 60, dtype=np.float64)
        geometric = (1 - np.exp(-1 / t)) * np.exp(-y / t)
        # Signed proposal: +y or -y with probability 1/2; -0 is rejected.
        laplace_mass = np.where(y == 0, 0.5, 1.0) * geometric
        gauss = np.exp(-((y - sigma**2 / t) ** 2) / (2 * sigma**2))
        keep = np.mean(np.exp(-np.arange(int(t)) / t))
        acceptance = keep * np.sum(laplace_mass * gauss)
        # Lemire's rejection of U keeps at least 1 - t / 2^32 of the draws.
        assert acceptance * (1 - t / 2**32) >= discrete_gaussian_module._ACCEPTANCE_FLOOR, (sigma, acceptance)


def test_zero_sigma_and_traced_sigma():
    key = jax.random.key(0)
    np.testing.assert_array_equal(sample(key, 0.0, (1000,)), np.zeros(1000))
    sigmas = jnp.array([0.0, -1.0, jnp.nan, 2.0])
    batched = jax.jit(
        jax.vmap(discrete_gaussian, in_axes=(None, 0, None)), static_argnums=2
    )(key, sigmas, (1000,))
    np.testing.assert_array_equal(batched[:3], np.zeros((3, 1000)))
    assert 1.5 < float(np.std(np.asarray(batched[3]))) < 2.5
    # vmap over sigma equals separate calls with the same key.
    np.testing.assert_array_equal(batched[3], sample(key, 2.0, (1000,)))


def test_keys_matter_and_determinism():
    a = sample(jax.random.key(1), 2.0, (1000,))
    b = sample(jax.random.key(1), 2.0, (1000,))
    c = sample(jax.random.key(2), 2.0, (1000,))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_argument_errors():
    with pytest.raises(ValueError, match="sigma"):
        discrete_gaussian(jax.random.key(0), -1.0, (3,))
    with pytest.raises(ValueError, match="sigma"):
        discrete_gaussian(jax.random.key(0), np.inf, (3,))
    with pytest.raises(ValueError, match="integer dtype"):
        discrete_gaussian(jax.random.key(0), 1.0, (3,), dtype=jnp.float32)


def test_wide_multiply_and_uniform_integers_match_python_integers():
    rng = np.random.default_rng(0)
    edges = np.array([0, 1, 2**16 - 1, 2**16, 2**31, 2**32 - 1], np.uint64)
    words = np.concatenate([edges, rng.integers(0, 2**32, 5000, dtype=np.uint64)])
    bounds = np.concatenate([
        np.array([1, 2, 3, 2**16 - 1, 2**16 + 1, 1_000_001], np.uint64),
        rng.integers(1, 1_000_002, words.size - 6, dtype=np.uint64),
    ])
    high, low = discrete_gaussian_module._multiply_wide(
        jnp.asarray(words, jnp.uint32), jnp.asarray(bounds, jnp.uint32)
    )
    product = [int(w) * int(b) for w, b in zip(words, bounds)]
    np.testing.assert_array_equal(np.asarray(high, np.uint64), [p >> 32 for p in product])
    np.testing.assert_array_equal(np.asarray(low, np.uint64), [p % 2**32 for p in product])
    value, kept = discrete_gaussian_module._uniform_below(
        jnp.asarray(words, jnp.uint32), jnp.asarray(bounds, jnp.uint32)
    )
    # Lemire: floor(w t / 2^32), kept when (w t mod 2^32) >= 2^32 mod t.
    np.testing.assert_array_equal(np.asarray(value, np.uint64), [p >> 32 for p in product])
    np.testing.assert_array_equal(
        np.asarray(kept), [p % 2**32 >= 2**32 % int(b) for p, b in zip(product, bounds)]
    )


def test_many_small_pools_fill_the_samples_in_order(monkeypatch):
    # Pools of 3 proposals: the samples are filled over many pools, from the accepted ones in
    # order; the law must stay N_Z.
    monkeypatch.setattr(discrete_gaussian_module, "_pool_size", lambda num_samples: 3)
    monkeypatch.setattr(discrete_gaussian_module, "_MAX_POOLS", 100_000)
    samples = np.asarray(jax.jit(discrete_gaussian, static_argnums=2)(jax.random.key(3), 2.0, (20_000,)))
    assert np.count_nonzero(samples) > 0.7 * samples.size  # every sample filled (P(0) is about 0.2)
    assert chi_square_p_value(samples, 2.0) > 1e-3
    assert chi_square_p_value(samples, 2.3) < 1e-6
