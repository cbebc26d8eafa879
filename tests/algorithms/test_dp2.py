"""DP^2-FL: its rounds against a NumPy per-client loop written in Algorithm 11's order (reset and
refresh at the start of a step, the gradient accumulated after it), over two cycles, for each way v
is refreshed; the preconditioner reads only what was released; bad variants refused."""

import functools

import jax
import numpy as np
import pytest
from algorithms.reference_rounds import (
    LOCAL,
    TASK,
    assert_params_close,
    initial_params,
    reference_rounds,
    run_rounds,
)
from reference import slow_after

from jaxfl.algorithms.dp2 import dp2
from jaxfl.training import ClientStrategy

M = 5
LR, LR2 = 0.2, 0.02
C1, C2 = 0.08, 0.05
S1, S2 = 3, 2  # Unequal, so that the two phase lengths cannot be confused unnoticed.
BETA, EPS = 0.8, 1e-3
ROUNDS = 9  # 3 SGD, 2 RMSProp, 3 SGD, 1 RMSProp (v refreshed twice).
KEY = jax.random.key(8)


@functools.cache
def build(variant):
    return dp2(TASK, LOCAL, M, dp2_variant=variant, strategy=ClientStrategy("vmap"))


def refreshed(variant, v, g):
    if variant == "rmsprop":
        return BETA * v + (1 - BETA) * g**2
    if variant == "adagrad":
        return v + g**2
    return v - (1 - BETA) * np.sign(v - g**2) * g**2


def reference(variant):
    zeros = tuple(np.zeros_like(np.asarray(x, np.float64)) for x in (
        initial_params()["dense"]["kernel"], initial_params()["dense"]["bias"]))

    def preconditioner(r, memory):
        # Algorithm 11's start of step r.
        memory.setdefault("v", zeros)
        memory.setdefault("G", zeros)
        p = r % (S1 + S2)
        if p == 0:
            memory["G"] = zeros
        if p == S1:
            memory["v"] = tuple(refreshed(variant, v, g / S1) for v, g in zip(memory["v"], memory["G"]))
            memory["G"] = zeros
        memory["round"] = r
        if p < S1:
            return (1.0, 1.0)
        # The local step lr * g / A is lr2 * g / (sqrt(v) + eps).
        return tuple((np.sqrt(v) + EPS) * LR / LR2 for v in memory["v"])

    def aggregate(ids, alpha, losses, deltas, decision, memory):
        del ids, alpha, losses, decision  # Unused.
        clip = C2 if memory["round"] % (S1 + S2) >= S1 else C1
        norms = np.array([np.sqrt(np.sum(k**2) + np.sum(b**2)) for k, b in deltas])
        memory.setdefault("clipped", []).append(np.mean(norms > clip))
        coefficients = np.minimum(1.0, clip / norms) / M
        mean = tuple(sum(c * d[i] for c, d in zip(coefficients, deltas)) for i in range(2))
        memory["G"] = tuple(g - m / LR for g, m in zip(memory["G"], mean))
        return coefficients

    history = {}

    def keep(r, memory):
        history.update(memory)
        return preconditioner(r, memory)

    kernel, bias, _ = reference_rounds(
        initial_params(), KEY, ROUNDS, clients_per_round=M, lr=LR, aggregate=aggregate,
        preconditioner=keep,
    )
    return kernel, bias, history


HPARAMS = {
    "lr": LR, "clip_norm": C1, "dp_noise_multiplier": 0.0, "dp2_sgd_rounds": S1, "dp2_rmsprop_rounds": S2,
    "dp2_beta": BETA, "dp2_eps": EPS, "dp2_lr": LR2, "dp2_clip_norm": C2,
}  # fmt: skip


@pytest.mark.parametrize("variant", slow_after(["rmsprop", "adagrad", "yogi"]))
def test_rounds_equal_algorithm_11_as_a_numpy_loop_over_clients(variant):
    algorithm = build(variant)
    state, history = run_rounds(algorithm, algorithm.init(initial_params(), HPARAMS), ROUNDS, KEY)
    kernel, bias, memory = reference(variant)
    assert_params_close(state.params, kernel, bias)
    phases = [h["dp2_rmsprop_phase"] for h in history]
    assert phases == [0, 0, 0, 1, 1, 0, 0, 0, 1]
    # Clipping is exercised in both phases, and the refreshed v is not trivial.
    clipped = np.asarray(memory["clipped"])
    assert clipped[:3].mean() > 0 and clipped[3:5].mean() > 0
    assert np.min(memory["v"][0]) > 0
    # The test has power: the same rounds with v never refreshed (pure SGD phases) differ.
    plain, _, _ = reference_rounds(
        initial_params(), KEY, ROUNDS, clients_per_round=M, lr=LR,
        aggregate=lambda ids, a, l, deltas, d, m: np.minimum(
            1.0, C1 / np.array([np.sqrt(np.sum(k**2) + np.sum(b**2)) for k, b in deltas])
        ) / M,
    )
    assert np.max(np.abs(plain - kernel)) > 1e-3


def test_the_preconditioner_is_built_from_the_released_updates_alone():
    # With noise, v must be the refresh of the *released* (noisy) mean updates, which the server's SGD
    # (learning rate 1) applies as they are: w_{t+1} - w_t. Recomputed here from the models alone.
    algorithm = build("rmsprop")
    state = algorithm.init(initial_params(), {**HPARAMS, "dp_noise_multiplier": 0.7})
    models = [state.params]
    for _ in range(S1 + S2 + 1):
        state, _ = run_rounds(algorithm, state, 1, KEY)
        models.append(state.params)
    released = [
        [np.asarray(b, np.float64) - np.asarray(a, np.float64)
         for a, b in zip(jax.tree.leaves(models[t]), jax.tree.leaves(models[t + 1]))]
        for t in range(S1 + S2 + 1)
    ]
    accumulated = [sum(-released[t][i] / LR for t in range(S1)) for i in range(2)]
    expected = [refreshed("rmsprop", 0.0, g / S1) for g in accumulated]
    for got, want in zip(jax.tree.leaves(state.extra.second), expected):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-9)
    assert np.max(expected[0]) > 0


def test_an_unknown_variant_is_refused():
    with pytest.raises(ValueError, match="dp2_variant"):
        dp2(TASK, LOCAL, M, dp2_variant="adam", strategy=ClientStrategy("vmap"))
