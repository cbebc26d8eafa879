"""A 'SAME' 2-D convolution whose gradient XLA:CPU runs fast inside loops.

`jax.grad` of `lax.conv_general_dilated` expresses the input and kernel
gradients as convolutions with permuted dimension labels (`b01f_01oi` and
`f01b_i01o -> 01bf`). XLA:CPU hands a convolution to its fast library kernel
only in the canonical layout (NHWC input, HWIO kernel, NHWC output); at the
top level of a program its layout passes insert the transposes that make the
gradient convolutions canonical, but inside a `while` loop (local SGD is
one) they are left as they are and fall back to a naive loop nest. With
this VJP, an SGD step of the EMNIST ConvNet inside `lax.fori_loop` is as
fast as the same step as a top-level program, several times faster than
with autodiff's gradient (measured: benchmarks/RESULTS.md, section
"The ConvNet on CPU: a layout bug in autodiff, found and fixed").

`same_conv2d` computes the same function as `lax.conv_general_dilated` with
'SAME' padding and unit strides, with a hand-written VJP whose three
convolutions are all canonical, the permutations done as explicit transposes
of the (small) operands:

* input gradient: dx = conv(dy, flip_hw(W) with in/out channels swapped);
* kernel gradient: dW[a, b, i, o] = sum_{n,h,w} x_pad[n, h+a, w+b, i] dy[n, h, w, o],
  a convolution of x (input channels as the batch, examples as features)
  with dy as the kernel.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

_CANONICAL = ("NHWC", "HWIO", "NHWC")


def _canonical_conv(x: jax.Array, kernel: jax.Array, pad: int) -> jax.Array:
    return lax.conv_general_dilated(
        x, kernel, (1, 1), [(pad, pad), (pad, pad)], dimension_numbers=_CANONICAL
    )


@jax.custom_vjp
def same_conv2d(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """'SAME', stride-1 convolution y = x * kernel (NHWC input, HWIO kernel).

    Args:
      x: [batch, height, width, in_channels].
      kernel: [k, k, in_channels, out_channels] with k odd (the padding of
        'SAME' is then (k - 1) / 2 on every side).

    Returns:
      [batch, height, width, out_channels], equal to
      `lax.conv_general_dilated(x, kernel, (1, 1), 'SAME', dimension_numbers=
      ('NHWC', 'HWIO', 'NHWC'))`.
    """
    return _canonical_conv(x, kernel, _same_padding(kernel))


def _same_padding(kernel: jax.Array) -> int:
    height, width = kernel.shape[:2]
    if height != width or height % 2 == 0:
        raise ValueError(f"same_conv2d needs a square kernel of odd size, got {height}x{width}")
    return height // 2


def _forward(x, kernel):
    return same_conv2d(x, kernel), (x, kernel)


def _backward(residuals, dy):
    x, kernel = residuals
    pad = _same_padding(kernel)
    flipped = jnp.transpose(jnp.flip(kernel, (0, 1)), (0, 1, 3, 2))
    dx = _canonical_conv(dy, flipped, pad)
    dkernel = _canonical_conv(
        jnp.transpose(x, (3, 1, 2, 0)),  # [in, H, W, batch]
        jnp.transpose(dy, (1, 2, 0, 3)),  # [H, W, batch, out] as the kernel
        pad,
    )  # [in, k, k, out]
    return dx, jnp.transpose(dkernel, (1, 2, 0, 3))


same_conv2d.defvjp(_forward, _backward)
