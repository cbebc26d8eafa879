"""The reference image models (jaxfl.models.vision) against NumPy references and hand counts."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from absl.testing import parameterized
from reference import slow_after

from jaxfl.models import count_parameters
from jaxfl.models.networks import as_model
from jaxfl.models.vision import (
    VISION_MODELS,
    ResNetBlock,
    build_deltafl_convnet,
    build_emnist_cr_cnn,
    build_leaf_cnn,
    build_resnet18_gn,
    center_crop,
    dropout,
    per_image_standardization,
    random_crop,
    resnet18_gn_parameters,
)

# ---------------------------------------------------------------------------
# NumPy references (float64)


def np_conv(x, kernel, padding):
    """Stride-1 convolution by a loop over kernel offsets: y[n,h,w,o] = sum x_pad[n,h+a,w+b,i] k[a,b,i,o]."""
    k = kernel.shape[0]
    if padding == "SAME":
        x = np.pad(x, ((0, 0), (k // 2, k // 2), (k // 2, k // 2), (0, 0)))
    height, width = x.shape[1] - k + 1, x.shape[2] - k + 1
    out = np.zeros((x.shape[0], height, width, kernel.shape[3]))
    for a in range(k):
        for b in range(k):
            out += np.einsum("nhwi,io->nhwo", x[:, a : a + height, b : b + width], kernel[a, b])
    return out


def np_max_pool(x, size=2):
    n, height, width, c = x.shape
    h, w = height // size, width // size
    return x[:, : h * size, : w * size].reshape(n, h, size, w, size, c).max(axis=(2, 4))


def np_group_norm(x, scale, bias, groups, eps=1e-3):
    n, height, width, c = x.shape
    grouped = x.reshape(n, height, width, groups, c // groups)
    mean = grouped.mean(axis=(1, 2, 4), keepdims=True)
    var = ((grouped - mean) ** 2).mean(axis=(1, 2, 4), keepdims=True)
    return ((grouped - mean) / np.sqrt(var + eps)).reshape(x.shape) * scale + bias


def relu(x):
    return np.maximum(x, 0.0)


def np_dense(x, layer):
    return x @ layer["kernel"] + layer["bias"]


def np_emnist_cr_cnn(p, x):
    x = relu(np_conv(x, p["conv1"]["kernel"], "VALID") + p["conv1"]["bias"])
    x = relu(np_conv(x, p["conv2"]["kernel"], "VALID") + p["conv2"]["bias"])
    x = np_max_pool(x).reshape(x.shape[0], -1)
    return np_dense(relu(np_dense(x, p["dense1"])), p["dense2"])


def np_two_conv(p, x, padding):
    for i in range(2):
        x = np_max_pool(relu(np_conv(x, p["convs"][i]["kernel"], padding) + p["convs"][i]["bias"]))
    x = x.reshape(x.shape[0], -1)
    layers = [p["dense"][i] for i in sorted(p["dense"])]
    for layer in layers[:-1]:
        x = relu(np_dense(x, layer))
    return np_dense(x, layers[-1])


def np_block(p, x, groups):
    def gn(y, name):
        return np_group_norm(y, p[name]["scale"], p[name]["bias"], groups)

    y = relu(gn(x, "norm1")) if "norm1" in p else x
    y = np_conv(y, p["conv1"]["kernel"], "SAME")
    y = np_conv(relu(gn(y, "norm2")), p["conv2"]["kernel"], "SAME")
    if "shortcut" in p:
        return gn(np.einsum("nhwi,io->nhwo", x, p["shortcut"]["kernel"][0, 0]), "shortcut_norm") + y
    return x + y


def perturbed(params, seed=0, scale=0.1):
    """The initial parameters plus noise, so that biases and norm parameters are not 0 and 1."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda p: p + jnp.asarray(scale * rng.normal(size=p.shape), jnp.float32), params)


def as_numpy(tree):
    return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def images(seed, shape):
    return np.random.default_rng(seed).uniform(size=shape).astype(np.float32)


# ---------------------------------------------------------------------------
# Forward passes against NumPy, jitted and not


class ForwardTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters("lax", "canonical")
    def test_emnist_cr_cnn_evaluation_pass(self, conv):
        model = build_emnist_cr_cnn((10, 10, 1), 5, conv=conv)  # 10 -> 8 -> 6 -> pool 3: 576 features.
        params = perturbed(model.init(jax.random.key(0)))
        x = images(1, (3, 10, 10, 1))
        got = self.variant(model.apply)(params, x)
        chex.assert_shape(got, (3, 5))
        chex.assert_trees_all_close(got, np_emnist_cr_cnn(as_numpy(params), x), rtol=1e-4, atol=1e-4)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters("lax", "canonical")
    def test_leaf_cnn(self, conv):
        model = build_leaf_cnn((64,), 7, conv=conv)  # Flat 8x8: 8 -> pool 4 -> pool 2, 256 -> 2048 -> 7.
        params = perturbed(model.init(jax.random.key(0)))
        x = images(2, (2, 64))
        got = self.variant(model.apply)(params, x)
        chex.assert_shape(got, (2, 7))
        expected = np_two_conv(as_numpy(params), x.reshape(2, 8, 8, 1), "SAME")
        chex.assert_trees_all_close(got, expected, rtol=1e-4, atol=1e-4)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(("valid", "lax"), ("valid", "canonical"), ("same", "canonical"))
    def test_deltafl_convnet(self, padding, conv):
        # 'valid': 18 -> 14 -> 7 -> 3 -> 1, 64 features; 'same': 18 -> 9 -> 4, 1024 features.
        model = build_deltafl_convnet((18, 18, 2), 4, padding=padding, conv=conv)
        params = perturbed(model.init(jax.random.key(0)))
        chex.assert_shape(params["dense"][0]["kernel"], (64 if padding == "valid" else 1024, 4))
        x = images(3, (2, 18, 18, 2))
        got = self.variant(model.apply)(params, x)
        expected = np_two_conv(as_numpy(params), x, padding.upper())
        chex.assert_trees_all_close(got, expected, rtol=1e-4, atol=1e-4)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(
        (4, 6, True, "lax"), (4, 6, False, "canonical"), (6, 6, True, "canonical"), (6, 6, False, "lax")
    )
    def test_resnet_basic_block_with_group_norm(self, in_channels, out_channels, first_norm, conv):
        block = as_model(
            lambda rngs: ResNetBlock(
                in_channels, out_channels, groups=2, first_norm=first_norm, conv=conv, rngs=rngs
            ),
            "block",
            0,
        )
        params = perturbed(block.init(jax.random.key(0)))
        assert ("norm1" in params) == first_norm
        assert ("shortcut" in params) == (in_channels != out_channels)
        x = np.random.default_rng(4).normal(size=(2, 5, 5, in_channels)).astype(np.float32)
        got = self.variant(block.apply)(params, x)
        chex.assert_shape(got, (2, 5, 5, out_channels))
        chex.assert_trees_all_close(got, np_block(as_numpy(params), x, 2), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------
# Sizes: parameter counts and FLOPs by hand


def _count(model):
    return count_parameters(jax.eval_shape(model.init, jax.random.key(0)))


def test_parameter_counts_and_flops_of_the_reference_shapes():
    # EMNIST CR CNN, 62 classes: 28 -> 26 -> 24 -> pool 12, 12*12*64 = 9216 features.
    emnist = build_emnist_cr_cnn((784,), 62)
    assert (
        _count(emnist)
        == (9 * 32 + 32) + (9 * 32 * 64 + 64) + (9216 * 128 + 128) + (128 * 62 + 62)
        == 1_206_590
    )
    assert emnist.flops_per_example == 2 * (26 * 26 * 9 * 32 + 24 * 24 * 9 * 32 * 64 + 9216 * 128 + 128 * 62)
    # LEAF CNN: 28 -> pool 14 -> pool 7, 7*7*64 = 3136 features, dense 2048.
    leaf = build_leaf_cnn((28, 28, 1), 62)
    assert (
        _count(leaf)
        == (25 * 32 + 32) + (25 * 32 * 64 + 64) + (3136 * 2048 + 2048) + (2048 * 62 + 62)
        == 6_603_710
    )
    assert leaf.flops_per_example == 2 * (
        28 * 28 * 25 * 32 + 14 * 14 * 25 * 32 * 64 + 3136 * 2048 + 2048 * 62
    )
    # Delta-FL ConvNet: 28 -> 24 -> 12 -> 8 -> 4, linear 1024 -> 62.
    deltafl = build_deltafl_convnet((784,), 62)
    assert _count(deltafl) == (25 * 32 + 32) + (25 * 32 * 64 + 64) + (1024 * 62 + 62) == 115_646
    assert deltafl.flops_per_example == 2 * (24 * 24 * 25 * 32 + 8 * 8 * 25 * 32 * 64 + 1024 * 62)
    # Its 'same' variant is the function class of jaxfl's 'convnet' (3136 -> 62).
    assert _count(build_deltafl_convnet((784,), 62, padding="same")) == 832 + 51264 + 3136 * 62 + 62
    assert [m.stochastic for m in (emnist, leaf, deltafl)] == [True, False, False]


@pytest.fixture(scope="module")
def full_resnet():
    return build_resnet18_gn((32, 32, 3), 100)


@pytest.fixture(scope="module")
def small_resnet():
    """A width-8 ResNet-18-GN (every layer of the full one, 1/64 of its multiply-adds), jitted once."""
    model = build_resnet18_gn((32, 32, 3), 10, width=8)
    uncropped = build_resnet18_gn((24, 24, 3), 10, width=8, crop_size=None)
    params = perturbed(model.init(jax.random.key(0)))
    return model, jax.jit(model.apply), jax.jit(uncropped.apply), params


@pytest.mark.slow  # The full-size ResNet-18 costs the default tier a compile.
def test_resnet18_gn_size(full_resnet, small_resnet):
    # Kernels: stem 7*7*3*64; stage widths c = 64, 128, 256, 512 from c' = 64, 64, 128, 256, each
    # 9c'c + 3*9c^2 (four 3x3 convolutions) + c'c (the 1x1 shortcut, stages 2-4).
    kernels = 7 * 7 * 3 * 64 + 4 * 9 * 64 * 64
    for c_in, c in ((64, 128), (128, 256), (256, 512)):
        kernels += 9 * c_in * c + 3 * 9 * c * c + c_in * c
    # GroupNorm scale and bias: stem 64; stage 1: three norms of 64 (the first block's first is
    # skipped); stages 2-4: norm1 of c', then norm2 (c), shortcut norm (c), norm1, norm2 (c); final 512.
    norms = 2 * (64 + 3 * 64 + sum(c_in + 4 * c for c_in, c in ((64, 128), (128, 256), (256, 512))) + 512)
    dense = 512 * 100 + 100
    assert kernels == 11_157_504 + 9408
    assert kernels + norms + dense == 11_227_812 == resnet18_gn_parameters(100)

    model = full_resnet
    params = jax.eval_shape(model.init, jax.random.key(0))
    assert count_parameters(params) == 11_227_812
    # Every stage at 6x6 (TFF's create_resnet passes no strides to its stages): the 3x3 and 1x1
    # convolutions at 36 positions, the stem at 12x12 outputs, the dense layer.
    assert model.flops_per_example == 2 * (12 * 12 * 7 * 7 * 3 * 64 + 36 * (kernels - 9408) + 512 * 100)
    x = jax.ShapeDtypeStruct((2, 32, 32, 3), jnp.float32)
    chex.assert_shape(jax.eval_shape(model.apply, params, x), (2, 100))
    chex.assert_shape(jax.eval_shape(model.apply, params, x, jax.random.key(0)), (2, 100))
    # Another width and class count: the formula against the built model (run for real below: the
    # full width's forward pass cost 7 s of the suite and adds nothing its shapes and this one's run do not).
    assert count_parameters(small_resnet[3]) == resnet18_gn_parameters(10, channels=3, width=8)


# ---------------------------------------------------------------------------
# Dropout and augmentation


@pytest.mark.parametrize("rate", [0.25, 0.5])
def test_dropout_zeroes_the_expected_fraction_and_rescales(rate):
    ones = jnp.ones((200_000,))
    out = np.asarray(dropout(ones, rate, jax.random.key(0), 0))
    zeros = np.mean(out == 0.0)
    assert abs(zeros - rate) < 0.005  # Standard deviation of the fraction: 0.0011.
    np.testing.assert_allclose(out[out != 0.0], 1.0 / (1.0 - rate), rtol=1e-6)
    expected = np.asarray(
        jax.random.bernoulli(jax.random.fold_in(jax.random.key(0), 0), 1 - rate, (200_000,))
    )
    np.testing.assert_array_equal(out != 0.0, expected)
    assert dropout(ones, rate, None, 0) is ones
    assert not np.array_equal(out, dropout(ones, rate, jax.random.key(0), 1))  # Each layer its own mask.


def test_emnist_cr_cnn_dropout_in_training_only():
    model = build_emnist_cr_cnn((12, 12, 1), 6)
    plain = build_emnist_cr_cnn((12, 12, 1), 6, dropout=(0.0, 0.0))
    params = perturbed(model.init(jax.random.key(0)))
    x = images(5, (4, 12, 12, 1))
    apply = jax.jit(model.apply)
    evaluation = apply(params, x)
    chex.assert_trees_all_equal(evaluation, apply(params, x))
    chex.assert_trees_all_close(evaluation, plain.apply(params, x, jax.random.key(3)), rtol=1e-5, atol=1e-5)
    key = jax.random.key(1)
    train = apply(params, x, key)
    chex.assert_trees_all_equal(train, apply(params, x, key))
    assert not np.allclose(train, apply(params, x, jax.random.key(2)))
    assert not np.allclose(train, evaluation)


def test_random_crop_takes_each_example_window_at_its_offsets():
    x = images(6, (8, 32, 32, 3))
    key = jax.random.key(7)
    crops = np.asarray(jax.jit(functools.partial(random_crop, size=24))(x, key))
    # The documented draws: offsets in [0, 8], a flip with probability 1/2.
    rows = np.asarray(jax.random.randint(jax.random.fold_in(key, 0), (8,), 0, 9))
    cols = np.asarray(jax.random.randint(jax.random.fold_in(key, 1), (8,), 0, 9))
    flips = np.asarray(jax.random.bernoulli(jax.random.fold_in(key, 2), 0.5, (8,)))
    assert len(set(zip(rows, cols, strict=True))) > 1 and 0 < flips.sum() < 8  # Per example.
    for n in range(8):
        window = x[n, rows[n] : rows[n] + 24, cols[n] : cols[n] + 24]
        np.testing.assert_array_equal(crops[n], window[:, ::-1] if flips[n] else window)
    # Without flips, the same windows; without a key (center_crop), the central one.
    np.testing.assert_array_equal(
        random_crop(x, key, 24, flip=False),
        np.stack([x[n, r : r + 24, c : c + 24] for n, r, c in zip(range(8), rows, cols, strict=True)]),
    )
    np.testing.assert_array_equal(center_crop(x, 24), x[:, 4:28, 4:28])
    standardized = np.asarray(per_image_standardization(jnp.asarray(x)), np.float64)
    np.testing.assert_allclose(standardized.mean(axis=(1, 2, 3)), 0.0, atol=1e-5)
    np.testing.assert_allclose(standardized.std(axis=(1, 2, 3)), 1.0, rtol=1e-4)


@pytest.mark.slow
def test_resnet_crops_in_training_and_evaluation(small_resnet):
    model, apply, uncropped, params = small_resnet
    x = images(8, (2, 32, 32, 3))
    key = jax.random.key(9)
    train = apply(params, x, key)
    # Training: the network on the random crops of `random_crop(x, key)`; evaluation: on the center.
    chex.assert_trees_all_close(train, uncropped(params, random_crop(x, key, 24)), rtol=1e-5, atol=1e-5)
    evaluation = apply(params, x)
    chex.assert_trees_all_close(evaluation, uncropped(params, x[:, 4:28, 4:28]), rtol=1e-5, atol=1e-5)
    chex.assert_trees_all_equal(train, apply(params, x, key))
    assert not np.allclose(train, apply(params, x, jax.random.key(10)))
    # Per-image standardization: the pixel scale does not matter ([0, 1] or [0, 255]).
    chex.assert_trees_all_close(evaluation, apply(params, 255.0 * x), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------
# Gradients, and clients under vmap


def _loss(model, params, x, y, key):
    logits = model.apply(params, x, key) if model.stochastic else model.apply(params, x)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y))


