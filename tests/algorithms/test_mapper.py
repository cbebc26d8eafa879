"""Mapper against a NumPy per-client loop with persistent local models and mixing weights.

The reference keeps (u_k, lam_k) for every client across rounds. Each round,
every sampled client tries each candidate lam on the minibatches of its local
training (the engine's epoch orders for fold_in(keys.clients, k)):
u <- u - lr lam grad F(lam u + (1 - lam) w_t), scores lam u + (1 - lam) w_t
by its loss on all the client's examples and keeps the best; then, on the
same minibatches, w <- w - lr (1 - lam_k) grad F(lam_k u_k + (1 - lam_k) w).
The server model moves by the examples-weighted mean of the w updates.
"""

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
    run_rounds,
)
from reference import slow_after, softmax_regression_grad

from jaxfl.algorithms.mapper import mapper
from jaxfl.training import ClientStrategy
from jaxfl.training.cohort import round_keys

M = 3
LR = 10.0  # Large enough that the most local candidate overshoots for some clients (varied choices).
KEY = jax.random.key(5)
N = len(SIZES)
CANDIDATES = (1.0, 0.0, 0.5)


def minibatches(data, orders):
    count = len(data["y"])
    for epoch in range(LOCAL.num_epochs):
        order = orders[epoch][:count]
        for start in range(0, count, LOCAL.batch_size):
            rows = order[start : start + LOCAL.batch_size]
            yield data["x"][rows], data["y"][rows]


def mix(lam, u, w):
    return tuple(lam * a + (1 - lam) * b for a, b in zip(u, w, strict=True))


def client_round_reference(w, u, data, orders):
    """One client's candidate search and global steps by hand: (w update, u, lam)."""
    best = None
    for lam in CANDIDATES:
        uk, ub = u
        for x, y in minibatches(data, orders):
            gk, gb, _ = softmax_regression_grad(*mix(lam, (uk, ub), w), x, y)
            uk, ub = uk - LR * lam * gk, ub - LR * lam * gb
        loss = softmax_regression_grad(*mix(lam, (uk, ub), w), data["x"], data["y"])[2]
        if best is None or loss < best[0]:
            best = (loss, (uk, ub), lam)
    _, u, lam = best
    wk, wb = w
    for x, y in minibatches(data, orders):
        gk, gb, _ = softmax_regression_grad(*mix(lam, u, (wk, wb)), x, y)
        wk, wb = wk - LR * (1 - lam) * gk, wb - LR * (1 - lam) * gb
    return (wk - w[0], wb - w[1]), u, lam


def mapper_reference(w0, num_rounds):
    kernel = np.array(w0["dense"]["kernel"], np.float64)
    bias = np.array(w0["dense"]["bias"], np.float64)
    u_kernel, u_bias = np.repeat(kernel[None], N, axis=0), np.repeat(bias[None], N, axis=0)
    lams = np.zeros(N)
    counts = np.asarray(POPULATION.counts)
    for r in range(num_rounds):
        keys = round_keys(KEY, jnp.int32(r))
        ids = np.asarray(_sample_cohort(keys.sampling, POPULATION, M))
        updates = []
        for i in ids:
            update, (u_kernel[i], u_bias[i]), lams[i] = client_round_reference(
                (kernel, bias), (u_kernel[i], u_bias[i]), POPULATION.client(int(i)), client_orders(keys, i)
            )
            updates.append(update)
        weights = counts[ids] / counts[ids].sum()
        kernel = kernel + sum(w * u[0] for w, u in zip(weights, updates, strict=True))
        bias = bias + sum(w * u[1] for w, u in zip(weights, updates, strict=True))
    return kernel, bias, u_kernel, u_bias, lams


@pytest.mark.parametrize("strategy", slow_after(["vmap", "sequential"]))
def test_mapper_matches_numpy_loop(strategy):
    layout = ClientStrategy(strategy)
    algorithm = mapper(TASK, LOCAL, M, N, strategy=layout, candidates=CANDIDATES)
    state = algorithm.init(initial_params(), {"lr": LR})
    state, metrics = run_rounds(algorithm, state, 5, KEY)
    kernel, bias, u_kernel, u_bias, lams = mapper_reference(initial_params(), 5)
    # The search chose more than one weight, so a wrong choice (argmax, a shifted index) shows.
    assert len(set(lams[lams > 0])) > 1
    np.testing.assert_allclose(state.clients["lam"], lams)
    np.testing.assert_allclose(state.params["dense"]["kernel"], kernel, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state.params["dense"]["bias"], bias, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state.clients["local"]["dense"]["kernel"], u_kernel, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state.clients["local"]["dense"]["bias"], u_bias, rtol=1e-4, atol=1e-5)
    personal = algorithm.personal_models(state)
    expected = lams[:, None, None] * u_kernel + (1 - lams[:, None, None]) * kernel[None]
    np.testing.assert_allclose(personal["dense"]["kernel"], expected, rtol=1e-4, atol=1e-5)
    assert all(0.0 <= m["mapper_lam_mean"] <= 1.0 and np.isfinite(m["personal_train_loss"]) for m in metrics)


@pytest.mark.parametrize(
    "candidates, words",
    [((), ["at least one"]), ((0.5, 1.5), ["[0, 1]", "1.5"])],
)
def test_mapper_refuses_bad_candidates(candidates, words):
    with pytest.raises(ValueError) as error:
        mapper(TASK, LOCAL, M, N, strategy=ClientStrategy("vmap"), candidates=candidates)
    assert all(word in str(error.value) for word in words)
