"""Sequence and text models of the benchmarks: recurrent language models, a GRU
next-character classifier, a causal transformer, and Sent140's classifiers on
a frozen GloVe table.

Every model is a flax NNX module whose trainable weights are `nnx.Param`s,
turned into a pure `Model(init, apply)` by `jaxfl.models.base.as_model`.
Recurrences are written by hand as one `jax.lax.scan` over time (not
`nnx.RNN`/`nnx.scan`), so `apply` stays a pure function of `(params, x)`
that can be `vmap`ped over clients and `scan`ned over local steps.

Token conventions (jaxfl's datasets): id 0 pads, at the END of a sequence.
The language models ('char-lstm', 'word-lstm', 'transformer') predict every
position (`[B, L, V]`) and leave padded targets to the task's mask; they are
causal (the output at position t reads positions <= t only), so trailing
padding never changes the outputs at real positions. The Sent140 models skip
pads ('sent140-lstm' reads the state after the last real token);
'char-gru' reads the last position of unpadded LEAF windows, where id 0 is a
character.

Initialization (Keras defaults, as the TFF/Reddi et al. baselines build
their layers): recurrent input kernels Glorot-uniform, recurrent kernels
orthogonal, biases zero, the LSTM forget-gate bias 1 (Keras
`unit_forget_bias=True`, Jozefowicz et al. 2015); dense kernels
Glorot-uniform with zero bias; trainable embeddings uniform in [-0.05, 0.05]
(Keras `RandomUniform`). google-research/federated's own builders
(`utils/models/shakespeare_models.py`, `stackoverflow_models.py`) use
He-normal LSTM input kernels and Glorot-normal dense kernels, and the PyTorch
references (Delta-FL, pfl-research) PyTorch's defaults: the same functions,
other starting points.

FLOPs (`flops_per_example`) count the forward pass's matrix products only
(a multiply-add is 2 FLOPs): gate and activation arithmetic, softmax, layer
norms and embedding look-ups are left out. Attention counts the full L x L
score matrix, causal masking included.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxfl.models.base import Model, as_model

__all__ = [
    "GRU",
    "LSTM",
    "SEQUENCE_MODELS",
    "CausalTransformer",
    "FrozenTable",
    "GRUClassifier",
    "MeanEmbeddingLogistic",
    "RecurrentLanguageModel",
    "Sent140LSTM",
    "build_char_gru",
    "build_char_lstm",
    "build_mean_embedding_logistic",
    "build_recurrent_lm",
    "build_sent140_lstm",
    "build_transformer",
    "build_word_lstm",
    "glove_lookup_table",
    "sinusoidal_positions",
]

CELLS = ("lstm", "gru")

_glorot_uniform = jax.nn.initializers.glorot_uniform()
_orthogonal = jax.nn.initializers.orthogonal()
_zeros = jax.nn.initializers.zeros


def _uniform_embedding(key, shape, dtype=jnp.float32):
    """Keras's `RandomUniform()` default: U[-0.05, 0.05]."""
    return jax.random.uniform(key, shape, dtype, -0.05, 0.05)


class FrozenTable(nnx.Variable):
    """A constant array in a module (a pretrained embedding table).

    Not an `nnx.Param`: `as_model` splits it out of the parameters and closes
    over it, so it is neither in `init`'s pytree nor in `jax.grad`'s.
    """


# ---------------------------------------------------------------- recurrent cells