GRADIENT_MODELS = {  # The shapes of the other tests, whose eager initializations are compiled already.
    "emnist-cr-cnn": lambda: build_emnist_cr_cnn((784,), 62),
    "leaf-cnn": lambda: build_leaf_cnn((28, 28, 1), 62),
    "deltafl-convnet": lambda: build_deltafl_convnet((784,), 62),
}


@pytest.mark.parametrize(
    "name", slow_after([*sorted(GRADIENT_MODELS), "resnet18-gn"], keep=1)
)
def test_gradients_are_finite_nonzero_and_descend(name, request):
    if name == "resnet18-gn":  # Built only for its own case: it costs a compile.
        model, _, _, params = request.getfixturevalue("small_resnet")
    else:
        model = GRADIENT_MODELS[name]()
        params = model.init(jax.random.key(0))
    x = images(11, (4, *model_input_shape(model, name)))
    y = jnp.arange(4) % 5
    key = jax.random.key(12)
    value_and_grad = jax.jit(jax.value_and_grad(functools.partial(_loss, model)))
    loss, grads = value_and_grad(params, x, y, key)
    chex.assert_tree_all_finite(grads)
    for path, g in jax.tree_util.tree_leaves_with_path(grads):
        assert np.any(np.asarray(g) != 0.0), f"{name}: zero gradient for {jax.tree_util.keystr(path)}"
    stepped = jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)
    assert value_and_grad(stepped, x, y, key)[0] < loss  # Same key: the same masks and crops.


