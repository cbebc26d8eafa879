"""Client-level tilted ERM against a NumPy per-client loop with softmax
weights; t = 0 is FedAvg and t -> 0 approaches it."""

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

from jaxfl.algorithms import term
from jaxfl.training import ClientStrategy

M = 5
LR = 0.2
KEY = jax.random.key(17)


@functools.cache
def algorithm():
    return term(TASK, LOCAL, M, strategy=ClientStrategy("vmap"))


def run(tilt, num_rounds=3):
    state = algorithm().init(initial_params(), {"lr": LR, "tilt": tilt})
    return run_rounds(algorithm(), state, num_rounds, KEY)[0]


def tilted_plan(tilt):
    def plan(r, ids, alpha, losses, key, memory):
        logits = tilt * losses + np.log(alpha)
        weights = np.exp(logits - logits.max())
        return dict(weights=weights / weights.sum())

    return plan


def test_rounds_equal_numpy_reference_and_small_tilts_approach_fedavg():
    for tilt in (2.0, -2.0):
        state = run(tilt)
        kernel, bias, _ = reference_rounds(
            initial_params(), KEY, 3, clients_per_round=M, lr=LR, plan=tilted_plan(tilt)
        )
        assert_params_close(state.params, kernel, bias)
    # t = 0 is FedAvg, and t -> 0 approaches it.
    kernel, bias = fedavg_reference(
        initial_params(), KEY, 3, clients_per_round=M, lr=LR
    )
    assert_params_close(run(0.0).params, kernel, bias)
    gaps = [
        np.max(np.abs(np.asarray(run(tilt).params["dense"]["kernel"]) - kernel))
        for tilt in (1.0, 0.1, 0.001)
    ]
    assert gaps[0] > gaps[1] > gaps[2] and gaps[2] < 1e-3
