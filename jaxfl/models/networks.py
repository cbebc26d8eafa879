"""Flax models of the papers, exposed as pure `Model(init, apply)` pairs.

The round vmaps and scans over clients, so models are used functionally: a
flax NNX module is split once into its graph and parameters, parameters are
kept as a plain nested dict (a pytree optax and `jax.tree` handle directly),
and `apply(params, x)` merges them back inside the traced function.

References:
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
  [Joulin et al. 2017] Bag of Tricks for Efficient Text Classification. EACL 2017.
  [Reddi et al. 2021] Adaptive Federated Optimization. ICLR 2021.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

# Model, default_conv and CONV_IMPLEMENTATIONS are also imported from here.
from jaxfl.models.base import CONV_IMPLEMENTATIONS, Model, as_model, default_conv, image_input_shape  # noqa: F401
from jaxfl.models.convolution import same_conv2d
from jaxfl.models.sequence import SEQUENCE_MODELS
from jaxfl.models.vision import VISION_MODELS
from jaxfl.types import Params


def _first_layer(layer: nnx.Linear, x: jax.Array, vocab_size: int | None) -> jax.Array:
    """`layer(x)` on real features, or on the one-hot encoding of token ids.

    With tokens (`vocab_size` V, x `[B, L]` ids), the layer's kernel has L*V
    rows, one per (position, token), and `one_hot(x) @ kernel` is the sum of
    the L rows the tokens pick: computed as that gather and sum, the same
    function (and gradient) as the one-hot product without materializing
    `[B, L*V]` one-hot inputs.
    """
    x = x.reshape(x.shape[0], -1)
    if vocab_size is None:
        return layer(x)
    kernel, bias = layer.kernel[...], layer.bias[...]
    batch, positions = x.shape
    tokens = x.astype(jnp.int32)
    bias = bias.reshape(1, -1)
    if batch * positions * kernel.shape[1] <= _GATHER_ELEMENTS:
        rows = jnp.arange(positions, dtype=jnp.int32).reshape(1, -1) * vocab_size + tokens
        return jnp.sum(kernel[rows], axis=1) + bias
    # Large batches (evaluation chunks): gathering [B, L, C] at once is
    # memory-bound on CPU; a scan over positions keeps the [B, C] sum in
    # cache, and was measured faster there. Same sum, another order.
    per_position = kernel.reshape(positions, vocab_size, kernel.shape[1])

    def add_position(total, position):
        return total + per_position[position][tokens[:, position]], None

    total, _ = jax.lax.scan(
        add_position, jnp.zeros((batch, kernel.shape[1]), kernel.dtype), jnp.arange(positions)
    )
    return total + bias


# Above this many gathered values, `_first_layer` sums position by position.
_GATHER_ELEMENTS = 1 << 20


class LinearClassifier(nnx.Module):
    """Softmax regression `x -> W x + b` (Pillutla et al. 2023, Appendix C.1, linear model).

    Starts at the origin: the problem is convex, and a deterministic start
    makes runs comparable across seeds that only change sampling. On token
    inputs (`vocab_size` set) x is one-hot encoded: `num_features` is then
    the sequence length times the vocabulary size.
    """

    def __init__(
        self, num_features: int, num_classes: int, *, vocab_size: int | None = None, rngs: nnx.Rngs
    ):
        self.vocab_size = vocab_size
        self.dense = nnx.Linear(
            num_features,
            num_classes,
            kernel_init=nnx.initializers.zeros_init(),
            rngs=rngs,
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        return _first_layer(self.dense, x, self.vocab_size)


class MLP(nnx.Module):
    """Fully connected network with ReLU hidden layers."""

    def __init__(
        self,
        num_features: int,
        hidden_sizes: Sequence[int],
        num_classes: int,
        *,
        vocab_size: int | None = None,
        rngs: nnx.Rngs,
    ):
        self.vocab_size = vocab_size
        sizes = [num_features, *hidden_sizes]
        self.hidden = nnx.List(
            [nnx.Linear(a, b, rngs=rngs) for a, b in zip(sizes[:-1], sizes[1:], strict=True)]
        )
        self.out = nnx.Linear(sizes[-1], num_classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = jax.nn.relu(_first_layer(self.hidden[0], x, self.vocab_size))
        for layer in self.hidden[1:]:
            x = jax.nn.relu(layer(x))
        return self.out(x)


class EmbeddingBag(nnx.Module):
    """Mean of the tokens' embeddings, then a linear layer (a fastText-style classifier).

    Joulin et al., "Bag of Tricks for Efficient Text Classification" (2017):
    `logits = W mean_{l: x_l != 0} E[x_l] + b`, token id 0 being padding (the
    id jaxfl's token datasets pad with). A small model for token inputs
    whose vocabulary is too large for a one-hot linear layer (StackOverflow's
    10k words).
    """

    def __init__(self, vocab_size: int, embedding_dim: int, num_classes: int, *, rngs: nnx.Rngs):
        self.embed = nnx.Embed(vocab_size, embedding_dim, rngs=rngs)
        self.dense = nnx.Linear(embedding_dim, num_classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        tokens = x.reshape(x.shape[0], -1).astype(jnp.int32)
        real = (tokens != 0).astype(jnp.float32)
        summed = jnp.einsum("bl,bld->bd", real, self.embed(tokens))
        mean = summed / jnp.maximum(jnp.sum(real, axis=1, keepdims=True), 1.0)
        return self.dense(mean)


class BagOfWordsLogistic(nnx.Module):
    """Logistic regression on TFF's StackOverflow bag of words, computed from the word ids.

    Reddi et al. 2021's StackOverflow LR (`google-research/federated :
    utils/models/stackoverflow_lr_models.py`, a `Dense(T, sigmoid)` on V
    features; `utils/datasets/stackoverflow_lr_dataset.py`, `build_to_ids_fn`):
    the features of a post are the mean of its words' one-hot vectors over
    V + 1 columns (the last one for every unknown word), that column
    dropped: f_v = (number of the post's words that are word v) / (number of
    its words, unknown ones included). The logits are `f @ W + b`, W `[V, T]`,
    computed as the sum of W's rows of the post's in-vocabulary words divided
    by that count: a gather and sum of the post's rows, never the `[B, V]`
    features (the same function and gradient). The sigmoid of the logits is
    the model's output; the task applies it in its loss.

    Ids (the 'tags' layout of jaxfl's StackOverflow, FedJAX's layout): 0 is
    padding (not a word), `first_word_id .. first_word_id + V - 1` are the
    vocabulary's words in order, and any other id an out-of-vocabulary word,
    which only counts in the denominator. `count_oov=False` divides by the
    number of in-vocabulary words instead (TFF's later
    `tag_prediction_preprocessing.py`, `divide_no_nan`). A post without
    words gets all-zero features (TF's mean over no words is NaN).

    Starts at zero, like the linear model (the problem is convex).
    """

    def __init__(
        self,
        num_words: int,
        num_classes: int,
        *,
        first_word_id: int = 3,
        count_oov: bool = True,
        rngs: nnx.Rngs,
    ):
        del rngs  # Zero initialization.
        self.num_words = num_words
        self.first_word_id = first_word_id
        self.count_oov = count_oov
        self.kernel = nnx.Param(jnp.zeros((num_words, num_classes), jnp.float32))
        self.bias = nnx.Param(jnp.zeros((num_classes,), jnp.float32))

    def __call__(self, x: jax.Array) -> jax.Array:
        tokens = x.reshape(x.shape[0], -1).astype(jnp.int32)
        rows = tokens - self.first_word_id
        is_word = (rows >= 0) & (rows < self.num_words)
        counted = (tokens != 0) if self.count_oov else is_word
        count = jnp.sum(counted, axis=1, keepdims=True).astype(jnp.float32)
        weights = is_word.astype(jnp.float32) / jnp.maximum(count, 1.0)
        summed = _weighted_row_sum(self.kernel[...], jnp.where(is_word, rows, 0), weights)
        return summed + self.bias[...].reshape(1, -1)


def _weighted_row_sum(table: jax.Array, rows: jax.Array, weights: jax.Array) -> jax.Array:
    """`[B, C]`: sum over l of `weights[b, l] * table[rows[b, l]]`.

    Gathered at once for small batches; position by position (a scan that
    keeps the `[B, C]` sum in cache) above `_GATHER_ELEMENTS` gathered values,
    as `_first_layer` does: on CPU, by positions was measured faster for
    StackOverflow-sized inputs (10,000 words, 500 tags, 128 positions),
    both for a training step of batch 100 and for the forward pass of
    4,096 posts. (Not measured on GPUs, where one gather may win.)
    """
    batch, positions = rows.shape
    if batch * positions * table.shape[1] <= _GATHER_ELEMENTS:
        return jnp.einsum("bl,blc->bc", weights, table[rows])

    def add_position(total, position):
        return total + weights[:, position, None] * table[rows[:, position]], None

    total, _ = jax.lax.scan(
        add_position, jnp.zeros((batch, table.shape[1]), table.dtype), jnp.arange(positions)
    )
    return total


class ConvNet(nnx.Module):
    """The EMNIST ConvNet of Pillutla et al. 2023, Appendix C.1.

    Two 5x5 convolutions ('SAME' padding) with 32 and 64 channels, each
    followed by ReLU and 2x2 max-pooling, then one dense layer to the classes.
    The paper gives no channel counts; these are those of the ConvNet
    workload that fedjax runs in the speed comparison
    (`benchmarks/compare_peers.py`), so both run the same network.

    Three implementations of the same function with the same parameters
    (`conv`), since which is fastest depends on the backend
    (benchmarks/RESULTS.md):

    * 'lax': `lax.conv_general_dilated` and its autodiff gradient (fastest
      measured on a GPU);
    * 'canonical': `jaxfl.models.convolution.same_conv2d`, whose gradient
      convolutions are all in XLA:CPU's fast layout (several times faster
      per local step on CPU than 'lax' inside the local-training loop:
      benchmarks/RESULTS.md, section
      "The ConvNet on CPU: a layout bug in autodiff, found and fixed");
    * 'patches': image patches times the reshaped kernel; under `vmap` over
      clients, each with its own kernel, that is a batched matrix product
      where a vmapped convolution becomes a grouped convolution.
    """

    def __init__(
        self,
        image_shape: tuple[int, int, int],
        num_classes: int,
        channels: Sequence[int] = (32, 64),
        *,
        conv: str = "lax",
        rngs: nnx.Rngs,
    ):
        if conv not in CONV_IMPLEMENTATIONS:
            raise ValueError(f"conv must be one of {CONV_IMPLEMENTATIONS}, got {conv!r}")
        self.conv_impl = conv
        self.image_shape = tuple(image_shape)
        height, width, in_channels = self.image_shape
        convs = []
        for out_channels in channels:
            convs.append(
                nnx.Conv(in_channels, out_channels, (5, 5), padding="SAME", rngs=rngs)
            )
            in_channels = out_channels
            height, width = height // 2, width // 2
        self.convs = nnx.List(convs)
        self.dense = nnx.Linear(height * width * in_channels, num_classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.reshape(x.shape[0], *self.image_shape)
        for conv in self.convs:
            if self.conv_impl == "patches":
                x = jax.nn.relu(_conv_as_matmul(x, conv.kernel[...], conv.bias[...]))
            elif self.conv_impl == "canonical":
                x = jax.nn.relu(same_conv2d(x, conv.kernel[...]) + conv.bias[...].reshape(1, 1, 1, -1))
            else:
                x = jax.nn.relu(conv(x))
            x = nnx.max_pool(x, window_shape=(2, 2), strides=(2, 2), padding="VALID")
        return self.dense(x.reshape(x.shape[0], -1))


def _conv_as_matmul(x: jax.Array, kernel: jax.Array, bias: jax.Array) -> jax.Array:
    """'SAME' stride-1 convolution as patches @ kernel (NHWC, HWIO kernel)."""
    height, width, in_channels, out_channels = kernel.shape
    patches = jax.lax.conv_general_dilated_patches(
        x,
        filter_shape=(height, width),
        window_strides=(1, 1),
        padding="SAME",
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
    )
    # Patch features are ordered (input channel, row, column).
    matrix = kernel.transpose(2, 0, 1, 3).reshape(in_channels * height * width, out_channels)
    return patches @ matrix + bias.reshape(1, 1, 1, out_channels)


def model_names() -> tuple[str, ...]:
    return ("linear", "mlp", "convnet", "embedding-bag", "bag-logistic", *VISION_MODELS, *SEQUENCE_MODELS)


def make_model(
    name: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    *,
    hidden_sizes: Sequence[int] = (64,),
    conv: str = "auto",
    input_vocab_size: int | None = None,
    embedding_dim: int = 32,
    embedding_table=None,
) -> Model:
    """Builds a registered model.

    The reference architectures live in `jaxfl.models.vision` (EMNIST CR CNN,
    LEAF CNN, ResNet-18 GN, the Delta-FL ConvNet) and `jaxfl.models.sequence`
    (character and word LSTMs, the GRU, the transformer, the Sent140 models),
    each at its paper's sizes.

    Args:
      name: 'linear', 'mlp', 'convnet', 'embedding-bag' or 'bag-logistic'
        (or a reference model's name).
      input_shape: shape of one example's features.
      num_classes: number of output classes.
      hidden_sizes: hidden layer widths of the MLP.
      conv: the convnet's convolution, 'lax', 'canonical' or 'patches' (the
        same function; see `ConvNet`), or 'auto': `default_conv` of the
        default backend.
      input_vocab_size: V when the inputs are token ids in [0, V): 'linear'
        and 'mlp' one-hot encode them, 'embedding-bag' embeds them (and
        needs them); 'bag-logistic' reads them as StackOverflow word ids
        (FedJAX's layout: pad, bos, eos, V - 4 words, one oov id).
      embedding_dim: the embedding width of 'embedding-bag'.
      embedding_table: the frozen `[V, D]` word vectors of 'sent140-lstm'
        and 'mean-embedding-logistic' (GloVe).

    Returns:
      The `Model`.

    Raises:
      ValueError: unknown name, a convnet on non-image features or on
        tokens, or an embedding-bag on real-valued features.
    """
    if name in VISION_MODELS:
        return VISION_MODELS[name](input_shape, num_classes, input_vocab_size=input_vocab_size, conv=conv)
    if name in SEQUENCE_MODELS:
        options = {"embedding_table": embedding_table} if embedding_table is not None else {}
        return SEQUENCE_MODELS[name](input_shape, num_classes, input_vocab_size=input_vocab_size, **options)
    num_positions = math.prod(input_shape)
    vocab = input_vocab_size
    num_features = num_positions * (vocab or 1)
    if name == "linear":
        # On tokens the one-hot product is a gather and sum: 2 FLOPs per
        # position and class at most.
        flops = 2 * (num_positions if vocab else num_features) * num_classes
        return as_model(
            lambda rngs: LinearClassifier(num_features, num_classes, vocab_size=vocab, rngs=rngs),
            name,
            flops,
            dense_layers=() if vocab else (("dense",),),
        )
    if name == "mlp":
        sizes = [num_positions if vocab else num_features, *hidden_sizes, num_classes]
        flops = sum(2 * a * b for a, b in zip(sizes[:-1], sizes[1:], strict=True))
        return as_model(
            lambda rngs: MLP(num_features, hidden_sizes, num_classes, vocab_size=vocab, rngs=rngs),
            name,
            flops,
            dense_layers=()
            if vocab
            else (*(("hidden", index) for index in range(len(hidden_sizes))), ("out",)),
        )
    if name == "embedding-bag":
        if vocab is None:
            raise ValueError("embedding-bag needs token inputs; this dataset's inputs are real-valued")
        flops = 2 * num_positions * embedding_dim + 2 * embedding_dim * num_classes
        return as_model(
            lambda rngs: EmbeddingBag(vocab, embedding_dim, num_classes, rngs=rngs), name, flops
        )
    if name == "bag-logistic":
        if vocab is None:
            raise ValueError(
                "bag-logistic needs StackOverflow word ids (--dataset-option layout=tags); "
                "this dataset's inputs are real-valued"
            )
        if vocab < 5:
            raise ValueError(
                f"bag-logistic needs a word vocabulary (pad, bos, eos, words, oov), got {vocab} ids"
            )
        # The gather and sum: a multiply-add per position and class.
        flops = 2 * num_positions * num_classes
        return as_model(
            lambda rngs: BagOfWordsLogistic(vocab - 4, num_classes, rngs=rngs), name, flops
        )
    if name == "convnet":
        image_shape = image_input_shape("the convnet", input_shape, vocab, num_classes)
        if conv == "auto":
            conv = default_conv(jax.default_backend())
        return as_model(
            lambda rngs: ConvNet(image_shape, num_classes, conv=conv, rngs=rngs),
            name,
            _convnet_flops(image_shape, num_classes),
        )
    raise ValueError(f"unknown model {name!r}; choose one of {', '.join(model_names())}")


def _convnet_flops(image_shape: tuple[int, int, int], num_classes: int) -> int:
    height, width, channels = image_shape
    flops = 0
    for out_channels in (32, 64):
        flops += 2 * height * width * 25 * channels * out_channels
        height, width, channels = height // 2, width // 2, out_channels
    return flops + 2 * height * width * channels * num_classes


def count_parameters(params: Params) -> int:
    """Number of scalars in a parameter pytree (arrays or shape structs)."""
    return int(sum(math.prod(p.shape) for p in jax.tree.leaves(params)))
