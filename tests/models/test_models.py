"""Models: shapes, parameter counts, and the linear model's formula."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import slow_after

from jaxfl.models import count_parameters, make_model, multinomial_logistic_loss


def test_linear_is_affine_and_starts_at_zero():
    model = make_model("linear", (6,), 4)
    params = model.init(jax.random.key(0))
    assert count_parameters(params) == 6 * 4 + 4
    assert not np.any(np.asarray(params["dense"]["kernel"]))
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
    x = rng.normal(size=(3, 6)).astype(np.float32)
    np.testing.assert_allclose(
        model.apply(params, x),
        x @ np.asarray(params["dense"]["kernel"]) + np.asarray(params["dense"]["bias"]),
        rtol=1e-5, atol=1e-5,
    )


def test_convnet_matches_the_peers_architecture():
    # conv5x5(32)-pool-conv5x5(64)-pool-dense(62) on 28x28x1, 'SAME' padding:
    # 832 + 51264 + 3136*62+62 parameters (shared/peers/README.md).
    model = make_model("convnet", (784,), 62)
    params = model.init(jax.random.key(0))
    assert count_parameters(params) == 832 + 51264 + 3136 * 62 + 62
    assert model.apply(params, jnp.ones((2, 784))).shape == (2, 62)
    # About 65 MFLOP of training (3x forward) per example (peers/README.md).
    assert 60e6 < 3 * model.flops_per_example < 70e6


def test_mlp_shapes():
    model = make_model("mlp", (60,), 10, hidden_sizes=(32, 16))
    params = model.init(jax.random.key(0))
    assert count_parameters(params) == 60 * 32 + 32 + 32 * 16 + 16 + 16 * 10 + 10
    assert model.apply(params, jnp.ones((5, 60))).shape == (5, 10)


def test_loss_is_cross_entropy():
    logits = jnp.array([[2.0, 0.0, -1.0]])
    expected = -np.log(np.exp(2.0) / np.sum(np.exp([2.0, 0.0, -1.0])))
    np.testing.assert_allclose(multinomial_logistic_loss(logits, jnp.array([0])), [expected], rtol=1e-6)


@pytest.mark.parametrize(
    "name, shape, message", [("resnet", (4,), "unknown model"), ("convnet", (60,), "square")]
)
def test_bad_models(name, shape, message):
    with pytest.raises(ValueError, match=message):
        make_model(name, shape, 3)


@pytest.mark.parametrize("conv", slow_after(["patches", "canonical"]))
def test_convnet_implementations_equal_lax_convolution_under_vmap(conv):
    lax_model = make_model("convnet", (784,), 62, conv="lax")
    patch_model = make_model("convnet", (784,), 62, conv=conv)
    keys = jax.random.split(jax.random.key(0), 3)
    params = jax.jit(jax.vmap(lax_model.init))(keys)  # Three clients' own models.
    x = jax.random.uniform(jax.random.key(1), (3, 4, 784))

    def loss(model):
        return lambda p, xb: jnp.sum(model.apply(p, xb) ** 2)

    for fn in (lambda m: m.apply, lambda m: jax.grad(loss(m))):
        # Compiled: op by op, the two models' vmapped passes cost many small compilations.
        expected = jax.jit(jax.vmap(fn(lax_model)))(params, x)
        got = jax.jit(jax.vmap(fn(patch_model)))(params, x)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-4), got, expected)
