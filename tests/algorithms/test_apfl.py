"""APFL against a NumPy per-client loop with persistent local models.

The reference keeps v_k for every client across rounds. Each round, every
sampled client runs, on the minibatches of its FedAvg local training (the
engine's epoch orders for fold_in(keys.clients, k)), the joint steps
w <- w - lr grad F(w) and v <- v - lr alpha grad F(alpha v + (1 - alpha) w)
from (w_t, v_k); the server model is FedAvg's (the examples-weighted mean of
the w updates). The personal model is alpha v_k + (1 - alpha) w.
"""

import csv
import dataclasses
import functools

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
    plan_key,
    run_rounds,
)
from reference import TINY_LABEL_SHIFT, slow_after, softmax_regression_grad

from jaxfl.algorithms import fedavg
from jaxfl.algorithms.apfl import apfl
from jaxfl.algorithms.plans import random_subset_mask
from jaxfl.cli import main
from jaxfl.training import ClientStrategy
from jaxfl.training.cohort import round_keys

M = 3
LR = 0.1
KEY = jax.random.key(11)
N = len(SIZES)


@functools.cache
def build(strategy="vmap"):
    layout = ClientStrategy(strategy)
    return apfl(fedavg(TASK, LOCAL, M, strategy=layout), LOCAL, N)


def joint_steps_reference(w, v, data, orders, alpha, alpha_lr=0.0):
    """One client's APFL local steps by hand, float64: ((w kernel, bias), (v kernel, bias), alpha).

    With `alpha_lr`, alpha steps by <v - w, grad F(mixture)> at each step's (v, w), clipped to [0, 1].
    """
    (wk, wb), (vk, vb) = w, v
    count = len(data["y"])
    for epoch in range(LOCAL.num_epochs):
        order = orders[epoch][:count]
        for start in range(0, count, LOCAL.batch_size):
            rows = order[start : start + LOCAL.batch_size]
            x, y = data["x"][rows], data["y"][rows]
            gwk, gwb, _ = softmax_regression_grad(wk, wb, x, y)
            gmk, gmb, _ = softmax_regression_grad(
                alpha * vk + (1 - alpha) * wk, alpha * vb + (1 - alpha) * wb, x, y
            )
            alpha_grad = np.sum((vk - wk) * gmk) + np.sum((vb - wb) * gmb)
            wk, wb = wk - LR * gwk, wb - LR * gwb
            vk, vb = vk - LR * alpha * gmk, vb - LR * alpha * gmb
            alpha = float(np.clip(alpha - alpha_lr * alpha_grad, 0.0, 1.0))
    return (wk, wb), (vk, vb), alpha


def apfl_reference(w0, num_rounds, alpha, alpha_lr=0.0):
    kernel = np.array(w0["dense"]["kernel"], np.float64)
    bias = np.array(w0["dense"]["bias"], np.float64)
    v_kernel, v_bias = np.repeat(kernel[None], N, axis=0), np.repeat(bias[None], N, axis=0)
    alphas = np.full(N, alpha)
    counts = np.asarray(POPULATION.counts)
    for r in range(num_rounds):
        keys = round_keys(KEY, jnp.int32(r))
        ids = np.asarray(_sample_cohort(keys.sampling, POPULATION, M))
        updates = []
        for i in ids:
            (wk, wb), (v_kernel[i], v_bias[i]), alphas[i] = joint_steps_reference(
                (kernel, bias),
                (v_kernel[i], v_bias[i]),
                POPULATION.client(int(i)),
                client_orders(keys, i),
                alphas[i],
                alpha_lr,
            )
            updates.append((wk - kernel, wb - bias))
        weights = counts[ids] / counts[ids].sum()
        kernel = kernel + sum(w * u[0] for w, u in zip(weights, updates, strict=True))
        bias = bias + sum(w * u[1] for w, u in zip(weights, updates, strict=True))
    if alpha_lr:
        return kernel, bias, v_kernel, v_bias, alphas
    return kernel, bias, v_kernel, v_bias


@pytest.mark.parametrize("alpha", slow_after([0.3, 1.0]))
def test_apfl_matches_numpy_loop(alpha):
    algorithm = build()
    state = algorithm.init(initial_params(), {"lr": LR, "apfl_alpha": alpha})
    state, metrics = run_rounds(algorithm, state, 4, KEY)
    kernel, bias, v_kernel, v_bias = apfl_reference(initial_params(), 4, alpha)
    np.testing.assert_allclose(state.params["dense"]["kernel"], kernel, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state.params["dense"]["bias"], bias, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state.clients["dense"]["kernel"], v_kernel, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state.clients["dense"]["bias"], v_bias, rtol=1e-4, atol=1e-5)
    personal = algorithm.personal_models(state)
    np.testing.assert_allclose(
        personal["dense"]["kernel"], alpha * v_kernel + (1 - alpha) * kernel[None], rtol=1e-4, atol=1e-5
    )
    assert all(np.isfinite(m["personal_train_loss"]) for m in metrics)


