"""q-MAML against a NumPy loop over clients (Li 2023, Algorithm 5); q = 0 is
first-order MAML."""

import functools

import jax
import numpy as np
import pytest
from algorithms.reference_rounds import (
    POPULATION,
    TASK,
    _epoch_orders,
    _sample_cohort,
    initial_params,
    run_rounds,
)
from reference import slow_after, softmax_regression_grad

from jaxfl.algorithms.qmaml import qmaml
from jaxfl.training import ClientStrategy
from jaxfl.training.cohort import round_keys

M = 4
LR = 0.2
ETA = 0.3
KEY = jax.random.key(21)
COUNTS = np.asarray(POPULATION.counts)


@functools.cache
def build(weighting):
    return qmaml(TASK, M, strategy=ClientStrategy("vmap"), client_weighting=weighting)


def qmaml_reference(q, weighting, num_rounds):
    params = initial_params()
    x = [np.array(params["dense"][k], np.float64) for k in ("kernel", "bias")]
    for r in range(num_rounds):
        keys = round_keys(KEY, np.int32(r))
        ids = np.asarray(_sample_cohort(keys.sampling, POPULATION, M))
        alpha = COUNTS[ids].astype(np.float64) if weighting == "num_examples" else np.ones(M)
        steps, h = [], []
        for i in ids:
            data = POPULATION.client(int(i))
            order = np.asarray(
                _epoch_orders(jax.random.fold_in(keys.clients, int(i)), COUNTS[i], POPULATION.max_count, 1)
            )[0][: COUNTS[i]]
            train, test = order[0::2], order[1::2]
            g = softmax_regression_grad(x[0], x[1], data["x"][train], data["y"][train])[:2]
            adapted = [v - ETA * gv for v, gv in zip(x, g, strict=True)]
            meta_kernel, meta_bias, loss = softmax_regression_grad(*adapted, data["x"][test], data["y"][test])
            f = loss + 1e-10
            steps.append([f**q * meta_kernel, f**q * meta_bias])
            h.append(q * f ** (q - 1) * (np.sum(meta_kernel**2) + np.sum(meta_bias**2)) + f**q / LR)
        total = np.sum(alpha * np.array(h))
        x = [v - sum(a * s[k] for a, s in zip(alpha, steps, strict=True)) / total for k, v in enumerate(x)]
    return x


@pytest.mark.parametrize(
    "q, weighting", slow_after([(1.0, "num_examples"), (0.0, "uniform"), (2.5, "uniform")])
)
def test_qmaml_matches_a_loop_over_clients(q, weighting):
    algorithm = build(weighting)
    hparams = {"lr": LR, "q": q, "perfedavg_alpha": ETA}
    state, _ = run_rounds(algorithm, algorithm.init(initial_params(), hparams), 3, KEY)
    for name, want in zip(("kernel", "bias"), qmaml_reference(q, weighting, 3), strict=True):
        np.testing.assert_allclose(state.params["dense"][name], want, rtol=1e-4, atol=1e-5)
