"""Symmetrized-KL fine-tuning (SKL, thesis section 5.5): the divergence against SciPy, and the
fine-tuned models against a NumPy loop with the divergence's gradient derived by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from algorithms.reference_rounds import POPULATION, SIZES, TASK, _epoch_orders, initial_params
from reference import TINY_LABEL_SHIFT, assert_cli_refuses
from scipy.special import log_softmax as scipy_log_softmax
from scipy.stats import entropy

from jaxfl.models.losses import symmetrized_kl
from jaxfl.models.networks import Model
from jaxfl.training import ClientStrategy, LocalTraining, Task
from jaxfl.training.cohort import finetune_models
from jaxfl.training.local import mean_symmetrized_kl

LOCAL = LocalTraining(batch_size=4, num_epochs=2)
LR = 0.1
KEY = jax.random.key(8)
_finetune = jax.jit(finetune_models, static_argnums=(0, 1, 2))


def skl_reference(logits, reference_logits):
    """KL(p || q) + KL(q || p) by SciPy, one distribution at a time."""
    p = np.exp(scipy_log_softmax(np.asarray(logits, np.float64), axis=-1))
    q = np.exp(scipy_log_softmax(np.asarray(reference_logits, np.float64), axis=-1))
    flat_p, flat_q = p.reshape(-1, p.shape[-1]), q.reshape(-1, q.shape[-1])
    values = [entropy(a, b) + entropy(b, a) for a, b in zip(flat_p, flat_q, strict=True)]
    return np.array(values).reshape(p.shape[:-1])


def test_symmetrized_kl_matches_scipy_under_jit_and_vmap():
    rng = np.random.default_rng(0)
    logits, reference = rng.normal(size=(2, 3, 6, 4)) * 3
    expected = skl_reference(logits, reference)
    np.testing.assert_allclose(jax.jit(symmetrized_kl)(logits, reference), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jax.vmap(symmetrized_kl)(logits, reference), expected, rtol=1e-5, atol=1e-6)
    # Equal distributions (also logits that differ by a constant): zero.
    np.testing.assert_allclose(symmetrized_kl(logits, logits + 5.0), 0.0, atol=1e-5)


def test_symmetrized_kl_of_a_binary_logit_is_the_two_class_one():
    z, r = np.array([[2.0], [-1.0], [0.0]]), np.array([[-1.0], [0.5], [0.0]])
    two_class = skl_reference(np.concatenate([z, 0 * z], 1), np.concatenate([r, 0 * r], 1))
    np.testing.assert_allclose(symmetrized_kl(z, r), two_class, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="differ in shape"):
        symmetrized_kl(z, r[:2])


def lookup_task(width, **task_options):
    """A model whose logits are rows of a table picked by integer inputs."""
    model = Model(init=None, apply=lambda params, x: params["table"][x], name="lookup", flops_per_example=0)
    return Task(model, **task_options)


def test_mean_symmetrized_kl_counts_real_examples_and_tokens():
    rng = np.random.default_rng(1)
    table, anchor_table = rng.normal(size=(2, 5, 3))
    params, anchor = {"table": table}, {"table": anchor_table}
    per_row = skl_reference(table, anchor_table)
    # One label per example: the mean over the real (valid) examples.
    x, valid = np.array([0, 3, 3, 4]), np.array([True, True, False, True])
    batch = {"x": x, "y": np.zeros(4, np.int32)}
    value = mean_symmetrized_kl(lookup_task(3), params, anchor, batch, valid)
    np.testing.assert_allclose(value, per_row[x[valid]].mean(), rtol=1e-5)
    # Token sequences: the real tokens (target != pad) of the real examples.
    x = np.array([[0, 1, 2], [3, 4, 0], [1, 1, 1]])
    y = np.array([[5, 6, 0], [7, 0, 0], [5, 5, 5]], np.int32)
    valid = np.array([True, True, False])
    value = mean_symmetrized_kl(lookup_task(3, pad_id=0), params, anchor, {"x": x, "y": y}, valid)
    counted = (y != 0) & valid[:, None]
    np.testing.assert_allclose(value, per_row[x][counted].mean(), rtol=1e-5)
    # Multi-label indicators: T Bernoulli outputs, averaged over T.
    x, y = np.array([1, 2]), np.ones((2, 3), np.uint8)
    value = mean_symmetrized_kl(lookup_task(3), params, anchor, {"x": x, "y": y}, np.array([True, True]))
    bernoulli = skl_reference(
        np.stack([table, 0 * table], -1), np.stack([anchor_table, 0 * anchor_table], -1)
    )
    np.testing.assert_allclose(value, bernoulli[x].mean(), rtol=1e-5)


def softmax(logits):
    logits = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(logits)
    return e / e.sum(axis=1, keepdims=True)


def skl_logit_gradient(p, q):
    """d/dz of KL(p || q) + KL(q || p), p = softmax(z), by hand: p (d - <p, d>) + p - q, d = log p - log q."""
    d = np.log(p) - np.log(q)
    return p * (d - (p * d).sum(axis=1, keepdims=True)) + p - q


def skl_finetune_reference(client, lam):
    w = initial_params()["dense"]
    w_kernel, w_bias = np.array(w["kernel"], np.float64), np.array(w["bias"], np.float64)
    data = POPULATION.client(client)
    count = len(data["y"])
    orders = np.asarray(
        _epoch_orders(
            jax.random.fold_in(KEY, client), POPULATION.counts[client], POPULATION.max_count, LOCAL.num_epochs
        )
    )
    kernel, bias = w_kernel.copy(), w_bias.copy()
    losses = []
    for epoch in range(LOCAL.num_epochs):
        order = orders[epoch][:count]
        for start in range(0, count, LOCAL.batch_size):
            rows = order[start : start + LOCAL.batch_size]
            x, y = data["x"][rows], data["y"][rows]
            p, q = softmax(x @ kernel + bias), softmax(x @ w_kernel + w_bias)
            losses.append(-np.log(p[np.arange(len(rows)), y]).mean())
            residual = p.copy()
            residual[np.arange(len(rows)), y] -= 1.0
            residual = (residual + 0.5 * lam * skl_logit_gradient(p, q)) / len(rows)
            kernel = kernel - LR * (x.T @ residual)
            bias = bias - LR * residual.sum(axis=0)
    return kernel, bias, np.mean(losses)


def test_skl_finetuning_matches_numpy_loop():
    lam = 4.0
    tuned = _finetune(
        TASK,
        LOCAL,
        ClientStrategy("vmap"),
        initial_params(),
        POPULATION,
        KEY,
        jnp.float32(LR),
        skl_lam=jnp.float32(lam),
    )
    plain = _finetune(TASK, LOCAL, ClientStrategy("vmap"), initial_params(), POPULATION, KEY, jnp.float32(LR))
    for client in range(len(SIZES)):
        kernel, bias, loss = skl_finetune_reference(client, lam)
        np.testing.assert_allclose(tuned.params["dense"]["kernel"][client], kernel, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(tuned.params["dense"]["bias"][client], bias, rtol=1e-4, atol=1e-5)
        # The reported loss is the data loss, without the penalty.
        np.testing.assert_allclose(tuned.mean_batch_loss[client], loss, rtol=1e-4)
    # The penalty changed the models.
    assert not np.allclose(tuned.params["dense"]["kernel"], plain.params["dense"]["kernel"], atol=1e-3)


def test_skl_at_zero_is_plain_finetuning():
    args = (TASK, LOCAL, ClientStrategy("vmap"), initial_params(), POPULATION, KEY, jnp.float32(LR))
    tuned, plain = _finetune(*args, skl_lam=jnp.float32(0.0)), _finetune(*args)
    for left, right in zip(jax.tree.leaves(tuned.params), jax.tree.leaves(plain.params), strict=True):
        np.testing.assert_allclose(left, right, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="one penalty"):
        finetune_models(*args, ewc_lam=jnp.float32(1.0), skl_lam=jnp.float32(1.0))


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--finetune-skl", "1"], ["finetune_skl", "finetune_epochs"]),
        (
            ["--finetune-epochs", "1", "--finetune-skl", "1", "--finetune-ewc", "1"],
            ["finetune_ewc", "finetune_skl"],
        ),
    ],
)
def test_cli_refuses_skl_without_finetuning_or_with_ewc(tmp_path, capsys, flags, named):
    out = tmp_path / "run"
    argv = ["run", *TINY_LABEL_SHIFT, "--clients-per-round", "5", *flags, "--out", str(out)]
    assert_cli_refuses(argv, named, out, capsys)
