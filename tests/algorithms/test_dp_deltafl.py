"""DP Delta-FL (004 Algorithm 4): with the noise off it is Delta-FL with the
histogram quantile; against a NumPy per-client loop with clipping; the update
noise has the calibrated scale over m_t (a KS test); the quantile noise is
applied; an uncalibrated quantile never passes for a noiseless one."""

import functools

import jax
import numpy as np
import pytest
from algorithms.reference_rounds import (
    LOCAL,
    TASK,
    assert_params_close,
    initial_params,
    reference_rounds,
    run_rounds,
)
from reference import slow_after
from scipy import stats

from jaxfl.algorithms import deltafl
from jaxfl.algorithms.dp_deltafl import dp_deltafl
from jaxfl.training import ClientStrategy

M = 5
LR = 0.2
KEY = jax.random.key(5)
BINS, SCALE = 16, 10
BOUND = 3.0
NOISE_OFF = {
    "dp_noise_multiplier": 0.0,
    "dp_quantile_sigma": 0.0,
    "dp_loss_bound": BOUND,
}


@functools.cache
def build(count="exact"):
    """One compiled round per count for every test of this module."""
    return dp_deltafl(
        TASK, LOCAL, M, strategy=ClientStrategy("vmap"), dp_bins=BINS, dp_scale=SCALE, count=count
    )


def run(hparams, num_rounds=3, key=KEY, count="exact"):
    algorithm = build(count)
    state = algorithm.init(initial_params(), {"lr": LR, **hparams})
    return run_rounds(algorithm, state, num_rounds, key)


def _flat(params):
    return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree.leaves(params)])


def np_histogram_quantile(losses, theta):
    """004 eq. 8 without noise: right edge of the bin j* (first on ties)."""
    index = np.clip(np.floor(np.clip(losses, 0, BOUND) * BINS / BOUND), 0, BINS - 1)
    cdf = np.cumsum(np.bincount(index.astype(int), minlength=BINS))
    return (np.argmin(np.abs(cdf - (1 - theta) * len(losses))) + 1) * BOUND / BINS


@functools.cache
def build_deltafl():
    """Delta-FL with the DP quantile's reweighting, uniform client weights."""
    return deltafl(
        TASK,
        LOCAL,
        M,
        strategy=ClientStrategy("vmap"),
        client_weighting="uniform",
        reweighting="dp",
        dp_bins=BINS,
    )


