"""FedNova against a NumPy loop over clients, with stragglers running fewer
epochs; with equal local steps it is FedAvg."""

import functools
import math

import jax
import numpy as np
import pytest
from algorithms.reference_rounds import (
    SIZES,
    TASK,
    assert_params_close,
    initial_params,
    reference_rounds,
    run_rounds,
)
from reference import slow_after

from jaxfl.algorithms import fedavg
from jaxfl.algorithms.fednova import fednova
from jaxfl.algorithms.plans import draw_stragglers
from jaxfl.training import ClientStrategy, LocalTraining

M = 5
LR = 0.1
KEY = jax.random.key(3)
LOCAL3 = LocalTraining(batch_size=4, num_epochs=3)


@functools.cache
def build(stragglers, local=LOCAL3, weighting="num_examples"):
    return fednova(
        TASK, local, M, strategy=ClientStrategy("vmap"), stragglers=stragglers, client_weighting=weighting
    )


def fednova_coefficients(epochs_of):
    """tau_eff p_i / tau_i, tau_i = ceil(n_i / B) * epochs_i (Wang et al. 2020, eq. 6)."""

    def aggregate(ids, alpha, losses, deltas, decision, memory):
        epochs = epochs_of(decision, len(ids))
        tau = np.array([math.ceil(SIZES[i] / 4) * e for i, e in zip(ids, epochs, strict=True)], np.float64)
        p = alpha / alpha.sum()
        return (p * tau).sum() * p / tau

    return aggregate


@pytest.mark.parametrize("weighting", slow_after(["num_examples", "uniform"]))
def test_fednova_matches_a_loop_over_clients_with_stragglers(weighting):
    algorithm = build(0.4, weighting=weighting)
    state, metrics = run_rounds(algorithm, algorithm.init(initial_params(), {"lr": LR}), 3, KEY)

    def plan(r, ids, alpha, losses, key, memory):
        return dict(epochs=np.asarray(draw_stragglers(key, ids, 2, 3).num_epochs))

    kernel, bias, history = reference_rounds(
        initial_params(), KEY, 3, clients_per_round=M, lr=LR, local=LOCAL3, weighting=weighting, plan=plan,
        aggregate=fednova_coefficients(lambda decision, m: decision["epochs"]),
    )  # fmt: skip
    assert_params_close(state.params, kernel, bias)
    for got, want in zip(metrics, history, strict=True):
        assert got["stragglers"] == 2
        ids, epochs = want["ids"], want["epochs"]
        tau = np.array([math.ceil(SIZES[i] / 4) * e for i, e in zip(ids, epochs, strict=True)])
        alpha = np.array([SIZES[i] for i in ids], float) if weighting == "num_examples" else np.ones(M)
        np.testing.assert_allclose(got["tau_eff"], (alpha / alpha.sum() * tau).sum(), rtol=1e-6)


def test_fednova_with_equal_local_steps_is_fedavg():
    # Batches of 1 capped at 2 steps: every client of SIZES (>= 2 examples) runs tau_i = 2.
    capped = LocalTraining(batch_size=1, num_epochs=1, max_steps=2)
    nova = build(0.0, local=capped)
    state, _ = run_rounds(nova, nova.init(initial_params(), {"lr": LR}), 2, KEY)
    plain = fedavg(TASK, capped, M, strategy=ClientStrategy("vmap"))
    want, _ = run_rounds(plain, plain.init(initial_params(), {"lr": LR}), 2, KEY)
    for got, expected in zip(jax.tree.leaves(state.params), jax.tree.leaves(want.params), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