def model_input_shape(model, name):
    return (32, 32, 3) if name == "resnet18-gn" else (784,)


@pytest.mark.parametrize("name", slow_after(["emnist-cr-cnn", "resnet18-gn"], keep=0))
def test_vmap_over_clients_matches_each_client(name, small_resnet):
    if name == "resnet18-gn":
        model, apply, _, params = small_resnet
    else:
        model = build_emnist_cr_cnn((784,), 62)
        apply, params = jax.jit(model.apply), model.init(jax.random.key(0))
    clients = 3
    stacked = jax.tree.map(lambda *p: jnp.stack(p), *[perturbed(params, seed=c) for c in range(clients)])
    keys = jax.random.split(jax.random.key(1), clients)
    x = images(13, (clients, 2, *model_input_shape(model, name)))
    batched = jax.jit(jax.vmap(model.apply))(stacked, x, keys)
    chex.assert_shape(batched, (clients, 2, 10 if name == "resnet18-gn" else 62))
    for c in range(clients):
        one = jax.tree.map(lambda p, c=c: p[c], stacked)
        chex.assert_trees_all_close(batched[c], apply(one, x[c], keys[c]), rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------
# Wrong inputs


@pytest.mark.parametrize(
    "name, shape, options, message",
    [
        (
            "emnist-cr-cnn",
            (20,),
            {"input_vocab_size": 100},
            "needs images; this dataset's inputs are token ids",
        ),
        ("leaf-cnn", (60,), {}, "needs square images: input shape \\(60,\\) has 60 features"),
        ("emnist-cr-cnn", (5, 5, 1), {}, "needs images of at least 6x6, got 5x5"),
        ("deltafl-convnet", (14, 14, 1), {}, "needs images of at least 16x16, got 14x14"),
        ("deltafl-convnet", (784,), {"padding": "full"}, "padding must be 'valid' or 'same'"),
        ("resnet18-gn", (20, 20, 3), {}, "needs images of at least 24x24, got 20x20"),
        ("resnet18-gn", (32, 32, 3), {"width": 9}, "width 9 must be a positive multiple of groups 2"),
        ("resnet18-gn", (32, 32), {}, "needs \\[H, W, C\\] images"),
        ("leaf-cnn", (784,), {"conv": "patches"}, "conv must be one of"),
        ("emnist-cr-cnn", (784,), {"dropout": (0.5, 1.0)}, "two dropout rates in \\[0, 1\\)"),
    ],
)
def test_wrong_inputs_raise(name, shape, options, message):
    with pytest.raises(ValueError, match=message):
        VISION_MODELS[name](shape, 10, **options)


@pytest.mark.parametrize(
    "shape, num_classes, message",
    [
        ((60,), 10, "the convnet needs square images: input shape \\(60,\\) has 60 features"),
        ((28, 28), 10, "the convnet needs \\[H, W, C\\] images"),
        ((784,), 0, "the convnet needs at least one class"),
    ],
)
def test_convnet_checks_its_inputs_as_the_vision_models_do(shape, num_classes, message):
    from jaxfl.models.networks import make_model

    with pytest.raises(ValueError, match=message):
        make_model("convnet", shape, num_classes)
    assert make_model("convnet", (28, 28, 1), 10).name == "convnet"
