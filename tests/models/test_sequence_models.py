"""Sequence models: forward passes against NumPy loops, parameter counts, causality and masking,
gradients, and vmap over clients inside a scan over local steps."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxfl.models import count_parameters
from jaxfl.models.sequence import (
    SEQUENCE_MODELS,
    build_char_gru,
    build_char_lstm,
    build_mean_embedding_logistic,
    build_recurrent_lm,
    build_sent140_lstm,
    build_transformer,
    build_word_lstm,
    sinusoidal_positions,
)

TOL = dict(rtol=2e-5, atol=2e-5)


def _random_params(params, seed=0, scale=0.5):
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda p: (scale * rng.normal(size=p.shape)).astype(np.float32), params)


def _np(tree):
    return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


# ---------------------------------------------------------------- NumPy references


def np_lstm(xs, p, mask=None):
    """Keras/PyTorch LSTM, gates [i, f, g, o]; masked steps keep the state."""
    batch, length, _ = xs.shape
    hidden = p["recurrent_kernel"].shape[0]
    h, c = np.zeros((batch, hidden)), np.zeros((batch, hidden))
    outputs = []
    for t in range(length):
        z = xs[:, t] @ p["kernel"] + h @ p["recurrent_kernel"] + p["bias"] + p.get("recurrent_bias", 0.0)
        i, f, g, o = (z[:, k * hidden:(k + 1) * hidden] for k in range(4))
        c_new = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
        h_new = _sigmoid(o) * np.tanh(c_new)
        if mask is not None:
            keep = mask[:, t:t + 1]
            h_new, c_new = np.where(keep, h_new, h), np.where(keep, c_new, c)
        h, c = h_new, c_new
        outputs.append(h)
    return np.stack(outputs, axis=1), h


def np_gru(xs, p):
    """PyTorch GRU, gates [r, z, n]."""
    batch, length, _ = xs.shape
    hidden = p["recurrent_kernel"].shape[0]
    h = np.zeros((batch, hidden))
    outputs = []
    for t in range(length):
        a = xs[:, t] @ p["kernel"] + p["bias"]
        u = h @ p["recurrent_kernel"] + p["recurrent_bias"]
        r = _sigmoid(a[:, :hidden] + u[:, :hidden])
        z = _sigmoid(a[:, hidden:2 * hidden] + u[:, hidden:2 * hidden])
        n = np.tanh(a[:, 2 * hidden:] + r * u[:, 2 * hidden:])
        h = (1 - z) * n + z * h
        outputs.append(h)
    return np.stack(outputs, axis=1), h


def np_layer_norm(x, p, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def np_dense(x, p):
    return x @ p["kernel"] + p.get("bias", 0.0)


def np_transformer(tokens, p, num_heads):
    """Post-LN causal transformer, head by head and position by position."""
    embedding = p["embed"]["embedding"]
    dim = embedding.shape[1]
    batch, length = tokens.shape
    positions = p["positions"][:length] if "positions" in p else sinusoidal_positions(length, dim)
    h = embedding[tokens] * np.sqrt(dim) + positions
    head_dim = dim // num_heads
    for layer in p["layers"].values():
        qkv = np_dense(h, layer["attention_in"])
        q, k, v = qkv[..., :dim], qkv[..., dim:2 * dim], qkv[..., 2 * dim:]
        attended = np.zeros_like(h)
        for b in range(batch):
            for head in range(num_heads):
                cols = slice(head * head_dim, (head + 1) * head_dim)
                for i in range(length):
                    scores = k[b, :i + 1, cols] @ q[b, i, cols] / np.sqrt(head_dim)
                    weights = np.exp(scores - scores.max())
                    weights /= weights.sum()
                    attended[b, i, cols] = weights @ v[b, :i + 1, cols]
        h = np_layer_norm(h + np_dense(attended, layer["attention_out"]), layer["norm1"])
        hidden = np.maximum(np_dense(h, layer["feedforward_in"]), 0.0)
        h = np_layer_norm(h + np_dense(hidden, layer["feedforward_out"]), layer["norm2"])
    return h @ embedding.T if "head" not in p else np_dense(h, p["head"])


# ---------------------------------------------------------------- small instances

# Every small model shares the embedding width 4, hidden width 6 and vocabulary 10, so the
# eager initialization `as_model` runs when building compiles few distinct shapes.
VOCAB, LENGTH = 10, 8
TABLE = np.random.default_rng(9).normal(size=(VOCAB - 2, 4)).astype(np.float32)  # ids 1..8 words, 9 unknown
SMALL = {
    "char-lstm": (VOCAB, dict(embedding_dim=4, hidden_size=6, num_layers=1)),
    "word-lstm": (VOCAB, dict(embedding_dim=4, hidden_size=6, num_layers=2, projection_dim=4)),
    "char-gru": (5, dict(embedding_dim=4, hidden_size=6)),
    "transformer": (VOCAB, dict(embedding_dim=8, num_heads=2, feedforward_size=12, num_layers=1)),
    "sent140-lstm": (2, dict(embedding_table=TABLE, hidden_size=6)),
    "mean-embedding-logistic": (2, dict(embedding_table=TABLE)),
}
LANGUAGE_MODELS = ("char-lstm", "word-lstm", "transformer")


@functools.cache
def _small(name):
    classes, kwargs = SMALL[name]
    return SEQUENCE_MODELS[name]((LENGTH,), classes, input_vocab_size=VOCAB, **kwargs)


@functools.cache
def _params(name, seed=0):
    scale = 0.3 if name == "transformer" else 0.5
    return _random_params(_small(name).init(jax.random.key(seed)), seed, scale=scale)


def _batch(name, batch=4, seed=0):
    classes = SMALL[name][0]
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, VOCAB, (batch, LENGTH))
    tokens[0, LENGTH // 2:] = 0  # a padded example
    labels = rng.integers(0, classes, (batch, LENGTH) if name in LANGUAGE_MODELS else batch)
    return tokens.astype(np.int32), labels.astype(np.int32)


def _loss(model, params, tokens, labels):
    logits = model.apply(params, tokens)
    if logits.shape[-1] == 1:
        return jnp.mean(optax.sigmoid_binary_cross_entropy(logits[:, 0], labels.astype(jnp.float32)))
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))


@functools.cache
def _value_and_grad(name):
    return jax.jit(jax.value_and_grad(functools.partial(_loss, _small(name))))


# ---------------------------------------------------------------- forward passes


class ForwardTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_lstm_language_models_match_numpy(self):
        tokens = np.random.default_rng(1).integers(0, VOCAB, (2, LENGTH))
        for name in ("char-lstm", "word-lstm"):  # 1 layer; 2 layers and a projection
            params = _params(name)
            logits = self.variant(_small(name).apply)(params, tokens)
            chex.assert_shape(logits, (2, LENGTH, VOCAB))
            p = _np(params)
            h = p["embed"]["embedding"][tokens]
            for layer in p["layers"].values():
                h, _ = np_lstm(h, layer)
            if "projection" in p:
                h = np_dense(h, p["projection"])
            chex.assert_trees_all_close(logits, np_dense(h, p["head"]), **TOL)

    @chex.variants(with_jit=True, without_jit=True)
    def test_char_gru_classifies_from_the_last_step(self):
        params = _params("char-gru")
        tokens = np.random.default_rng(2).integers(0, VOCAB, (3, LENGTH))
        tokens[0, -1] = 0  # id 0 is a real character (Delta-FL: the space), not padding
        logits = self.variant(_small("char-gru").apply)(params, tokens)
        chex.assert_shape(logits, (3, 5))
        p = _np(params)
        _, last = np_gru(p["embed"]["embedding"][tokens], p["layers"][0])
        chex.assert_trees_all_close(logits, np_dense(last, p["head"]), **TOL)

    @chex.variants(with_jit=True)  # eagerly, the transformer's many small ops each compile: slow
    def test_transformer_matches_numpy(self):
        tokens = np.random.default_rng(3).integers(0, VOCAB, (2, LENGTH))
        tied = _small("transformer")  # sinusoidal positions, tied output embedding, 1 layer
        untied = build_transformer(
            (LENGTH,), 7, input_vocab_size=VOCAB, embedding_dim=8, num_heads=2, feedforward_size=12,
            num_layers=2, tie_embeddings=False, learned_positions=True,
        )
        for model in (tied, untied):
            assert model.stochastic  # dropout 0.1, off without a key
            params = _random_params(model.init(jax.random.key(0)), scale=0.3)
            logits = self.variant(model.apply)(params, tokens)
            chex.assert_shape(logits, (2, LENGTH, VOCAB if model is tied else 7))
            chex.assert_trees_all_close(logits, np_transformer(tokens, _np(params), 2), **TOL)

    @chex.variants(with_jit=True, without_jit=True)
    def test_sent140_lstm_reads_the_last_real_token(self):
        params = _params("sent140-lstm")
        tokens = np.array([[3, 9, 1, 8, 0, 0, 0, 0], [5, 5, 2, 7, 7, 1, 9, 3], [0] * LENGTH])
        logits = self.variant(_small("sent140-lstm").apply)(params, tokens)
        chex.assert_shape(logits, (3, 1))
        p = _np(params)
        full = np.concatenate([np.zeros((1, 4)), TABLE, np.zeros((1, 4))])  # pad 0 and unknown 9: zeros
        expected = []
        for row in tokens:
            real = row[row != 0]
            _, h = np_lstm(full[real][None], p["layers"][0]) if real.size else (None, np.zeros((1, 6)))
            expected.append(np_dense(h, p["head"])[0])
        chex.assert_trees_all_close(logits, np.stack(expected), **TOL)

    @chex.variants(with_jit=True, without_jit=True)
    def test_mean_embedding_logistic_averages_known_words(self):
        model = _small("mean-embedding-logistic")
        assert not np.any(np.asarray(model.init(jax.random.key(0))["dense"]["kernel"]))  # starts at zero
        params = _params("mean-embedding-logistic")
        tokens = np.array([[3, 9, 1, 0, 0, 0, 0, 0], [9, 0, 0, 0, 0, 0, 0, 0], [8, 8, 2, 4, 1, 1, 1, 1]])
        logits = self.variant(model.apply)(params, tokens)
        chex.assert_shape(logits, (3, 1))
        known = [row[(row >= 1) & (row <= 8)] for row in tokens]
        means = np.stack([TABLE[words - 1].mean(0) if words.size else np.zeros(4) for words in known])
        chex.assert_trees_all_close(logits, np_dense(means, _np(params)["dense"]), **TOL)


def test_transformer_dropout_is_keyed():
    model, params = _small("transformer"), _params("transformer")
    tokens = np.arange(16).reshape(2, 8) % VOCAB
    apply = jax.jit(model.apply)
    one, again, other = (apply(params, tokens, jax.random.key(k)) for k in (1, 1, 2))
    chex.assert_trees_all_close(one, again)
    assert not np.allclose(one, other) and not np.allclose(one, apply(params, tokens))
    _, kwargs = SMALL["transformer"]
    deterministic = build_transformer((LENGTH,), VOCAB, input_vocab_size=VOCAB, dropout_rate=0.0, **kwargs)
    assert not deterministic.stochastic


# ---------------------------------------------------------------- sizes


def _lstm(e, h, biases=1):
    return 4 * h * (e + h + biases)


def _abstract(build, *args, **kwargs):
    """`(parameter count, FLOPs)` of a builder's model, built and initialized abstractly.

    Building under `jax.eval_shape` traces the eager initialization that
    `as_model` runs once, so paper-size models cost no compilation here.
    """
    found = {}

    def trace():
        model = build(*args, **kwargs)
        found["count"] = count_parameters(jax.eval_shape(model.init, jax.random.key(0)))
        found["flops"] = model.flops_per_example
        return jnp.zeros(())

    jax.eval_shape(trace)
    return found["count"], found["flops"]


@pytest.mark.slow
def test_parameter_counts_and_flops_at_paper_sizes():
    # Shakespeare (TFF/FedJAX): 90 ids, embedding 8, 2 x LSTM 256, sequence 80.
    count, flops = _abstract(build_char_lstm, (80,), 90, input_vocab_size=90)
    assert count == 90 * 8 + _lstm(8, 256) + _lstm(256, 256) + 256 * 90 + 90 == 820_522
    assert flops == 80 * 2 * (4 * 256 * (8 + 256) + 4 * 256 * 512 + 256 * 90)
    # StackOverflow NWP (Reddi et al.): 10,004 ids, embedding 96, LSTM 670, projection 96.
    count, flops = _abstract(build_word_lstm, (20,), 10_004, input_vocab_size=10_004)
    assert count == 10_004 * 96 + _lstm(96, 670) + 670 * 96 + 96 + 96 * 10_004 + 10_004 == 4_050_748
    assert flops == 20 * 2 * (4 * 670 * (96 + 670) + 670 * 96 + 96 * 10_004)
    # Delta-FL Shakespeare: 53 symbols, embedding 8, GRU 128 (PyTorch's two biases), linear.
    gru = 53 * 8 + 3 * 128 * (8 + 128 + 2)
    count, flops = _abstract(build_char_gru, (20,), 53, input_vocab_size=53)
    assert count == gru + 128 * 53 + 53
    assert flops == 20 * 2 * 3 * 128 * (8 + 128) + 2 * 128 * 53
    assert _abstract(build_char_gru, (20,), 53, input_vocab_size=53, num_outputs=128)[0] == gru + 128 * 129
    # pfl-research transformer: tied embeddings, 3 post-LN layers of width 96, FF 1536.
    layer = 4 * 96 * 96 + 4 * 96 + 2 * 96 * 1536 + 1536 + 96 + 4 * 96
    count, flops = _abstract(build_transformer, (20,), 10_004, input_vocab_size=10_004)
    assert count == 10_004 * 96 + 3 * layer == 1_962_912
    untied = _abstract(
        build_transformer, (20,), 10_004, input_vocab_size=10_004, tie_embeddings=False,
        learned_positions=True,
    )
    assert untied[0] == 1_962_912 + 96 * 10_004 + 10_004 + 20 * 96
    per_layer = 2 * 96 * 288 + 4 * 20 * 96 + 2 * 96 * 96 + 4 * 96 * 1536
    assert flops == 20 * (3 * per_layer + 2 * 96 * 10_004)
    # Delta-FL Sent140: frozen GloVe 50d, LSTM 50 (PyTorch's two biases), linear 50 -> 1.
    table = np.zeros((100, 50), np.float32)
    count, flops = _abstract(build_sent140_lstm, (20,), 2, input_vocab_size=102, embedding_table=table)
    assert count == _lstm(50, 50, biases=2) + 51 == 20_451
    assert flops == 20 * 2 * 4 * 50 * 100 + 2 * 50
    count, flops = _abstract(
        build_mean_embedding_logistic, (20,), 2, input_vocab_size=102, embedding_table=table
    )
    assert (count, flops) == (51, 2 * 20 * 50 + 2 * 50)


def test_frozen_table_is_not_a_parameter():
    for name in ("sent140-lstm", "mean-embedding-logistic"):
        model = _small(name)
        params = model.init(jax.random.key(0))
        leaves = jax.tree.leaves(params)
        assert not any(leaf.ndim == 2 and leaf.shape[0] in (VOCAB - 2, VOCAB) for leaf in leaves)
        tokens, labels = _batch(name)
        _, grads = _value_and_grad(name)(params, tokens, labels)
        chex.assert_trees_all_equal_shapes_and_dtypes(grads, params)


@pytest.mark.parametrize(
    "build, kwargs, message",
    [
        (build_char_lstm, dict(), "needs token inputs"),
        (build_char_lstm, dict(input_vocab_size=90, hidden_size=0), "hidden_size must be a positive"),
        (build_recurrent_lm, dict(input_vocab_size=90, cell="rnn"), "cell must be one of"),
        (build_char_gru, dict(input_vocab_size=90, num_outputs=2), "num_outputs"),
        (build_transformer, dict(input_vocab_size=91), "tied embeddings"),
        (build_transformer, dict(input_vocab_size=90, num_heads=7), "must divide"),
        (build_sent140_lstm, dict(input_vocab_size=90), "needs embedding_table"),
        (build_sent140_lstm, dict(input_vocab_size=90, embedding_table=np.zeros((90, 4))), "V \\+ 2"),
        (build_mean_embedding_logistic, dict(input_vocab_size=6, embedding_table=np.zeros(4)), "2-D float"),
    ],
)
def test_bad_inputs(build, kwargs, message):
    with pytest.raises(ValueError, match=message):
        build((20,), 90, **kwargs)


def test_bad_shapes_and_classes():
    with pytest.raises(ValueError, match="one token sequence"):
        build_char_lstm((4, 5), 90, input_vocab_size=90)
    with pytest.raises(ValueError, match="num_classes must be 2"):
        build_sent140_lstm((20,), 3, input_vocab_size=6, embedding_table=np.zeros((4, 2)))
    assert set(SEQUENCE_MODELS) == {
        "char-lstm", "char-gru", "word-lstm", "transformer", "sent140-lstm", "mean-embedding-logistic"
    }


@pytest.mark.parametrize("name", LANGUAGE_MODELS)
def test_language_models_are_causal(name):
    params = _params(name)
    tokens, _ = _batch(name)
    apply = jax.jit(_small(name).apply)
    base = apply(params, tokens)
    chex.assert_shape(base, (4, LENGTH, VOCAB))
    for t in (2, 5):
        changed = tokens.copy()
        changed[:, t + 1:] = tokens[:, t + 1:] % (VOCAB - 1) + 1
        logits = apply(params, changed)
        chex.assert_trees_all_close(logits[:, :t + 1], base[:, :t + 1], rtol=1e-6, atol=1e-6)
        assert not np.allclose(logits[:, t + 1], base[:, t + 1])


def test_sent140_models_ignore_appended_padding():
    for name in ("sent140-lstm", "mean-embedding-logistic"):
        params = _params(name)
        tokens, _ = _batch(name)
        apply = jax.jit(_small(name).apply)
        padded = np.concatenate([tokens, np.zeros((4, 5), np.int32)], axis=1)
        base = apply(params, tokens)
        chex.assert_trees_all_close(apply(params, padded), base, rtol=1e-6, atol=1e-6)
        # The last real token matters.
        changed = tokens.copy()
        changed[1, -1] = tokens[1, -1] % (VOCAB - 2) + 1
        assert not np.allclose(apply(params, changed)[1], base[1])


@pytest.mark.parametrize("name", list(SMALL))
def test_gradients_are_finite_and_a_step_descends(name):
    params = _small(name).init(jax.random.key(0))
    tokens, labels = _batch(name, seed=1)
    value, grads = _value_and_grad(name)(params, tokens, labels)
    chex.assert_trees_all_equal_shapes_and_dtypes(grads, params)
    chex.assert_tree_all_finite(grads)
    for path, leaf in jax.tree_util.tree_leaves_with_path(grads):
        assert np.any(np.asarray(leaf) != 0), f"{name}: zero gradient for {jax.tree_util.keystr(path)}"
    stepped = jax.tree.map(lambda p, g: np.asarray(p) - np.float32(0.1) * np.asarray(g), params, grads)
    assert float(_value_and_grad(name)(stepped, tokens, labels)[0]) < float(value)


@pytest.mark.parametrize("name", ["char-lstm", "transformer", "sent140-lstm"])
def test_vmap_over_clients_inside_a_scan_of_local_steps(name):
    model = _small(name)
    grad = jax.grad(functools.partial(_loss, model))
    clients, steps = 3, 2
    # Host-side (NumPy) bookkeeping: eager jax ops would each compile for every new shape.
    params = jax.tree.map(lambda *leaves: np.stack(leaves), *(_params(name, seed) for seed in range(clients)))
    batches = [_batch(name, seed=10 * c + s) for c in range(clients) for s in range(steps)]
    tokens = np.stack([b[0] for b in batches]).reshape(clients, steps, 4, LENGTH)
    labels = np.stack([b[1] for b in batches]).reshape(clients, steps, *batches[0][1].shape)

    def local_training(p, client_tokens, client_labels):
        def step(p, batch):
            return jax.tree.map(lambda w, g: w - 0.1 * g, p, grad(p, *batch)), None

        return jax.lax.scan(step, p, (client_tokens, client_labels))[0]

    got = jax.tree.map(np.asarray, jax.jit(jax.vmap(local_training))(params, tokens, labels))
    for c in range(clients):  # each client alone, step by step (the jitted gradient of the tests above)
        p = jax.tree.map(lambda leaf, c=c: leaf[c], params)
        for s in range(steps):
            _, g = _value_and_grad(name)(p, tokens[c, s], labels[c, s])
            p = jax.tree.map(lambda w, g: w - np.float32(0.1) * np.asarray(g), p, g)
        chex.assert_trees_all_close(jax.tree.map(lambda leaf, c=c: leaf[c], got), p, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("masked", [False, True])
def test_lstm_recurrence_vjp_equals_autodiff_of_the_scan(masked):
    # The hand-written VJP (U's gradient as one product after the scan) against
    # autodiff of the same recurrence, with kept-out steps and cotangents on
    # every output and on the final state.
    from jaxfl.models.sequence import _lstm_forward_scan, lstm_recurrence

    rng = np.random.default_rng(0)
    length, batch, hidden = 7, 3, 5
    inputs = jnp.asarray(rng.normal(size=(length, batch, 4 * hidden)), jnp.float32)
    recurrent = jnp.asarray(rng.normal(size=(hidden, 4 * hidden)) / 2, jnp.float32)
    keep = jnp.asarray(rng.random((length, batch)) > (0.3 if masked else -1.0))
    d_outputs = jnp.asarray(rng.normal(size=(length, batch, hidden)), jnp.float32)
    d_final = jnp.asarray(rng.normal(size=(batch, hidden)), jnp.float32)

    def plain(inputs, recurrent):
        outputs, h, _ = _lstm_forward_scan(inputs, recurrent, keep)
        return outputs, h

    def custom(inputs, recurrent):
        return lstm_recurrence(inputs, recurrent, keep)

    chex.assert_trees_all_close(custom(inputs, recurrent), plain(inputs, recurrent), rtol=1e-6, atol=1e-6)
    _, plain_vjp = jax.vjp(plain, inputs, recurrent)
    _, custom_vjp = jax.vjp(custom, inputs, recurrent)
    chex.assert_trees_all_close(
        jax.jit(custom_vjp)((d_outputs, d_final)), plain_vjp((d_outputs, d_final)), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("masked", [False, True])
def test_gru_recurrence_vjp_equals_autodiff_of_the_scan(masked):
    from jaxfl.models.sequence import _gru_forward_scan, gru_recurrence

    rng = np.random.default_rng(1)
    length, batch, hidden = 6, 3, 4
    inputs = jnp.asarray(rng.normal(size=(length, batch, 3 * hidden)), jnp.float32)
    recurrent = jnp.asarray(rng.normal(size=(hidden, 3 * hidden)) / 2, jnp.float32)
    recurrent_bias = jnp.asarray(rng.normal(size=(3 * hidden,)), jnp.float32)
    keep = jnp.asarray(rng.random((length, batch)) > (0.3 if masked else -1.0))
    cotangents = (
        jnp.asarray(rng.normal(size=(length, batch, hidden)), jnp.float32),
        jnp.asarray(rng.normal(size=(batch, hidden)), jnp.float32),
    )

    def plain(*args):
        outputs, h, _ = _gru_forward_scan(*args, keep)
        return outputs, h

    def custom(*args):
        return gru_recurrence(*args, keep)

    args = (inputs, recurrent, recurrent_bias)
    chex.assert_trees_all_close(custom(*args), plain(*args), rtol=1e-6, atol=1e-6)
    _, plain_vjp = jax.vjp(plain, *args)
    _, custom_vjp = jax.vjp(custom, *args)
    chex.assert_trees_all_close(jax.jit(custom_vjp)(cotangents), plain_vjp(cotangents), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_char_gru_gradients_equal_those_of_the_unfolded_network():
    # The model gathers rows of one [V, 3H] table (embedding times the input kernel); its gradients
    # must be those of embedding lookup, then x W + b, then the recurrence, differentiated as written.
    model = build_char_gru((6,), 5, input_vocab_size=9, embedding_dim=3, hidden_size=4, num_layers=2)
    params = _random_params(model.init(jax.random.key(0)), scale=0.5)
    tokens = np.random.default_rng(4).integers(0, 9, (3, 6))
    labels = np.array([0, 3, 4])

    def unfolded(p):
        h_seq = p["embed"]["embedding"][tokens]
        for i in range(2):
            layer = p["layers"][i]
            size = layer["recurrent_kernel"].shape[0]

            def step(h, x_t, layer=layer, size=size):
                a = x_t @ layer["kernel"] + layer["bias"][None]
                u = h @ layer["recurrent_kernel"] + layer["recurrent_bias"][None]
                r = jax.nn.sigmoid(a[:, :size] + u[:, :size])
                z = jax.nn.sigmoid(a[:, size : 2 * size] + u[:, size : 2 * size])
                n = jnp.tanh(a[:, 2 * size :] + r * u[:, 2 * size :])
                h = (1 - z) * n + z * h
                return h, h

            last, outs = jax.lax.scan(step, jnp.zeros((3, size)), jnp.swapaxes(h_seq, 0, 1))
            h_seq = jnp.swapaxes(outs, 0, 1)
        return last @ p["head"]["kernel"] + p["head"]["bias"][None]

    def loss(apply):
        return lambda p: optax.softmax_cross_entropy_with_integer_labels(apply(p), labels).mean()

    got = jax.grad(loss(lambda p: model.apply(p, tokens)))(params)
    want = jax.grad(loss(unfolded))(params)
    chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-6)
