"""Delta-FL: every reweighting against a NumPy per-client loop, theta = 1 is
FedAvg, Algorithms 1 and 3 coincide (004 Proposition 3(c)), client
self-filtering equals server filtering, the threshold period T_eta, and the
number of clients with nonzero weight."""

import functools
import math

import jax
import numpy as np
import pytest
from algorithms.reference_rounds import (
    LOCAL,
    SIZES,
    TASK,
    assert_params_close,
    fedavg_reference,
    initial_params,
    normalized,
    reference_rounds,
    run_rounds,
)

from jaxfl.algorithms import deltafl
from jaxfl.algorithms.deltafl import filter_threshold
from jaxfl.training import ClientStrategy

M = 5
LR = 0.2
KEY = jax.random.key(7)
DP = dict(dp_loss_bound=3.0, dp_sigma=0.0, dp_scale=10.0)
DP_BINS = 16


@functools.cache
def build(
    reweighting,
    filtering="server",
    weighting="num_examples",
    clients=M,
    strategy="vmap",
):
    """One compiled round per static setting, shared by the tests."""
    kind = (
        ClientStrategy("sharded", inner="sequential")
        if strategy == "sharded"
        else (ClientStrategy(strategy))
    )
    return deltafl(
        TASK,
        LOCAL,
        clients,
        strategy=kind,
        client_weighting=weighting,
        reweighting=reweighting,
        filtering=filtering,
        dp_bins=DP_BINS,
    )


def run(algorithm, hparams, num_rounds=3, key=KEY, strategy=None):
    state = algorithm.init(initial_params(), {"lr": LR, **hparams})
    return run_rounds(algorithm, state, num_rounds, key, strategy=strategy)


# --- NumPy references of the reweightings (independent of the primitives) ---


def np_filter_threshold(losses, theta, alpha):
    """Largest loss whose clients at or above it carry >= theta of alpha."""
    order = np.argsort(-losses)
    mass = np.cumsum(alpha[order])
    first = np.argmax(mass >= theta * alpha.sum() * (1 - 1e-6))
    return losses[order][first]


def np_exact_weights(losses, theta, alpha):
    """Greedy maximizer of sum pi F over pi_i <= alpha_i / (theta W)."""
    pi, left = np.zeros_like(losses), 1.0
    for i in np.argsort(-losses):
        pi[i] = min(alpha[i] / (theta * alpha.sum()), left)
        left -= pi[i]
    return pi


def np_smoothed_weights(losses, theta, nu, alpha):
    """pi_i = min(wbar_i / theta, wbar_i exp((F_i - lam) / nu)), sum = 1."""
    wbar = alpha / alpha.sum()

    def pi(lam):
        return np.minimum(wbar / theta, wbar * np.exp((losses - lam) / nu))

    low, high = losses.min() - 50 * nu, losses.max() + 50 * nu
    for _ in range(200):  # Bisection: sum(pi) decreases in lam.
        mid = (low + high) / 2
        low, high = (mid, high) if pi(mid).sum() > 1 else (low, mid)
    return pi((low + high) / 2)


def np_dp_threshold(losses, theta, bound, bins):
    """Histogram quantile of 004 eq. 8 without noise: right edge of bin j*."""
    index = np.clip(np.floor(np.clip(losses, 0, bound) * bins / bound), 0, bins - 1)
    counts = np.bincount(index.astype(int), minlength=bins)
    cdf = np.cumsum(counts)  # H(j), j = 1..b
    j_star = np.argmin(np.abs(cdf - (1 - theta) * len(losses)))
    return (j_star + 1) * bound / bins


def deltafl_plan(reweighting, theta, *, period=1, nu=0.1):
    def plan(r, ids, alpha, losses, key, memory):
        del ids, key  # Unused (no noise in these references).
        if reweighting == "exact":
            weights = np_exact_weights(losses, theta, alpha)
            return dict(weights=weights, active=weights > 0)
        if reweighting == "smoothed":
            weights = np_smoothed_weights(losses, theta, nu, alpha)
            return dict(weights=weights, active=weights > 0)
        if r % period == 0:
            memory["threshold"] = (
                np_filter_threshold(losses, theta, alpha)
                if reweighting == "threshold"
                else np_dp_threshold(losses, theta, DP["dp_loss_bound"], DP_BINS)
            )
        passes = losses >= memory["threshold"]
        return dict(
            weights=np.where(passes, alpha, 0.0),
            active=passes,
            threshold=memory["threshold"],
        )

    return plan


