"""Task losses and errors beyond one label: token sequences (masked) and binary labels.

Expected values are computed by hand in NumPy, token by token, client by
client, independently of `jaxfl.training.local.target_stats`.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfl.data.population import pack_clients
from jaxfl.evaluation.per_client import per_client_metrics
from jaxfl.models.networks import Model
from jaxfl.training.local import (
    LocalHParams,
    LocalTraining,
    Task,
    client_loss_and_error,
    local_sgd,
    target_stats,
)

PAD, BOS, EOS, OOV = 0, 1, 2, 9
VOCAB = 10
EXCLUDED = (PAD, OOV, BOS, EOS)


def log_softmax(logits):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def hand_sequence_stats(logits, targets):
    """Per example: (sum of -log p over non-pad targets, their number, errors over counted ones, number)."""
    out = []
    for row_logits, row_targets in zip(logits, targets, strict=True):
        loss = weight = error = counted = 0.0
        for position_logits, target in zip(row_logits, row_targets, strict=True):
            if target == PAD:
                continue
            loss += -log_softmax(position_logits.astype(np.float64))[target]
            weight += 1
            if target in EXCLUDED:
                continue
            counted += 1
            error += float(np.argmax(position_logits) != target)
        out.append((loss, weight, error, counted))
    return np.array(out)


def random_sequences(rng, batch, length):
    targets = rng.integers(3, VOCAB, (batch, length))
    targets[rng.random((batch, length)) < 0.15] = OOV
    targets[:, 0] = EOS
    lengths = rng.integers(1, length + 1, batch)
    for row, kept in enumerate(lengths):
        targets[row, kept:] = PAD
    return targets.astype(np.int32)


@pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_masked_sequence_loss_and_error_against_hand_computation(transform):
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(4, 6, VOCAB)).astype(np.float32)
    targets = random_sequences(rng, 4, 6)
    stats = transform(lambda lg, t: target_stats(lg, t, EXCLUDED))(logits, targets)
    chex.assert_shape(list(stats), [(4,)] * 4)
    chex.assert_trees_all_close(
        np.stack(stats, axis=1), hand_sequence_stats(logits, targets), rtol=1e-5, atol=1e-5
    )


def test_sequence_stats_under_vmap_over_clients():
    rng = np.random.default_rng(6)
    logits = rng.normal(size=(3, 4, 5, VOCAB)).astype(np.float32)
    targets = np.stack([random_sequences(rng, 4, 5) for _ in range(3)])
    stats = jax.vmap(lambda lg, t: target_stats(lg, t, EXCLUDED))(logits, targets)
    for client in range(3):
        np.testing.assert_allclose(
            np.stack([s[client] for s in stats], axis=1),
            hand_sequence_stats(logits[client], targets[client]),
            rtol=1e-5,
            atol=1e-5,
        )


def test_binary_logit_loss_and_sign_error():
    logits = np.array([[2.0], [-1.0], [0.5], [-3.0]], np.float32)
    labels = np.array([1, 1, 0, 0], np.int32)
    stats = target_stats(logits, labels)
    z = logits[:, 0].astype(np.float64)
    expected_loss = np.where(labels == 1, np.log1p(np.exp(-z)), np.log1p(np.exp(z)))
    np.testing.assert_allclose(stats.loss, expected_loss, rtol=1e-6)
    np.testing.assert_array_equal(stats.error, [0, 1, 1, 0])
    np.testing.assert_array_equal(stats.loss_weight, 1)


def test_one_label_stats_are_the_old_per_example_loss():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(6, 4)).astype(np.float32)
    labels = rng.integers(0, 4, 6).astype(np.int32)
    stats = target_stats(logits, labels)
    np.testing.assert_allclose(
        stats.loss, -log_softmax(logits.astype(np.float64))[np.arange(6), labels], rtol=1e-5
    )
    np.testing.assert_array_equal(stats.error, logits.argmax(1) != labels)
    np.testing.assert_array_equal(stats.error_weight, 1)


class _TokenEcho:
    """A deterministic 'language model': logits = table[x] (a [V, V] parameter)."""

    @staticmethod
    def model():
        def init(key):
            return {"table": jax.random.normal(key, (VOCAB, VOCAB))}

        def apply(params, x):
            return params["table"][x]

        return Model(init=init, apply=apply, name="echo", flops_per_example=0)


def _sequence_population(rng, sizes, length=5):
    clients = []
    for size in sizes:
        targets = random_sequences(rng, size, length)
        inputs = np.roll(targets, 1, axis=1)
        inputs[:, 0] = BOS
        clients.append({"x": inputs.astype(np.int32), "y": targets})
    return clients, pack_clients(clients)


def test_per_client_metrics_are_token_means_per_client():
    # Loss: mean over the client's non-pad tokens; error: over its counted tokens
    # (a plain loop over clients and tokens).
    rng = np.random.default_rng(3)
    clients, population = _sequence_population(rng, [3, 1, 6, 2])
    task = Task(_TokenEcho.model(), excluded_target_ids=EXCLUDED)
    params = task.model.init(jax.random.key(0))
    table = np.asarray(params["table"])
    metrics = per_client_metrics(task, params, population, chunk_rows=4)
    for i, client in enumerate(clients):
        sums = hand_sequence_stats(table[client["x"]], client["y"]).sum(axis=0)
        expected_loss = sums[0] / sums[1]
        expected_error = sums[2] / sums[3] if sums[3] else 0.0
        np.testing.assert_allclose(metrics.loss[i], expected_loss, rtol=1e-5)
        np.testing.assert_allclose(metrics.error[i], expected_error, rtol=1e-5, atol=1e-7)
        assert metrics.targets[i] == sums[3]
        loss, error = jax.jit(client_loss_and_error, static_argnums=0)(task, params, population, jnp.int32(i))
        np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
        np.testing.assert_allclose(error, expected_error, rtol=1e-5, atol=1e-7)


def test_local_step_on_sequences_descends_the_token_mean():
    # One full-batch step: the gradient of sum(token losses) / (number of real tokens).
    rng = np.random.default_rng(4)
    clients, population = _sequence_population(rng, [4])
    task = Task(_TokenEcho.model(), excluded_target_ids=EXCLUDED)
    params = task.model.init(jax.random.key(1))
    result = local_sgd(
        task,
        params,
        population,
        jnp.int32(0),
        jax.random.key(2),
        LocalHParams(lr=jnp.float32(0.5)),
        LocalTraining(batch_size=4),
    )
    x, y = clients[0]["x"], clients[0]["y"]
    real = y != PAD

    def token_mean(p):
        log_p = jax.nn.log_softmax(p["table"][x])
        picked = jnp.take_along_axis(log_p, y[..., None], axis=-1)[..., 0]
        return -jnp.sum(jnp.where(real, picked, 0.0)) / real.sum()

    expected = jax.tree.map(lambda w, g: w - 0.5 * g, params, jax.grad(token_mean)(params))
    chex.assert_trees_all_close(result.params, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result.mean_batch_loss, token_mean(params), rtol=1e-5)


@pytest.mark.parametrize("stochastic", [False, True])
def test_stochastic_models_get_a_key_per_step_from_the_client_key(stochastic):
    # A model that adds key-drawn noise: the same client key gives the same
    # result, another key another one; a deterministic model ignores keys.
    def init(key):
        return {"w": jnp.zeros((VOCAB, VOCAB))}

    def apply(params, x, key=None):
        logits = params["w"][x]
        if key is not None:
            logits = logits + jax.random.normal(key, logits.shape)
        return logits

    model = Model(init=init, apply=apply, name="noisy", flops_per_example=0, stochastic=stochastic)
    task = Task(model)
    rng = np.random.default_rng(5)
    _, population = _sequence_population(rng, [6])

    def train(seed):
        return local_sgd(
            task,
            init(None),
            population,
            jnp.int32(0),
            jax.random.key(seed),
            LocalHParams(lr=jnp.float32(0.5)),
            LocalTraining(batch_size=2),
        ).params["w"]

    np.testing.assert_array_equal(train(0), train(0))
    # With batch 2 and one epoch the orders differ between keys too; compare
    # a stochastic model against its deterministic twin on the same key.
    if stochastic:
        twin = Task(model._replace(stochastic=False))
        plain = local_sgd(
            twin,
            init(None),
            population,
            jnp.int32(0),
            jax.random.key(0),
            LocalHParams(lr=jnp.float32(0.5)),
            LocalTraining(batch_size=2),
        ).params["w"]
        assert not np.allclose(train(0), plain)


# ---------------------------------------------------------------------------
# Multi-label (StackOverflow tags): mean sigmoid cross-entropy, recall@5.


def hand_multi_label_stats(logits, labels, k=5):
    """Per example: (mean over outputs of the logistic loss, 1, true labels not in the top k, true labels)."""
    out = []
    for row_logits, row_labels in zip(logits.astype(np.float64), labels, strict=True):
        losses = [
            np.log1p(np.exp(-z)) if y else np.log1p(np.exp(z))
            for z, y in zip(row_logits, row_labels, strict=True)
        ]
        top = sorted(range(len(row_logits)), key=lambda j: -row_logits[j])[:k]
        true = [j for j, y in enumerate(row_labels) if y]
        hits = sum(1 for j in true if j in top)
        out.append((np.mean(losses), 1.0, len(true) - hits, len(true)))
    return np.array(out)


def random_tags(rng, batch, tags):
    labels = (rng.random((batch, tags)) < 0.2).astype(np.uint8)
    labels[0] = 0  # A post without a known tag: it counts nothing in recall.
    labels[1, :8] = 1  # More true tags than k.
    return labels


@pytest.mark.parametrize("dtype", [np.uint8, np.bool_, np.float32])
def test_multi_label_loss_and_recall_at_5_against_hand_computation(dtype):
    rng = np.random.default_rng(7)
    logits = rng.normal(size=(6, 12)).astype(np.float32)
    labels = random_tags(rng, 6, 12)
    stats = jax.jit(target_stats)(logits, labels.astype(dtype))
    chex.assert_shape(list(stats), [(6,)] * 4)
    np.testing.assert_allclose(np.stack(stats, axis=1), hand_multi_label_stats(logits, labels), rtol=1e-5)


def test_multi_label_top_k_is_a_task_field_and_vmaps_over_clients():
    rng = np.random.default_rng(8)
    logits = rng.normal(size=(3, 4, 9)).astype(np.float32)
    labels = np.stack([random_tags(rng, 4, 9) for _ in range(3)])
    model = Model(init=lambda key: {}, apply=lambda params, x: x, name="identity", flops_per_example=0)
    task = Task(model, top_k=2)
    stats = jax.vmap(lambda lg, y: task.example_stats({}, {"x": lg, "y": y}))(logits, labels)
    for client in range(3):
        np.testing.assert_allclose(
            np.stack([s[client] for s in stats], axis=1),
            hand_multi_label_stats(logits[client], labels[client], k=2),
            rtol=1e-5,
        )


def test_int32_targets_with_one_logit_per_target_are_refused():
    with pytest.raises(ValueError, match="token ids"):
        target_stats(np.zeros((2, 5), np.float32), np.zeros((2, 5), np.int32))


def test_pooled_per_client_errors_give_recall_at_5():
    # Per-client metrics on a bag-logistic model: a client's loss is the mean of its
    # examples' mean cross-entropies; its errors pooled by true tags are 1 - recall@5
    # over all examples, as tf.keras.metrics.Recall(top_k=5) accumulates it.
    from jaxfl.models import make_model

    words, tags, length = 30, 12, 8
    model = make_model("bag-logistic", (length,), tags, input_vocab_size=words + 4)
    rng = np.random.default_rng(9)
    params = jax.tree.map(
        lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), model.init(jax.random.key(0))
    )
    clients = []
    for size in (5, 1, 7, 3):
        x = rng.integers(0, words + 4, (size, length)).astype(np.int32)
        clients.append({"x": x, "y": random_tags(rng, max(size, 2), tags)[:size]})
    clients[1]["y"][:] = 0  # A client without a known tag.
    population = pack_clients(clients)
    task = Task(model)
    metrics = jax.jit(per_client_metrics, static_argnums=0, static_argnames="chunk_rows")(
        task, params, population, chunk_rows=4
    )
    apply = jax.jit(model.apply)  # Op by op, each client's pass costs a dozen small compilations.
    hits = true = 0
    for i, client in enumerate(clients):
        expected = hand_multi_label_stats(np.asarray(apply(params, client["x"])), client["y"])
        np.testing.assert_allclose(metrics.loss[i], expected[:, 0].mean(), rtol=1e-5)
        assert metrics.targets[i] == expected[:, 3].sum()
        hits += expected[:, 3].sum() - expected[:, 2].sum()
        true += expected[:, 3].sum()
    assert metrics.error[1] == 0 and metrics.targets[1] == 0
    pooled_recall = np.sum(metrics.targets * (1 - metrics.error)) / np.sum(metrics.targets)
    np.testing.assert_allclose(pooled_recall, hits / true, rtol=1e-5)
