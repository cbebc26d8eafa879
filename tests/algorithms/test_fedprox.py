"""FedProx with stragglers against a NumPy per-client loop; FedAvg drops the
same stragglers; mu = 0 without stragglers is FedAvg; stragglers run fewer
epochs, drawn from {1, ..., E - 1}."""

import functools
import math

import jax
import numpy as np
import pytest
from algorithms.reference_rounds import (
    SIZES,
    TASK,
    assert_params_close,
    fedavg_reference,
    initial_params,
    plan_key,
    reference_rounds,
    run_rounds,
)

from jaxfl.algorithms import fedavg, fedprox
from jaxfl.algorithms.fedavg import straggler_plan
from jaxfl.algorithms.plans import draw_stragglers, num_stragglers
from jaxfl.training import ClientStrategy, LocalTraining

M = 5
LR = 0.1
KEY = jax.random.key(9)
LOCAL3 = LocalTraining(batch_size=4, num_epochs=3)
STRAGGLERS = 0.4  # 5 - round(5 * 0.6) = 2 stragglers per round.


@functools.cache
def build(name, stragglers):
    make = {"fedprox": fedprox, "fedavg": fedavg}[name]
    return make(
        TASK, LOCAL3, M, strategy=ClientStrategy("sequential"), stragglers=stragglers
    )


def run(name, stragglers, hparams, num_rounds=3):
    algorithm = build(name, stragglers)
    state = algorithm.init(initial_params(), {"lr": LR, **hparams})
    return run_rounds(algorithm, state, num_rounds, KEY)


def straggler_reference(keep):
    def plan(r, ids, alpha, losses, key, memory):
        drawn = draw_stragglers(key, ids, 2, LOCAL3.num_epochs)
        if keep:
            return dict(epochs=np.asarray(drawn.num_epochs))
        return dict(active=~np.asarray(drawn.is_straggler))

    return plan


def steps(ids, epochs):
    return np.mean(
        [math.ceil(SIZES[i] / 4) * e for i, e in zip(ids, epochs, strict=True)]
    )


def test_fedprox_keeps_stragglers_partial_work():
    state, metrics = run("fedprox", STRAGGLERS, {"mu": 0.5})
    kernel, bias, history = reference_rounds(
        initial_params(),
        KEY,
        3,
        clients_per_round=M,
        lr=LR,
        mu=0.5,
        local=LOCAL3,
        plan=straggler_reference(keep=True),
    )
    assert_params_close(state.params, kernel, bias)
    for got, want in zip(metrics, history, strict=True):
        assert got["stragglers"] == 2 and got["clients_with_weight"] == M
        np.testing.assert_allclose(
            got["local_steps"], steps(want["ids"], want["epochs"])
        )
        # Stragglers run 1..E-1 epochs, the others E.
        epochs = sorted(want["epochs"])
        assert max(epochs[:2]) <= 2 and epochs[2:] == [3, 3, 3]


def test_fedavg_drops_the_same_stragglers():
    state, metrics = run("fedavg", STRAGGLERS, {})
    kernel, bias, history = reference_rounds(
        initial_params(),
        KEY,
        3,
        clients_per_round=M,
        lr=LR,
        local=LOCAL3,
        plan=straggler_reference(keep=False),
    )
    assert_params_close(state.params, kernel, bias)
    for got, want in zip(metrics, history, strict=True):
        assert got["stragglers"] == 2 and got["clients_with_weight"] == M - 2
        full = [3 if a else 0 for a in want["active"]]
        np.testing.assert_allclose(got["local_steps"], steps(want["ids"], full))


def test_fedprox_without_mu_and_stragglers_is_fedavg():
    state, _ = run("fedprox", 0.0, {"mu": 0.0})
    kernel, bias = fedavg_reference(
        initial_params(), KEY, 3, clients_per_round=M, lr=LR, local=LOCAL3
    )
    assert_params_close(state.params, kernel, bias)


def test_straggler_epochs_are_uniform_below_e():
    ids = jax.numpy.arange(200, dtype=jax.numpy.int32)
    drawn = draw_stragglers(plan_key(KEY, 0), ids, 150, 4)
    epochs = np.asarray(drawn.num_epochs)
    is_straggler = np.asarray(drawn.is_straggler)
    assert is_straggler.sum() == 150
    assert set(epochs[~is_straggler]) == {4}
    counts = np.bincount(epochs[is_straggler], minlength=4)[1:]
    assert counts.sum() == 150 and np.all(counts > 30)  # {1, 2, 3}, about 50 each


def test_straggler_count_follows_the_fedprox_code():
    assert [num_stragglers(10, s) for s in (0.0, 0.5, 0.9)] == [0, 5, 9]
    assert num_stragglers(5, 0.5) == 3  # round(2.5) = 2 active.
    with pytest.raises(ValueError, match="stragglers"):
        num_stragglers(5, 1.0)


def test_no_stragglers_compiles_plain_fedavg():
    assert straggler_plan(M, 0.0, 1, keep=False) is None
    assert straggler_plan(M, 0.05, 1, keep=True) is None  # round(4.75) = 5 active.


def test_fedprox_stragglers_need_two_epochs_fedavg_does_not():
    one_epoch = LocalTraining(batch_size=4, num_epochs=1)
    with pytest.raises(ValueError, match="local_epochs >= 2"):
        fedprox(TASK, one_epoch, M, strategy=ClientStrategy("vmap"), stragglers=0.5)
    fedavg(TASK, one_epoch, M, strategy=ClientStrategy("vmap"), stragglers=0.5)
