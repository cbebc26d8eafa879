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
def algorithm(sample_tilt=None):
    return term(TASK, LOCAL, M, sample_tilt=sample_tilt, strategy=ClientStrategy("vmap"))


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


def run_hierarchical(tilt, sample_tilt, num_rounds=3):
    hierarchical = algorithm(0.0)  # One compiled round for every tau (a traced hyperparameter).
    state = hierarchical.init(initial_params(), {"lr": LR, "tilt": tilt, "sample_tilt": sample_tilt})
    return run_rounds(hierarchical, state, num_rounds, KEY)[0]


def test_hierarchical_rounds_equal_a_numpy_loop_over_clients():
    # tau tilts each client's examples (its local steps and its loss in the server's weights), t tilts
    # across clients; the reference computes both by hand, per example.
    for tilt, sample_tilt in ((2.0, -2.0), (-1.0, 3.0)):
        state = run_hierarchical(tilt, sample_tilt)
        kernel, bias, _ = reference_rounds(
            initial_params(), KEY, 3, clients_per_round=M, lr=LR, plan=tilted_plan(tilt),
            sample_tilt=sample_tilt,
        )
        assert_params_close(state.params, kernel, bias)
        # The test has power: the client-level tilt alone lands elsewhere.
        plain, _, _ = reference_rounds(
            initial_params(), KEY, 3, clients_per_round=M, lr=LR, plan=tilted_plan(tilt)
        )
        assert np.max(np.abs(plain - kernel)) > 1e-3


def test_zero_sample_tilt_is_the_client_level_tilt():
    # The hierarchical round at tau = 0 against the client-level round (no sample tilt in it).
    assert "sample_tilt" not in algorithm().hparam_defaults
    for a, b in zip(
        jax.tree.leaves(run_hierarchical(1.5, 0.0).params), jax.tree.leaves(run(1.5).params), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
