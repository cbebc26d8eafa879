"""Ditto against a NumPy per-client loop with persistent personal models.

The reference keeps v_k for every client across rounds, trains the sampled
ones with v <- v - lr (grad F_k(v) + lambda (v - w_t)) on the minibatches of
their global local training (the engine's epoch orders for
fold_in(keys.clients, k)) and FedAvg's global model beside them; clients never
sampled keep v_k = w_0.
"""

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
    _epoch_orders,
    _sample_cohort,
    assert_params_close,
    fedavg_reference,
    initial_params,
    proximal_steps_reference,
    run_rounds,
)
from reference import local_sgd_reference

from jaxfl.algorithms import deltafl, fedavg
from jaxfl.algorithms.ditto import ditto
from jaxfl.training import ClientStrategy
from jaxfl.training.cohort import round_keys

M = 4
LR = 0.1
KEY = jax.random.key(3)
N = len(SIZES)


@functools.cache
def build(kind="fedavg", strategy="vmap"):
    layout = ClientStrategy(strategy)
    if kind == "fedavg":
        inner = fedavg(TASK, LOCAL, M, strategy=layout)
    else:
        inner = deltafl(TASK, LOCAL, M, strategy=layout)
    return ditto(inner, LOCAL, N)


def personal_reference(w0, key, num_rounds, lam):
    """(global kernel, bias, personal kernels [N], personal biases [N])."""
    kernel = np.array(w0["dense"]["kernel"], np.float64)
    bias = np.array(w0["dense"]["bias"], np.float64)
    v_kernel = np.repeat(kernel[None], N, axis=0)
    v_bias = np.repeat(bias[None], N, axis=0)
    counts = np.asarray(POPULATION.counts)
    for r in range(num_rounds):
        keys = round_keys(key, jnp.int32(r))
        ids = np.asarray(_sample_cohort(keys.sampling, POPULATION, M))
        deltas, alpha = [], counts[ids].astype(np.float64)
        for i in ids:
            data = POPULATION.client(int(i))
            orders = np.asarray(
                _epoch_orders(
                    jax.random.fold_in(keys.clients, int(i)),
                    POPULATION.counts[i],
                    POPULATION.max_count,
                    LOCAL.num_epochs,
                )
            )
            k, b, _ = local_sgd_reference(
                kernel, bias, data["x"], data["y"], orders,
                batch_size=LOCAL.batch_size, num_epochs=LOCAL.num_epochs, lr=LR,
            )
            deltas.append((k - kernel, b - bias))
            # The personal model: same minibatches, anchored at w_t.
            v_kernel[i], v_bias[i] = proximal_steps_reference(
                v_kernel[i], v_bias[i], data, orders, kernel, bias, lam, LR
            )
        weights = alpha / alpha.sum()
        kernel = kernel + sum(w * d[0] for w, d in zip(weights, deltas, strict=True))
        bias = bias + sum(w * d[1] for w, d in zip(weights, deltas, strict=True))
    return kernel, bias, v_kernel, v_bias


@pytest.mark.parametrize("lam", [0.0, 0.5])
def test_ditto_matches_numpy_loop_with_persistent_personal_models(lam):
    algorithm = build()
    state = algorithm.init(initial_params(), {"lr": LR, "lam": lam})
    # Four rounds of 4 of 8 clients: some clients are sampled twice or more
    # (their v_k carries over), and the reference says which never were.
    state, metrics = run_rounds(algorithm, state, 4, KEY)
    kernel, bias, v_kernel, v_bias = personal_reference(initial_params(), KEY, 4, lam)
    assert_params_close(state.params, kernel, bias)
    np.testing.assert_allclose(state.clients["dense"]["kernel"], v_kernel, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state.clients["dense"]["bias"], v_bias, rtol=1e-4, atol=1e-5)
    assert all(np.isfinite(m["personal_train_loss"]) for m in metrics)
    assert float(state.hparams["lam"]) == lam


def test_global_model_is_the_global_algorithms():
    # Only Delta is sent: G's trajectory is G's alone, bit for bit.
    alone = fedavg(TASK, LOCAL, M, strategy=ClientStrategy("vmap"))
    with_ditto = build()
    state_alone, _ = run_rounds(alone, alone.init(initial_params(), {"lr": LR}), 3, KEY)
    state_ditto, _ = run_rounds(
        with_ditto, with_ditto.init(initial_params(), {"lr": LR, "lam": 2.0}), 3, KEY
    )
    for a, b in zip(jax.tree.leaves(state_alone.params), jax.tree.leaves(state_ditto.params), strict=True):
        np.testing.assert_array_equal(a, b)
    kernel, bias = fedavg_reference(initial_params(), KEY, 3, clients_per_round=M, lr=LR)
    assert_params_close(state_ditto.params, kernel, bias)


def test_ditto_on_deltafl_keeps_its_hparams_and_trains_personal_models():
    algorithm = build("deltafl")
    assert {"theta", "lam", "lr"} <= set(algorithm.hparam_defaults)
    state = algorithm.init(initial_params(), {"lr": LR, "lam": 1.0, "theta": 0.5})
    state, _ = run_rounds(algorithm, state, 2, KEY)
    sampled = set()
    for r in range(2):
        keys = round_keys(KEY, jnp.int32(r))
        sampled |= set(np.asarray(_sample_cohort(keys.sampling, POPULATION, M)).tolist())
    w0 = initial_params()["dense"]["kernel"]
    for i in range(N):
        moved = not np.allclose(state.clients["dense"]["kernel"][i], w0)
        # Every sampled client trains its personal model, filtered or not.
        assert moved == (i in sampled)


@pytest.mark.slow
def test_sharded_layout_matches_vmap():
    vmapped, sharded = build(), build(strategy="sharded")
    start = {"lr": LR, "lam": 0.5}
    a, _ = run_rounds(vmapped, vmapped.init(initial_params(), start), 2, KEY)
    b, _ = run_rounds(
        sharded, sharded.init(initial_params(), start), 2, KEY, strategy=ClientStrategy("sharded")
    )
    for x, y in zip(jax.tree.leaves(a.clients), jax.tree.leaves(b.clients), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_ditto_refuses_bad_settings():
    inner = fedavg(TASK, LOCAL, M, strategy=ClientStrategy("vmap"))
    with pytest.raises(ValueError, match="num_clients >= 1"):
        ditto(inner, LOCAL, 0)
    with pytest.raises(ValueError, match="unknown hyperparameters"):
        build().init(initial_params(), {"mu": 1.0})


def test_finetuning_baseline_matches_numpy_local_sgd_from_the_global_model():
    from jaxfl.training import LocalTraining
    from jaxfl.training.cohort import finetune_models

    local = LocalTraining(batch_size=4, num_epochs=3)
    key = jax.random.key(5)
    tuned = jax.jit(finetune_models, static_argnums=(0, 1, 2))(
        TASK, local, ClientStrategy("vmap"), initial_params(), POPULATION, key, jnp.float32(LR)
    )
    w0 = initial_params()["dense"]
    for i in range(N):
        data = POPULATION.client(i)
        orders = _epoch_orders(jax.random.fold_in(key, i), POPULATION.counts[i], POPULATION.max_count, 3)
        kernel, bias, steps = local_sgd_reference(
            w0["kernel"], w0["bias"], data["x"], data["y"], np.asarray(orders),
            batch_size=4, num_epochs=3, lr=LR,
        )
        np.testing.assert_allclose(tuned.params["dense"]["kernel"][i], kernel, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(tuned.params["dense"]["bias"][i], bias, rtol=1e-4, atol=1e-5)
        assert int(tuned.num_steps[i]) == steps