def test_adaptive_alpha_matches_numpy_loop():
    layout = ClientStrategy("vmap")
    algorithm = apfl(fedavg(TASK, LOCAL, M, strategy=layout), LOCAL, N, alpha_lr=2.0)
    state = algorithm.init(initial_params(), {"lr": LR, "apfl_alpha": 0.5})
    state, metrics = run_rounds(algorithm, state, 4, KEY)
    kernel, bias, v_kernel, v_bias, alphas = apfl_reference(initial_params(), 4, 0.5, alpha_lr=2.0)
    np.testing.assert_allclose(state.params["dense"]["kernel"], kernel, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state.clients["local"]["dense"]["kernel"], v_kernel, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state.clients["local"]["dense"]["bias"], v_bias, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state.clients["alpha"], alphas, rtol=1e-4, atol=1e-5)
    # The alphas moved, apart (not one shared value), and clients never sampled kept alpha^0.
    trained = alphas != 0.5
    assert trained.any() and len(set(np.round(alphas[trained], 4))) > 1
    personal = algorithm.personal_models(state)
    mixed = alphas[:, None, None] * v_kernel + (1 - alphas[:, None, None]) * kernel[None]
    np.testing.assert_allclose(personal["dense"]["kernel"], mixed, rtol=1e-4, atol=1e-5)
    assert 0.0 <= metrics[-1]["apfl_alpha_mean"] <= 1.0


def test_apfl_global_model_is_fedavgs_bit_for_bit():
    fedavg_alone = fedavg(TASK, LOCAL, M, strategy=ClientStrategy("vmap"))
    hparams = {"lr": LR}
    with_apfl, _ = run_rounds(build(), build().init(initial_params(), {**hparams, "apfl_alpha": 0.5}), 3, KEY)
    alone, _ = run_rounds(fedavg_alone, fedavg_alone.init(initial_params(), hparams), 3, KEY)
    for left, right in zip(jax.tree.leaves(with_apfl.params), jax.tree.leaves(alone.params), strict=True):
        np.testing.assert_array_equal(left, right)


@pytest.mark.slow
def test_sharded_layout_matches_vmap():
    vmapped, sharded = build(), build(strategy="sharded")
    start = {"lr": LR, "apfl_alpha": 0.5}
    expected, _ = run_rounds(vmapped, vmapped.init(initial_params(), start), 2, KEY)
    got, _ = run_rounds(
        sharded, sharded.init(initial_params(), start), 2, KEY, strategy=ClientStrategy("sharded")
    )
    for left, right in zip(jax.tree.leaves(got.clients), jax.tree.leaves(expected.clients), strict=True):
        np.testing.assert_allclose(left, right, rtol=1e-5, atol=1e-6)


def test_stragglers_dropped_by_fedavg_keep_their_local_models():
    layout = ClientStrategy("vmap")
    global_algorithm = fedavg(TASK, LOCAL, 4, strategy=layout, stragglers=0.5)
    algorithm = apfl(global_algorithm, LOCAL, N)
    state, metrics = run_rounds(algorithm, algorithm.init(initial_params(), {"lr": LR}), 1, KEY)
    keys = round_keys(KEY, jnp.int32(0))
    ids = np.asarray(_sample_cohort(keys.sampling, POPULATION, 4))
    # FedAvg's choice of stragglers, from the plan key of round 0 (jaxfl.algorithms.fedavg).
    choice_key, _ = jax.random.split(plan_key(KEY, 0))
    straggling = np.asarray(random_subset_mask(choice_key, jnp.asarray(ids), 2))
    assert metrics[0]["stragglers"] == 2 == straggling.sum()
    start = np.asarray(initial_params()["dense"]["kernel"])
    moved = [not np.array_equal(state.clients["dense"]["kernel"][i], start) for i in range(N)]
    assert moved == [i in set(ids[~straggling]) for i in range(N)]


def test_personal_models_of_a_stacked_sweep_state():
    """As a sweep evaluates them (`jax.vmap(algorithm.personal_models)` over the points): alpha = 0 gives the
    global model, alpha = 1 the local models."""
    algorithm = build()
    state, _ = run_rounds(algorithm, algorithm.init(initial_params(), {"lr": LR, "apfl_alpha": 0.5}), 2, KEY)
    points = [
        dataclasses.replace(state, hparams={**state.hparams, "apfl_alpha": jnp.float32(alpha)})
        for alpha in (0, 1)
    ]
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *points)
    personal = jax.vmap(algorithm.personal_models)(stacked)
    for mixed, local_rows, global_leaf in zip(
        jax.tree.leaves(personal), jax.tree.leaves(state.clients), jax.tree.leaves(state.params), strict=True
    ):
        np.testing.assert_array_equal(mixed[0], np.broadcast_to(global_leaf, local_rows.shape))
        np.testing.assert_array_equal(mixed[1], local_rows)


@pytest.mark.slow
def test_apfl_run_reports_and_saves_the_mixtures(tmp_path, capsys):
    """`jaxfl run` evaluates and saves alpha v_k + (1 - alpha) w: at alpha = 0, the global model."""
    from jaxfl.experiment.saved_model import load_model

    out = tmp_path / "run"
    argv = [
        "run", *TINY_LABEL_SHIFT, "--rounds", "2", "--clients-per-round", "8", "--eval-every", "2",
        "--no-progress", "--algorithm", "apfl", "--apfl-alpha", "0", "--client-split", "0.25",
        "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    assert "apfl (personal)" in capsys.readouterr().out
    with (out / "clients.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["population"] == "test"]
    assert [r["personal_error"] for r in rows] == [r["error"] for r in rows]
    saved = load_model(out)
    for personal, global_leaf in zip(
        jax.tree.leaves(saved.personal), jax.tree.leaves(saved.params), strict=True
    ):
        assert personal.shape == (40, *global_leaf.shape)
        np.testing.assert_array_equal(personal, np.broadcast_to(global_leaf, personal.shape))
