"""Per-FedAvg (HF) against a NumPy loop, and its personal models (one adaptation step) against NumPy.

The reference deals each local step's minibatch into D, D', D'' by position
(mod 3), takes w_tilde = w - alpha grad F(w; D), g = grad F(w_tilde; D'), the
finite difference h = (grad F(w + delta g; D'') - grad F(w - delta g; D'')) /
(2 delta), and steps w <- w - lr (g - alpha h), with softmax regression's
gradients by hand; the server averages the local models FedAvg's way.
"""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from algorithms.reference_rounds import (
    LOCAL,
    POPULATION,
    SIZES,
    TASK,
    _sample_cohort,
    client_orders,
    initial_params,
    run_rounds,
)
from reference import TINY_LABEL_SHIFT, softmax_regression_grad

from jaxfl.algorithms.perfedavg import adapted_models, perfedavg
from jaxfl.cli import main
from jaxfl.training import ClientStrategy
from jaxfl.training.cohort import round_keys

M = 3
LR = 0.1
ALPHA, DELTA = 0.3, 0.01  # A large alpha, so that the curvature term matters.
KEY = jax.random.key(29)


@functools.cache
def build():
    return perfedavg(TASK, LOCAL, M, strategy=ClientStrategy("vmap"))


def gradient(kernel, bias, x, y):
    if len(y) == 0:
        return np.zeros_like(kernel), np.zeros_like(bias)
    grad_kernel, grad_bias, _ = softmax_regression_grad(kernel, bias, x, y)
    return grad_kernel, grad_bias


def hessian_free_steps(kernel, bias, data, orders):
    count = len(data["y"])
    for epoch in range(LOCAL.num_epochs):
        order = orders[epoch][:count]
        for start in range(0, count, LOCAL.batch_size):
            rows = order[start : start + LOCAL.batch_size]
            parts = [rows[part::3] for part in range(3)]
            x, y = [data["x"][p] for p in parts], [data["y"][p] for p in parts]
            gk, gb = gradient(kernel, bias, x[0], y[0])
            mk, mb = gradient(kernel - ALPHA * gk, bias - ALPHA * gb, x[1], y[1])
            pk, pb = gradient(kernel + DELTA * mk, bias + DELTA * mb, x[2], y[2])
            nk, nb = gradient(kernel - DELTA * mk, bias - DELTA * mb, x[2], y[2])
            kernel = kernel - LR * (mk - ALPHA * (pk - nk) / (2 * DELTA))
            bias = bias - LR * (mb - ALPHA * (pb - nb) / (2 * DELTA))
    return kernel, bias


def perfedavg_reference(num_rounds):
    w0 = initial_params()["dense"]
    kernel, bias = np.array(w0["kernel"], np.float64), np.array(w0["bias"], np.float64)
    counts = np.asarray(POPULATION.counts)
    for r in range(num_rounds):
        keys = round_keys(KEY, jnp.int32(r))
        ids = np.asarray(_sample_cohort(keys.sampling, POPULATION, M))
        local = [
            hessian_free_steps(kernel, bias, POPULATION.client(int(i)), client_orders(keys, i)) for i in ids
        ]
        weights = counts[ids] / counts[ids].sum()
        kernel = sum(w * k for w, (k, _) in zip(weights, local, strict=True))
        bias = sum(w * b for w, (_, b) in zip(weights, local, strict=True))
    return kernel, bias


def test_perfedavg_matches_numpy_loop():
    algorithm = build()
    hparams = {"lr": LR, "perfedavg_alpha": ALPHA, "perfedavg_delta": DELTA}
    state, metrics = run_rounds(algorithm, algorithm.init(initial_params(), hparams), 3, KEY)
    kernel, bias = perfedavg_reference(3)
    np.testing.assert_allclose(state.params["dense"]["kernel"], kernel, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state.params["dense"]["bias"], bias, rtol=1e-4, atol=1e-5)
    assert all(np.isfinite(m["train_loss"]) for m in metrics)


def test_personal_models_are_one_adaptation_step_on_all_the_clients_data():
    params = initial_params()
    adapted = jax.jit(adapted_models, static_argnums=(0, 1))(
        TASK, ClientStrategy("vmap"), params, POPULATION, jnp.float32(ALPHA)
    )
    kernel, bias = (
        np.asarray(params["dense"]["kernel"], np.float64),
        np.asarray(params["dense"]["bias"], np.float64),
    )
    for k in range(len(SIZES)):
        data = POPULATION.client(k)
        gk, gb = gradient(kernel, bias, data["x"], data["y"])
        np.testing.assert_allclose(adapted["dense"]["kernel"][k], kernel - ALPHA * gk, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(adapted["dense"]["bias"][k], bias - ALPHA * gb, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_perfedavg_sweep_points_make_their_adapted_models(tmp_path, capsys):
    """A sweep's points make their adapted models (a single run's: test_cli_algorithms.py)."""
    sweep = tmp_path / "sweep"
    argv = [
        "sweep", *TINY_LABEL_SHIFT, "--rounds", "2", "--clients-per-round", "8", "--eval-every", "2",
        "--no-progress", "--algorithm", "perfedavg", "--client-split", "0.25", "--batch-size", "30",
        "--grid", "perfedavg_alpha=0.5,1e-9", "--eval-train", "--out", str(sweep),
    ]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()
    points = [json.loads((sweep / "points" / f"00{g}" / "summary.json").read_text()) for g in (0, 1)]
    adapted, unadapted = sorted(points, key=lambda p: -p["hparams"]["perfedavg_alpha"])
    # One step on its own data lowers each client's training loss on average; alpha = 0 is the global model.
    assert adapted["personal_train_loss"]["mean"] < adapted["train_loss"]["mean"]
    assert unadapted["personal_train_loss"]["mean"] == pytest.approx(
        unadapted["train_loss"]["mean"], rel=1e-6
    )
