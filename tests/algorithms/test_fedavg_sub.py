"""FedAvg-Sub: a random round(theta m) of the m sampled clients train and are
averaged, against a NumPy per-client loop; theta = 1 is FedAvg."""

import functools

import jax
import numpy as np
from algorithms.reference_rounds import (
    LOCAL,
    TASK,
    assert_params_close,
    fedavg_reference,
    initial_params,
    reference_rounds,
    run_rounds,
)

from jaxfl.algorithms import fedavg_sub
from jaxfl.algorithms.fedavg_sub import subcohort_size
from jaxfl.algorithms.plans import random_subset_mask
from jaxfl.training import ClientStrategy

M = 5
LR = 0.2
KEY = jax.random.key(5)


@functools.cache
def algorithm():
    return fedavg_sub(TASK, LOCAL, M, strategy=ClientStrategy("sequential"))


def run(theta, num_rounds=3):
    state = algorithm().init(initial_params(), {"lr": LR, "theta": theta})
    return run_rounds(algorithm(), state, num_rounds, KEY)


def test_rounds_equal_numpy_reference_and_theta_one_is_fedavg():
    # One compiled round for every theta (a traced hyperparameter).
    for theta, size in [(0.4, 2), (0.5, 2), (0.05, 1)]:

        def plan(r, ids, alpha, losses, key, memory, size=size):
            return dict(active=np.asarray(random_subset_mask(key, ids, size)))

        state, metrics = run(theta)
        kernel, bias, history = reference_rounds(
            initial_params(), KEY, 3, clients_per_round=M, lr=LR, plan=plan
        )
        assert_params_close(state.params, kernel, bias)
        for got, want in zip(metrics, history, strict=True):
            assert got["clients_with_weight"] == size == want["active"].sum(), theta
    state, metrics = run(1.0)
    assert all(m["clients_with_weight"] == M for m in metrics)
    kernel, bias = fedavg_reference(
        initial_params(), KEY, 3, clients_per_round=M, lr=LR
    )
    assert_params_close(state.params, kernel, bias)


def test_subcohort_size_rounds_half_to_even_and_keeps_one():
    sizes = [int(subcohort_size(theta, 5)) for theta in (0.01, 0.1, 0.3, 0.5, 0.7, 1.0)]
    assert sizes == [1, 1, 2, 2, 4, 5]  # round(1.5) = 2, round(2.5) = 2, round(3.5) = 4


def test_random_subset_is_uniform():
    # Every client of a cohort of 4 is chosen with probability 2/4.
    ids = jax.numpy.arange(4, dtype=jax.numpy.int32)
    masks = jax.vmap(lambda k: random_subset_mask(k, ids, 2))(
        jax.random.split(jax.random.key(0), 4000)
    )
    assert np.all(np.asarray(masks).sum(axis=1) == 2)
    np.testing.assert_allclose(np.asarray(masks).mean(axis=0), 0.5, atol=0.03)
