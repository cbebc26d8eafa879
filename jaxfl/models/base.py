"""The pure model type every jaxfl model is, and how a flax NNX module becomes one.

A leaf of `jaxfl.models`: the architectures (`networks`, `vision`,
`sequence`) build on it, and `networks.make_model` looks them up by name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
from flax import nnx

from jaxfl.types import Key, Params

CONV_IMPLEMENTATIONS = ("lax", "canonical", "patches")


def default_conv(backend: str) -> str:
    """The ConvNet's convolution per backend, from measurements.

    CPU: 'canonical', since XLA:CPU runs the gradient convolutions of 'lax'
    as a naive loop nest inside the local-training loop (measured:
    benchmarks/RESULTS.md, section
    "The ConvNet on CPU: a layout bug in autodiff, found and fixed");
    GPU/TPU: 'lax', the fastest measured on a GPU, where 'patches' was
    slower (docs/strategies.md, section "The measurements behind them").
    """
    return "canonical" if backend == "cpu" else "lax"


def image_input_shape(
    name: str,
    input_shape: Sequence[int],
    input_vocab_size: int | None,
    num_classes: int,
    min_side: int = 1,
) -> tuple[int, int, int]:
    """(H, W, C) of an image model's inputs, from `[H, W, C]` or flat square grayscale (784 = 28x28x1).

    Raises:
      ValueError: token inputs (`input_vocab_size` set), a shape that is
        neither, a side under `min_side`, or no class.
    """
    if input_vocab_size is not None:
        raise ValueError(f"{name} needs images; this dataset's inputs are token ids")
    shape = tuple(int(d) for d in input_shape)
    if len(shape) == 1:
        side = math.isqrt(shape[0])
        if side * side != shape[0]:
            raise ValueError(
                f"{name} needs square images: input shape {shape} has {shape[0]} features, "
                "not a perfect square"
            )
        shape = (side, side, 1)
    elif len(shape) != 3:
        raise ValueError(
            f"{name} needs [H, W, C] images or flat square grayscale ones, got input shape {shape}"
        )
    height, width, _ = shape
    if min(height, width) < min_side:
        raise ValueError(f"{name} needs images of at least {min_side}x{min_side}, got {height}x{width}")
    if num_classes < 1:
        raise ValueError(f"{name} needs at least one class, got num_classes={num_classes}")
    return shape  # type: ignore[return-value]


class Model(NamedTuple):
    """A model as two pure functions.

    Attributes:
      init: `key -> params`, a nested dict of arrays.
      apply: `(params, x [B, *input_shape], key=None) -> logits`: `[B, C]`
        for one label per example, `[B, 1]` for a binary label, `[B, L, V]`
        for token sequences. With a `key` (training) the model draws its
        dropout masks and data augmentation from it; `key=None` is the
        deterministic evaluation pass.
      name: the registry name, for logs.
      flops_per_example: forward-pass FLOPs (multiply-adds count 2) of one
        example, for throughput figures; training costs about 3x this.
      stochastic: whether `apply` uses its key (dropout, augmentation).
      dense_layers: for a stack of dense layers with ReLU between them, read
        from features flattened to `[B, -1]` (the linear model and the MLP
        on real-valued inputs), the paths in `params` of its layers' dicts
        (`kernel` `[in, out]`, `bias` `[out]`), first to last; empty for
        other models. Local training of such a stack can run as one fused
        kernel (`jaxfl.training.fused`).
    """

    init: Callable[[Key], Params]
    apply: Callable[..., jax.Array]
    name: str
    flops_per_example: int
    stochastic: bool = False
    dense_layers: tuple[tuple[str | int, ...], ...] = ()


def as_model(
    build: Callable[[nnx.Rngs], nnx.Module],
    name: str,
    flops: int,
    *,
    stochastic: bool = False,
    dense_layers: tuple[tuple[str | int, ...], ...] = (),
) -> Model:
    """Splits an NNX module into pure `init` and `apply` functions.

    The parameters are the module's `nnx.Param`s; any other state (e.g. a
    frozen embedding table held as a non-`Param` variable) is rebuilt from
    `build` and closed over as a constant, so training never updates it.
    A `stochastic` module's `__call__(x, key=None)` takes the key.
    """
    # Shapes only (an eager build compiles every initializer: 1-3 s for the
    # large models); modules with non-parameter state are built for real.
    graphdef, _, rest = nnx.split(nnx.eval_shape(lambda: build(nnx.Rngs(0))), nnx.Param, ...)
    if jax.tree.leaves(rest):
        graphdef, _, rest = nnx.split(build(nnx.Rngs(0)), nnx.Param, ...)

    def init(key: Key) -> Params:
        module = build(nnx.Rngs(params=key))
        return nnx.to_pure_dict(nnx.split(module, nnx.Param, ...)[1])

    def apply(params: Params, x: jax.Array, key: Key | None = None) -> jax.Array:
        module = nnx.merge(graphdef, params, rest)
        return module(x, key=key) if stochastic else module(x)

    return Model(
        init=init,
        apply=apply,
        name=name,
        flops_per_example=flops,
        stochastic=stochastic,
        dense_layers=dense_layers,
    )
