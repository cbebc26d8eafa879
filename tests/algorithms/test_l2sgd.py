"""L2SGD against a NumPy per-client loop with persistent personal models.

The reference keeps w_k for every client across rounds; each round the
sampled ones run v <- v - lr (grad F_k(v) + lambda (v - w_bar)) from their
w_k on the minibatches of their local training (the engine's epoch orders
for fold_in(keys.clients, k)), and w_bar becomes the mean of all N.
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
    _sample_cohort,
    client_orders,
    initial_params,
    proximal_steps_reference,
    run_rounds,
)

from jaxfl.algorithms.l2sgd import l2sgd
from jaxfl.training import ClientStrategy
from jaxfl.training.cohort import round_keys

M = 3
LR = 0.1
KEY = jax.random.key(5)
N = len(SIZES)


@functools.cache
def build():
    return l2sgd(TASK, LOCAL, M, N, strategy=ClientStrategy("vmap"))


def l2sgd_reference(w0, key, num_rounds, lam):
    kernels = np.repeat(np.array(w0["dense"]["kernel"], np.float64)[None], N, axis=0)
    biases = np.repeat(np.array(w0["dense"]["bias"], np.float64)[None], N, axis=0)
    mean_kernel, mean_bias = kernels.mean(axis=0), biases.mean(axis=0)
    sampled = set()
    for r in range(num_rounds):
        keys = round_keys(key, jnp.int32(r))
        for i in np.asarray(_sample_cohort(keys.sampling, POPULATION, M)):
            sampled.add(int(i))
            kernels[i], biases[i] = proximal_steps_reference(
                kernels[i], biases[i], POPULATION.client(int(i)), client_orders(keys, i),
                mean_kernel, mean_bias, lam, LR,
            )
        mean_kernel, mean_bias = kernels.mean(axis=0), biases.mean(axis=0)
    return mean_kernel, mean_bias, kernels, biases, sampled


@pytest.mark.parametrize("lam", [0.0, 2.0])
def test_l2sgd_matches_numpy_loop(lam):
    algorithm = build()
    state = algorithm.init(initial_params(), {"lr": LR, "lam": lam})
    state, metrics = run_rounds(algorithm, state, 4, KEY)
    mean_kernel, mean_bias, kernels, biases, sampled = l2sgd_reference(initial_params(), KEY, 4, lam)
    np.testing.assert_allclose(state.clients["dense"]["kernel"], kernels, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state.clients["dense"]["bias"], biases, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state.params["dense"]["kernel"], mean_kernel, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state.params["dense"]["bias"], mean_bias, rtol=1e-4, atol=1e-5)
    # Clients never sampled keep the start; some were sampled, some not.
    assert 0 < len(sampled) < N
    start = initial_params()["dense"]["kernel"]
    for i in set(range(N)) - sampled:
        np.testing.assert_array_equal(state.clients["dense"]["kernel"][i], start)
    assert all(np.isfinite(m["train_loss"]) for m in metrics)
    assert int(state.round) == 4


def test_l2sgd_refuses_robust_aggregators_and_update_attacks():
    from jaxfl.aggregators import median
    from jaxfl.algorithms.base import server_optimizer
    from jaxfl.algorithms.registry import Engine, build_algorithm
    from jaxfl.algorithms.stages import Robustness

    engine = Engine(TASK, LOCAL, M, ClientStrategy("vmap"), server_optimizer("sgd"), "num_examples",
                    num_clients=N, robustness=Robustness(aggregator=median()))
    with pytest.raises(ValueError, match="l2sgd sends no updates"):
        build_algorithm("l2sgd", engine, {})
