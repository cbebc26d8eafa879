"""The reference image models of the federated benchmarks, as pure `Model`s.

* 'emnist-cr-cnn': the EMNIST CNN of Reddi et al. 2021 / TFF / FedJAX
  (google-research/federated `utils/models/emnist_models.py`,
  `create_conv_dropout_model`): Keras' default 'valid' 3x3 convolutions,
  28 -> 26 -> 24 -> pool 12, dropout 0.25 and 0.5; 1,206,590 parameters for
  62 classes.
* 'leaf-cnn': LEAF's FEMNIST CNN (TalwalkarLab/leaf `models/femnist/cnn.py`):
  'same' 5x5 convolutions, 2x2 pooling, dense 2048.
* 'resnet18-gn': TFF's CIFAR-100 ResNet-18 with GroupNorm (Reddi et al.
  2021; google-research/federated `utils/models/resnet_models.py`,
  `create_resnet18`, and `utils/datasets/cifar100_dataset.py`), random
  24x24 crops and horizontal flips in the training pass; see `ResNet18GN`.
* 'deltafl-convnet': the Delta-FL reference FEMNIST ConvNet
  (krishnap25/simplicial-fl `models/femnist/erm_cnn_log_reg.py`): 'valid'
  5x5 convolutions, 28 -> 24 -> 12 -> 8 -> 4, linear 1024 -> classes.

Inputs are `[B, *input_shape]`: flat square grayscale images (784 =
28x28x1) or `[H, W, C]` (NHWC). Outputs are logits (the references whose
Keras models end in a softmax are trained there with the cross-entropy of
that softmax, which is jaxfl's cross-entropy of these logits).

Stochastic models (`Model.stochastic`) draw dropout masks and augmentation
from the `key` of `apply(params, x, key)` with `jax.random`; they hold no RNG
state, and `key=None` is the deterministic evaluation pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from jaxfl.models.base import Model, as_model, default_conv, image_input_shape
from jaxfl.models.convolution import same_conv2d
from jaxfl.types import Key

_NHWC = ("NHWC", "HWIO", "NHWC")
CONV_CHOICES = ("auto", "lax", "canonical")


# ---------------------------------------------------------------------------
# Shared pieces


def conv2d(x: jax.Array, kernel: jax.Array, padding: str, impl: str) -> jax.Array:
    """Stride-1 convolution, NHWC input and HWIO kernel, 'SAME' or 'VALID'.

    `impl` 'lax' is `lax.conv_general_dilated`; 'canonical' is
    `jaxfl.models.convolution.same_conv2d` (whose gradient stays fast inside
    loops on XLA:CPU), a 'VALID' convolution then being the interior of the
    'SAME' one (the outputs whose window lies inside the image). The border
    it computes and discards costs less than the slow gradient it avoids:
    inside `lax.fori_loop` on XLA:CPU, an SGD step with 'canonical' was
    measured several times faster than with 'lax' for every model here
    (emnist-cr-cnn, deltafl-convnet, leaf-cnn, resnet18-gn); the cause is
    the layout of the gradient convolutions, see benchmarks/RESULTS.md,
    section "The ConvNet on CPU: a layout bug in autodiff, found and fixed".
    """
    if impl == "canonical":
        y = same_conv2d(x, kernel)
        if padding == "VALID":
            cut = kernel.shape[0] // 2
            y = y[:, cut : y.shape[1] - cut, cut : y.shape[2] - cut, :]
        return y
    return lax.conv_general_dilated(x, kernel, (1, 1), padding, dimension_numbers=_NHWC)


def _add_bias(y: jax.Array, bias: jax.Array) -> jax.Array:
    return y + bias.reshape((1,) * (y.ndim - 1) + (-1,))


def _max_pool(x: jax.Array, size: int, stride: int, padding: str = "VALID") -> jax.Array:
    return nnx.max_pool(x, window_shape=(size, size), strides=(stride, stride), padding=padding)


def dropout(x: jax.Array, rate: float, key: Key | None, layer: int) -> jax.Array:
    """Inverted dropout: zero with probability `rate`, scale the rest by 1 / (1 - rate).

    The mask is `bernoulli(fold_in(key, layer), 1 - rate, x.shape)`; with no
    key (evaluation) or a zero rate it is the identity.
    """
    if key is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(jax.random.fold_in(key, layer), 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


def center_crop(images: jax.Array, size: int) -> jax.Array:
    """The central `size` x `size` window of `[B, H, W, C]` images.

    TensorFlow's `tf.image.resize_with_crop_or_pad` when cropping: offsets
    `(H - size) // 2` and `(W - size) // 2`.
    """
    _, height, width, _ = images.shape
    top, left = (height - size) // 2, (width - size) // 2
    return images[:, top : top + size, left : left + size, :]


def random_crop(images: jax.Array, key: Key, size: int, *, flip: bool = True) -> jax.Array:
    """A random `size` x `size` window of each image, mirrored left-right with probability 1/2.

    Per example, as TFF's CIFAR-100 training preprocessing
    (`tf.image.random_crop`, then `tf.image.random_flip_left_right`): the
    offsets are `randint(fold_in(key, 0), [B], 0, H - size + 1)` (rows) and
    `randint(fold_in(key, 1), [B], 0, W - size + 1)` (columns), the flips
    `bernoulli(fold_in(key, 2), 0.5, [B])`.
    """
    batch, height, width, channels = images.shape
    rows = jax.random.randint(jax.random.fold_in(key, 0), (batch,), 0, height - size + 1)
    cols = jax.random.randint(jax.random.fold_in(key, 1), (batch,), 0, width - size + 1)

    def window(image, row, col):
        return lax.dynamic_slice(image, (row, col, jnp.zeros_like(row)), (size, size, channels))

    crops = jax.vmap(window)(images, rows, cols)
    if not flip:
        return crops
    flips = jax.random.bernoulli(jax.random.fold_in(key, 2), 0.5, (batch,))
    return jnp.where(flips.reshape(batch, 1, 1, 1), crops[:, :, ::-1, :], crops)


def per_image_standardization(images: jax.Array) -> jax.Array:
    """`tf.image.per_image_standardization` of `[B, H, W, C]` images.

    (x - mean) / max(std, 1 / sqrt(H W C)), the moments over each image.
    """
    count = math.prod(images.shape[1:])
    mean = jnp.mean(images, axis=(1, 2, 3), keepdims=True)
    std = jnp.sqrt(jnp.mean(jnp.square(images - mean), axis=(1, 2, 3), keepdims=True))
    return (images - mean) / jnp.maximum(std, 1.0 / math.sqrt(count))


def _conv_flops(height: int, width: int, kernel: int, in_channels: int, out_channels: int) -> int:
    """FLOPs of a convolution with `height` x `width` outputs (a multiply-add is 2)."""
    return 2 * height * width * kernel * kernel * in_channels * out_channels


def _conv_impl(name: str, conv: str) -> str:
    if conv not in CONV_CHOICES:
        raise ValueError(f"{name}: conv must be one of {CONV_CHOICES}, got {conv!r}")
    return default_conv(jax.default_backend()) if conv == "auto" else conv


# ---------------------------------------------------------------------------
# EMNIST CR CNN (Reddi et al. 2021, TFF, FedJAX)


class EmnistCrCnn(nnx.Module):
    """TFF's `create_conv_dropout_model` (the EMNIST character-recognition CNN).

    conv 3x3 32 'valid' ReLU, conv 3x3 64 'valid' ReLU, max-pool 2x2, dropout
    0.25, flatten, dense 128 ReLU, dropout 0.5, dense classes. Keras'
    default padding is 'valid' and its `GlorotNormal` the kernels'
    initializer (flax's `glorot_normal` is the same truncated normal);
    biases start at zero.
    """

    def __init__(
        self,
        image_shape: tuple[int, int, int],
        num_classes: int,
        *,
        rates: tuple[float, float] = (0.25, 0.5),
        conv: str = "lax",
        rngs: nnx.Rngs,
    ):
        self.image_shape = tuple(image_shape)
        self.rates = tuple(rates)
        self.conv_impl = conv
        height, width, channels = self.image_shape
        init = nnx.initializers.glorot_normal()
        self.conv1 = nnx.Conv(channels, 32, (3, 3), padding="VALID", kernel_init=init, rngs=rngs)
        self.conv2 = nnx.Conv(32, 64, (3, 3), padding="VALID", kernel_init=init, rngs=rngs)
        features = ((height - 4) // 2) * ((width - 4) // 2) * 64
        self.dense1 = nnx.Linear(features, 128, kernel_init=init, rngs=rngs)
        self.dense2 = nnx.Linear(128, num_classes, kernel_init=init, rngs=rngs)

    def __call__(self, x: jax.Array, key: Key | None = None) -> jax.Array:
        x = x.reshape(x.shape[0], *self.image_shape)
        for layer in (self.conv1, self.conv2):
            x = jax.nn.relu(_add_bias(conv2d(x, layer.kernel[...], "VALID", self.conv_impl), layer.bias[...]))
        x = dropout(_max_pool(x, 2, 2), self.rates[0], key, 0)
        x = jax.nn.relu(self.dense1(x.reshape(x.shape[0], -1)))
        return self.dense2(dropout(x, self.rates[1], key, 1))


def build_emnist_cr_cnn(
    input_shape: Sequence[int],
    num_classes: int,
    *,
    input_vocab_size: int | None = None,
    dropout: tuple[float, float] = (0.25, 0.5),
    conv: str = "auto",
) -> Model:
    """'emnist-cr-cnn': `EmnistCrCnn` (stochastic: dropout in the training pass).

    Args:
      input_shape: one example's shape, (784,) or (28, 28, 1); at least 6x6.
      num_classes: 62 for EMNIST-62, 10 for digits.
      input_vocab_size: must be None (the model needs images).
      dropout: the two dropout rates, after the pooling and after dense 128.
      conv: 'lax', 'canonical' (`conv2d`) or 'auto' (`default_conv` of the backend).

    Returns:
      The `Model`; 1,206,590 parameters and 23,998,208 FLOPs per example for
      28x28x1 inputs and 62 classes.
    """
    name = "emnist-cr-cnn"
    image_shape = image_input_shape(name, input_shape, input_vocab_size, num_classes, 6)
    rates = tuple(float(r) for r in dropout)
    if len(rates) != 2 or not all(0.0 <= r < 1.0 for r in rates):
        raise ValueError(f"{name} needs two dropout rates in [0, 1), got {dropout}")
    impl = _conv_impl(name, conv)
    height, width, channels = image_shape
    pooled = ((height - 4) // 2) * ((width - 4) // 2) * 64
    flops = (
        _conv_flops(height - 2, width - 2, 3, channels, 32)
        + _conv_flops(height - 4, width - 4, 3, 32, 64)
        + 2 * pooled * 128
        + 2 * 128 * num_classes
    )
    return as_model(
        lambda rngs: EmnistCrCnn(image_shape, num_classes, rates=rates, conv=impl, rngs=rngs),
        name,
        flops,
        stochastic=True,
    )


# ---------------------------------------------------------------------------
# LEAF FEMNIST CNN and the Delta-FL ConvNet


class TwoConvNet(nnx.Module):
    """Two 5x5 convolutions (32, 64 channels), each with ReLU and 2x2 max-pooling, then dense layers.

    LEAF's FEMNIST CNN is `hidden=(2048,)` with 'SAME' padding and TF1's
    default Glorot-uniform kernels; the Delta-FL ConvNet is `hidden=()`
    with 'VALID' padding and PyTorch's default initialization (kernels and
    biases uniform in +-1/sqrt(fan_in)). Features are flattened in NHWC
    order (PyTorch flattens NCHW: the same function class, with the dense
    kernel's rows permuted).
    """

    def __init__(
        self,
        image_shape: tuple[int, int, int],
        num_classes: int,
        *,
        padding: str,
        hidden: tuple[int, ...],
        init: str,
        conv: str = "lax",
        rngs: nnx.Rngs,
    ):
        self.image_shape = tuple(image_shape)
        self.padding = padding
        self.conv_impl = conv
        height, width, channels = self.image_shape
        convs = []
        for out_channels in (32, 64):
            kernel_init, bias_init = _initializers(init, 25 * channels)
            convs.append(
                nnx.Conv(
                    channels,
                    out_channels,
                    (5, 5),
                    padding=padding,
                    kernel_init=kernel_init,
                    bias_init=bias_init,
                    rngs=rngs,
                )
            )
            height, width, channels = (
                _two_conv_size(height, padding),
                _two_conv_size(width, padding),
                out_channels,
            )
        self.convs = nnx.List(convs)
        sizes = [height * width * channels, *hidden, num_classes]
        layers = []
        for a, b in zip(sizes[:-1], sizes[1:], strict=True):
            kernel_init, bias_init = _initializers(init, a)
            layers.append(nnx.Linear(a, b, kernel_init=kernel_init, bias_init=bias_init, rngs=rngs))
        self.dense = nnx.List(layers)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.reshape(x.shape[0], *self.image_shape)
        for layer in self.convs:
            y = conv2d(x, layer.kernel[...], self.padding, self.conv_impl)
            x = _max_pool(jax.nn.relu(_add_bias(y, layer.bias[...])), 2, 2)
        x = x.reshape(x.shape[0], -1)
        for layer in self.dense[:-1]:
            x = jax.nn.relu(layer(x))
        return self.dense[-1](x)


def _two_conv_size(size: int, padding: str) -> int:
    """Side after a 5x5 convolution and a 2x2 pooling."""
    return (size - 4 if padding == "VALID" else size) // 2


def _initializers(kind: str, fan_in: int) -> tuple[Callable, Callable]:
    if kind == "torch":
        bound = 1.0 / math.sqrt(fan_in)

        def bias_init(key, shape, dtype=jnp.float32):
            return jax.random.uniform(key, shape, dtype, -bound, bound)

        return nnx.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform"), bias_init
    return nnx.initializers.glorot_uniform(), nnx.initializers.zeros_init()


def _two_conv_flops(
    image_shape: tuple[int, int, int], padding: str, hidden: tuple[int, ...], classes: int
) -> int:
    height, width, channels = image_shape
    flops = 0
    for out_channels in (32, 64):
        out_h, out_w = (height - 4, width - 4) if padding == "VALID" else (height, width)
        flops += _conv_flops(out_h, out_w, 5, channels, out_channels)
        height, width, channels = out_h // 2, out_w // 2, out_channels
    sizes = [height * width * channels, *hidden, classes]
    return flops + sum(2 * a * b for a, b in zip(sizes[:-1], sizes[1:], strict=True))


def build_leaf_cnn(
    input_shape: Sequence[int],
    num_classes: int,
    *,
    input_vocab_size: int | None = None,
    conv: str = "auto",
) -> Model:
    """'leaf-cnn': LEAF's FEMNIST CNN (`TwoConvNet`, 'SAME', dense 2048).

    Args:
      input_shape: one example's shape, (784,) or (28, 28, 1); at least 4x4.
      num_classes: 62 for FEMNIST.
      input_vocab_size: must be None (the model needs images).
      conv: 'lax', 'canonical' or 'auto' (`default_conv` of the backend).

    Returns:
      The `Model`; 6,603,710 parameters and 34,423,808 FLOPs per example for
      28x28x1 inputs and 62 classes.
    """
    name = "leaf-cnn"
    image_shape = image_input_shape(name, input_shape, input_vocab_size, num_classes, 4)
    impl = _conv_impl(name, conv)
    return as_model(
        lambda rngs: TwoConvNet(
            image_shape, num_classes, padding="SAME", hidden=(2048,), init="glorot", conv=impl, rngs=rngs
        ),
        name,
        _two_conv_flops(image_shape, "SAME", (2048,), num_classes),
    )


def build_deltafl_convnet(
    input_shape: Sequence[int],
    num_classes: int,
    *,
    input_vocab_size: int | None = None,
    padding: str = "valid",
    conv: str = "auto",
) -> Model:
    """'deltafl-convnet': the Delta-FL reference FEMNIST ConvNet (`TwoConvNet`, no hidden layer).

    conv 1->32 5x5 'valid', ReLU, max-pool 2, conv 32->64 5x5 'valid', ReLU,
    max-pool 2, linear 1024 -> classes (28 -> 24 -> 12 -> 8 -> 4), PyTorch's
    default initialization. `padding='same'` gives the 'same' variant
    (28 -> 14 -> 7, linear 3136 -> classes: the function class of jaxfl's
    'convnet', the ConvNet that fedjax runs in `benchmarks/compare_peers.py`).

    Args:
      input_shape: one example's shape, (784,) or (28, 28, 1); at least
        16x16 with 'valid' padding, 4x4 with 'same'.
      num_classes: 62 for FEMNIST.
      input_vocab_size: must be None (the model needs images).
      padding: 'valid' (the reference) or 'same'.
      conv: 'lax', 'canonical' or 'auto' (`default_conv` of the backend).

    Returns:
      The `Model`; 115,646 parameters and 7,602,176 FLOPs per example for
      28x28x1 inputs, 62 classes and 'valid' padding.
    """
    name = "deltafl-convnet"
    if str(padding).upper() not in ("VALID", "SAME"):
        raise ValueError(f"{name}: padding must be 'valid' or 'same', got {padding!r}")
    pad = str(padding).upper()
    min_side = 16 if pad == "VALID" else 4
    image_shape = image_input_shape(name, input_shape, input_vocab_size, num_classes, min_side)
    impl = _conv_impl(name, conv)
    return as_model(
        lambda rngs: TwoConvNet(
            image_shape, num_classes, padding=pad, hidden=(), init="torch", conv=impl, rngs=rngs
        ),
        name,
        _two_conv_flops(image_shape, pad, (), num_classes),
    )


# ---------------------------------------------------------------------------
# ResNet-18 with GroupNorm (TFF's CIFAR-100 model)


def _group_norm(features: int, groups: int, rngs: nnx.Rngs) -> nnx.GroupNorm:
    # tfa.layers.GroupNormalization: epsilon 1e-3, variance as the mean squared deviation.
    return nnx.GroupNorm(features, num_groups=groups, epsilon=1e-3, use_fast_variance=False, rngs=rngs)


class ResNetBlock(nnx.Module):
    """TFF's pre-activation basic block (`_basic_block`, stride 1).

    y = conv3x3(relu(gn(conv3x3(relu(gn(x)))))) + shortcut(x), the first
    norm-ReLU skipped in the network's very first block (`avoid_norm`: the
    stem already ends with one). The shortcut is the identity, or, when the
    channel count changes, a 1x1 convolution of the raw input followed by a
    GroupNorm. Convolutions have no bias and He-normal kernels.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        *,
        groups: int,
        first_norm: bool = True,
        conv: str = "lax",
        rngs: nnx.Rngs,
    ):
        he = nnx.initializers.he_normal()
        self.conv_impl = conv
        self.norm1 = _group_norm(in_channels, groups, rngs) if first_norm else None
        self.conv1 = nnx.Conv(in_channels, out_channels, (3, 3), use_bias=False, kernel_init=he, rngs=rngs)
        self.norm2 = _group_norm(out_channels, groups, rngs)
        self.conv2 = nnx.Conv(out_channels, out_channels, (3, 3), use_bias=False, kernel_init=he, rngs=rngs)
        if in_channels != out_channels:
            self.shortcut = nnx.Conv(
                in_channels, out_channels, (1, 1), use_bias=False, kernel_init=he, rngs=rngs
            )
            self.shortcut_norm = _group_norm(out_channels, groups, rngs)
        else:
            self.shortcut = None
            self.shortcut_norm = None

    def __call__(self, x: jax.Array) -> jax.Array:
        y = x if self.norm1 is None else jax.nn.relu(self.norm1(x))
        y = conv2d(y, self.conv1.kernel[...], "SAME", self.conv_impl)
        y = conv2d(jax.nn.relu(self.norm2(y)), self.conv2.kernel[...], "SAME", self.conv_impl)
        if self.shortcut is None:
            return x + y
        shortcut = jnp.einsum("bhwi,io->bhwo", x, self.shortcut.kernel[...][0, 0])
        return self.shortcut_norm(shortcut) + y


