"""AFL: gradient descent on w with the mixture weights lambda and projected
gradient ascent on lambda, against a NumPy per-client loop with its own
simplex projection; lambda uniform and frozen is FedAvg with uniform
weights."""

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
    assert_params_close,
    fedavg_reference,
    initial_params,
    normalized,
    reference_rounds,
    run_rounds,
)
from reference import tiny_population

from jaxfl.algorithms import afl
from jaxfl.algorithms.afl import lambda_ascent
from jaxfl.training import ClientStrategy

M = 5
N = len(SIZES)
LR = 0.1
KEY = jax.random.key(13)


@functools.cache
def algorithm():
    return afl(TASK, LOCAL, M, N, strategy=ClientStrategy("vmap"))


def np_project_simplex(v):
    """Euclidean projection onto the simplex (Duchi et al. 2008), by sorting."""
    u = np.sort(v)[::-1]
    cumulative = np.cumsum(u) - 1
    rho = np.nonzero(u - cumulative / np.arange(1, len(v) + 1) > 0)[0][-1]
    return np.maximum(v - cumulative[rho] / (rho + 1), 0)


def afl_aggregate(step_size):
    def aggregate(ids, alpha, losses, deltas, decision, memory):
        mixture = memory.setdefault("lambda", np.full(N, 1.0 / N))
        coefficients = normalized(mixture[ids])
        gradient = np.zeros(N)
        gradient[ids] = N / M * losses
        memory["lambda"] = np_project_simplex(mixture + step_size * gradient)
        return coefficients

    return aggregate


def run(step_size, num_rounds=4):
    state = algorithm().init(initial_params(), {"lr": LR, "afl_lambda_lr": step_size})
    return run_rounds(algorithm(), state, num_rounds, KEY)


def final_lambda(history, step_size):
    """The reference's lambda after the rounds of `history`."""
    mixture = np.full(N, 1.0 / N)
    for h in history:
        gradient = np.zeros(N)
        gradient[h["ids"]] = N / M * h["losses"]
        mixture = np_project_simplex(mixture + step_size * gradient)
    return mixture


def test_rounds_equal_numpy_reference():
    for step_size in (0.02, 0.3):
        state, metrics = run(step_size)
        kernel, bias, history = reference_rounds(
            initial_params(),
            KEY,
            4,
            clients_per_round=M,
            lr=LR,
            aggregate=afl_aggregate(step_size),
        )
        assert_params_close(state.params, kernel, bias)
        mixture = np.asarray(state.extra["lambda"])
        np.testing.assert_allclose(mixture, final_lambda(history, step_size), atol=1e-5)
        assert np.all(mixture >= 0) and np.isclose(mixture.sum(), 1, atol=1e-5)
    # The large step concentrated lambda: some cohort clients got no weight.
    assert min(m["clients_with_weight"] for m in metrics) < M

    # lambda frozen at uniform: FedAvg with uniform weights.
    state, _ = run(0.0, 3)
    kernel, bias = fedavg_reference(
        initial_params(), KEY, 3, clients_per_round=M, lr=LR, weighting="uniform"
    )
    assert_params_close(state.params, kernel, bias)
    np.testing.assert_allclose(state.extra["lambda"], 1.0 / N)


def test_projection_matches_numpy():
    rng = np.random.default_rng(1)
    for _ in range(5):
        mixture = rng.dirichlet(np.ones(N))
        ids = rng.choice(N, M, replace=False)
        losses = rng.uniform(0, 3, M)
        got = lambda_ascent(
            jnp.asarray(mixture, jnp.float32),
            jnp.asarray(ids),
            jnp.asarray(losses, jnp.float32),
            0.2,
        )
        gradient = np.zeros(N)
        gradient[ids] = N / M * losses
        np.testing.assert_allclose(
            got, np_project_simplex(mixture + 0.2 * gradient), atol=1e-6
        )


def test_population_of_another_size_is_an_error():
    state = algorithm().init(initial_params(), {"lr": LR})
    other = tiny_population([5, 6, 7, 8, 9, 10], seed=1)
    with pytest.raises(ValueError, match="built for 8 training clients"):
        algorithm().round(state, other, KEY)
    assert POPULATION.num_clients == N
    with pytest.raises(ValueError, match="num_clients"):
        afl(TASK, LOCAL, M, 3, strategy=ClientStrategy("vmap"))
