"""Local training against a hand-written NumPy SGD, edge cases, jit/vmap."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from reference import (
    client_loss_reference,
    local_sgd_reference,
    softmax_regression_grad,
    tiny_population,
)

from jaxfl.models import make_model
from jaxfl.training.local import (
    LocalHParams,
    LocalTraining,
    Task,
    client_loss_and_error,
    epoch_orders,
    local_sgd,
)

SIZES = [7, 23, 10, 1, 31]
POPULATION = tiny_population(SIZES)
TASK = Task(make_model("linear", (5,), 3))


def _start_params(seed=1):
    rng = np.random.default_rng(seed)
    return {
        "dense": {
            "kernel": jnp.asarray(rng.normal(size=(5, 3)), jnp.float32),
            "bias": jnp.asarray(rng.normal(size=3), jnp.float32),
        }
    }


_local_sgd = jax.jit(local_sgd, static_argnums=(0, 6))


@pytest.mark.parametrize(
    "client, batch_size, num_epochs, lr, l2, mu, max_steps",
    [
        (1, 10, 1, 0.1, None, None, None),  # partial last batch
        (2, 10, 1, 0.1, None, None, None),  # exact multiple of the batch
        (3, 4, 3, 0.2, None, None, None),  # one example, batch larger than data
        (4, 4, 2, 0.05, 0.1, None, None),  # l2 decay
        (0, 3, 2, 0.1, None, 0.5, None),  # proximal term
        (4, 4, 3, 0.1, None, None, 5),  # step cap
    ],
)
# The CPU's loop in the default tier; the scan (the GPU's, also checked against the fused kernel) in the slow one.
@pytest.mark.parametrize("loop", ["while", pytest.param("scan", marks=pytest.mark.slow)])
def test_local_sgd_matches_numpy_reference(client, batch_size, num_epochs, lr, l2, mu, max_steps, loop):
    params = _start_params()
    key = jax.random.key(client + 10)
    config = LocalTraining(batch_size, num_epochs, max_steps, loop=loop)
    hparams = LocalHParams(
        lr=jnp.float32(lr),
        l2=None if l2 is None else jnp.float32(l2),
        prox_mu=None if mu is None else jnp.float32(mu),
    )
    result = _local_sgd(TASK, params, POPULATION, jnp.int32(client), key, hparams, config)
    data = POPULATION.client(client)
    orders = epoch_orders(
        key, POPULATION.counts[client], POPULATION.max_count, num_epochs
    )
    kernel, bias, steps = local_sgd_reference(
        params["dense"]["kernel"], params["dense"]["bias"], data["x"], data["y"],
        np.asarray(orders), batch_size=batch_size, num_epochs=num_epochs, lr=lr,
        l2=l2 or 0.0, mu=mu or 0.0, max_steps=max_steps,
    )
    assert int(result.num_steps) == steps
    np.testing.assert_allclose(result.params["dense"]["kernel"], kernel, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(result.params["dense"]["bias"], bias, rtol=1e-5, atol=1e-5)


def test_epoch_orders_are_fresh_permutations():
    key = jax.random.key(0)
    orders = np.asarray(epoch_orders(key, 23, 31, 4))
    for row in orders:
        assert sorted(row[:23]) == list(range(23))
    # A fresh shuffle each epoch: not all epochs share one order.
    assert len({tuple(row[:23]) for row in orders}) == 4


@pytest.mark.parametrize(
    "max_count, draws",
    [(4, 24_000), pytest.param(1025, 12_000, marks=pytest.mark.slow)],  # Float keys: 12,000 sorts of 1,025.
    ids=["packed-keys", "float-keys"],
)
def test_epoch_orders_are_uniform_permutations(max_count, draws):
    # Every order of 4 examples equally likely (chi-square over the draws,
    # 23 degrees of freedom: 99.9% quantile 49.7), padding positions last in
    # position order, on both the packed-key path and the general one (from
    # 1025 = 2^10 + 1 positions). Sorting the general path's 1025 float keys per
    # draw is the cost (24,000 draws took 6 s): 12,000 (500 per order) still fail,
    # with probability > 0.998, one order 40% more likely than the others, or half
    # of them 20% more likely.
    count = 4
    keys = jax.random.split(jax.random.key(1), draws)
    orders = np.asarray(jax.jit(jax.vmap(lambda k: epoch_orders(k, count, max_count, 1)[0]))(keys))
    padding = np.broadcast_to(np.arange(count, max_count), (draws, max_count - count))
    np.testing.assert_array_equal(orders[:, count:], padding)
    _, frequencies = np.unique(orders[:, :count], axis=0, return_counts=True)
    assert len(frequencies) == 24
    expected = draws / 24
    chi_square = np.sum((frequencies - expected) ** 2 / expected)
    assert chi_square < 49.7


def test_one_client_one_step_equals_centralized_sgd_step():
    # A single full-batch step on one client is one step of gradient descent
    # on that client's data, computed here with optax.
    params = _start_params()
    client = 2
    config = LocalTraining(batch_size=POPULATION.max_count, num_epochs=1)
    result = _local_sgd(
        TASK, params, POPULATION, jnp.int32(client), jax.random.key(0),
        LocalHParams(lr=jnp.float32(0.3)), config,
    )
    data = POPULATION.client(client)

    def loss(p):
        return TASK.example_stats(p, data).loss.mean()

    tx = optax.sgd(0.3)
    updates, _ = tx.update(jax.grad(loss)(params), tx.init(params))
    expected = optax.apply_updates(params, updates)
    assert int(result.num_steps) == 1
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6),
        result.params, expected,
    )


def test_padded_steps_change_nothing():
    # Client 3 has one example: one real step per epoch; the scan runs
    # ceil(31 / 4) * 2 = 16 steps. Its result must be the two real steps.
    params = _start_params()
    key = jax.random.key(5)
    result = _local_sgd(
        TASK, params, POPULATION, jnp.int32(3), key,
        LocalHParams(lr=jnp.float32(0.1)), LocalTraining(4, 2),
    )
    data = POPULATION.client(3)
    kernel = np.array(params["dense"]["kernel"], np.float64)
    bias = np.array(params["dense"]["bias"], np.float64)
    for _ in range(2):
        g_kernel, g_bias, _ = softmax_regression_grad(kernel, bias, data["x"], data["y"])
        kernel, bias = kernel - 0.1 * g_kernel, bias - 0.1 * g_bias
    assert int(result.num_steps) == 2
    np.testing.assert_allclose(result.params["dense"]["kernel"], kernel, rtol=1e-5, atol=1e-6)


def test_inactive_client_and_zero_lr_keep_params():
    params = _start_params()
    config = LocalTraining(4, 1)
    inactive = _local_sgd(
        TASK, params, POPULATION, jnp.int32(1), jax.random.key(0),
        LocalHParams(lr=jnp.float32(0.5)), config, active=False,
    )
    assert int(inactive.num_steps) == 0
    jax.tree.map(np.testing.assert_array_equal, inactive.params, params)


@pytest.mark.parametrize("loop", ["scan", "while"])
def test_vmap_over_clients_matches_loop(loop):
    params = _start_params()
    config = LocalTraining(4, 2, loop=loop)
    hparams = LocalHParams(lr=jnp.float32(0.1))
    ids = jnp.arange(len(SIZES), dtype=jnp.int32)
    keys = jax.vmap(jax.random.key)(ids)
    batched = jax.jit(
        jax.vmap(lambda i, k: local_sgd(TASK, params, POPULATION, i, k, hparams, config))
    )(ids, keys)
    for i in range(len(SIZES)):
        single = _local_sgd(TASK, params, POPULATION, ids[i], keys[i], hparams, config)
        np.testing.assert_allclose(
            batched.params["dense"]["kernel"][i], single.params["dense"]["kernel"],
            rtol=1e-5, atol=1e-6,
        )
        assert int(batched.num_steps[i]) == int(single.num_steps)


@pytest.mark.parametrize("scan_unroll", [3, 1000])
def test_unrolled_scan_matches_numpy_reference(scan_unroll):
    # 3 does not divide the 16 scanned steps (batch 4, 2 epochs of up to 31 examples); 1000 unrolls all.
    params = _start_params()
    config = LocalTraining(4, 2, loop="scan", scan_unroll=scan_unroll)
    hparams = LocalHParams(lr=jnp.float32(0.1))
    for client in (1, 3):
        key = jax.random.key(client)
        result = _local_sgd(TASK, params, POPULATION, jnp.int32(client), key, hparams, config)
        orders = epoch_orders(key, POPULATION.counts[client], POPULATION.max_count, 2)
        data = POPULATION.client(client)
        kernel, bias, steps = local_sgd_reference(
            params["dense"]["kernel"], params["dense"]["bias"], data["x"], data["y"],
            np.asarray(orders), batch_size=4, num_epochs=2, lr=0.1, l2=0.0, mu=0.0, max_steps=None,
        )
        assert int(result.num_steps) == steps
        np.testing.assert_allclose(result.params["dense"]["kernel"], kernel, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(result.params["dense"]["bias"], bias, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk_size", [1, 4, 16, 128])
def test_client_loss_and_error_matches_reference(chunk_size):
    params = _start_params()
    fn = jax.jit(client_loss_and_error, static_argnums=0, static_argnames="chunk_size")
    for client in range(len(SIZES)):
        loss, error = fn(TASK, params, POPULATION, jnp.int32(client), chunk_size=chunk_size)
        data = POPULATION.client(client)
        ref_loss, ref_error = client_loss_reference(
            np.asarray(params["dense"]["kernel"]), np.asarray(params["dense"]["bias"]),
            data["x"], data["y"],
        )
        np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
        np.testing.assert_allclose(error, ref_error, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(batch_size=0), "batch_size"),
        (dict(batch_size=2, num_epochs=0), "num_epochs"),
        (dict(batch_size=2, max_steps=0), "max_steps"),
        (dict(batch_size=2, loop="for"), "loop"),
        (dict(batch_size=2, scan_unroll=0), "scan_unroll"),
    ],
)
def test_local_training_rejects_bad_shapes(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LocalTraining(**kwargs)


def test_scan_length():
    assert LocalTraining(10, 2).scan_length(31) == 8
    assert LocalTraining(10, 2, max_steps=5).scan_length(31) == 5
    assert int(LocalTraining(10, 3).num_steps(jnp.int32(21))) == 9