class ResNet18GN(nnx.Module):
    """TFF's ResNet-18 (v2, pre-activation) with GroupNorm, as trained on CIFAR-100 by Reddi et al.

    Follows google-research/federated `utils/models/resnet_models.py`
    (`create_resnet18` -> `create_resnet(block='basic', repetitions=[2, 2,
    2, 2])`, which `optimization/tasks/cifar100.py` built on 24x24x3 crops):

    * stem: conv 7x7 64 stride 2 'same' (24 -> 12), GroupNorm, ReLU, max-pool
      3x3 stride 2 'same' (12 -> 6);
    * four stages of two `ResNetBlock`s with 64, 128, 256, 512 channels,
      **all with stride 1**: `create_resnet` never passes strides to its
      stages, so every stage runs at 6x6 (a quirk of the source, kept);
    * GroupNorm, ReLU, global average pooling, dense classes (the source's
      softmax is left to the loss), its kernel normal(0.01), bias zero.

    GroupNorm is `tfa.layers.GroupNormalization(axis=-1)` there, whose
    default was groups=2 until TF Addons 0.12 (2020-11-18, commit b1314071
    "Change GroupNormalization default groups to 32"): the 2 groups per
    layer of Reddi et al. (and Hsieh et al. 2020); epsilon 1e-3.

    The input pipeline (`utils/datasets/cifar100_dataset.py`) is part of the
    model: with a key, `random_crop` (a random 24x24 window per example,
    mirrored left-right with probability 1/2); without, `center_crop`; then
    `per_image_standardization`, which also makes the model indifferent to
    the pixel scale ([0, 1] or [0, 255]).

    Not here: the source's L2 regularizers (1e-4 on every kernel and on the
    dense bias), which TFF's `from_keras_model` adds to the training loss
    (`keras_model.losses`); an objective's weight decay, not a layer.
    """

    def __init__(
        self,
        image_shape: tuple[int, int, int],
        num_classes: int,
        *,
        crop_size: int | None = 24,
        flip: bool = True,
        standardize: bool = True,
        groups: int = 2,
        width: int = 64,
        conv: str = "lax",
        rngs: nnx.Rngs,
    ):
        self.image_shape = tuple(image_shape)
        self.crop_size = crop_size
        self.flip = flip
        self.standardize = standardize
        channels = self.image_shape[2]
        he = nnx.initializers.he_normal()
        self.stem = nnx.Conv(
            channels, width, (7, 7), strides=2, padding="SAME", use_bias=False, kernel_init=he, rngs=rngs
        )
        self.stem_norm = _group_norm(width, groups, rngs)
        blocks = []
        in_channels = width
        for stage in range(4):
            out_channels = width * 2**stage
            for index in range(2):
                blocks.append(
                    ResNetBlock(
                        in_channels,
                        out_channels,
                        groups=groups,
                        first_norm=(stage, index) != (0, 0),
                        conv=conv,
                        rngs=rngs,
                    )
                )
                in_channels = out_channels
        self.blocks = nnx.List(blocks)
        self.final_norm = _group_norm(in_channels, groups, rngs)
        self.dense = nnx.Linear(
            in_channels, num_classes, kernel_init=nnx.initializers.normal(0.01), rngs=rngs
        )

    def __call__(self, x: jax.Array, key: Key | None = None) -> jax.Array:
        x = x.reshape(x.shape[0], *self.image_shape)
        if self.crop_size is not None:
            if key is None:
                x = center_crop(x, self.crop_size)
            else:
                x = random_crop(x, key, self.crop_size, flip=self.flip)
        if self.standardize:
            x = per_image_standardization(x)
        x = lax.conv_general_dilated(x, self.stem.kernel[...], (2, 2), "SAME", dimension_numbers=_NHWC)
        x = _max_pool(jax.nn.relu(self.stem_norm(x)), 3, 2, "SAME")
        for block in self.blocks:
            x = block(x)
        x = jnp.mean(jax.nn.relu(self.final_norm(x)), axis=(1, 2))
        return self.dense(x)


