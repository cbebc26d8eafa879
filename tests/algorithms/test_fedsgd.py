"""FedSGD: one full-local-data gradient per client at w_t, the alpha-weighted
mean gradient, one step with the local learning rate; against the gradient
formula in NumPy."""

import functools

import jax
import numpy as np
from algorithms.reference_rounds import (
    POPULATION,
    TASK,
    assert_params_close,
    initial_params,
    reference_rounds,
    run_rounds,
)
from reference import softmax_regression_grad

from jaxfl.algorithms import fedsgd
from jaxfl.training import ClientStrategy

M = 4
LR = 0.5
KEY = jax.random.key(3)


@functools.cache
def algorithm():
    return fedsgd(TASK, M, strategy=ClientStrategy("vmap"))


def test_rounds_are_full_batch_gradient_steps():
    for l2 in (0.0, 0.1):
        state = algorithm().init(initial_params(), {"lr": LR, "l2": l2})
        state, metrics = run_rounds(algorithm(), state, 3, KEY)
        kernel, bias, _ = reference_rounds(
            initial_params(), KEY, 3, clients_per_round=M, lr=LR, l2=l2, full_batch=True
        )
        assert_params_close(state.params, kernel, bias)
        assert all(m["local_steps"] == 1 for m in metrics)

    # With alpha = number of examples, the mean of the clients' gradients is
    # the gradient of the pooled data: one round is one centralized
    # full-batch gradient descent step on the cohort's data.
    state = algorithm().init(initial_params(), {"lr": LR})
    new_state, _ = run_rounds(algorithm(), state, 1, KEY)
    _, _, history = reference_rounds(
        initial_params(), KEY, 1, clients_per_round=M, lr=LR, full_batch=True
    )
    data = [POPULATION.client(int(i)) for i in history[0]["ids"]]
    x = np.concatenate([d["x"] for d in data]).astype(np.float64)
    y = np.concatenate([d["y"] for d in data])
    params = initial_params()
    kernel = np.asarray(params["dense"]["kernel"], np.float64)
    bias = np.asarray(params["dense"]["bias"], np.float64)
    g_kernel, g_bias, _ = softmax_regression_grad(kernel, bias, x, y)
    assert_params_close(new_state.params, kernel - LR * g_kernel, bias - LR * g_bias)
