import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfl.models.convolution import same_conv2d


def numpy_same_conv(x, kernel):
    """Slow reference: y[n,h,w,o] = sum_{a,b,i} x_pad[n,h+a,w+b,i] kernel[a,b,i,o]."""
    k = kernel.shape[0]
    pad = k // 2
    padded = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    n, height, width, _ = x.shape
    out = np.zeros((n, height, width, kernel.shape[3]))
    for a in range(k):
        for b in range(k):
            out += np.einsum("nhwi,io->nhwo", padded[:, a:a + height, b:b + width], kernel[a, b])
    return out


def numpy_gradients(x, kernel, dy):
    """Gradients of sum(y * dy) by the same loop: the adjoint of each shift."""
    k = kernel.shape[0]
    pad = k // 2
    padded = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    _, height, width, _ = x.shape
    dpadded = np.zeros_like(padded)
    dkernel = np.zeros_like(kernel)
    for a in range(k):
        for b in range(k):
            window = padded[:, a:a + height, b:b + width]
            dkernel[a, b] = np.einsum("nhwi,nhwo->io", window, dy)
            dpadded[:, a:a + height, b:b + width] += np.einsum("nhwo,io->nhwi", dy, kernel[a, b])
    return dpadded[:, pad:pad + height, pad:pad + width], dkernel


@pytest.mark.parametrize("k, channels", [(5, (1, 4)), (3, (3, 2)), (1, (2, 5))])
def test_value_and_gradients_match_a_numpy_loop(k, channels):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 7, 6, channels[0]))
    kernel = rng.normal(size=(k, k, *channels))
    dy = rng.normal(size=(3, 7, 6, channels[1]))
    y, vjp = jax.vjp(jax.jit(same_conv2d), jnp.asarray(x, jnp.float32), jnp.asarray(kernel, jnp.float32))
    np.testing.assert_allclose(y, numpy_same_conv(x, kernel), rtol=1e-4, atol=1e-4)
    dx, dkernel = vjp(jnp.asarray(dy, jnp.float32))
    expected_dx, expected_dkernel = numpy_gradients(x, kernel, dy)
    np.testing.assert_allclose(dx, expected_dx, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dkernel, expected_dkernel, rtol=1e-4, atol=1e-4)


def test_equals_lax_under_vmap_and_in_a_loop():
    keys = jax.random.split(jax.random.key(0), 2)
    x = jax.random.normal(keys[0], (2, 4, 8, 8, 3))  # Two clients' batches.
    kernels = jax.random.normal(keys[1], (2, 5, 5, 3, 4))

    def reference(x, kernel):
        return jax.lax.conv_general_dilated(
            x, kernel, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )

    def trained(conv):
        def steps(x, kernel):
            def step(_, kernel):
                return kernel - 0.01 * jax.grad(lambda w: jnp.sum(jnp.tanh(conv(x, w))))(kernel)
            return jax.lax.fori_loop(0, 3, step, kernel)
        return jax.jit(jax.vmap(steps))(x, kernels)

    np.testing.assert_allclose(trained(same_conv2d), trained(reference), rtol=1e-4, atol=1e-4)


def test_gradient_convolutions_stay_canonical_inside_a_loop():
    # Why the module exists: XLA:CPU runs non-canonical convolutions as a naive
    # loop nest; autodiff of lax.conv leaves them non-canonical inside loops.
    x = jnp.ones((4, 8, 8, 2))

    def steps(kernel):
        def step(_, kernel):
            return kernel - 0.01 * jax.grad(lambda w: jnp.sum(same_conv2d(x, w) ** 2))(kernel)
        return jax.lax.fori_loop(0, 2, step, kernel)

    text = jax.jit(steps).lower(jnp.ones((5, 5, 2, 3))).compile().as_text()
    labels = [line.split("dim_labels=")[1].split(",")[0] for line in text.splitlines()
              if " convolution(" in line]
    assert labels and all(label == "b01f_01io->b01f" for label in labels), labels


def test_even_kernels_are_refused():
    with pytest.raises(ValueError, match="odd size"):
        same_conv2d(jnp.ones((1, 4, 4, 1)), jnp.ones((2, 2, 1, 1)))