def expected_local_steps(ids, active):
    steps = [math.ceil(SIZES[i] / LOCAL.batch_size) * LOCAL.num_epochs for i in ids]
    return np.mean(np.where(active, steps, 0))


def check_against_reference(reweighting, hparams, num_rounds=4):
    """Runs Delta-FL and the NumPy loop from the same start; compares models
    and per-round metrics. Returns the metrics."""
    theta = hparams["theta"]
    state, metrics = run(build(reweighting), hparams, num_rounds)
    kernel, bias, history = reference_rounds(
        initial_params(),
        KEY,
        num_rounds,
        clients_per_round=M,
        lr=LR,
        plan=deltafl_plan(
            reweighting,
            theta,
            period=hparams.get("threshold_period", 1),
            nu=hparams.get("smoothing", 0.1),
        ),
    )
    assert_params_close(state.params, kernel, bias)
    for got, want in zip(metrics, history, strict=True):
        assert got["clients_with_weight"] == np.sum(want["coefficients"] > 0)
        # Clients without weight do not train.
        np.testing.assert_allclose(
            got["local_steps"], expected_local_steps(want["ids"], want["active"])
        )
        if "threshold" in want:
            np.testing.assert_allclose(got["threshold"], want["threshold"], rtol=1e-5)
    return metrics


def check_theta_one_is_fedavg(reweighting, hparams):
    # The NumPy FedAvg loop, which tests/algorithms/test_fedavg.py checks
    # against the compiled FedAvg.
    state, metrics = run(build(reweighting), dict(hparams, theta=1.0), 3)
    assert all(m["clients_with_weight"] == M for m in metrics)
    kernel, bias = fedavg_reference(
        initial_params(), KEY, 3, clients_per_round=M, lr=LR
    )
    assert_params_close(state.params, kernel, bias)


# Each test below uses its own compiled rounds (tests sharing one would each
# compile it on a different pytest-xdist worker).


def test_threshold_reweighting_its_period_and_self_filtering():
    # Algorithm 1 with T_eta = 2 against the NumPy loop.
    metrics = check_against_reference("threshold", dict(theta=0.5, threshold_period=2))
    assert [bool(m["threshold_recomputed"]) for m in metrics] == [True, False] * 2
    # theta = 1 is FedAvg (with T_eta = 1: a stored threshold can filter
    # clients of a later cohort even at theta = 1).
    check_theta_one_is_fedavg("threshold", dict(threshold_period=1))

    # T_eta = 3 reuses the threshold of rounds 0 and 3.
    _, metrics = run(build("threshold"), dict(theta=0.5, threshold_period=3), 5)
    thresholds = [float(m["threshold"]) for m in metrics]
    assert [bool(m["threshold_recomputed"]) for m in metrics] == [
        True,
        False,
        False,
        True,
        False,
    ]
    assert thresholds[0] == thresholds[1] == thresholds[2]
    assert thresholds[3] == thresholds[4] != thresholds[0]
    # A fresh threshold each round would have differed (the model moved).
    _, fresh = run(build("threshold"), dict(theta=0.5, threshold_period=1), 2)
    assert float(fresh[1]["threshold"]) != thresholds[1]
    # Client self-filtering (000 Algorithm 3) gives exactly the same rounds.
    hparams = dict(threshold_period=2, theta=0.4)
    server, server_metrics = run(build("threshold", "server"), hparams, 4)
    client, client_metrics = run(build("threshold", "client"), hparams, 4)
    jax.tree.map(np.testing.assert_array_equal, server.params, client.params)
    np.testing.assert_array_equal(server.extra["threshold"], client.extra["threshold"])
    for a, b in zip(server_metrics, client_metrics, strict=True):
        assert a.keys() == b.keys()
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])


def test_exact_reweighting():
    # Algorithm 3 (fractional boundary client: theta m = 2.5).
    check_against_reference("exact", dict(theta=0.5))
    check_theta_one_is_fedavg("exact", {})


