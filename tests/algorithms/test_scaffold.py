"""SCAFFOLD against a NumPy loop over clients (both control-variate options);
its server variate stays the mean of the clients'; its rows split over
devices give what one device gives."""

import functools

import jax
import numpy as np
import pytest
from algorithms.reference_rounds import (
    LOCAL,
    POPULATION,
    SIZES,
    TASK,
    _epoch_orders,
    _sample_cohort,
    initial_params,
    run_rounds,
)
from reference import slow_after, softmax_regression_grad

from jaxfl.algorithms.scaffold import scaffold
from jaxfl.training import ClientStrategy
from jaxfl.training.cohort import round_keys

M = 3
N = len(SIZES)
LR = 0.1
L2 = 0.01
KEY = jax.random.key(5)


@functools.cache
def build(option, strategy=ClientStrategy("vmap")):
    return scaffold(TASK, LOCAL, M, N, strategy=strategy, control_option=option)


def run(option, num_rounds=3, strategy=ClientStrategy("vmap")):
    algorithm = build(option, strategy)
    state = algorithm.init(initial_params(), {"lr": LR, "l2": L2})
    placed = None if strategy.kind == "vmap" else strategy
    return run_rounds(algorithm, state, num_rounds, KEY, strategy=placed)


def scaffold_reference(option, num_rounds):
    """Karimireddy et al. 2020, Algorithm 1, in float64, one client at a time."""
    params = initial_params()
    x = [np.array(params["dense"][k], np.float64) for k in ("kernel", "bias")]
    c = [np.zeros_like(v) for v in x]
    c_clients = [[np.zeros_like(v) for v in x] for _ in range(N)]
    counts = np.asarray(POPULATION.counts)
    for r in range(num_rounds):
        keys = round_keys(KEY, np.int32(r))
        ids = np.asarray(_sample_cohort(keys.sampling, POPULATION, M))
        deltas, delta_cs = [], []
        for i in ids:
            data = POPULATION.client(int(i))
            orders = np.asarray(
                _epoch_orders(jax.random.fold_in(keys.clients, int(i)), counts[i], POPULATION.max_count, 2)
            )
            y = [v.copy() for v in x]
            steps = 0
            for epoch in range(LOCAL.num_epochs):
                order = orders[epoch][: counts[i]]
                for start in range(0, counts[i], LOCAL.batch_size):
                    rows = order[start : start + LOCAL.batch_size]
                    g = softmax_regression_grad(y[0], y[1], data["x"][rows], data["y"][rows])[:2]
                    y = [
                        (1 - LR * L2) * yv - LR * (gv - ci + cv)
                        for yv, gv, ci, cv in zip(y, g, c_clients[i], c, strict=True)
                    ]
                    steps += 1
            if option == 2:
                new_c = [ci - cv + (xv - yv) / (steps * LR) for ci, cv, xv, yv in zip(c_clients[i], c, x, y)]
            else:
                g = softmax_regression_grad(x[0], x[1], data["x"], data["y"])[:2]
                new_c = [gv + L2 * xv for gv, xv in zip(g, x, strict=True)]
            deltas.append([yv - xv for yv, xv in zip(y, x, strict=True)])
            delta_cs.append([n - o for n, o in zip(new_c, c_clients[i], strict=True)])
            c_clients[i] = new_c
        alpha = counts[ids] / counts[ids].sum()
        x = [xv + sum(a * d[k] for a, d in zip(alpha, deltas, strict=True)) for k, xv in enumerate(x)]
        c = [cv + sum(d[k] for d in delta_cs) / N for k, cv in enumerate(c)]
    return x, c, c_clients


def leaves(tree):
    return [np.asarray(tree["dense"][k]) for k in ("kernel", "bias")]


@pytest.mark.parametrize("option", slow_after([2, 1]))
def test_scaffold_matches_a_loop_over_clients(option):
    state, history = run(option)
    x, c, c_clients = scaffold_reference(option, 3)
    for got, want in zip(leaves(state.params), x, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    for got, want in zip(leaves(state.extra), c, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    rows = leaves(state.clients)
    for client in range(N):
        for got, want in zip(rows, c_clients[client], strict=True):
            np.testing.assert_allclose(got[client], want, rtol=1e-4, atol=1e-5)
    # The server's variate is the mean of all N clients' (all start at 0).
    for server, per_client in zip(leaves(state.extra), rows, strict=True):
        np.testing.assert_allclose(server, per_client.mean(axis=0), rtol=1e-5, atol=1e-6)
    assert np.abs(rows[0]).sum() > 0 and history[-1]["clients_with_weight"] == M


@pytest.mark.slow
def test_scaffold_rows_split_over_devices_match_one_device():
    split = ClientStrategy("sharded", num_devices=3, split_client_state=True)
    state, _ = run(2, num_rounds=2, strategy=split)
    alone, _ = run(2, num_rounds=2)
    for got, want in zip(leaves(state.clients), leaves(alone.clients), strict=True):
        assert got.shape[0] == split.client_state_rows(N)
        np.testing.assert_allclose(got[:N], want, rtol=1e-5, atol=1e-6)
    for got, want in zip(leaves(state.params), leaves(alone.params), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_scaffold_refuses_an_unknown_option():
    with pytest.raises(ValueError, match="scaffold_option must be 1 or 2"):
        scaffold(TASK, LOCAL, M, N, strategy=ClientStrategy("vmap"), control_option=3)
