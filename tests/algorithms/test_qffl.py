"""q-FedAvg and q-FedSGD against a NumPy per-client loop of thesis
Algorithms 3-4; q = 0 is FedAvg (resp. FedSGD) with the same weights."""

import functools

import jax
import numpy as np
import pytest
from algorithms.reference_rounds import (
    LOCAL,
    TASK,
    assert_params_close,
    fedavg_reference,
    initial_params,
    reference_rounds,
    run_rounds,
)
from reference import slow_after

from jaxfl.algorithms import Engine, build_algorithm, server_optimizer
from jaxfl.training import ClientStrategy

M = 5
LR = 0.1
KEY = jax.random.key(11)


@functools.cache
def build(name, variant, weighting):
    engine = Engine(
        TASK, LOCAL, M, ClientStrategy("vmap"), server_optimizer("sgd"), weighting
    )
    return build_algorithm(name, engine, {"qffl_variant": variant})


def qffl_aggregate(q, lr):
    lipschitz = 1.0 / lr

    def aggregate(ids, alpha, losses, deltas, decision, memory):
        f = losses + 1e-10
        sq = np.array([np.sum(k**2) + np.sum(b**2) for k, b in deltas])
        h = q * f ** (q - 1) * lipschitz**2 * sq + lipschitz * f**q
        return alpha * lipschitz * f**q / np.sum(alpha * h)

    return aggregate


def run(algorithm, hparams, num_rounds=3):
    state = algorithm.init(initial_params(), {"lr": LR, **hparams})
    return run_rounds(algorithm, state, num_rounds, KEY)


# q-FedAvg through the registry's "AFL as q-FFL" entry (uniform weights, the
# thesis's setting), q-FedSGD through "qffl" (weights = number of examples).
CASES = {
    "q-FedAvg": ("afl-qffl", "fedavg", "uniform"),
    "q-FedSGD": ("qffl", "fedsgd", "num_examples"),
}


@pytest.mark.parametrize("case", slow_after(list(CASES)))
def test_rounds_equal_numpy_reference_and_q_zero_is_fedavg(case):
    name, variant, weighting = CASES[case]
    algorithm = build(name, variant, weighting)
    full_batch = variant == "fedsgd"
    for q in (0.5, 3.0):
        state, metrics = run(algorithm, {"q": q})
        kernel, bias, _ = reference_rounds(
            initial_params(),
            KEY,
            3,
            clients_per_round=M,
            lr=LR,
            weighting=weighting,
            full_batch=full_batch,
            aggregate=qffl_aggregate(q, LR),
        )
        assert_params_close(state.params, kernel, bias)
        assert all(m["clients_with_weight"] == M for m in metrics)
    # q = 0: FedAvg (FedSGD) with the same weights.
    state, _ = run(algorithm, {"q": 0.0})
    kernel, bias = fedavg_reference(
        initial_params(),
        KEY,
        3,
        clients_per_round=M,
        lr=LR,
        weighting=weighting,
        full_batch=full_batch,
    )
    assert_params_close(state.params, kernel, bias)
    # The registry's defaults: q = 10 for "AFL as q-FFL", 1 for q-FFL.
    default_q = {"afl-qffl": 10.0, "qffl": 1.0}[name]
    assert algorithm.hparam_defaults["q"] == default_q
    state, _ = run(algorithm, {})
    kernel, bias, _ = reference_rounds(
        initial_params(),
        KEY,
        3,
        clients_per_round=M,
        lr=LR,
        weighting=weighting,
        full_batch=full_batch,
        aggregate=qffl_aggregate(default_q, LR),
    )
    assert_params_close(state.params, kernel, bias)


def test_unknown_variant_raises():
    with pytest.raises(ValueError, match="qffl_variant"):
        build("qffl", "fedprox", "uniform")
