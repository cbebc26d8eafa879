"""The tilted losses of local training: a minibatch's and a client's (over chunks) against NumPy, tau = 0
the mean (a minibatch's bit for bit, with a finite gradient), under jit and vmap over tau."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import client_loss_reference, tilted_risk_reference, tiny_population

from jaxfl.models import make_model
from jaxfl.training import Task
from jaxfl.training.local import client_loss_and_error, minibatch_loss, tilted_minibatch_loss

POPULATION = tiny_population([23, 9, 1], seed=2)
TASK = Task(make_model("linear", (5,), 3))
# Compiled once for every test and tau (tau traced).
TILTED_LOSS = jax.jit(jax.value_and_grad(
    lambda p, batch, valid, tau: tilted_minibatch_loss(TASK, p, batch, valid, tau)
))


def params():
    leaves, treedef = jax.tree.flatten(TASK.model.init(jax.random.key(0)))
    keys = jax.random.split(jax.random.key(1), len(leaves))
    return jax.tree.unflatten(treedef, [jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)])


def example_losses(p, x, y):
    kernel, bias = np.asarray(p["dense"]["kernel"], np.float64), np.asarray(p["dense"]["bias"], np.float64)
    return [client_loss_reference(kernel, bias, x[i : i + 1], y[i : i + 1])[0] for i in range(len(y))]


@pytest.mark.parametrize("tau", [-4.0, -0.5, 0.7, 5.0])
def test_a_minibatchs_tilted_risk_against_numpy_padding_left_out(tau):
    data = POPULATION.client(0)
    batch = {"x": jnp.asarray(data["x"][:8]), "y": jnp.asarray(data["y"][:8])}
    valid = jnp.arange(8) < 6  # Two padded rows.
    p = params()
    value, _ = TILTED_LOSS(p, batch, valid, jnp.float32(tau))
    expected, _ = tilted_risk_reference(example_losses(p, data["x"][:6], data["y"][:6]), tau)
    np.testing.assert_allclose(value, expected, rtol=1e-5)


def test_zero_tau_is_the_mean_bit_for_bit_with_a_finite_gradient():
    data = POPULATION.client(0)
    batch = {"x": jnp.asarray(data["x"][:8]), "y": jnp.asarray(data["y"][:8])}
    valid = jnp.arange(8) < 7
    p = params()
    tilted = jax.jit(
        jax.value_and_grad(lambda q: tilted_minibatch_loss(TASK, q, batch, valid, jnp.float32(0)))
    )
    mean = jax.jit(jax.value_and_grad(lambda q: minibatch_loss(TASK, q, batch, valid)))
    (a, grad_a), (b, grad_b) = tilted(p), mean(p)
    assert a == b
    for x, y in zip(jax.tree.leaves(grad_a), jax.tree.leaves(grad_b), strict=True):
        assert np.all(np.isfinite(x))
        np.testing.assert_allclose(x, y, rtol=1e-7, atol=0)


@pytest.mark.parametrize("chunk_size", [4, 128])
def test_a_clients_tilted_risk_over_chunks_against_numpy(chunk_size):
    p = params()
    taus = jnp.asarray([-3.0, 0.0, 0.4, 6.0], jnp.float32)
    clients = jnp.arange(3, dtype=jnp.int32)
    # One program for every client and tau (both traced), and one for the untilted mean.
    tilted = jax.jit(jax.vmap(jax.vmap(
        lambda c, tau: client_loss_and_error(TASK, p, POPULATION, c, chunk_size=chunk_size, tilt=tau),
        in_axes=(None, 0)), in_axes=(0, None)))
    plain = jax.jit(jax.vmap(lambda c: client_loss_and_error(TASK, p, POPULATION, c, chunk_size=chunk_size)))
    values, errors = (np.asarray(a) for a in tilted(clients, taus))
    means, mean_errors = (np.asarray(a) for a in plain(clients))
    for client in range(3):
        data = POPULATION.client(client)
        losses = example_losses(p, data["x"], data["y"])
        for tau, value in zip(np.asarray(taus), values[client]):
            np.testing.assert_allclose(value, tilted_risk_reference(losses, tau)[0], rtol=2e-5)
        # tau = 0: the mean (to rounding: the tilted sums beside the plain ones may change how XLA
        # orders the plain ones' additions; 1 ulp is seen with several chunks).
        np.testing.assert_allclose(values[client, 1], means[client], rtol=1e-6)
        np.testing.assert_allclose(errors[client], mean_errors[client])


def test_a_batch_of_padding_has_loss_zero_and_no_gradient():
    data = POPULATION.client(0)
    batch = {"x": jnp.asarray(data["x"][:4]), "y": jnp.asarray(data["y"][:4])}
    batch = {name: jnp.concatenate([value, value]) for name, value in batch.items()}  # The shapes above.
    value, grads = TILTED_LOSS(params(), batch, jnp.zeros(8, bool), jnp.float32(2.0))
    assert value == 0.0 and all(np.all(g == 0) for g in jax.tree.leaves(grads))
