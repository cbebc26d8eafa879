"""FedAvg: compiled round against a plain Python loop over clients, and the
round's contract (one trace, determinism, server optimizers, weights)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from reference import local_sgd_reference, slow_after, tiny_population

from jaxfl.algorithms import fedavg, server_optimizer
from jaxfl.models import make_model
from jaxfl.training import ClientStrategy, LocalTraining, Task
from jaxfl.training.cohort import round_keys, sample_cohort
from jaxfl.training.local import epoch_orders

SIZES = [7, 23, 10, 1, 31, 12, 5, 18]
POPULATION = tiny_population(SIZES, seed=4)
TASK = Task(make_model("linear", (5,), 3))
LOCAL = LocalTraining(batch_size=4, num_epochs=2)


def _reference_rounds(params, key, num_rounds, *, clients_per_round, lr, weighting):
    kernel = np.array(params["dense"]["kernel"], np.float64)
    bias = np.array(params["dense"]["bias"], np.float64)
    for r in range(num_rounds):
        keys = round_keys(key, jnp.int32(r))
        ids = np.asarray(sample_cohort(keys.sampling, POPULATION, clients_per_round))
        deltas, weights = [], []
        for i in ids:  # The slow path: one client at a time, NumPy float64.
            client_key = jax.random.fold_in(keys.clients, int(i))
            orders = epoch_orders(
                client_key, POPULATION.counts[i], POPULATION.max_count, LOCAL.num_epochs
            )
            data = POPULATION.client(int(i))
            k, b, _ = local_sgd_reference(
                kernel, bias, data["x"], data["y"], np.asarray(orders),
                batch_size=LOCAL.batch_size, num_epochs=LOCAL.num_epochs, lr=lr,
            )
            deltas.append((k - kernel, b - bias))
            weights.append(SIZES[i] if weighting == "num_examples" else 1.0)
        weights = np.asarray(weights) / np.sum(weights)
        kernel = kernel + sum(w * d[0] for w, d in zip(weights, deltas, strict=True))
        bias = bias + sum(w * d[1] for w, d in zip(weights, deltas, strict=True))
    return kernel, bias


@pytest.mark.parametrize("weighting", slow_after(["num_examples", "uniform"]))
def test_compiled_rounds_equal_python_loop(weighting):
    algorithm = fedavg(
        TASK, LOCAL, 5, strategy=ClientStrategy("vmap"), client_weighting=weighting
    )
    params = TASK.model.init(jax.random.key(0))
    params = jax.tree.map(lambda p: p + 0.1, params)
    state = algorithm.init(params, {"lr": 0.2})
    key = jax.random.key(7)
    round_fn = jax.jit(algorithm.round)
    for _ in range(3):
        state, _ = round_fn(state, POPULATION, key)
    kernel, bias = _reference_rounds(
        params, key, 3, clients_per_round=5, lr=0.2, weighting=weighting
    )
    np.testing.assert_allclose(state.params["dense"]["kernel"], kernel, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state.params["dense"]["bias"], bias, rtol=1e-4, atol=1e-5)
    assert int(state.round) == 3


def test_round_is_traced_once_over_many_rounds():
    traces = []
    algorithm = fedavg(TASK, LOCAL, 3, strategy=ClientStrategy("sequential"))

    def counted_round(state, population, key):
        traces.append(1)  # Runs at trace time only.
        return algorithm.round(state, population, key)

    round_fn = jax.jit(counted_round, donate_argnums=0)
    state = algorithm.init(TASK.model.init(jax.random.key(0)), {"lr": 0.1})
    for _ in range(6):
        state, metrics = round_fn(state, POPULATION, jax.random.key(1))
    jax.block_until_ready(state)
    assert len(traces) == 1


def test_same_key_same_result_and_different_key_differs():
    algorithm = fedavg(TASK, LOCAL, 4, strategy=ClientStrategy("vmap"))
    round_fn = jax.jit(algorithm.round)
    init = algorithm.init(TASK.model.init(jax.random.key(0)), {"lr": 0.1})

    def run(seed):
        state = init
        for _ in range(3):
            state, _ = round_fn(state, POPULATION, jax.random.key(seed))
        return np.asarray(state.params["dense"]["kernel"])

    np.testing.assert_array_equal(run(1), run(1))
    assert not np.array_equal(run(1), run(2))


def test_client_randomness_depends_only_on_round_and_client():
    # The same client in two different cohorts gets the same key, hence the
    # same update: run a round with M = N (everyone) and with M = 2, and
    # compare the per-client deltas of the clients in both.
    from jaxfl.training.cohort import train_cohort
    from jaxfl.training.local import LocalHParams

    params = TASK.model.init(jax.random.key(0))
    key = jax.random.key(11)
    hparams = LocalHParams(lr=jnp.float32(0.1))
    everyone = jnp.arange(len(SIZES), dtype=jnp.int32)
    some = jnp.array([6, 2], jnp.int32)
    # Compiled, as a round runs it (op by op it costs a hundred small compilations).
    strategy = ClientStrategy("vmap")
    train = jax.jit(lambda ids: train_cohort(TASK, LOCAL, strategy, params, POPULATION, ids, key, hparams))
    full, part = train(everyone), train(some)
    for j, i in enumerate([6, 2]):
        np.testing.assert_allclose(
            part.deltas["dense"]["kernel"][j], full.deltas["dense"]["kernel"][i], atol=1e-6
        )


REFERENCE_SERVER_TX = {
    "adam": lambda: optax.adam(0.01, b1=0.9, b2=0.99, eps=1e-3),
    "yogi": lambda: optax.yogi(0.01, b1=0.9, b2=0.99, eps=1e-3),
    "adagrad": lambda: optax.adagrad(0.01, initial_accumulator_value=0.0, eps=1e-3),
    "avgm": lambda: optax.sgd(0.01, momentum=0.9),
    "sgd": lambda: optax.sgd(0.01),
}


@pytest.mark.parametrize("name", slow_after(sorted(REFERENCE_SERVER_TX), keep=1))
def test_server_optimizers_apply_optax_to_the_pseudo_gradient(name):
    # FedAvgM/FedAdagrad/FedAdam/FedYogi (Reddi et al. 2021): the server step
    # is optax's on -mean(delta), two rounds so that the optimizer state counts.
    tx = server_optimizer(name, 0.01)
    algorithm = fedavg(TASK, LOCAL, 4, strategy=ClientStrategy("vmap"), server_tx=tx)
    plain = fedavg(TASK, LOCAL, 4, strategy=ClientStrategy("vmap"))
    params = TASK.model.init(jax.random.key(0))
    state = algorithm.init(params, {"lr": 0.1})
    plain_state = plain.init(params, {"lr": 0.1})
    key = jax.random.key(3)
    reference_tx = REFERENCE_SERVER_TX[name]()
    reference_state = reference_tx.init(params)
    expected = params
    for round_key in jax.random.split(key, 2):
        # The clients' mean delta from `expected`: a plain FedAvg round from there.
        start = dataclasses.replace(plain_state, params=expected, round=state.round)
        plain_new, _ = jax.jit(plain.round)(start, POPULATION, round_key)
        state, _ = jax.jit(algorithm.round)(state, POPULATION, round_key)
        mean_delta = jax.tree.map(jnp.subtract, plain_new.params, expected)
        updates, reference_state = reference_tx.update(
            jax.tree.map(jnp.negative, mean_delta), reference_state, expected
        )
        expected = optax.apply_updates(expected, updates)
    new_state = state
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
        new_state.params, expected,
    )


def test_step_decay_learning_rate():
    from jaxfl.algorithms.base import local_learning_rate

    hparams = {"lr": jnp.float32(0.8), "lr_decay": jnp.float32(0.5), "lr_decay_period": jnp.float32(10)}
    got = [float(local_learning_rate(hparams, jnp.int32(t))) for t in (0, 9, 10, 25)]
    np.testing.assert_allclose(got, [0.8, 0.8, 0.4, 0.2])


def test_unknown_hyperparameter_is_an_error():
    algorithm = fedavg(TASK, LOCAL, 4, strategy=ClientStrategy("vmap"))
    with pytest.raises(ValueError, match="unknown hyperparameters"):
        algorithm.init(TASK.model.init(jax.random.key(0)), {"lrr": 0.1})


def test_too_many_clients_per_round_is_an_error():
    algorithm = fedavg(TASK, LOCAL, len(SIZES) + 1, strategy=ClientStrategy("vmap"))
    state = algorithm.init(TASK.model.init(jax.random.key(0)), {"lr": 0.1})
    with pytest.raises(ValueError, match="clients_per_round"):
        algorithm.round(state, POPULATION, jax.random.key(0))