class LSTM(nnx.Module):
    """One LSTM layer (Hochreiter & Schmidhuber 1997, with forget gate), scanned over time.

    With `z = x_t W + h_{t-1} U + b` (`[4H]`, split in the Keras/TensorFlow
    gate order `[i, f, g, o]`):

        i = sigmoid(z_i), f = sigmoid(z_f), g = tanh(z_g), o = sigmoid(z_o)
        c_t = f * c_{t-1} + i * g,  h_t = o * tanh(c_t)

    from `h_0 = c_0 = 0`. Parameters: `kernel` `W [E, 4H]` (Glorot-uniform),
    `recurrent_kernel` `U [H, 4H]` (orthogonal), `bias` `b [4H]` (zero, the
    forget block `forget_bias`), and with `recurrent_bias` a second bias
    `[4H]` (zero) added to `h U`: PyTorch's `nn.LSTM` layout (`b_ih + b_hh`,
    gate order `[i, f, g, o]` too), the same function with 4H more
    parameters. FedJAX's Haiku LSTM orders the gates `[i, g, f, o]` and adds
    its forget bias 1 in the forward pass instead of the initializer: the
    same function class.
    """

    def __init__(
        self,
        in_features: int,
        hidden_size: int,
        *,
        forget_bias: float = 1.0,
        recurrent_bias: bool = False,
        rngs: nnx.Rngs,
    ):
        size = hidden_size
        self.hidden_size = size
        self.kernel = nnx.Param(_glorot_uniform(rngs.params(), (in_features, 4 * size), jnp.float32))
        self.recurrent_kernel = nnx.Param(_orthogonal(rngs.params(), (size, 4 * size), jnp.float32))
        self.bias = nnx.Param(jnp.zeros((4 * size,), jnp.float32).at[size : 2 * size].set(forget_bias))
        self.recurrent_bias = nnx.Param(jnp.zeros((4 * size,), jnp.float32)) if recurrent_bias else None

    def __call__(self, xs: jax.Array, mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """Runs the layer over `xs [B, L, E]`.

        With a `mask [B, L]` (bool), a step where the mask is False keeps the
        previous state (Keras `mask_zero` semantics), so the final state is
        the state after the last unmasked step.

        Returns:
          `(outputs [B, L, H], final hidden state h [B, H])`.
        """
        bias = self.bias[...]
        if self.recurrent_bias is not None:
            bias = bias + self.recurrent_bias[...]  # z = x W + h U + b_ih + b_hh.
        # The input products of all steps as one matrix product, outside the scan.
        inputs = jnp.swapaxes(xs @ self.kernel[...] + bias.reshape(1, 1, -1), 0, 1)  # [L, B, 4H]
        keep = jnp.ones(inputs.shape[:2], bool) if mask is None else jnp.swapaxes(mask, 0, 1)
        outputs, h = lstm_recurrence(inputs, self.recurrent_kernel[...], keep)
        return jnp.swapaxes(outputs, 0, 1), h


def _lstm_forward_scan(inputs, recurrent, keep):
    """The recurrence of `LSTM`, with what the backward pass needs."""

    def step(carry, inp):
        h, c = carry
        z, kept = inp
        i, f, g, o = jnp.split(z + h @ recurrent, 4, axis=-1)
        i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
        c_new = f * c + i * g
        tanh_c = jnp.tanh(c_new)
        h_new = o * tanh_c
        kept = kept[:, None]
        h_new, c_new = jnp.where(kept, h_new, h), jnp.where(kept, c_new, c)
        return (h_new, c_new), (h_new, (h, c, i, f, g, o, tanh_c))

    zeros = jnp.zeros((inputs.shape[1], recurrent.shape[0]), inputs.dtype)
    (h, _), (outputs, saved) = jax.lax.scan(step, (zeros, zeros), (inputs, keep))
    return outputs, h, saved


@jax.custom_vjp
def lstm_recurrence(inputs: jax.Array, recurrent: jax.Array, keep: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`h_t, c_t` of `LSTM` from `z_t = inputs[t] + h_{t-1} U` over t, from zero states.

    Args:
      inputs: `[L, B, 4H]`, x_t W + b for every step (gate order i, f, g, o).
      recurrent: U `[H, 4H]`.
      keep: `[L, B]` bool; where False the step keeps the previous state.

    Returns:
      (`[L, B, H]` hidden states, `[B, H]` final hidden state).

    Its VJP is written by hand so that the gradient of U is one matrix
    product after the backward scan (`sum_t h_{t-1}^T dz_t` over all steps
    at once) instead of an `[H, 4H]` accumulation at each step, which is what
    autodiff of the scan does: on CPU each step then re-reads and re-writes
    U's gradient (1 MB for H = 256, beyond the L2 cache). The input products'
    gradient `dz` is returned for all steps, so `x W` is differentiated
    outside as one product too.
    """
    outputs, h, _ = _lstm_forward_scan(inputs, recurrent, keep)
    return outputs, h


def _lstm_recurrence_forward(inputs, recurrent, keep):
    outputs, h, saved = _lstm_forward_scan(inputs, recurrent, keep)
    return (outputs, h), (recurrent, keep, saved)


def _lstm_recurrence_backward(residuals, cotangents):
    recurrent, keep, saved = residuals
    d_outputs, d_final = cotangents
    transposed = recurrent.T

    def step(carry, inp):
        dh, dc = carry
        d_output, kept, (h_prev, c_prev, i, f, g, o, tanh_c) = inp
        dh = dh + d_output
        dc_new = dc + dh * o * (1.0 - tanh_c**2)
        dz = jnp.concatenate(
            [
                dc_new * g * i * (1.0 - i),
                dc_new * c_prev * f * (1.0 - f),
                dc_new * i * (1.0 - g**2),
                dh * tanh_c * o * (1.0 - o),
            ],
            axis=-1,
        )
        kept = kept[:, None]
        dz = jnp.where(kept, dz, 0.0)
        # A kept-out step passes its state's gradient straight to the previous state.
        dh_prev = jnp.where(kept, dz @ transposed, dh)
        dc_prev = jnp.where(kept, dc_new * f, dc)
        return (dh_prev, dc_prev), dz

    zeros = jnp.zeros_like(d_final)
    _, dz = jax.lax.scan(step, (d_final, zeros), (d_outputs, keep, saved), reverse=True)
    h_prev = saved[0]
    d_recurrent = jnp.einsum("lbh,lbg->hg", h_prev, dz)
    return dz, d_recurrent, None


lstm_recurrence.defvjp(_lstm_recurrence_forward, _lstm_recurrence_backward)


class GRU(nnx.Module):
    """One GRU layer (Cho et al. 2014), PyTorch's `nn.GRU` formulas, scanned over time.

    With `a = x_t W + b` and `u = h_{t-1} U + b_h` (each `[3H]`, split in
    PyTorch's gate order `[r, z, n]`):

        r = sigmoid(a_r + u_r), z = sigmoid(a_z + u_z)
        n = tanh(a_n + r * u_n)
        h_t = (1 - z) * n + z * h_{t-1}

    from `h_0 = 0`: the reset gate multiplies the recurrent product after its
    bias (Keras `GRU(reset_after=True)`, the TF2 default, computes the same
    with gate order `[z, r, n]`). Parameters: `kernel` `W [E, 3H]`
    (Glorot-uniform), `recurrent_kernel` `U [H, 3H]` (orthogonal), `bias` and
    `recurrent_bias` `[3H]` (zero). PyTorch initializes all of them
    U[-1/sqrt(H), 1/sqrt(H)].
    """

    def __init__(self, in_features: int, hidden_size: int, *, rngs: nnx.Rngs):
        size = hidden_size
        self.hidden_size = size
        self.kernel = nnx.Param(_glorot_uniform(rngs.params(), (in_features, 3 * size), jnp.float32))
        self.recurrent_kernel = nnx.Param(_orthogonal(rngs.params(), (size, 3 * size), jnp.float32))
        self.bias = nnx.Param(jnp.zeros((3 * size,), jnp.float32))
        self.recurrent_bias = nnx.Param(jnp.zeros((3 * size,), jnp.float32))

    def __call__(self, xs: jax.Array, mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """Runs the layer over `xs [B, L, E]`; `mask` as `LSTM.__call__`.

        Returns:
          `(outputs [B, L, H], final hidden state [B, H])`.
        """
        inputs = jnp.swapaxes(xs @ self.kernel[...] + self.bias[...].reshape(1, 1, -1), 0, 1)  # [L, B, 3H]
        keep = jnp.ones(inputs.shape[:2], bool) if mask is None else jnp.swapaxes(mask, 0, 1)
        outputs, h = gru_recurrence(inputs, self.recurrent_kernel[...], self.recurrent_bias[...], keep)
        return jnp.swapaxes(outputs, 0, 1), h


def _gru_forward_scan(inputs, recurrent, recurrent_bias, keep):
    """The recurrence of `GRU`, with what the backward pass needs."""

    def step(h, inp):
        a, kept = inp
        a_r, a_z, a_n = jnp.split(a, 3, axis=-1)
        u_r, u_z, u_n = jnp.split(h @ recurrent + recurrent_bias.reshape(1, -1), 3, axis=-1)
        r = jax.nn.sigmoid(a_r + u_r)
        z = jax.nn.sigmoid(a_z + u_z)
        n = jnp.tanh(a_n + r * u_n)
        h_new = jnp.where(kept[:, None], (1.0 - z) * n + z * h, h)
        return h_new, (h_new, (h, r, z, n, u_n))

    zeros = jnp.zeros((inputs.shape[1], recurrent.shape[0]), inputs.dtype)
    h, (outputs, saved) = jax.lax.scan(step, zeros, (inputs, keep))
    return outputs, h, saved


@jax.custom_vjp
def gru_recurrence(
    inputs: jax.Array, recurrent: jax.Array, recurrent_bias: jax.Array, keep: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The hidden states of `GRU` from `inputs[t] = x_t W + b` (`[L, B, 3H]`), U and b_h.

    As `lstm_recurrence`: where `keep [L, B]` is False a step keeps the
    previous state, and the hand-written VJP forms the gradients of U and b_h
    after the backward scan, as one product and one sum over all steps.

    Returns:
      (`[L, B, H]` hidden states, `[B, H]` final hidden state).
    """
    outputs, h, _ = _gru_forward_scan(inputs, recurrent, recurrent_bias, keep)
    return outputs, h


def _gru_recurrence_forward(inputs, recurrent, recurrent_bias, keep):
    outputs, h, saved = _gru_forward_scan(inputs, recurrent, recurrent_bias, keep)
    return (outputs, h), (recurrent, keep, saved)


def _gru_recurrence_backward(residuals, cotangents):
    recurrent, keep, saved = residuals
    d_outputs, d_final = cotangents
    transposed = recurrent.T

    def step(dh, inp):
        d_output, kept, (h_prev, r, z, n, u_n) = inp
        dh = dh + d_output
        dn = dh * (1.0 - z) * (1.0 - n**2)
        dr = dn * u_n * r * (1.0 - r)
        dz = dh * (h_prev - n) * z * (1.0 - z)
        kept = kept[:, None]
        da = jnp.where(kept, jnp.concatenate([dr, dz, dn], axis=-1), 0.0)
        du = jnp.where(kept, jnp.concatenate([dr, dz, dn * r], axis=-1), 0.0)
        dh_prev = jnp.where(kept, dh * z + du @ transposed, dh)
        return dh_prev, (da, du)

    _, (da, du) = jax.lax.scan(step, d_final, (d_outputs, keep, saved), reverse=True)
    d_recurrent = jnp.einsum("lbh,lbg->hg", saved[0], du)
    return da, d_recurrent, jnp.sum(du, axis=(0, 1)), None


gru_recurrence.defvjp(_gru_recurrence_forward, _gru_recurrence_backward)


def _cell(cell: str, in_features: int, hidden_size: int, rngs: nnx.Rngs) -> LSTM | GRU:
    layer = LSTM if cell == "lstm" else GRU
    return layer(in_features, hidden_size, rngs=rngs)


def _layer_widths(in_features: int, hidden_size: int, num_layers: int) -> list[tuple[int, int]]:
    """(in, out) widths of K stacked recurrent layers: (E, H) for the first, (H, H) for the others."""
    sizes = [in_features] + [hidden_size] * num_layers
    return list(zip(sizes[:-1], sizes[1:], strict=True))


def _dense(in_features: int, out_features: int, rngs: nnx.Rngs, *, use_bias: bool = True) -> nnx.Linear:
    return nnx.Linear(in_features, out_features, use_bias=use_bias, kernel_init=_glorot_uniform, rngs=rngs)


def _embed(vocab_size: int, dim: int, rngs: nnx.Rngs) -> nnx.Embed:
    return nnx.Embed(vocab_size, dim, embedding_init=_uniform_embedding, rngs=rngs)


def _tokens(x: jax.Array) -> jax.Array:
    return x.reshape(x.shape[0], -1).astype(jnp.int32)


# ---------------------------------------------------------------- recurrent models


class RecurrentLanguageModel(nnx.Module):
    """Embedding -> K recurrent layers -> optional linear projection -> dense to the vocabulary.

    `x [B, L]` token ids to logits `[B, L, V]`, the prediction of the next
    token at every position (McMahan et al. 2017's and TFF's Shakespeare
    model; Reddi et al. 2021's StackOverflow next-word model).

    The projection (width P, no activation) comes once, after the last
    recurrent layer. TFF's `create_recurrent_model` for StackOverflow puts one
    after every LSTM layer; with its one layer that is the same network.
    The layers do not skip padding (TFF's Keras `mask_zero=True` does): pads
    come last, and the recurrence is causal, so outputs at real positions are
    the same either way.
    """

    def __init__(
        self,
        input_vocab_size: int,
        num_classes: int,
        *,
        embedding_dim: int,
        hidden_size: int,
        num_layers: int,
        projection_dim: int | None = None,
        cell: str = "lstm",
        rngs: nnx.Rngs,
    ):
        self.embed = _embed(input_vocab_size, embedding_dim, rngs)
        widths = _layer_widths(embedding_dim, hidden_size, num_layers)
        self.layers = nnx.List([_cell(cell, a, b, rngs) for a, b in widths])
        self.projection = _dense(hidden_size, projection_dim, rngs) if projection_dim else None
        self.head = _dense(projection_dim or hidden_size, num_classes, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = self.embed(_tokens(x))
        for layer in self.layers:
            h, _ = layer(h)
        if self.projection is not None:
            h = self.projection(h)
        return self.head(h)


class GRUClassifier(nnx.Module):
    """The Delta-FL reference's Shakespeare model: embedding -> GRU -> linear on the last step.

    `x [B, L]` character ids to logits `[B, num_outputs]` of the character
    after the window: `logits = W h_L + b`, `h_L` the last layer's hidden
    state after the L-th (last) character (krishnap25/simplicial-fl :
    models/shakespeare/erm_lstm_log_reg.py, `RecurrentModel`: `nn.Embedding`
    (8), `nn.GRU` (128), `nn.Linear` on `out[:, -1, :]`). Every position is a
    real character (LEAF windows have no padding; id 0 is the space).
    """

    def __init__(
        self,
        input_vocab_size: int,
        num_outputs: int,
        *,
        embedding_dim: int,
        hidden_size: int,
        num_layers: int,
        rngs: nnx.Rngs,
    ):
        self.embed = _embed(input_vocab_size, embedding_dim, rngs)
        widths = _layer_widths(embedding_dim, hidden_size, num_layers)
        self.layers = nnx.List([GRU(a, b, rngs=rngs) for a, b in widths])
        self.head = _dense(hidden_size, num_outputs, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        tokens = _tokens(x)
        first = self.layers[0]
        # Embedding then input projection is a lookup of one [V, 3H] table (the same products, once per
        # id), gathered time-major: the [B, L, 3H] inputs and their transpose are never formed.
        table = self.embed.embedding[...] @ first.kernel[...] + first.bias[...].reshape(1, -1)
        inputs = table[tokens.T]  # [L, B, 3H]
        keep = jnp.ones(inputs.shape[:2], bool)
        outputs, last = gru_recurrence(inputs, first.recurrent_kernel[...], first.recurrent_bias[...], keep)
        h = jnp.swapaxes(outputs, 0, 1)
        for layer in self.layers[1:]:
            h, last = layer(h)
        return self.head(last)


def glove_lookup_table(table: np.ndarray) -> np.ndarray:
    """Jaxfl's Sent140 token-id table from a `[V, D]` GloVe table: `[V + 2, D]` float32.

    Row 0 (pad) and row V + 1 (unknown word) are zeros; row i + 1 is GloVe
    word i (`jaxfl.data.datasets.sent140`, 'tokens' features). The Delta-FL
    reference (LEAF's `get_embs.py`) likewise appends one zero row, for its
    id V that stands for both padding and unknown words.
    """
    table = np.asarray(table, np.float32)
    rows, dim = table.shape
    full = np.zeros((rows + 2, dim), np.float32)
    full[1 : rows + 1] = table
    return full


class Sent140LSTM(nnx.Module):
    """Frozen word embeddings -> LSTM -> one logit (the Delta-FL reference's Sent140 model).

    `x [B, L]` word ids to `[B, 1]` logits of the positive class:
    `W h + b`, `h` the LSTM's hidden state after the LAST REAL token, id != 0
    (padded steps keep the state, Keras `mask_zero` semantics, so appending
    pads changes nothing; an all-pad tweet gives `h = 0`). Unknown words
    (id V + 1, a zero embedding) are steps like any other.

    The reference (krishnap25/simplicial-fl : models/sent140/erm_lstm_log_reg.py,
    `LSTMModel`) reads `out[:, -1, :]`, the state after the 20th position,
    and its padding (LEAF's `line_to_indices` pads with the unknown id, whose
    embedding is zeros) runs through the LSTM as zero inputs: its output
    depends on how many pads follow the tweet; here it does not. Its LSTM has
    PyTorch's two biases (`recurrent_bias=True` here: 4 * (E + H + 2) * H
    parameters); the embedding is `Embedding.from_pretrained`, frozen.
    """

    def __init__(self, table: np.ndarray, *, hidden_size: int, num_layers: int, rngs: nnx.Rngs):
        self.table = FrozenTable(jnp.asarray(table, jnp.float32))
        widths = _layer_widths(table.shape[1], hidden_size, num_layers)
        self.layers = nnx.List([LSTM(a, b, recurrent_bias=True, rngs=rngs) for a, b in widths])
        self.head = _dense(hidden_size, 1, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        tokens = _tokens(x)
        mask = tokens != 0
        h = jnp.take(self.table[...], tokens, axis=0)
        for layer in self.layers:
            h, last = layer(h, mask)
        return self.head(last)


class MeanEmbeddingLogistic(nnx.Module):
    """Logistic regression on the mean frozen embedding of a tweet's known words.

    `x [B, L]` word ids to `[B, 1]` logits: `w . mean_{l: 1 <= x_l <= V} E[x_l] + b`,
    the mean over known words (pad 0 and unknown V + 1 left out; zeros when
    there is none), which is the Sent140 'mean-glove' feature (the Delta-FL
    reference's linear model) of the first L words. Starts at zero (convex).
    """

    def __init__(self, table: np.ndarray, *, rngs: nnx.Rngs):
        self.table = FrozenTable(jnp.asarray(table, jnp.float32))
        self.known = table.shape[0] - 2  # V: ids 1..V are words
        self.dense = nnx.Linear(table.shape[1], 1, kernel_init=nnx.initializers.zeros_init(), rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        tokens = _tokens(x)
        known = ((tokens >= 1) & (tokens <= self.known)).astype(jnp.float32)
        summed = jnp.einsum("bl,bld->bd", known, jnp.take(self.table[...], tokens, axis=0))
        return self.dense(summed / jnp.maximum(jnp.sum(known, axis=1, keepdims=True), 1.0))


# ---------------------------------------------------------------- transformer


def sinusoidal_positions(length: int, dim: int) -> np.ndarray:
    """Vaswani et al. (2017) section 3.5: `[length, dim]`, sin at even and cos at odd columns."""
    positions = np.arange(length, dtype=np.float64)[:, None]
    rates = np.exp(np.arange(0, dim, 2) * (-np.log(10000.0) / dim))
    table = np.zeros((length, dim), np.float64)
    table[:, 0::2] = np.sin(positions * rates)
    table[:, 1::2] = np.cos(positions * rates[: dim // 2])
    return table.astype(np.float32)


def _dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
    if key is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0)


class TransformerLayer(nnx.Module):
    """A post-LN causal encoder layer, PyTorch's `nn.TransformerEncoderLayer` (`norm_first=False`).

        x = LN1(x + Dropout(MHA(x)));  x = LN2(x + Dropout(W2 Dropout(relu(W1 x + b1)) + b2))

    MHA: `[q, k, v] = x W_in + b_in` (`W_in [E, 3E]`), H heads of E / H
    dimensions, scores `q k^T / sqrt(E / H)` with the causal mask (position i
    attends to j <= i), softmax, dropout on the attention weights, then the
    output projection `W_out [E, E] + b_out`. Layer norms: eps 1e-5.
    """

    def __init__(self, dim: int, num_heads: int, feedforward_size: int, dropout_rate: float, *, rngs):
        self.num_heads = num_heads
        self.dropout_rate = dropout_rate
        self.attention_in = _dense(dim, 3 * dim, rngs)
        self.attention_out = _dense(dim, dim, rngs)
        self.norm1 = nnx.LayerNorm(dim, epsilon=1e-5, rngs=rngs)
        self.feedforward_in = _dense(dim, feedforward_size, rngs)
        self.feedforward_out = _dense(feedforward_size, dim, rngs)
        self.norm2 = nnx.LayerNorm(dim, epsilon=1e-5, rngs=rngs)

    def __call__(self, x: jax.Array, key: jax.Array | None = None) -> jax.Array:
        keys = [None] * 4 if key is None else list(jax.random.split(key, 4))
        batch, length, dim = x.shape
        heads = self.num_heads
        q, k, v = jnp.split(self.attention_in(x).reshape(batch, length, 3 * heads, dim // heads), 3, axis=2)
        scores = jnp.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(dim // heads)
        causal = jnp.tril(jnp.ones((length, length), bool))
        weights = jax.nn.softmax(jnp.where(causal[None, None], scores, -jnp.inf), axis=-1)
        weights = _dropout(weights, self.dropout_rate, keys[0])
        attended = jnp.einsum("bhij,bjhd->bihd", weights, v).reshape(batch, length, dim)
        x = self.norm1(x + _dropout(self.attention_out(attended), self.dropout_rate, keys[1]))
        hidden = _dropout(jax.nn.relu(self.feedforward_in(x)), self.dropout_rate, keys[2])
        return self.norm2(x + _dropout(self.feedforward_out(hidden), self.dropout_rate, keys[3]))


class CausalTransformer(nnx.Module):
    """pfl-research's StackOverflow transformer language model.

    apple/pfl-research : benchmarks/model/pytorch/transformer.py
    (`LMTransformer`, after google-research/federated's
    `fedopt_guide/stackoverflow_transformer`, Wang et al. 2021):

        h = E[x] * sqrt(D) + P;  h = layer_K(...layer_1(h));  logits = h E^T

    with `E [V, D]` the token embedding (U[-0.05, 0.05]), `P [L, D]` the
    fixed sinusoidal positions (`learned_positions`: a trained `[L, D]`
    table instead), K post-LN `TransformerLayer`s with a causal mask, and
    the output tied to the input embedding (`tie_embeddings=False`: a dense
    layer `[D, V]` with bias). pfl-research's hidden size equals its
    embedding size (96), so its in/out projections are the identity and are
    left out. Padding (id 0, at the end) is not masked as a key, as in the
    reference: under the causal mask a real position never attends to a
    later pad. Dropout (`dropout_rate`, PyTorch's places) applies only when
    `__call__` gets a key.
    """

    def __init__(
        self,
        input_vocab_size: int,
        num_classes: int,
        max_length: int,
        *,
        embedding_dim: int,
        num_heads: int,
        feedforward_size: int,
        num_layers: int,
        dropout_rate: float,
        tie_embeddings: bool,
        learned_positions: bool,
        rngs: nnx.Rngs,
    ):
        self.embedding_dim = embedding_dim
        self.embed = _embed(input_vocab_size, embedding_dim, rngs)
        shape = (max_length, embedding_dim)
        self.positions = nnx.Param(_uniform_embedding(rngs.params(), shape)) if learned_positions else None
        self.layers = nnx.List(
            [
                TransformerLayer(embedding_dim, num_heads, feedforward_size, dropout_rate, rngs=rngs)
                for _ in range(num_layers)
            ]
        )
        self.head = None if tie_embeddings else _dense(embedding_dim, num_classes, rngs)

    def __call__(self, x: jax.Array, key: jax.Array | None = None) -> jax.Array:
        tokens = _tokens(x)
        length = tokens.shape[1]
        if self.positions is None:
            positions = jnp.asarray(sinusoidal_positions(length, self.embedding_dim))
        else:
            positions = self.positions[...][:length]
        h = self.embed(tokens) * math.sqrt(self.embedding_dim) + positions[None]
        for index, layer in enumerate(self.layers):
            h = layer(h, None if key is None else jax.random.fold_in(key, index))
        if self.head is None:
            return self.embed.attend(h)
        return self.head(h)


# ---------------------------------------------------------------- builders


def _sequence_length(name: str, input_shape: Sequence[int], input_vocab_size: int | None) -> int:
    if input_vocab_size is None:
        raise ValueError(f"{name} needs token inputs; this dataset's inputs are real-valued")
    shape = tuple(input_shape)
    if len(shape) != 1 or shape[0] < 1:
        raise ValueError(f"{name} needs one token sequence per example (input shape [L]), got {shape}")
    return shape[0]


def _positive(name: str, **values: int | None) -> None:
    for option, value in values.items():
        if value is not None and (not isinstance(value, int | np.integer) or value < 1):
            raise ValueError(f"{name}: {option} must be a positive integer, got {value!r}")


def _lstm_flops(in_features: int, hidden_size: int) -> int:
    return 2 * (in_features + hidden_size) * 4 * hidden_size


def _gru_flops(in_features: int, hidden_size: int) -> int:
    return 2 * (in_features + hidden_size) * 3 * hidden_size


def build_recurrent_lm(
    input_shape: Sequence[int],
    num_classes: int,
    *,
    input_vocab_size: int | None = None,
    embedding_dim: int = 8,
    hidden_size: int = 256,
    num_layers: int = 2,
    projection_dim: int | None = None,
    cell: str = "lstm",
    name: str = "recurrent-lm",
) -> Model:
    """A `RecurrentLanguageModel`: `[B, L]` ids to `[B, L, num_classes]` logits.

    Args:
      input_shape: `(L,)`.
      num_classes: V, the output vocabulary (the dataset's target ids).
      input_vocab_size: the input ids' vocabulary (required: token inputs).
      embedding_dim: E.
      hidden_size: H, the recurrent layers' width.
      num_layers: K.
      projection_dim: P, a linear layer after the recurrence (None: none).
      cell: 'lstm' or 'gru'.
      name: the registry name.

    Raises:
      ValueError: real-valued inputs, not one sequence per example, an
        unknown cell or a non-positive size.
    """
    length = _sequence_length(name, input_shape, input_vocab_size)
    if cell not in CELLS:
        raise ValueError(f"{name}: cell must be one of {CELLS}, got {cell!r}")
    _positive(
        name,
        num_classes=num_classes,
        embedding_dim=embedding_dim,
        hidden_size=hidden_size,
        num_layers=num_layers,
        projection_dim=projection_dim,
    )
    cell_flops = _lstm_flops if cell == "lstm" else _gru_flops
    flops = sum(cell_flops(a, b) for a, b in _layer_widths(embedding_dim, hidden_size, num_layers))
    flops += 2 * hidden_size * projection_dim if projection_dim else 0
    flops += 2 * (projection_dim or hidden_size) * num_classes
    return as_model(
        lambda rngs: RecurrentLanguageModel(
            input_vocab_size,
            num_classes,
            embedding_dim=embedding_dim,
            hidden_size=hidden_size,
            num_layers=num_layers,
            projection_dim=projection_dim,
            cell=cell,
            rngs=rngs,
        ),
        name,
        length * flops,
    )


def build_char_lstm(
    input_shape: Sequence[int],
    num_classes: int,
    *,
    input_vocab_size: int | None = None,
    embedding_dim: int = 8,
    hidden_size: int = 256,
    num_layers: int = 2,
    projection_dim: int | None = None,
) -> Model:
    """'char-lstm': TFF/FedJAX Shakespeare, embedding 8, 2 x LSTM 256, dense to the vocabulary.

    McMahan et al. (2017); Reddi et al. (2021) section 2's table; FedJAX
    `shakespeare.create_lstm_model` (86 characters + 4 specials = 90 ids,
    sequence length 80). See `build_recurrent_lm`.
    """
    return build_recurrent_lm(
        input_shape,
        num_classes,
        input_vocab_size=input_vocab_size,
        embedding_dim=embedding_dim,
        hidden_size=hidden_size,
        num_layers=num_layers,
        projection_dim=projection_dim,
        name="char-lstm",
    )


def build_word_lstm(
    input_shape: Sequence[int],
    num_classes: int,
    *,
    input_vocab_size: int | None = None,
    embedding_dim: int = 96,
    hidden_size: int = 670,
    num_layers: int = 1,
    projection_dim: int | None = 96,
) -> Model:
    """'word-lstm': Reddi et al. (2021) StackOverflow next-word prediction.

    Embedding 96, 1 x LSTM 670, linear projection to 96, dense to the
    vocabulary (10,000 words + pad/bos/eos/oov = 10,004 ids: 4,050,748
    parameters), sequence length 20 (google-research/federated :
    utils/models/stackoverflow_models.py, `create_recurrent_model`). See
    `build_recurrent_lm`.
    """
    return build_recurrent_lm(
        input_shape,
        num_classes,
        input_vocab_size=input_vocab_size,
        embedding_dim=embedding_dim,
        hidden_size=hidden_size,
        num_layers=num_layers,
        projection_dim=projection_dim,
        name="word-lstm",
    )


def build_char_gru(
    input_shape: Sequence[int],
    num_classes: int,
    *,
    input_vocab_size: int | None = None,
    embedding_dim: int = 8,
    hidden_size: int = 128,
    num_layers: int = 1,
    num_outputs: int | None = None,
) -> Model:
    """'char-gru': the Delta-FL Shakespeare model (`GRUClassifier`), `[B, L]` ids to `[B, C]`.

    Args:
      input_shape: `(L,)` (the reference: 20 characters).
      num_classes: the next character's classes (the reference: 53).
      input_vocab_size: the input ids' vocabulary (required).
      embedding_dim: 8 in the reference.
      hidden_size: the GRU width, 128 in the reference.
      num_layers: 1 in the reference.
      num_outputs: the linear layer's width, default `num_classes`. The
        reference passes its hidden size (128) as the output width, so its
        128 logits include 75 classes no label ever takes; 128 reproduces
        that network (and its parameter count) exactly.

    Raises:
      ValueError: real-valued inputs, not one sequence per example, a
        non-positive size, or `num_outputs < num_classes`.
    """
    name = "char-gru"
    length = _sequence_length(name, input_shape, input_vocab_size)
    _positive(
        name,
        num_classes=num_classes,
        embedding_dim=embedding_dim,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_outputs=num_outputs,
    )
    outputs = num_classes if num_outputs is None else num_outputs
    if outputs < num_classes:
        raise ValueError(f"{name}: num_outputs ({outputs}) must be at least num_classes ({num_classes})")
    flops = length * sum(_gru_flops(a, b) for a, b in _layer_widths(embedding_dim, hidden_size, num_layers))
    flops += 2 * hidden_size * outputs
    return as_model(
        lambda rngs: GRUClassifier(
            input_vocab_size,
            outputs,
            embedding_dim=embedding_dim,
            hidden_size=hidden_size,
            num_layers=num_layers,
            rngs=rngs,
        ),
        name,
        flops,
    )


def build_transformer(
    input_shape: Sequence[int],
    num_classes: int,
    *,
    input_vocab_size: int | None = None,
    embedding_dim: int = 96,
    num_heads: int = 8,
    feedforward_size: int = 1536,
    num_layers: int = 3,
    dropout_rate: float = 0.1,
    tie_embeddings: bool = True,
    learned_positions: bool = False,
) -> Model:
    """'transformer': pfl-research's StackOverflow `CausalTransformer`, `[B, L]` ids to `[B, L, V]`.

    Defaults are pfl-research's `benchmarks/lm/configs/baseline.yaml`:
    embedding (= hidden) 96, 8 heads, feed-forward 1536, 3 layers, dropout
    0.1, tied input/output embeddings. The model is `stochastic` when
    `dropout_rate > 0` (dropout with a key, none without).

    Raises:
      ValueError: real-valued inputs, not one sequence per example, a
        non-positive size, heads not dividing the embedding, a dropout rate
        outside [0, 1), or tied embeddings with `num_classes !=
        input_vocab_size`.
    """
    name = "transformer"
    length = _sequence_length(name, input_shape, input_vocab_size)
    _positive(
        name,
        num_classes=num_classes,
        embedding_dim=embedding_dim,
        num_heads=num_heads,
        feedforward_size=feedforward_size,
        num_layers=num_layers,
    )
    if embedding_dim % num_heads:
        raise ValueError(f"{name}: num_heads ({num_heads}) must divide embedding_dim ({embedding_dim})")
    if not 0.0 <= dropout_rate < 1.0:
        raise ValueError(f"{name}: dropout_rate must be in [0, 1), got {dropout_rate}")
    if tie_embeddings and num_classes != input_vocab_size:
        raise ValueError(
            f"{name}: tied embeddings need num_classes == input_vocab_size, got {num_classes} and "
            f"{input_vocab_size} (pass tie_embeddings=False)"
        )
    dim, ff = embedding_dim, feedforward_size
    per_layer = 2 * dim * 3 * dim + 2 * 2 * length * dim + 2 * dim * dim + 2 * 2 * dim * ff
    flops = length * (num_layers * per_layer + 2 * dim * num_classes)
    return as_model(
        lambda rngs: CausalTransformer(
            input_vocab_size,
            num_classes,
            length,
            embedding_dim=embedding_dim,
            num_heads=num_heads,
            feedforward_size=feedforward_size,
            num_layers=num_layers,
            dropout_rate=float(dropout_rate),
            tie_embeddings=tie_embeddings,
            learned_positions=learned_positions,
            rngs=rngs,
        ),
        name,
        flops,
        stochastic=dropout_rate > 0,
    )


def _frozen_table(name: str, embedding_table, input_vocab_size: int) -> np.ndarray:
    if embedding_table is None:
        raise ValueError(f"{name} needs embedding_table, the [V, D] GloVe array of the dataset's vocabulary")
    table = np.asarray(embedding_table)
    if table.ndim != 2 or not np.issubdtype(table.dtype, np.floating):
        raise ValueError(
            f"{name}: embedding_table must be a 2-D float array [V, D], got {table.dtype} {table.shape}"
        )
    if table.shape[0] + 2 != input_vocab_size:
        raise ValueError(
            f"{name}: embedding_table has {table.shape[0]} words but the inputs have {input_vocab_size} ids; "
            "expected input_vocab_size = V + 2 (0 pads, 1..V words, V + 1 unknown)"
        )
    return glove_lookup_table(table)


def _binary(name: str, num_classes: int) -> None:
    if num_classes != 2:
        raise ValueError(
            f"{name} is a binary classifier (one logit): num_classes must be 2, got {num_classes}"
        )


def build_sent140_lstm(
    input_shape: Sequence[int],
    num_classes: int,
    *,
    input_vocab_size: int | None = None,
    embedding_table: np.ndarray | None = None,
    hidden_size: int | None = None,
    num_layers: int = 1,
) -> Model:
    """'sent140-lstm': the Delta-FL `Sent140LSTM`, `[B, L]` word ids to `[B, 1]` logits.

    Args:
      input_shape: `(L,)` (the reference: 20 words).
      num_classes: 2 (one logit of the positive class).
      input_vocab_size: V + 2 (required: token inputs).
      embedding_table: the frozen `[V, D]` GloVe table (the reference: 6B,
        50d); GloVe word i is id i + 1.
      hidden_size: the LSTM width, default D (the reference: 50).
      num_layers: 1 in the reference.

    Raises:
      ValueError: real-valued inputs, a missing or mis-sized table, not one
        sequence per example, non-positive sizes, or `num_classes != 2`.
    """
    name = "sent140-lstm"
    length = _sequence_length(name, input_shape, input_vocab_size)
    table = _frozen_table(name, embedding_table, input_vocab_size)
    _binary(name, num_classes)
    dim = table.shape[1]
    hidden = dim if hidden_size is None else hidden_size
    _positive(name, hidden_size=hidden, num_layers=num_layers)
    flops = length * sum(_lstm_flops(a, b) for a, b in _layer_widths(dim, hidden, num_layers)) + 2 * hidden
    return as_model(
        lambda rngs: Sent140LSTM(table, hidden_size=hidden, num_layers=num_layers, rngs=rngs), name, flops
    )


def build_mean_embedding_logistic(
    input_shape: Sequence[int],
    num_classes: int,
    *,
    input_vocab_size: int | None = None,
    embedding_table: np.ndarray | None = None,
) -> Model:
    """'mean-embedding-logistic': `MeanEmbeddingLogistic` on a frozen `[V, D]` table, `[B, 1]` logits.

    Raises:
      ValueError: as `build_sent140_lstm`.
    """
    name = "mean-embedding-logistic"
    length = _sequence_length(name, input_shape, input_vocab_size)
    table = _frozen_table(name, embedding_table, input_vocab_size)
    _binary(name, num_classes)
    dim = table.shape[1]
    return as_model(
        lambda rngs: MeanEmbeddingLogistic(table, rngs=rngs), name, 2 * length * dim + 2 * dim
    )


SEQUENCE_MODELS: dict[str, Callable[..., Model]] = {
    "char-lstm": build_char_lstm,
    "char-gru": build_char_gru,
    "word-lstm": build_word_lstm,
    "transformer": build_transformer,
    "sent140-lstm": build_sent140_lstm,
    "mean-embedding-logistic": build_mean_embedding_logistic,
}
