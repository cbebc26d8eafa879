"""Tests of the DP quantile protocol (004 Algorithm 2) and its accounting.

Modular arithmetic is checked against Python's arbitrary-precision integers,
the protocol against (c h + sum_i xi_i) mod M recomputed from the same noise,
and Theorem 6's formulas against an independent transcription.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfl.primitives import (
    discrete_gaussian,
    dp_hierarchical_histogram,
    dp_quantile,
    dp_quantile_epsilon,
    dp_quantile_modulus,
    dp_quantile_scale,
    dp_quantile_sigma,
    hierarchical_histogram,
    histogram_quantile,
)
from jaxfl.primitives.dp_quantile import (
    add_mod,
    mod_signed,
    secure_sum_of_noisy_histograms,
    signed_representative,
    sum_mod,
)

NUM_CLIENTS = 256
NUM_BINS = 16
UPPER = 10.0
THETAS = np.linspace(0.1, 0.9, 9).astype(np.float32)

exact_levels_jit = jax.jit(hierarchical_histogram, static_argnums=(1,))
exact_quantiles_jit = jax.jit(
    jax.vmap(histogram_quantile, in_axes=(None, 0, None, None)), static_argnums=(3,)
)


def _values(seed=0):
    return np.random.default_rng(seed).uniform(0, UPPER, NUM_CLIENTS).astype(np.float32)


@functools.cache
def _levels_jit(modulus):
    """The server's decoded noisy tree; one compile per modulus."""
    return jax.jit(
        lambda key, values, sigma, scale: dp_hierarchical_histogram(
            key,
            values,
            num_bins=NUM_BINS,
            upper=UPPER,
            sigma=sigma,
            scale=scale,
            modulus=modulus,
        )
    )


@jax.jit
def _quantiles_of(levels):
    """histogram_quantile of a tree at every theta of THETAS (n = NUM_CLIENTS)."""
    return jax.vmap(histogram_quantile, in_axes=(None, 0, None, None))(
        levels, jnp.asarray(THETAS), NUM_CLIENTS, UPPER
    )


@jax.jit
def _dp_quantiles(key, values, sigma, scale, mask):
    """dp_quantile itself, vmapped over THETAS (M = 2^32)."""

    def one(theta):
        return dp_quantile(
            key,
            values,
            theta,
            num_bins=NUM_BINS,
            upper=UPPER,
            sigma=sigma,
            scale=scale,
            modulus=2**32,
            client_mask=mask,
        )

    return jax.vmap(one)(jnp.asarray(THETAS))


ALL_CLIENTS = np.ones(NUM_CLIENTS, bool)


MODULI = [2, 3, 1000, 1024, 2**31 + 11, 2**32 - 5, 2**32]