def resnet18_gn_parameters(num_classes: int, channels: int = 3, width: int = 64) -> int:
    """Parameter count of `ResNet18GN` by hand: conv kernels, GroupNorm scales and biases, dense.

    Stem 7*7*C*w + 2w; per stage s (c = w 2^s, c' = the input channels)
    two blocks of 9c'c + 9c^2 kernels, GroupNorm 2c' (absent in the first
    block) + 2c + 2c + 2c, a 1x1 shortcut c'c and its GroupNorm 2c when
    c' != c; final GroupNorm 2*8w; dense 8w*classes + classes.
    """
    total = 7 * 7 * channels * width + 2 * width
    previous = width
    for stage in range(4):
        c = width * 2**stage
        for index in range(2):
            total += 9 * previous * c + 9 * c * c + 2 * c  # The convolutions and norm2.
            if (stage, index) != (0, 0):
                total += 2 * previous  # norm1.
            if previous != c:
                total += previous * c + 2 * c  # The projection shortcut and its norm.
            previous = c
    return total + 2 * previous + previous * num_classes + num_classes


def _resnet_flops(size: tuple[int, int], channels: int, width: int, num_classes: int) -> int:
    height, width_px = size
    height, width_px = -(-height // 2), -(-width_px // 2)  # The stem's stride 2, 'same'.
    flops = _conv_flops(height, width_px, 7, channels, width)
    height, width_px = -(-height // 2), -(-width_px // 2)  # The max-pool's stride 2, 'same'.
    previous = width
    for stage in range(4):
        c = width * 2**stage
        for _ in range(2):
            flops += _conv_flops(height, width_px, 3, previous, c) + _conv_flops(height, width_px, 3, c, c)
            if previous != c:
                flops += _conv_flops(height, width_px, 1, previous, c)
            previous = c
    return flops + 2 * previous * num_classes


def build_resnet18_gn(
    input_shape: Sequence[int],
    num_classes: int,
    *,
    input_vocab_size: int | None = None,
    crop_size: int | None = 24,
    flip: bool = True,
    standardize: bool = True,
    groups: int = 2,
    width: int = 64,
    conv: str = "auto",
) -> Model:
    """'resnet18-gn': `ResNet18GN` (stochastic: random crops and flips in the training pass).

    Args:
      input_shape: one example's shape, e.g. (32, 32, 3) (or flat square grayscale).
      num_classes: 100 for CIFAR-100.
      input_vocab_size: must be None (the model needs images).
      crop_size: the side of the crops (24 in the reference); None: no cropping.
      flip: random left-right flips in the training pass (the reference: True).
      standardize: `per_image_standardization` after the crop (the reference: True).
      groups: GroupNorm groups per layer (the reference: 2).
      width: the first stage's channels (64; smaller for tests).
      conv: the 3x3 convolutions, 'lax', 'canonical' or 'auto'.

    Returns:
      The `Model`; 11,227,812 parameters (`resnet18_gn_parameters`) and
      806,152,192 FLOPs per example (convolutions and dense; normalization,
      pooling and ReLU not counted) for 32x32x3 inputs, 100 classes and the
      defaults.
    """
    name = "resnet18-gn"
    min_side = 1 if crop_size is None else crop_size
    image_shape = image_input_shape(name, input_shape, input_vocab_size, num_classes, min_side)
    height, width_px, channels = image_shape
    if crop_size is not None and crop_size < 1:
        raise ValueError(f"{name}: crop_size must be positive or None, got {crop_size}")
    if groups < 1 or width < 1 or width % groups:
        raise ValueError(f"{name}: width {width} must be a positive multiple of groups {groups}")
    impl = _conv_impl(name, conv)
    size = (height, width_px) if crop_size is None else (crop_size, crop_size)
    return as_model(
        lambda rngs: ResNet18GN(
            image_shape,
            num_classes,
            crop_size=crop_size,
            flip=flip,
            standardize=standardize,
            groups=groups,
            width=width,
            conv=impl,
            rngs=rngs,
        ),
        name,
        _resnet_flops(size, channels, width, num_classes),
        stochastic=True,
    )


VISION_MODELS: dict[str, Callable[..., Model]] = {
    "emnist-cr-cnn": build_emnist_cr_cnn,
    "leaf-cnn": build_leaf_cnn,
    "resnet18-gn": build_resnet18_gn,
    "deltafl-convnet": build_deltafl_convnet,
}
