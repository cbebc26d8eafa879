"""Slow, independent references for the engine's tests.

Softmax regression trained with plain NumPy float64 loops over clients and
steps: the gradients are written out by hand, not taken from JAX, so a bug in
the engine's batching, masking, weighting or update rule shows up as a
mismatch. Only the random choices (cohort, example orders) are taken from the
engine, through its public functions, since those are tested on their own.
"""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxfl.data.population import ClientPopulation, pack_clients


def tiny_population(
    sizes, *, num_features=5, num_classes=3, seed=0
) -> ClientPopulation:
    """Clients with the given numbers of examples and linearly separable-ish labels."""
    rng = np.random.default_rng(seed)
    true_weights = rng.normal(size=(num_features, num_classes))
    clients = []
    for size in sizes:
        x = rng.normal(size=(size, num_features)).astype(np.float32)
        noise = rng.normal(scale=0.5, size=(size, num_classes))
        y = np.argmax(x @ true_weights + noise, axis=1).astype(np.int32)
        clients.append({"x": x, "y": y})
    return pack_clients(clients)


def softmax_regression_grad(kernel, bias, x, y):
    """Mean cross-entropy gradient of softmax regression, by hand (float64)."""
    logits = x @ kernel + bias
    logits = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    loss = -np.mean(np.log(probs[np.arange(len(y)), y]))
    probs[np.arange(len(y)), y] -= 1.0
    probs /= len(y)
    return x.T @ probs, probs.sum(axis=0), loss


def tilted_risk_reference(losses, tilt):
    """(1/t) log mean exp(t f) in float64 (the mean at t = 0), and its weights softmax(t f)."""
    losses = np.asarray(losses, np.float64)
    if tilt == 0:
        return losses.mean(), np.full(len(losses), 1 / len(losses))
    shifted = tilt * losses - np.max(tilt * losses)
    weights = np.exp(shifted) / np.exp(shifted).sum()
    return (np.log(np.mean(np.exp(shifted))) + np.max(tilt * losses)) / tilt, weights


def tilted_softmax_regression_grad(kernel, bias, x, y, tilt):
    """The gradient of the tilt-tilted risk of the examples' losses: sum_x softmax(t f)_x grad f_x."""
    rows = [softmax_regression_grad(kernel, bias, x[i : i + 1], y[i : i + 1]) for i in range(len(y))]
    _, weights = tilted_risk_reference([loss for _, _, loss in rows], tilt)
    g_kernel = sum(w * g for w, (g, _, _) in zip(weights, rows))
    g_bias = sum(w * g for w, (_, g, _) in zip(weights, rows))
    return g_kernel, g_bias


def local_sgd_reference(
    kernel, bias, x, y, orders, *, batch_size, num_epochs, lr, l2=0.0, mu=0.0,
    max_steps=None, correction=(0.0, 0.0), preconditioner=(1.0, 1.0), sample_tilt=0.0,
    example_clip=None, step_noise=None,
):
    """Minibatch SGD over `orders[e]` (the engine's epoch orders), real steps only.

    `correction` (kernel, bias) is added to every step's gradient (control variates), which is then
    divided by `preconditioner` (kernel, bias) entry by entry. A nonzero `sample_tilt` descends each
    minibatch's tilted risk instead of its mean loss. With `example_clip` C, a step's gradient is
    DP-SGD's: each example's gradient clipped to l2 norm C (kernel and bias together), summed, plus
    `step_noise(step)` (a (kernel, bias) pair, or zeros), over the batch size.
    """
    kernel, bias = np.array(kernel, np.float64), np.array(bias, np.float64)
    anchor_kernel, anchor_bias = kernel.copy(), bias.copy()
    count = len(y)
    steps = 0
    for epoch in range(num_epochs):
        order = np.asarray(orders[epoch][:count])
        for start in range(0, count, batch_size):
            if max_steps is not None and steps >= max_steps:
                return kernel, bias, steps
            rows = order[start : start + batch_size]
            g_kernel, g_bias, _ = softmax_regression_grad(kernel, bias, x[rows], y[rows])
            if example_clip is not None:
                g_kernel, g_bias = np.zeros_like(kernel), np.zeros_like(bias)
                for row in rows:
                    one = slice(row, row + 1)
                    e_kernel, e_bias, _ = softmax_regression_grad(kernel, bias, x[one], y[one])
                    norm = np.sqrt(np.sum(e_kernel**2) + np.sum(e_bias**2))
                    scale = min(1.0, example_clip / norm)
                    g_kernel, g_bias = g_kernel + scale * e_kernel, g_bias + scale * e_bias
                noise = (0.0, 0.0) if step_noise is None else step_noise(steps)
                g_kernel = (g_kernel + noise[0]) / batch_size
                g_bias = (g_bias + noise[1]) / batch_size
            if sample_tilt != 0:
                g_kernel, g_bias = tilted_softmax_regression_grad(kernel, bias, x[rows], y[rows], sample_tilt)
            g_kernel = (g_kernel + mu * (kernel - anchor_kernel) + correction[0]) / preconditioner[0]
            g_bias = (g_bias + mu * (bias - anchor_bias) + correction[1]) / preconditioner[1]
            kernel = (1 - lr * l2) * kernel - lr * g_kernel
            bias = (1 - lr * l2) * bias - lr * g_bias
            steps += 1
    return kernel, bias, steps


