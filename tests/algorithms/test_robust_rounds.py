"""Attacks and aggregators inside the round template, against NumPy rounds.

The reference trains each sampled client in NumPy (the engine's cohort and
example orders), forges the corrupted clients' updates and combines the
updates with a NumPy aggregator, one round after another.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from algorithms.reference_rounds import (
    LOCAL,
    POPULATION,
    SIZES,
    TASK,
    _epoch_orders,
    _sample_cohort,
    assert_params_close,
    initial_params,
    run_rounds,
)
from reference import local_sgd_reference

from jaxfl.aggregators import aggregator
from jaxfl.algorithms import deltafl, fedavg, qffl
from jaxfl.algorithms.ditto import ditto
from jaxfl.algorithms.stages import Robustness
from jaxfl.training import ClientStrategy
from jaxfl.training.cohort import round_keys

M = 5
LR = 0.1
KEY = jax.random.key(11)
N = len(SIZES)
# Clients 1 and 4 are corrupted.
ATTACKED = np.zeros(N, bool)
ATTACKED[[1, 4]] = True
LAYOUT = ClientStrategy("vmap")


@functools.cache
def build(aggregator_name="mean", attack=None, scale=None, personal=False):
    robustness = Robustness(
        aggregator=aggregator(aggregator_name),
        attack=attack,
        attack_options={"scale": scale} if attack else None,
        attacked=ATTACKED if attack else None,
    )
    inner = fedavg(TASK, LOCAL, M, strategy=LAYOUT, robustness=robustness)
    return ditto(inner, LOCAL, N) if personal else inner


def numpy_rounds(num_rounds, combine, forge=None):
    """Global (kernel, bias) after rounds with `combine(deltas [M, P], alpha) -> [P]`."""
    w0 = initial_params()
    kernel = np.array(w0["dense"]["kernel"], np.float64)
    bias = np.array(w0["dense"]["bias"], np.float64)
    counts = np.asarray(POPULATION.counts)
    for r in range(num_rounds):
        keys = round_keys(KEY, jnp.int32(r))
        ids = np.asarray(_sample_cohort(keys.sampling, POPULATION, M))
        flat = []
        for i in ids:
            data = POPULATION.client(int(i))
            orders = _epoch_orders(
                jax.random.fold_in(keys.clients, int(i)), POPULATION.counts[i], POPULATION.max_count,
                LOCAL.num_epochs,
            )
            k, b, _ = local_sgd_reference(
                kernel, bias, data["x"], data["y"], np.asarray(orders),
                batch_size=LOCAL.batch_size, num_epochs=LOCAL.num_epochs, lr=LR,
            )
            delta = np.concatenate([(k - kernel).ravel(), (b - bias).ravel()])
            flat.append(forge(delta) if forge is not None and ATTACKED[i] else delta)
        update = combine(np.stack(flat), counts[ids].astype(np.float64))
        kernel = kernel + update[: kernel.size].reshape(kernel.shape)
        bias = bias + update[kernel.size :]
    return kernel, bias


def weighted_mean(deltas, alpha):
    return alpha @ deltas / alpha.sum()


def test_model_replacement_scales_the_corrupted_updates():
    algorithm = build(attack="model-replacement", scale=3.0)
    state, _ = run_rounds(algorithm, algorithm.init(initial_params(), {"lr": LR}), 3, KEY)
    kernel, bias = numpy_rounds(3, weighted_mean, forge=lambda d: 3.0 * d)
    assert_params_close(state.params, kernel, bias)


def test_sign_flip_with_the_coordinatewise_median():
    algorithm = build("median", attack="sign-flip", scale=1.0)
    state, metrics = run_rounds(algorithm, algorithm.init(initial_params(), {"lr": LR}), 3, KEY)
    # The clients' sizes differ: the alpha-weighted median (midpoint rule).
    ref_kernel, ref_bias = numpy_rounds(3, weighted_median, forge=lambda d: -d)
    assert_params_close(state.params, ref_kernel, ref_bias)
    assert all(m["aggregated_clients"] == M for m in metrics)


def weighted_median(deltas, alpha):
    out = np.empty(deltas.shape[1])
    for j in range(deltas.shape[1]):
        order = np.argsort(deltas[:, j], kind="stable")
        values, weights = deltas[order, j], alpha[order]
        cumulative, half = np.cumsum(weights), weights.sum() / 2
        lower = values[np.argmax(cumulative >= half)]
        upper = values[np.argmax(cumulative > half)]
        out[j] = (lower + upper) / 2
    return out


def test_geometric_median_round_and_ditto_with_attack_trace_once():
    algorithm = build("geometric-median", attack="model-replacement", scale=10.0, personal=True)
    state = algorithm.init(initial_params(), {"lr": LR, "lam": 1.0})
    state, metrics = run_rounds(algorithm, state, 3, KEY)  # Checks: traced once.
    assert all(m["geometric_median_iterations"] >= 1 for m in metrics)
    assert np.all(np.isfinite(state.clients["dense"]["kernel"]))


def test_mean_aggregator_is_the_template_bit_for_bit():
    plain = fedavg(TASK, LOCAL, M, strategy=LAYOUT)
    with_mean = build("mean")
    a, _ = run_rounds(plain, plain.init(initial_params(), {"lr": LR}), 2, KEY)
    b, _ = run_rounds(with_mean, with_mean.init(initial_params(), {"lr": LR}), 2, KEY)
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_array_equal(x, y)


def test_deltafl_weights_reach_the_aggregator():
    # Delta-FL's plan weights (only the tail trains) are the aggregator's weights.
    robust = deltafl(TASK, LOCAL, M, strategy=LAYOUT, robustness=Robustness(aggregator=aggregator("median")))
    state, metrics = run_rounds(robust, robust.init(initial_params(), {"lr": LR, "theta": 0.4}), 2, KEY)
    for m in metrics:
        assert m["aggregated_clients"] == m["clients_with_weight"] < M


def test_algorithms_with_their_own_update_refuse_a_robust_aggregator():
    with pytest.raises(ValueError, match="computes its own server update"):
        qffl(TASK, LOCAL, M, strategy=LAYOUT, robustness=Robustness(aggregator=aggregator("krum")))
    with pytest.raises(ValueError, match="corrupted clients"):
        fedavg(TASK, LOCAL, M, strategy=LAYOUT, robustness=Robustness(attack="sign-flip"))
