"""EWC fine-tuning (thesis section 5.5) against a NumPy loop: the diagonal
empirical Fisher of the global model on each client's first minibatch, by
hand, then local SGD with the Fisher-weighted proximal term."""

import jax
import jax.numpy as jnp
import numpy as np
from algorithms.reference_rounds import POPULATION, SIZES, TASK, _epoch_orders, initial_params
from reference import TINY_LABEL_SHIFT, assert_cli_refuses

from jaxfl.training import ClientStrategy, LocalTraining
from jaxfl.training.cohort import finetune_models

LOCAL = LocalTraining(batch_size=4, num_epochs=2)
LR = 0.1
KEY = jax.random.key(8)
_finetune = jax.jit(finetune_models, static_argnums=(0, 1, 2))


def softmax(logits):
    logits = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(logits)
    return e / e.sum(axis=1, keepdims=True)


def fisher_reference(kernel, bias, x, y):
    """Mean over the examples of each one's squared cross-entropy gradient."""
    residual = softmax(x @ kernel + bias)
    residual[np.arange(len(y)), y] -= 1.0
    per_example_kernel = x[:, :, None] * residual[:, None, :]
    return (per_example_kernel**2).mean(axis=0), (residual**2).mean(axis=0)


def ewc_reference(client, lam):
    w = initial_params()["dense"]
    w_kernel, w_bias = np.array(w["kernel"], np.float64), np.array(w["bias"], np.float64)
    data = POPULATION.client(client)
    count = len(data["y"])
    orders = np.asarray(_epoch_orders(jax.random.fold_in(KEY, client), POPULATION.counts[client],
                                      POPULATION.max_count, LOCAL.num_epochs))
    first = orders[0][: min(LOCAL.batch_size, count)]
    f_kernel, f_bias = fisher_reference(w_kernel, w_bias, data["x"][first], data["y"][first])
    kernel, bias = w_kernel.copy(), w_bias.copy()
    for epoch in range(LOCAL.num_epochs):
        order = orders[epoch][:count]
        for start in range(0, count, LOCAL.batch_size):
            rows = order[start : start + LOCAL.batch_size]
            residual = softmax(data["x"][rows] @ kernel + bias)
            residual[np.arange(len(rows)), data["y"][rows]] -= 1.0
            residual /= len(rows)
            kernel = kernel - LR * (data["x"][rows].T @ residual + lam * f_kernel * (kernel - w_kernel))
            bias = bias - LR * (residual.sum(axis=0) + lam * f_bias * (bias - w_bias))
    return kernel, bias


def test_ewc_finetuning_matches_numpy_loop():
    lam = 50.0  # Large enough that the Fisher-weighted pull matters.
    tuned = _finetune(TASK, LOCAL, ClientStrategy("vmap"), initial_params(), POPULATION, KEY,
                      jnp.float32(LR), ewc_lam=jnp.float32(lam))
    plain = _finetune(TASK, LOCAL, ClientStrategy("vmap"), initial_params(), POPULATION, KEY, jnp.float32(LR))
    for client in range(len(SIZES)):
        kernel, bias = ewc_reference(client, lam)
        np.testing.assert_allclose(tuned.params["dense"]["kernel"][client], kernel, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(tuned.params["dense"]["bias"][client], bias, rtol=1e-4, atol=1e-5)
    # The penalty changed the models (the Fisher is not zero).
    assert not np.allclose(tuned.params["dense"]["kernel"], plain.params["dense"]["kernel"], atol=1e-3)


def test_ewc_at_zero_is_plain_finetuning():
    args = (TASK, LOCAL, ClientStrategy("vmap"), initial_params(), POPULATION, KEY, jnp.float32(LR))
    tuned, plain = _finetune(*args, ewc_lam=jnp.float32(0.0)), _finetune(*args)
    for left, right in zip(jax.tree.leaves(tuned.params), jax.tree.leaves(plain.params), strict=True):
        np.testing.assert_array_equal(left, right)


def test_cli_refuses_ewc_without_finetuning(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["run", *TINY_LABEL_SHIFT, "--clients-per-round", "5", "--finetune-ewc", "1", "--out", str(out)]
    assert_cli_refuses(argv, ["finetune_ewc", "finetune_epochs"], out, capsys)
