"""FedDyn and FedDane against NumPy loops over clients: FedDyn's per-client
gradient state and server state h, FedDane's corrected local problems."""

import functools

import jax
import numpy as np
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
from reference import local_sgd_reference, softmax_regression_grad

from jaxfl.algorithms.feddane import feddane
from jaxfl.algorithms.feddyn import feddyn
from jaxfl.training import ClientStrategy
from jaxfl.training.cohort import round_keys

M = 3
N = len(SIZES)
LR = 0.1
KEY = jax.random.key(8)
COUNTS = np.asarray(POPULATION.counts)


@functools.cache
def build(name):
    if name == "feddyn":
        return feddyn(TASK, LOCAL, M, N, strategy=ClientStrategy("vmap"))
    return feddane(TASK, LOCAL, M, strategy=ClientStrategy("chunked", chunk_size=2))


def start():
    params = initial_params()
    return [np.array(params["dense"][k], np.float64) for k in ("kernel", "bias")]


def leaves(tree):
    return [np.asarray(tree["dense"][k]) for k in ("kernel", "bias")]


def cohort_and_training(r):
    """The round's cohort and a function training client i from x with a correction and a proximal weight."""
    keys = round_keys(KEY, np.int32(r))
    ids = np.asarray(_sample_cohort(keys.sampling, POPULATION, M))

    def train(i, x, correction, mu):
        data = POPULATION.client(int(i))
        orders = _epoch_orders(jax.random.fold_in(keys.clients, int(i)), COUNTS[i], POPULATION.max_count, 2)
        kernel, bias, _ = local_sgd_reference(
            x[0], x[1], data["x"], data["y"], np.asarray(orders), batch_size=LOCAL.batch_size,
            num_epochs=LOCAL.num_epochs, lr=LR, mu=mu, correction=correction,
        )  # fmt: skip
        return [kernel - x[0], bias - x[1]]

    return ids, train


def test_feddyn_matches_a_loop_over_clients():
    alpha = 0.05
    algorithm = build("feddyn")
    state = algorithm.init(initial_params(), {"lr": LR, "feddyn_alpha": alpha})
    state, _ = run_rounds(algorithm, state, 3, KEY)
    x = start()
    h = [np.zeros_like(v) for v in x]
    g = [[np.zeros_like(v) for v in x] for _ in range(N)]
    for r in range(3):
        ids, train = cohort_and_training(r)
        deltas = {}
        for i in ids:
            deltas[i] = train(i, x, [-v for v in g[i]], alpha)
            g[i] = [gv - alpha * d for gv, d in zip(g[i], deltas[i], strict=True)]
        p = COUNTS[ids] / COUNTS[ids].sum()
        h = [hv - alpha * sum(deltas[i][k] for i in ids) / N for k, hv in enumerate(h)]
        mean = [sum(pk * deltas[i][k] for pk, i in zip(p, ids, strict=True)) for k in range(2)]
        x = [xv + mean[k] - h[k] / alpha for k, xv in enumerate(x)]
    for got, want in zip(leaves(state.params), x, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    for got, want in zip(leaves(state.extra), h, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    rows = leaves(state.clients)
    for client in range(N):
        for got, want in zip(rows, g[client], strict=True):
            np.testing.assert_allclose(got[client], want, rtol=1e-4, atol=1e-5)


def test_feddane_matches_a_loop_over_clients():
    mu = 0.2
    algorithm = build("feddane")
    state, _ = run_rounds(algorithm, algorithm.init(initial_params(), {"lr": LR, "mu": mu}), 3, KEY)
    x = start()
    for r in range(3):
        ids, train = cohort_and_training(r)
        p = COUNTS[ids] / COUNTS[ids].sum()
        gradients = [softmax_regression_grad(x[0], x[1], **POPULATION.client(int(i)))[:2] for i in ids]
        mean = [sum(pk * gk[k] for pk, gk in zip(p, gradients, strict=True)) for k in range(2)]
        deltas = [
            train(i, x, [mean[k] - gk[k] for k in range(2)], mu) for i, gk in zip(ids, gradients, strict=True)
        ]
        x = [xv + sum(pk * d[k] for pk, d in zip(p, deltas, strict=True)) for k, xv in enumerate(x)]
    for got, want in zip(leaves(state.params), x, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
