"""Every algorithm trains a token-sequence model: one round of each on padded sequences.

The losses Δ-FL, q-FFL, AFL and TERM reweight by are the clients' mean token
losses (`jaxfl.training.local.client_loss_and_error`, tested against a loop in
tests/training/test_task.py); here each algorithm's round must compile with a
recurrent model under `vmap`, move the model and keep it finite.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from jaxfl.algorithms import Engine, algorithm_names, algorithm_spec, build_algorithm, server_optimizer
from jaxfl.data.population import pack_clients
from jaxfl.models.sequence import build_char_lstm
from jaxfl.training import ClientStrategy, LocalTraining, Task

VOCAB, LENGTH = 12, 6
PAD, BOS, EOS = 0, 1, 2


def sequence_population(seed=0, sizes=(3, 5, 2, 4, 6, 3)):
    rng = np.random.default_rng(seed)
    clients = []
    for size in sizes:
        y = rng.integers(3, VOCAB, (size, LENGTH)).astype(np.int32)
        for row, kept in enumerate(rng.integers(1, LENGTH + 1, size)):
            y[row, kept - 1] = EOS
            y[row, kept:] = PAD
        x = np.concatenate([np.full((size, 1), BOS, np.int32), y[:, :-1]], axis=1)
        x[y == PAD] = PAD
        clients.append({"x": x, "y": y})
    return pack_clients(clients)


POPULATION = sequence_population()
TASK = Task(
    build_char_lstm((LENGTH,), VOCAB, input_vocab_size=VOCAB, embedding_dim=4, hidden_size=8),
    excluded_target_ids=(PAD, BOS, EOS),
)
ENGINE = Engine(
    TASK,
    LocalTraining(batch_size=2, num_epochs=1),
    4,
    ClientStrategy("vmap"),
    server_optimizer("sgd"),
    "num_examples",
    num_clients=POPULATION.num_clients,
)


def _kind(name: str) -> tuple[bool, bool, bool]:
    spec = algorithm_spec(name)
    return spec.personal_models, bool(spec.client_rows), spec.adapts_after_training


# The first algorithm of each kind of per-client state (none; personal models; other rows, e.g. control
# variates; personal models made after training) compiles and runs its round; the others' rounds are traced
# (compiling each took 3-5 s of the suite).
COMPILED = {
    next(name for name in algorithm_names() if _kind(name) == kind) for kind in map(_kind, algorithm_names())
}


def _cases():
    # The default tier compiles the first algorithm and traces the first of each other kind; the slow
    # tier compiles those and traces every other algorithm.
    first = algorithm_names()[0]
    for name in algorithm_names():
        if name == first:
            yield pytest.param(name, True, id=f"{name}-compiled")
        elif name in COMPILED:
            yield pytest.param(name, False, id=f"{name}-traced")
            yield pytest.param(name, True, id=f"{name}-compiled", marks=pytest.mark.slow)
        else:
            yield pytest.param(name, False, id=f"{name}-traced", marks=pytest.mark.slow)


@pytest.mark.parametrize("name, compiled", list(_cases()))
def test_every_algorithm_trains_a_sequence_model_in_one_compiled_round(name, compiled):
    # Per-FedAvg deals each minibatch into three parts.
    engine = dataclasses.replace(ENGINE, local=LocalTraining(batch_size=3)) if name == "perfedavg" else ENGINE
    algorithm = build_algorithm(name, engine)
    params = TASK.model.init(jax.random.key(0))
    # DP noise is calibrated by the runner (NaN until then): set it here.
    privacy = {"dp_noise_multiplier": 0.1, "dp_quantile_sigma": 1.0}
    hparams = {"lr": 0.5, **{k: v for k, v in privacy.items() if k in algorithm.hparam_defaults}}
    state = algorithm.init(params, hparams)
    if not compiled:
        new_state, metrics = jax.eval_shape(algorithm.round, state, POPULATION, jax.random.key(1))
        assert jax.tree.map(lambda a: (a.shape, a.dtype), new_state.params) == jax.tree.map(
            lambda a: (a.shape, a.dtype), params
        )
        assert all(value.shape == () for value in jax.tree.leaves(metrics))
        return
    new_state, metrics = jax.jit(algorithm.round)(state, POPULATION, jax.random.key(1))
    before, after = jax.tree.leaves(params), jax.tree.leaves(new_state.params)
    moved = [not np.allclose(a, b) for a, b in zip(before, after, strict=True)]
    assert any(moved)
    assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(new_state.params))
    assert all(np.all(np.isfinite(value)) for value in jax.tree.leaves(metrics))