def test_smoothed_reweighting():
    check_against_reference("smoothed", dict(theta=0.5, smoothing=0.3))
    check_theta_one_is_fedavg("smoothed", dict(smoothing=0.3))


def test_dp_reweighting():
    # Without noise: the histogram quantile of 004 eq. 8.
    metrics = check_against_reference("dp", dict(DP, theta=0.5))
    assert all(bool(m["threshold_recomputed"]) for m in metrics)
    # With noise, the threshold is still a bin edge.
    _, metrics = run(build("dp"), dict(DP, dp_sigma=3.0, dp_scale=1.0, theta=0.3), 3)
    edges = np.arange(1, DP_BINS + 1) * DP["dp_loss_bound"] / DP_BINS
    for m in metrics:
        assert np.min(np.abs(edges - m["threshold"])) < 1e-5


def test_algorithm_1_equals_algorithm_3_when_theta_m_is_an_integer():
    # 004 Proposition 3(c): uniform weights, distinct losses, theta m = 2.
    (a, a_metrics), (b, b_metrics) = (
        run(build(reweighting, weighting="uniform"), {"theta": 0.4})
        for reweighting in ("threshold", "exact")
    )
    jax.tree.map(
        lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6),
        a.params,
        b.params,
    )
    for m1, m3 in zip(a_metrics, b_metrics, strict=True):
        assert m1["clients_with_weight"] == m3["clients_with_weight"] == 2
    # theta m = 2.5: Algorithm 3 gives the boundary client half weight and
    # Algorithm 1 full weight, so the models differ (the check above can fail).
    a, _ = run(build("threshold", weighting="uniform"), {"theta": 0.5})
    b, _ = run(build("exact", weighting="uniform"), {"theta": 0.5})
    assert not np.allclose(a.params["dense"]["kernel"], b.params["dense"]["kernel"])


def test_sharded_clients_equal_the_reference():
    # The pre-training loss pass and inactive clients on 8 devices (M = 5
    # padded to 8).
    strategy = ClientStrategy("sharded", inner="sequential")
    state, _ = run(
        build("exact", strategy="sharded"), {"theta": 0.5}, 2, strategy=strategy
    )
    kernel, bias, _ = reference_rounds(
        initial_params(),
        KEY,
        2,
        clients_per_round=M,
        lr=LR,
        plan=deltafl_plan("exact", 0.5),
    )
    assert_params_close(state.params, kernel, bias)


def test_filter_threshold_keeps_the_smallest_top_set_with_theta_of_the_mass():
    rng = np.random.default_rng(0)
    for _ in range(20):
        losses = rng.permutation(10).astype(np.float32)
        alpha = rng.integers(1, 5, size=10).astype(np.float32)
        theta = float(rng.choice([0.1, 0.25, 0.5, 0.7, 1.0]))
        got = float(filter_threshold(losses, theta, alpha))
        assert got == np_filter_threshold(losses, theta, alpha)


def test_invalid_static_options_raise():
    def make(**options):
        return deltafl(TASK, LOCAL, M, strategy=ClientStrategy("vmap"), **options)

    with pytest.raises(ValueError, match="reweighting must be one of"):
        make(reweighting="median")
    with pytest.raises(ValueError, match="filtering must be one of"):
        make(filtering="both")
    with pytest.raises(ValueError, match="needs reweighting threshold or dp"):
        make(reweighting="exact", filtering="client")
    with pytest.raises(ValueError, match="dp_bins must be a power of two"):
        make(reweighting="dp", dp_bins=48)
    with pytest.raises(ValueError, match="dp_bits"):
        make(reweighting="dp", dp_bits=40)
    # Hyperparameters an option does not use are an error, not silently kept.
    with pytest.raises(ValueError, match="unknown hyperparameters"):
        make(reweighting="exact").init(initial_params(), {"smoothing": 0.1})


def test_exact_weights_reference_is_sane():
    # The fractional boundary client of theta m = 2.5.
    pi = np_exact_weights(np.array([5.0, 4, 3, 2, 1]), 0.5, np.ones(5))
    np.testing.assert_allclose(pi, [0.4, 0.4, 0.2, 0, 0])
    assert np.isclose(normalized(pi).sum(), 1)
