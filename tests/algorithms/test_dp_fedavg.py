"""DP-FedAvg: against a NumPy per-client loop with clipping, noise off and
C = inf is FedAvg with uniform weights, the noise added has the calibrated
scale (a KS test), fresh noise every round, and one trace."""

import functools

import jax
import numpy as np
from algorithms.reference_rounds import (
    LOCAL,
    SIZES,
    TASK,
    assert_params_close,
    initial_params,
    reference_rounds,
    run_rounds,
)
from scipy import stats

from jaxfl.algorithms import fedavg
from jaxfl.algorithms.dp_fedavg import dp_fedavg
from jaxfl.training import ClientStrategy

M = 5
LR = 0.2
KEY = jax.random.key(11)


@functools.cache
def build():
    """One compiled round for every test of this module."""
    return dp_fedavg(TASK, LOCAL, M, strategy=ClientStrategy("vmap"))


def run(hparams, num_rounds=3, key=KEY):
    algorithm = build()
    state = algorithm.init(initial_params(), {"lr": LR, **hparams})
    return run_rounds(algorithm, state, num_rounds, key)


def _flat(params):
    return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree.leaves(params)])


def test_clipped_rounds_equal_a_numpy_loop_over_clients():
    clip_norm = 0.05  # Below most update norms: clipping is active.

    def aggregate(ids, alpha, losses, deltas, decision, memory):
        del ids, alpha, losses, decision, memory  # Unused.
        norms = np.array([np.sqrt(np.sum(k**2) + np.sum(b**2)) for k, b in deltas])
        memory_norms.append(norms)
        return np.minimum(1.0, clip_norm / norms) / M  # sum of clipped / m

    memory_norms = []
    state, history = run(
        {"clip_norm": clip_norm, "dp_noise_multiplier": 0.0}, num_rounds=3
    )
    kernel, bias, _ = reference_rounds(
        initial_params(), KEY, 3, clients_per_round=M, lr=LR, aggregate=aggregate
    )
    assert_params_close(state.params, kernel, bias)
    norms = np.concatenate(memory_norms)
    assert np.mean(norms > clip_norm) > 0.5  # The test exercises clipping.
    clipped = [h["clipped_fraction"] for h in history]
    expected = [np.mean(n > clip_norm) for n in memory_norms]
    np.testing.assert_allclose(clipped, expected)


def test_without_noise_and_clipping_it_is_fedavg_with_uniform_weights():
    state, history = run({"clip_norm": np.inf, "dp_noise_multiplier": 0.0})
    plain = fedavg(
        TASK, LOCAL, M, strategy=ClientStrategy("vmap"), client_weighting="uniform"
    )
    reference, _ = run_rounds(plain, plain.init(initial_params(), {"lr": LR}), 3, KEY)
    for a, b in zip(
        jax.tree.leaves(state.params), jax.tree.leaves(reference.params), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert all(h["clipped_fraction"] == 0 for h in history)


def test_noise_has_the_calibrated_scale():
    # lr = 0: every client's update is zero, so w_{t+1} - w_t is the noise of
    # the sum divided by m; it must be N(0, (z 2C)^2 / m^2) per coordinate.
    z, clip_norm, rounds = 1.7, 0.3, 25
    algorithm = build()
    state = algorithm.init(
        initial_params(), {"lr": 0.0, "clip_norm": clip_norm, "dp_noise_multiplier": z}
    )
    previous = _flat(state.params)
    standardized = []
    for _ in range(rounds):
        state, _ = run_rounds(algorithm, state, 1, KEY)
        current = _flat(state.params)
        standardized.append((current - previous) * M / (z * 2 * clip_norm))
        previous = current
    samples = np.concatenate(standardized)  # 18 coordinates x 25 rounds.
    assert stats.kstest(samples, "norm").pvalue > 1e-3
    # The test has power: the add/remove scale z C (half) is rejected.
    assert stats.kstest(samples * 2, "norm").pvalue < 1e-6
    # Fresh keys: no two rounds (or leaves) repeat the noise.
    assert len({tuple(np.round(s, 6)) for s in standardized}) == rounds
    assert abs(np.corrcoef(standardized[0], standardized[1])[0, 1]) < 0.8


def test_uncalibrated_noise_is_nan_not_silent():
    algorithm = build()
    assert np.isnan(algorithm.hparam_defaults["dp_noise_multiplier"])
    state, _ = run({"clip_norm": 1.0}, num_rounds=1)
    assert np.all(np.isnan(_flat(state.params)))


def test_every_sampled_client_counts_once():
    _, history = run({"clip_norm": 1.0, "dp_noise_multiplier": 0.0}, num_rounds=1)
    assert history[0]["clients_with_weight"] == M < len(SIZES)