@pytest.mark.parametrize("theta", slow_after([0.5, 0.25]))
def test_without_noise_it_is_deltafl_with_the_histogram_quantile(theta):
    state, history = run({**NOISE_OFF, "theta": theta, "clip_norm": np.inf})
    plain = build_deltafl()
    hparams = dict(
        lr=LR, theta=theta, dp_loss_bound=BOUND, dp_sigma=0.0, dp_scale=SCALE
    )
    reference, plain_history = run_rounds(
        plain, plain.init(initial_params(), hparams), 3, KEY
    )
    for a, b in zip(
        jax.tree.leaves(state.params), jax.tree.leaves(reference.params), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for ours, theirs in zip(history, plain_history, strict=True):
        assert ours["threshold"] == theirs["threshold"]
        assert ours["clients_with_weight"] == theirs["clients_with_weight"]


@pytest.mark.parametrize("count", slow_after(["fixed", "exact"]))
def test_clipped_rounds_equal_a_numpy_loop_over_clients(count):
    # exact: s_t / m_t (004 App. D); fixed: s_t / (theta m), the sound default.
    theta, clip_norm = 0.5, 0.05

    def plan(r, ids, alpha, losses, key, memory):
        del r, ids, alpha, key, memory  # Unused (no noise).
        passes = losses >= np_histogram_quantile(losses, theta)
        return dict(active=passes, weights=passes.astype(float))

    def aggregate(ids, alpha, losses, deltas, decision, memory):
        del ids, alpha, losses, memory  # Unused.
        norms = np.array([np.sqrt(np.sum(k**2) + np.sum(b**2)) for k, b in deltas])
        passes = decision["active"]
        scale = np.where(
            passes, np.minimum(1.0, clip_norm / np.maximum(norms, 1e-30)), 0
        )
        return scale / (max(passes.sum(), 1) if count == "exact" else theta * M)

    state, history = run({**NOISE_OFF, "theta": theta, "clip_norm": clip_norm}, count=count)
    kernel, bias, reference = reference_rounds(
        initial_params(),
        KEY,
        3,
        clients_per_round=M,
        lr=LR,
        weighting="uniform",
        plan=plan,
        aggregate=aggregate,
    )
    assert_params_close(state.params, kernel, bias)
    for ours, theirs in zip(history, reference, strict=True):
        assert ours["clients_with_weight"] == theirs["active"].sum()
        np.testing.assert_allclose(
            ours["threshold"], np_histogram_quantile(theirs["losses"], theta), rtol=1e-6
        )
    assert any(h["clipped_fraction"] > 0 for h in history)


def test_update_noise_has_the_calibrated_scale_over_the_selected_count():
    # lr = 0: zero updates; w_{t+1} - w_t = xi / m_t, xi ~ N(0, (z 2C)^2 I).
    z, clip_norm, rounds = 0.8, 0.5, 25
    algorithm = build()
    state = algorithm.init(
        initial_params(),
        {
            "lr": 0.0,
            "theta": 0.5,
            "clip_norm": clip_norm,
            "dp_noise_multiplier": z,
            "dp_quantile_sigma": 0.6,
            "dp_loss_bound": BOUND,
        },
    )
    previous, standardized = _flat(state.params), []
    for _ in range(rounds):
        state, (metrics,) = run_rounds(algorithm, state, 1, KEY)
        current = _flat(state.params)
        selected = metrics["clients_with_weight"]
        if selected > 0:
            standardized.append((current - previous) * selected / (z * 2 * clip_norm))
        previous = current
    samples = np.concatenate(standardized)
    assert len(standardized) >= rounds // 2
    assert stats.kstest(samples, "norm").pvalue > 1e-3
    assert stats.kstest(samples * 2, "norm").pvalue < 1e-6  # The test has power.


def test_with_the_fixed_count_every_round_releases_noise_over_theta_m():
    # lr = 0: w_{t+1} - w_t = xi / (theta m) in every round, nobody passing or not.
    z, clip_norm, theta, rounds = 0.8, 0.5, 0.5, 25
    algorithm = build("fixed")
    state = algorithm.init(
        initial_params(),
        {"lr": 0.0, "theta": theta, "clip_norm": clip_norm, "dp_noise_multiplier": z,
         "dp_quantile_sigma": 0.6, "dp_loss_bound": BOUND},
    )
    previous, standardized = _flat(state.params), []
    for _ in range(rounds):
        state, _ = run_rounds(algorithm, state, 1, KEY)
        current = _flat(state.params)
        standardized.append((current - previous) * theta * M / (z * 2 * clip_norm))
        previous = current
    samples = np.concatenate(standardized)
    assert stats.kstest(samples, "norm").pvalue > 1e-3
    assert stats.kstest(samples * 2, "norm").pvalue < 1e-6


def test_with_the_fixed_count_nobody_passing_moves_nothing_without_noise():
    _, history = run(
        {"theta": 0.5, "clip_norm": 1.0, "dp_noise_multiplier": 0.0}, num_rounds=1, count="fixed"
    )
    assert history[0]["clients_with_weight"] == 0 and np.isfinite(history[0]["update_norm"])
    assert history[0]["update_norm"] == 0.0


def test_quantile_noise_is_applied_and_keyed_per_round():
    hparams = {"theta": 0.5, "clip_norm": 1.0, "dp_noise_multiplier": 0.0}
    _, quiet = run({**NOISE_OFF, **hparams}, num_rounds=3)
    _, noisy = run({**NOISE_OFF, **hparams, "dp_quantile_sigma": 30.0}, num_rounds=3)
    thresholds = [h["threshold"] for h in noisy]
    assert thresholds != [h["threshold"] for h in quiet]
    assert all(0 < t <= BOUND for t in thresholds)


def test_an_uncalibrated_quantile_selects_nobody():
    _, history = run(
        {"theta": 0.5, "clip_norm": 1.0, "dp_noise_multiplier": 0.0}, num_rounds=1
    )
    assert np.isnan(history[0]["threshold"])
    assert history[0]["clients_with_weight"] == 0


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(dp_bins=48), "power of two"),
        (dict(dp_bits=40), "dp_bits"),
        (dict(dp_scale=0), "dp_scale"),
        (dict(count="noisy"), "count"),
    ],
)
def test_invalid_static_options_raise(options, message):
    with pytest.raises(ValueError, match=message):
        dp_deltafl(TASK, LOCAL, M, strategy=ClientStrategy("vmap"), **options)
