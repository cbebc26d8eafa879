"""Models on token inputs: one-hot linear and MLP, and the embedding bag, against NumPy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfl.models import count_parameters, make_model


def _random_params(params, seed=0):
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)


def _one_hot(tokens, vocab):
    return np.eye(vocab, dtype=np.float64)[tokens].reshape(tokens.shape[0], -1)


# (batch, positions, vocabulary, classes): the first takes the gather path, the
# second is large enough (> 2**20 gathered values) for the scan over positions.
SHAPES = [(5, 7, 11, 4), (2048, 8, 13, 70)]


@pytest.mark.parametrize("batch, positions, vocab, classes", SHAPES)
def test_linear_on_tokens_is_the_one_hot_linear_model(batch, positions, vocab, classes):
    model = make_model("linear", (positions,), classes, input_vocab_size=vocab)
    params = _random_params(model.init(jax.random.key(0)))
    assert count_parameters(params) == positions * vocab * classes + classes
    tokens = np.random.default_rng(1).integers(0, vocab, (batch, positions)).astype(np.uint8)
    kernel = np.asarray(params["dense"]["kernel"], np.float64)
    expected = _one_hot(tokens, vocab) @ kernel + np.asarray(params["dense"]["bias"])
    np.testing.assert_allclose(jax.jit(model.apply)(params, tokens), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch, positions, vocab, classes", SHAPES)
def test_gradients_on_tokens_are_the_one_hot_gradients(batch, positions, vocab, classes):
    model = make_model("linear", (positions,), classes, input_vocab_size=vocab)
    params = _random_params(model.init(jax.random.key(0)))
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, vocab, (batch, positions)), jnp.int32)
    weights = jnp.asarray(np.random.default_rng(3).normal(size=(batch, classes)), jnp.float32)

    def objective(p):
        return jnp.sum(weights * model.apply(p, tokens))

    def one_hot_objective(p):
        one_hot = jax.nn.one_hot(tokens, vocab).reshape(batch, -1)
        return jnp.sum(weights * (one_hot @ p["dense"]["kernel"] + p["dense"]["bias"].reshape(1, -1)))

    got, expected = jax.grad(objective)(params), jax.grad(one_hot_objective)(params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4), got, expected)


def test_mlp_on_tokens_one_hot_encodes_and_vmaps_over_clients():
    model = make_model("mlp", (6,), 5, hidden_sizes=(8,), input_vocab_size=9)
    rng = np.random.default_rng(0)
    stacked = jax.vmap(lambda k: _random_params(model.init(k)))(jax.random.split(jax.random.key(0), 3))
    stacked = jax.tree.map(lambda p: p + jnp.asarray(rng.normal(size=p.shape), jnp.float32), stacked)
    tokens = rng.integers(0, 9, (3, 4, 6))
    got = jax.vmap(model.apply)(stacked, tokens)
    for c in range(3):
        p = jax.tree.map(lambda a, c=c: np.asarray(a[c], np.float64), stacked)
        hidden = np.maximum(_one_hot(tokens[c], 9) @ p["hidden"][0]["kernel"] + p["hidden"][0]["bias"], 0)
        expected = hidden @ p["out"]["kernel"] + p["out"]["bias"]
        np.testing.assert_allclose(got[c], expected, rtol=1e-4, atol=1e-4)


def test_embedding_bag_averages_the_non_padding_tokens():
    model = make_model("embedding-bag", (5,), 3, input_vocab_size=10, embedding_dim=4)
    params = _random_params(model.init(jax.random.key(0)))
    assert count_parameters(params) == 10 * 4 + 4 * 3 + 3
    tokens = np.array([[1, 2, 0, 0, 0], [3, 3, 3, 9, 0], [0, 0, 0, 0, 0]])
    table = np.asarray(params["embed"]["embedding"], np.float64)
    kernel, bias = np.asarray(params["dense"]["kernel"]), np.asarray(params["dense"]["bias"])
    expected = []
    for row in tokens:
        real = row[row != 0]
        mean = table[real].mean(axis=0) if real.size else np.zeros(4)
        expected.append(mean @ kernel + bias)
    np.testing.assert_allclose(jax.jit(model.apply)(params, tokens), np.stack(expected), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "name, vocab, message",
    [("convnet", 10, "needs images"), ("embedding-bag", None, "needs token inputs")],
)
def test_models_refuse_the_wrong_inputs(name, vocab, message):
    with pytest.raises(ValueError, match=message):
        make_model(name, (784,), 10, input_vocab_size=vocab)
