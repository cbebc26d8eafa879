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


@pytest.mark.slow
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


# ---------------------------------------------------------------------------
# bag-logistic: StackOverflow word ids (pad 0, bos 1, eos 2, words 3..V+2, oov V+3).


def _bag_of_words(tokens, num_words, count_oov=True):
    """TFF's features in NumPy: per post, word counts over the number of words (oov too, or not)."""
    features = np.zeros((tokens.shape[0], num_words))
    for b, row in enumerate(tokens):
        for token in row:
            if 3 <= token < 3 + num_words:
                features[b, token - 3] += 1
        denominator = np.count_nonzero(row) if count_oov else features[b].sum()
        if denominator:
            features[b] /= denominator
    return features


def _word_ids(rng, batch, positions, num_words):
    """Left-aligned posts of 0..positions words, some out of vocabulary, then padding."""
    tokens = np.zeros((batch, positions), np.int32)
    for b in range(batch):
        n = int(rng.integers(0, positions + 1))
        tokens[b, :n] = rng.integers(3, num_words + 4, n)
    return tokens


# (batch, positions, words, tags): the gather path, and the scan over positions.
BAG_SHAPES = [(6, 9, 20, 7), (1100, 32, 30, 40)]


@pytest.mark.parametrize("batch, positions, num_words, tags", BAG_SHAPES)
def test_bag_logistic_is_the_dense_product_with_the_bag_of_words(batch, positions, num_words, tags):
    model = make_model("bag-logistic", (positions,), tags, input_vocab_size=num_words + 4)
    zero = model.init(jax.random.key(0))
    assert count_parameters(zero) == num_words * tags + tags
    assert all(not np.any(p) for p in jax.tree.leaves(zero))  # Zero start, like 'linear'.
    assert model.flops_per_example == 2 * positions * tags
    params = _random_params(zero)
    rng = np.random.default_rng(1)
    tokens = _word_ids(rng, batch, positions, num_words)
    tokens[0] = 0  # A post without words: zero features.
    tokens[1, :3] = [num_words + 3] * 3  # Only out-of-vocabulary words.
    kernel, bias = np.asarray(params["kernel"], np.float64), np.asarray(params["bias"], np.float64)
    expected = _bag_of_words(tokens, num_words) @ kernel + bias
    np.testing.assert_allclose(jax.jit(model.apply)(params, tokens), expected, rtol=1e-4, atol=1e-5)

    weights = jnp.asarray(rng.normal(size=(batch, tags)), jnp.float32)
    features = jnp.asarray(_bag_of_words(tokens, num_words), jnp.float32)
    got = jax.grad(lambda p: jnp.sum(weights * model.apply(p, tokens)))(params)
    dense = jax.grad(lambda p: jnp.sum(weights * (features @ p["kernel"] + p["bias"].reshape(1, -1))))(params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4), got, dense)


def test_bag_logistic_can_leave_out_of_vocabulary_words_out_of_the_mean():
    from flax import nnx

    from jaxfl.models.networks import BagOfWordsLogistic

    module = BagOfWordsLogistic(12, 5, count_oov=False, rngs=nnx.Rngs(0))
    module.kernel[...] = jnp.asarray(np.random.default_rng(0).normal(size=(12, 5)), jnp.float32)
    tokens = _word_ids(np.random.default_rng(2), 8, 10, 12)
    expected = _bag_of_words(tokens, 12, count_oov=False) @ np.asarray(module.kernel[...], np.float64)
    np.testing.assert_allclose(module(jnp.asarray(tokens)), expected, rtol=1e-5, atol=1e-6)


def test_bag_logistic_vmaps_over_clients():
    model = make_model("bag-logistic", (7,), 4, input_vocab_size=15 + 4)
    rng = np.random.default_rng(3)
    stacked = jax.vmap(lambda k: _random_params(model.init(k)))(jax.random.split(jax.random.key(0), 3))
    stacked = jax.tree.map(lambda p: p + jnp.asarray(rng.normal(size=p.shape), jnp.float32), stacked)
    tokens = np.stack([_word_ids(rng, 5, 7, 15) for _ in range(3)])
    got = jax.jit(jax.vmap(model.apply))(stacked, tokens)
    for c in range(3):
        kernel, bias = np.asarray(stacked["kernel"][c], np.float64), np.asarray(stacked["bias"][c])
        np.testing.assert_allclose(got[c], _bag_of_words(tokens[c], 15) @ kernel + bias, rtol=1e-4, atol=1e-5)


def test_bag_logistic_refuses_real_valued_inputs():
    with pytest.raises(ValueError, match="layout=tags"):
        make_model("bag-logistic", (784,), 10)