def client_loss_reference(kernel, bias, x, y):
    logits = np.asarray(x, np.float64) @ kernel + bias
    logits = logits - logits.max(axis=1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    loss = -np.mean(log_probs[np.arange(len(y)), y])
    error = np.mean(np.argmax(logits, axis=1) != y)
    return loss, error


@contextlib.contextmanager
def imported_script(path):
    """A script of scripts/ or benchmarks/ imported as a module (not as __main__)."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    # Registered first: dataclasses look their module up in sys.modules.
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def csv_rows(path):
    """The rows of a CSV file as dicts (header keys)."""
    with Path(path).open() as f:
        return list(csv.DictReader(f))


def assert_cli_refuses(argv, words, out, capsys):
    """`jaxfl argv` exits 2 with one error line naming every word, and writes nothing at `out`."""
    from jaxfl.cli import main

    status = main(list(argv))
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.count("\n") == 1 and err.startswith("jaxfl: error: "), err
    assert "Traceback" not in err
    for word in words:
        assert word in err, (word, err)
    assert not out.exists() and not Path(str(out) + ".partial").exists()


# The tiny label-shift population the CLI tests run on (40 training and 20 test
# clients from a pool of 20,000 examples): flags for `jaxfl run`.
TINY_LABEL_SHIFT = [
    "--dataset-option", "num_train_clients=40",
    "--dataset-option", "num_validation_clients=0",
    "--dataset-option", "num_test_clients=20",
    "--dataset-option", "pool_size=20000",
]  # fmt: skip


class StopAfter:
    """A stop request (for `jaxfl.experiment.training_loop.current_request`) whose signal appears
    after `calls` reads: one read per compiled call."""

    def __init__(self, calls, number=None):
        import signal

        self.calls = calls
        self.number = signal.SIGINT if number is None else number

    @property
    def signal(self):
        self.calls -= 1
        return self.number if self.calls < 0 else None


def floyd_sample_reference(key, population_size: int, sample_size: int) -> np.ndarray:
    """Robert Floyd's sampling, one step after another in Python.

    Takes the engine's draws (d_i uniform on [0, N - M + i], from the same
    `jax.random.randint` call) and applies Floyd's rule step by step: keep
    d_i unless it was chosen before, else take N - M + i.
    """
    import jax
    import jax.numpy as jnp

    start = population_size - sample_size
    last = jnp.arange(start, population_size, dtype=jnp.int32)
    draws = np.asarray(jax.random.randint(key, (sample_size,), 0, last + 1, dtype=jnp.int32))
    chosen: list[int] = []
    for i, draw in enumerate(draws.tolist()):
        chosen.append(start + i if draw in chosen else draw)
    return np.asarray(chosen, np.int32)


def slow_after(values, keep: int = 1):
    """`values` for `pytest.mark.parametrize` with those after the first `keep` marked slow.

    The default tier checks a mechanism on the first `keep` cases; the slow tier (CI runs both) on every one.
    """
    return [
        value if index < keep else pytest.param(*(value if isinstance(value, tuple) else (value,)),
                                                 marks=pytest.mark.slow)
        for index, value in enumerate(values)
    ]