@pytest.mark.parametrize("modulus", MODULI)
def test_modular_arithmetic_against_python_ints(modulus):
    rng = np.random.default_rng(modulus % 1000)
    xs = np.concatenate(
        [
            np.array(
                [0, 1, -1, 2**31 - 1, -(2**31), -(2**31) + 1, modulus % 2**31], np.int64
            ),
            rng.integers(-(2**31), 2**31, size=200),
        ]
    ).astype(np.int32)
    residues = np.asarray(mod_signed(jnp.asarray(xs), modulus)).astype(np.int64)
    np.testing.assert_array_equal(residues, [int(x) % modulus for x in xs])
    a, b = residues[:100], residues[100:200]
    added = np.asarray(
        add_mod(jnp.asarray(a, jnp.uint32), jnp.asarray(b, jnp.uint32), modulus)
    )
    np.testing.assert_array_equal(
        added.astype(np.int64),
        [(int(x) + int(y)) % modulus for x, y in zip(a, b, strict=True)],
    )
    # The secure sum over clients (rows), odd count to exercise padding.
    table = residues[:201].reshape(67, 3)
    summed = np.asarray(sum_mod(jnp.asarray(table, jnp.uint32), modulus))
    np.testing.assert_array_equal(
        summed.astype(np.int64),
        [sum(int(v) for v in table[:, k]) % modulus for k in range(3)],
    )
    # Signed representatives in (-M/2, M/2].
    signed = np.asarray(
        signed_representative(
            jnp.asarray(residues, jnp.uint32),
            modulus,
            jnp.float64 if jax.config.jax_enable_x64 else jnp.float32,
        )
    )
    expected = [r - modulus if r > modulus // 2 else r for r in residues.tolist()]
    np.testing.assert_allclose(signed, expected, rtol=1e-7)


def test_modulus_range():
    values = _values()
    with pytest.raises(ValueError, match="modulus"):
        dp_quantile(
            jax.random.key(0),
            values,
            0.5,
            num_bins=16,
            upper=10.0,
            sigma=1.0,
            scale=1,
            modulus=2**32 + 1,
        )
    with pytest.raises(ValueError, match="modulus"):
        dp_quantile(
            jax.random.key(0),
            values,
            0.5,
            num_bins=16,
            upper=10.0,
            sigma=1.0,
            scale=1,
            modulus=1,
        )
    with pytest.raises(ValueError, match="scale"):
        dp_quantile(
            jax.random.key(0),
            values,
            0.5,
            num_bins=16,
            upper=10.0,
            sigma=1.0,
            scale=1.5,
            modulus=64,
        )
    with pytest.raises(ValueError, match="sigma"):
        dp_quantile(
            jax.random.key(0),
            values,
            0.5,
            num_bins=16,
            upper=10.0,
            sigma=-1.0,
            scale=1,
            modulus=64,
        )
    with pytest.raises(ValueError, match="theta"):
        dp_quantile(
            jax.random.key(0),
            values,
            0.0,
            num_bins=16,
            upper=10.0,
            sigma=1.0,
            scale=1,
            modulus=64,
        )
    with pytest.raises(ValueError, match="power of two"):
        dp_quantile(
            jax.random.key(0),
            values,
            0.5,
            num_bins=10,
            upper=10.0,
            sigma=1.0,
            scale=1,
            modulus=64,
        )


@pytest.mark.parametrize("seed", [0, 1])
def test_zero_noise_large_modulus_is_the_exact_histogram_quantile(seed):
    values = _values(seed)
    if seed == 1:  # chi-square(4), clipped, with values exactly on bin edges
        values = (
            np.random.default_rng(seed).chisquare(4, NUM_CLIENTS).astype(np.float32)
        )
        values[:16] = np.arange(16, dtype=np.float32) * np.float32(UPPER / NUM_BINS)
    exact_levels = exact_levels_jit(values, NUM_BINS, UPPER)
    got = _dp_quantiles(jax.random.key(seed), values, 0.0, 3, ALL_CLIENTS)
    np.testing.assert_array_equal(got, _quantiles_of(exact_levels))
    levels = _levels_jit(2**32)(jax.random.key(seed), values, 0.0, 3)
    for noisy, true in zip(levels, exact_levels, strict=True):
        np.testing.assert_array_equal(noisy, np.asarray(true, np.float32))


def _signed(residues, modulus):
    residues = np.asarray(residues, np.int64) % modulus
    return np.where(residues > modulus // 2, residues - modulus, residues)


def test_protocol_and_no_wraparound_at_the_theorem_6_modulus():
    # The server's tree is signed((c h + sum_i xi_i) mod M) / c, with client
    # i's noise drawn from fold_in(key, i); sum_i ((c x_i + xi_i) mod M) mod M
    # is that residue. M from Theorem 6 is not a power of two (the modular
    # tree sum) and no wraparound happens: decoding with M = 2^32 agrees.
    values = _values(5)
    key, sigma, scale = jax.random.key(9), 1.0, 3
    modulus = dp_quantile_modulus(NUM_BINS, NUM_CLIENTS, sigma, scale, 1e-5)
    assert modulus & (modulus - 1) != 0
    small = _levels_jit(modulus)(key, values, sigma, scale)
    size = 2 * NUM_BINS - 2
    client_noise = jax.jit(
        lambda i: discrete_gaussian(jax.random.fold_in(key, i), sigma, (size,))
    )
    noise_sum = np.sum(
        [np.asarray(client_noise(i), np.int64) for i in range(NUM_CLIENTS)], axis=0
    )
    exact = exact_levels_jit(values, NUM_BINS, UPPER)
    true = np.concatenate([np.asarray(level, np.int64) for level in exact])
    # Up to the float32 division by c (XLA may multiply by 1/c instead).
    expected = _signed(scale * true + noise_sum, modulus) / scale
    np.testing.assert_allclose(np.concatenate(small), expected, rtol=3e-7)
    large = _levels_jit(2**32)(key, values, sigma, scale)
    for a, b in zip(small, large, strict=True):
        np.testing.assert_array_equal(a, b)
    assert np.any(noise_sum != 0)  # the noise really is there


def test_secure_sum_residues_with_a_large_odd_modulus():
    values = _values(2)
    key, modulus = jax.random.key(3), 1_000_003
    residues = jax.jit(
        lambda k: secure_sum_of_noisy_histograms(
            k,
            values,
            num_bins=NUM_BINS,
            upper=UPPER,
            sigma=0.0,
            scale=5,
            modulus=modulus,
        )
    )(key)
    exact = exact_levels_jit(values, NUM_BINS, UPPER)
    true = np.concatenate([np.asarray(level, np.int64) for level in exact])
    np.testing.assert_array_equal(np.asarray(residues, np.int64), (5 * true) % modulus)


def test_wraparound_at_bit_width_10():
    # c h reaches 8 * 128 = 1024 > M / 2 = 512 on the top-level nodes: the
    # server decodes them as wrong, negative counts (004 Figure 5, 10 bits).
    values = _values(4)
    scale, modulus = 8, 2**10
    exact_levels = [
        np.asarray(level) for level in exact_levels_jit(values, NUM_BINS, UPPER)
    ]
    decoded = _levels_jit(modulus)(jax.random.key(0), values, 0.0, scale)
    for noisy, true in zip(decoded, exact_levels, strict=True):
        np.testing.assert_array_equal(
            noisy, _signed(scale * true.astype(np.int64), modulus) / scale
        )
    assert np.any(np.asarray(decoded[-1]) < 0)  # the halves wrapped
    # The quantile suffers: large errors for some theta; none with 32 bits.
    exact = _quantiles_of(exact_levels)
    wrapped = _quantiles_of(decoded)
    assert np.max(np.abs(np.asarray(wrapped) - np.asarray(exact))) >= UPPER / 4
    np.testing.assert_array_equal(
        _dp_quantiles(jax.random.key(0), values, 0.0, scale, ALL_CLIENTS), exact
    )


def test_noisy_quantile_error_is_of_the_predicted_size():
    # Error of eq. 19 at sigma/c = 1 over 8 keys: each H_hat(j) has noise of
    # std <= sqrt(n log2 b) sigma / c = 32, i.e. 0.125 of n, so the mean error
    # over theta is well below 0.125 and clearly above the noiseless one.
    values = _values(6)
    exact_levels = exact_levels_jit(values, NUM_BINS, UPPER)
    cdf = np.cumsum(np.asarray(exact_levels[0])) / NUM_CLIENTS
    errors = []
    for seed in range(8):
        estimates = np.asarray(
            _dp_quantiles(jax.random.key(100 + seed), values, 2.0, 2, ALL_CLIENTS)
        )
        j_star = np.rint(estimates * NUM_BINS / UPPER).astype(int)
        errors.append(np.abs(cdf[j_star - 1] - (1 - THETAS)))
    mean_error = float(np.mean(errors))
    assert 0.02 < mean_error < 0.1, mean_error


def test_vmap_over_theta_reuses_one_noisy_histogram_and_client_mask():
    values = _values(7)
    key = jax.random.key(1)
    batched = _dp_quantiles(key, values, 1.5, 2, ALL_CLIENTS)
    levels = _levels_jit(2**32)(key, values, 1.5, 2)
    np.testing.assert_array_equal(batched, _quantiles_of(levels))
    # Masked clients take no part: without noise, the quantile of the others.
    mask = np.arange(NUM_CLIENTS) % 3 != 0
    got = _dp_quantiles(key, values, 0.0, 1, mask)
    subset = exact_levels_jit(values[mask], NUM_BINS, UPPER)
    expected = exact_quantiles_jit(subset, THETAS, int(mask.sum()), UPPER)
    np.testing.assert_array_equal(got, expected)


# ---------------------------------------------------------------------------
# Theorem 6


def psi_loop(n, sigma):
    return 10 * sum(math.exp(-2 * math.pi**2 * sigma**2 * i / (i + 1)) for i in range(1, n))


def zcdp_epsilon_from_proposition14(b, n, sigma, c):
    """sqrt(2 rho) for the smallest rho with D_alpha <= rho alpha at every order.

    KLS21 Proposition 14's three Renyi bounds with d = 2b nodes, Delta2 = c
    log2(b) (004's value) and Delta1 = 2 c log2(b) (replacement), each turned
    into a zCDP rho numerically: the sup over a grid of orders of bound /
    alpha (no closed form used).
    """
    tau, d = psi_loop(n, sigma), 2 * b
    delta2, delta1 = c * math.log2(b), 2 * c * math.log2(b)
    root = math.sqrt(n) * sigma
    alphas = np.concatenate([[1.0], np.geomspace(1.0001, 1e6, 2000)])
    bounds = [
        alphas / 2 * delta2**2 / root**2 + tau * d,
        alphas / 2 * (delta2**2 / root**2 + 2 * delta1 * tau / root + tau**2 * d),
        alphas / 2 * (delta2 / root + tau * math.sqrt(d)) ** 2,
    ]
    return math.sqrt(2 * min(float(np.max(bound / alphas)) for bound in bounds))


def theorem6_as_printed(b, n, sigma, c):
    """004 Theorem 6(a) as printed: its first branch holds only from order 4."""
    psi, signal = psi_loop(n, sigma), c * math.log2(b) / (math.sqrt(n) * sigma)
    return min(math.sqrt(signal**2 + psi * b), signal + psi * math.sqrt(2 * b))


@pytest.mark.parametrize(
    "b,n,sigma,c",
    [
        (64, 256, 1.0, 3.0),
        (16, 100, 0.5, 1.0),
        (64, 256, 0.7, 2.0),
        (2, 1, 2.0, 1.0),
        (1024, 10_000, 1.2, 40.0),
        (32, 100, 0.6, 1.0),
        (32, 100, 0.6, 10.0),
    ],
)
def test_epsilon_is_proposition14_at_every_order(b, n, sigma, c):
    got = dp_quantile_epsilon(b, n, sigma, c)
    np.testing.assert_allclose(got, zcdp_epsilon_from_proposition14(b, n, sigma, c), rtol=1e-9)
    # Where psi is negligible (sigma >= 1.2 here) it is the printed Theorem 6(a).
    if sigma >= 1.2:
        np.testing.assert_allclose(got, theorem6_as_printed(b, n, sigma, c), rtol=1e-3)
    psi = psi_loop(n, sigma)
    # The theorem states psi <= 10 (n - 1) exp(-2 pi^2 sigma^2), but each term
    # exp(-2 pi^2 sigma^2 i / (i + 1)) is at least exp(-2 pi^2 sigma^2): the
    # inequality is reversed. Since i / (i + 1) >= 1/2 the bound that holds is
    # 10 (n - 1) exp(-pi^2 sigma^2). (Documented in docs/primitives.md.)
    assert psi >= 10 * (n - 1) * math.exp(-2 * math.pi**2 * sigma**2)
    assert psi <= 10 * (n - 1) * math.exp(-(math.pi**2) * sigma**2)


def test_epsilon_at_small_sigma_exceeds_the_printed_theorem():
    # Issue 13's example: b = 32, n = 100, c = 1, sigma = 0.6. Printed: 6.86;
    # valid at every order: 11.84 (branch B: s^2 + 4 psi s + 2 psi^2 b with
    # s = 5/6, psi = 1.4503: 0.694 + 4.834 + 134.6 = 140.2).
    assert theorem6_as_printed(32, 100, 0.6, 1) == pytest.approx(6.863, abs=1e-3)
    assert dp_quantile_epsilon(32, 100, 0.6, 1) == pytest.approx(11.8385, abs=1e-4)
    # From sigma = 2 psi is below 1e-20 at n = 100: both are s.
    assert dp_quantile_epsilon(32, 100, 2.0, 1) == pytest.approx(5 / 20, rel=1e-12)


def test_epsilon_is_monotone_and_inverses_round_trip():
    b, n = 64, 256
    sigmas = np.linspace(0.5, 5, 40)
    eps = [dp_quantile_epsilon(b, n, s, 3.0) for s in sigmas]
    assert np.all(np.diff(eps) < 0)
    scales = np.linspace(0.5, 20, 40)
    eps = [dp_quantile_epsilon(b, n, 1.0, c) for c in scales]
    assert np.all(np.diff(eps) > 0)
    for target in (0.2, 1.0, 2.5):
        sigma = dp_quantile_sigma(target, b, n, 3.0)
        achieved = dp_quantile_epsilon(b, n, sigma, 3.0)
        assert achieved <= target
        np.testing.assert_allclose(achieved, target, rtol=1e-9)
        scale = dp_quantile_scale(target, b, n, 1.5)
        np.testing.assert_allclose(
            dp_quantile_epsilon(b, n, 1.5, scale), target, rtol=1e-9
        )
    # Where psi matters (small sigma) the inverse still solves the min.
    sigma = dp_quantile_sigma(8.0, b, n, 3.0)
    np.testing.assert_allclose(dp_quantile_epsilon(b, n, sigma, 3.0), 8.0, rtol=1e-9)


def test_accounting_errors():
    with pytest.raises(ValueError, match="sigma >= 1/2"):
        dp_quantile_epsilon(64, 256, 0.4, 1.0)
    with pytest.raises(ValueError, match="increase the scale"):
        dp_quantile_sigma(100.0, 64, 256, 1.0)
    with pytest.raises(ValueError, match="not reachable"):
        dp_quantile_scale(1e-3, 64, 256, 0.5)
    with pytest.raises(ValueError, match="delta"):
        dp_quantile_modulus(64, 256, 1.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="num_clients"):
        dp_quantile_epsilon(64, 0, 1.0, 1.0)


def test_modulus_formula():
    b, n, sigma, c, delta = 64, 256, 1.0, 3, 1e-5
    bound = (
        2 + 2 * c * n + 2 * n * math.sqrt(2 * sigma**2 * math.log(16 * n * b / delta))
    )
    assert dp_quantile_modulus(b, n, sigma, c, delta) == math.ceil(bound)
    assert dp_quantile_modulus(b, n, 0.0, c, delta) == 2 + 2 * c * n
