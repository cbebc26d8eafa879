"""Pallas kernel: all of one client's local SGD steps in one program, for dense ReLU stacks.

Local training of a linear or fully connected model (Pillutla et al. 2023,
Algorithm 1 line 8; FedProx's proximal term and l2 as in
`jaxfl.training.local.local_sgd`):

    w <- (1 - lr * l2) w - lr * (grad F_i(w; batch) + mu (w - anchor)),

S dependent steps per client. Run as XLA operations, each step is ~20 small
kernels per layer and a round is latency-bound: its time does not change
with the model's width (measured: benchmarks/RESULTS.md, section
"NVIDIA H100 80GB HBM3 (JAX 0.11.2, CUDA 13), 2026-11-25"). Here one program
instance (grid axis 0 = the client) runs all its steps: it copies the start
weights into its own output rows once, then each step gathers only the
minibatch rows it needs from the packed population, runs the forward pass,
the softmax (or logistic) gradient and the backward pass, and updates its
weights in place. The weights live in the program's output buffer, written
and re-read by the same program: a few hundred KB per client that stay in
the L2 cache (100 clients of the 784 -> 62 model: 22 MB, under the H100's
50 MB), rather than in shared memory, which the Triton backend does not let
a kernel keep across loop iterations. One launch per round instead of ~20
per step.

Layout (static, `DenseLayout`): layer l maps `in_l -> out_l`; widths are
padded to powers of two of at least 16 (Triton's dot needs 16); the first
layer's input is read in tiles of `tile` features (masked past the real
width), so that one tile of weights (`tile * out_0` floats) fits in
registers; later layers are read whole. Padded weights start at zero and
stay zero: their inputs, gradients and anchors are zero.

The minibatch of each step is given as row indices into the population,
`rows [M, S, batch]` with -1 for a padding slot (past the client's data, or a
step past its own count), computed outside the kernel by
`jaxfl.training.local.minibatch_rows` with the same per-client shuffles as
`local_sgd`. A program runs `num_steps[c]` steps (a loop of the client's
own length).

`fused_local_sgd` is the jitted wrapper, `fused_local_sgd_reference` the
pure-jnp reference with the same signature (jax.grad of the same loss, one
client at a time under `vmap`), and `fused_local_sgd_kernel` the kernel
body. `jaxfl.training.fused` connects them to rounds.

References:
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

# Triton's dot needs every dimension >= 16.
_MIN_WIDTH = 16
# Floats of one weight tile held in registers (first layer: tile x out_0).
_TILE_FLOATS = 8192
# Widths above this (after padding) are not fused: a whole later layer is
# held in registers.
MAX_WIDTH = 256
MAX_BATCH = 256
LOSSES = ("softmax", "logistic")


def _padded(width: int) -> int:
    return max(_MIN_WIDTH, 1 << (width - 1).bit_length())


@dataclasses.dataclass(frozen=True)
class DenseLayout:
    """Static shapes of a fused dense stack.

    Attributes:
      widths: (in_0, out_0, out_1, ..., out_{L-1}): the real layer widths.
      batch: B, the real minibatch size.
      loss: 'softmax' (one label among out_{L-1} classes) or 'logistic'
        (one binary label, out_{L-1} = 1).
      max_tile: the most first-layer features read per tile (a power of two).
    """

    widths: tuple[int, ...]
    batch: int
    loss: str = "softmax"
    max_tile: int = 128

    def __post_init__(self):
        if len(self.widths) < 2 or min(self.widths) < 1:
            raise ValueError(f"widths must be >= 2 positive sizes, got {self.widths}")
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {self.loss!r}")
        if self.loss == "logistic" and self.widths[-1] != 1:
            raise ValueError(f"the logistic loss needs one output, got {self.widths[-1]}")
        if self.loss == "softmax" and self.widths[-1] < 2:
            raise ValueError(f"the softmax loss needs >= 2 classes, got {self.widths[-1]}")
        if not 1 <= self.batch <= MAX_BATCH:
            raise ValueError(f"batch must be in [1, {MAX_BATCH}], got {self.batch}")
        too_wide = [w for w in self.widths[1:] if _padded(w) > MAX_WIDTH]
        if too_wide:
            raise ValueError(f"layer widths above {MAX_WIDTH} are not fused, got {self.widths}")

    @property
    def num_layers(self) -> int:
        return len(self.widths) - 1

    @property
    def padded_batch(self) -> int:
        return _padded(self.batch)

    @property
    def padded_out(self) -> tuple[int, ...]:
        return tuple(_padded(w) for w in self.widths[1:])

    @property
    def tile(self) -> int:
        """Features of the first layer read per tile (a power of two)."""
        widest = max(_MIN_WIDTH, _TILE_FLOATS // self.padded_out[0])
        return min(_padded(self.widths[0]), self.max_tile, widest)

    @property
    def num_tiles(self) -> int:
        return -(-self.widths[0] // self.tile)

    @property
    def padded_in(self) -> tuple[int, ...]:
        return (self.num_tiles * self.tile, *self.padded_out[:-1])


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How the kernel runs on a GPU (results should not depend on it).

    Only the default of `jaxfl.training.fused.SCHEDULE` (8 warps, tile loop,
    1 stage) has been checked natively against the reference (the tests
    marked `gpu`); the others were only timed, not checked (benchmarks/RESULTS.md, section
    "NVIDIA H200 (JAX 0.11.2, CUDA 13), 2026-11-26: the fused local-training kernel (issue 14)").

    Attributes:
      num_warps: warps per program.
      num_stages: Triton's software-pipelining depth of the tile loops.
      tile_loop: the first layer's tiles as a loop (which Triton can
        pipeline: the next tiles' loads in flight during this tile's product)
        rather than unrolled.
    """

    num_warps: int = 4
    num_stages: int = 1
    tile_loop: bool = False


def supports(widths: tuple[int, ...], batch: int, loss: str) -> str | None:
    """Why a dense stack cannot be fused (None: it can)."""
    try:
        DenseLayout(tuple(widths), batch, loss)
    except ValueError as error:
        return str(error)
    return None


def _pad_layers(layout: DenseLayout, layers):
    """[(W [in, out], b [out])] -> the same padded to `layout`, leading axes kept."""
    padded = []
    for (kernel, bias), rows, cols in zip(layers, layout.padded_in, layout.padded_out, strict=True):
        lead = kernel.ndim - 2
        kernel = jnp.pad(
            kernel.astype(jnp.float32),
            [(0, 0)] * lead + [(0, rows - kernel.shape[-2]), (0, cols - kernel.shape[-1])],
        )
        bias = jnp.pad(bias.astype(jnp.float32), [(0, 0)] * lead + [(0, cols - bias.shape[-1])])
        padded.append((kernel, bias))
    return padded


def _unpad_layers(layout: DenseLayout, layers):
    widths = layout.widths
    return [
        (kernel[..., : widths[i], : widths[i + 1]], bias[..., : widths[i + 1]])
        for i, (kernel, bias) in enumerate(layers)
    ]


def _loss_and_gradient(layout: DenseLayout, logits, labels, valid):
    """Mean loss over the valid rows and d(loss)/d(logits) `[Bp, out_p]`."""
    count = jnp.maximum(jnp.sum(valid.astype(jnp.float32)), 1.0)
    weight = valid.astype(jnp.float32) / count
    columns = lax.broadcasted_iota(jnp.int32, logits.shape, 1)
    if layout.loss == "softmax":
        logits = jnp.where(columns < layout.widths[-1], logits, -jnp.inf)
        top = jnp.max(logits, axis=1)
        shifted = logits - top[:, None]
        exp = jnp.exp(shifted)
        total = jnp.sum(exp, axis=1)
        target = jnp.sum(jnp.where(columns == labels[:, None], shifted, 0.0), axis=1)
        losses = jnp.log(total) - target
        probabilities = exp / total[:, None]
        gradient = probabilities - (columns == labels[:, None]).astype(jnp.float32)
    else:
        logit = jnp.sum(jnp.where(columns == 0, logits, 0.0), axis=1)
        label = labels.astype(jnp.float32)
        # log(1 + e^z) - y z, stable for either sign of z.
        losses = jnp.maximum(logit, 0.0) - logit * label + jnp.log1p(jnp.exp(-jnp.abs(logit)))
        gradient = jnp.where(columns == 0, (jax.nn.sigmoid(logit) - label)[:, None], 0.0)
    losses = jnp.where(valid, losses, 0.0)
    return jnp.sum(losses * weight), gradient * weight[:, None]


def fused_local_sgd_kernel(
    rows_ref,
    steps_ref,
    hparams_ref,
    x_ref,
    y_ref,
    *refs,
    layout: DenseLayout,
    start_per_client: bool,
    tile_loop: bool,
    interpret: bool,
):
    """One client: `num_steps[c]` SGD steps on its own output weights.

    refs: start weights (W_0, b_0, ..., W_{L-1}, b_{L-1}; with a leading
    client axis where `start_per_client`), anchors (same, without), then the
    outputs: final weights `[M, ...]` (same order) and the mean minibatch
    loss `[M]`.
    """
    num_layers = layout.num_layers
    start = refs[: 2 * num_layers]
    anchor = refs[2 * num_layers : 4 * num_layers]
    out = refs[4 * num_layers : 6 * num_layers]
    loss_ref = refs[6 * num_layers]
    client = pl.program_id(0)
    lr, l2, mu = hparams_ref[0], hparams_ref[1], hparams_ref[2]
    shrink = 1.0 - lr * l2
    tile, num_features = layout.tile, layout.widths[0]
    features = lax.broadcasted_iota(jnp.int32, (layout.padded_batch, tile), 1)

    def sync():
        # Orders the program's reads and writes of its weights across its
        # threads: the weights live in global memory, written and re-read by
        # the same program, and two threads may touch one element (a CTA
        # barrier; nothing to order in the interpreter, which runs the
        # program as one sequence).
        if not interpret:
            plgpu.debug_barrier()

    def weight_block(layer, tile_index=None):
        if layer == 0:
            block = pl.ds(tile_index * tile, tile)
            return block
        return slice(None)

    def update(layer, block, gradient):
        """W <- (1 - lr l2) w - lr (g + mu (w - anchor)) on one block of layer `layer`."""
        weights_ref, anchor_ref = out[2 * layer], anchor[2 * layer]
        weights = weights_ref[client, block, :]
        new = shrink * weights - lr * (gradient + mu * (weights - anchor_ref[block, :]))
        weights_ref[client, block, :] = new

    def update_bias(layer, gradient):
        bias_ref, anchor_ref = out[2 * layer + 1], anchor[2 * layer + 1]
        bias = bias_ref[client, :]
        bias_ref[client, :] = shrink * bias - lr * (gradient + mu * (bias - anchor_ref[:]))

    # Every program starts from the server's weights.
    for layer in range(num_layers):
        for tile_index in range(layout.num_tiles if layer == 0 else 1):
            block = weight_block(layer, tile_index)
            if start_per_client:
                out[2 * layer][client, block, :] = start[2 * layer][client, block, :]
            else:
                out[2 * layer][client, block, :] = start[2 * layer][block, :]
        if start_per_client:
            out[2 * layer + 1][client, :] = start[2 * layer + 1][client, :]
        else:
            out[2 * layer + 1][client, :] = start[2 * layer + 1][:]
    sync()

    def load_features(rows, valid, tile_index):
        """The minibatch's features [Bp, tile] of one tile (zero past the data)."""
        columns = features + tile_index * tile
        mask = valid[:, None] & (columns < num_features)
        # Two array indexers (a gather the interpreter supports too); columns
        # past the data are masked, and clamped so that no address leaves x.
        row_index = jnp.broadcast_to(rows[:, None], columns.shape)
        values = plgpu.load(
            x_ref.at[row_index, jnp.minimum(columns, num_features - 1)], mask=mask, other=0.0
        )
        return values.astype(jnp.float32)

    def step(index, loss_sum):
        rows = rows_ref[client, index, :]
        valid = rows >= 0
        rows = jnp.where(valid, rows, 0)
        labels = plgpu.load(y_ref.at[rows], mask=valid, other=0).astype(jnp.int32)

        # Forward: the first layer over feature tiles, then the others whole.
        def forward_tile(tile_index, hidden):
            block = weight_block(0, tile_index)
            return hidden + plgpu.dot(load_features(rows, valid, tile_index), out[0][client, block, :])

        hidden = jnp.broadcast_to(out[1][client, :][None, :], (layout.padded_batch, layout.padded_out[0]))
        if tile_loop:
            hidden = lax.fori_loop(0, layout.num_tiles, forward_tile, hidden)
        else:
            for tile_index in range(layout.num_tiles):
                hidden = forward_tile(tile_index, hidden)
        inputs = []
        for layer in range(1, num_layers):
            hidden = jnp.maximum(hidden, 0.0)
            inputs.append(hidden)
            hidden = out[2 * layer + 1][client, :][None, :] + plgpu.dot(hidden, out[2 * layer][client, :, :])
        loss, gradient = _loss_and_gradient(layout, hidden, labels, valid)
        sync()  # Every thread has read this step's weights before any is overwritten.

        # Backward, from the last layer; each layer's input gradient uses its
        # weights before this step's update.
        for layer in range(num_layers - 1, 0, -1):
            below = inputs[layer - 1]
            weight_gradient = plgpu.dot(below, gradient, trans_a=True)
            input_gradient = plgpu.dot(gradient, out[2 * layer][client, :, :], trans_b=True)
            sync()
            update(layer, slice(None), weight_gradient)
            update_bias(layer, jnp.sum(gradient, axis=0))
            gradient = jnp.where(below > 0, input_gradient, 0.0)
        def backward_tile(tile_index, carry):
            block = weight_block(0, tile_index)
            update(0, block, plgpu.dot(load_features(rows, valid, tile_index), gradient, trans_a=True))
            return carry

        if tile_loop:
            lax.fori_loop(0, layout.num_tiles, backward_tile, jnp.zeros((), jnp.int32))
        else:
            for tile_index in range(layout.num_tiles):
                backward_tile(tile_index, None)
        update_bias(0, jnp.sum(gradient, axis=0))
        sync()
        return loss_sum + loss

    num_steps = steps_ref[client]
    loss_sum = lax.fori_loop(0, num_steps, step, jnp.zeros((), jnp.float32))
    loss_ref[client] = loss_sum / jnp.maximum(num_steps, 1).astype(jnp.float32)


def _prepare_hparams(lr, l2, mu):
    return jnp.stack([jnp.asarray(v, jnp.float32) for v in (lr, l2, mu)] + [jnp.zeros((), jnp.float32)])


@functools.partial(jax.jit, static_argnames=("layout", "interpret", "schedule"))
def fused_local_sgd(
    layers,
    anchors,
    features,
    labels,
    rows,
    num_steps,
    lr,
    l2=0.0,
    mu=0.0,
    *,
    layout: DenseLayout,
    interpret: bool = False,
    schedule: Schedule = Schedule(),  # noqa: B008 (frozen, hashable)
):
    """Local SGD of M clients on a dense ReLU stack, all steps of a client in one program.

    Args:
      layers: the start weights [(W_l [in_l, out_l], b_l [out_l])] (the
        server model), shared by every client; or each client's own, with a
        leading axis M (Ditto's personal models).
      anchors: the proximal term's centers, same structure (the server
        model for FedProx; Ditto's global model for its personal models).
      features: `[N, in_0]` the packed population's features (any real or
        integer dtype; read as float32).
      labels: `[N]` integer labels (class ids; 0/1 for 'logistic').
      rows: `[M, S, batch]` int32 row indices of each step's minibatch,
        -1 where a slot is empty (`jaxfl.training.local.minibatch_rows`).
      num_steps: `[M]` int32 steps each client runs (<= S).
      lr: the learning rate (a scalar).
      l2: the l2 regularization lambda (0: off).
      mu: the proximal term's weight (0: off).
      layout: static shapes (`DenseLayout`).
      interpret: run in the Pallas interpreter (CPU).
      schedule: how the kernel runs on a GPU (`Schedule`).

    Returns:
      (the clients' final weights, same structure with a leading M axis;
      `[M]` mean minibatch loss over each client's steps).
    """
    num_clients, _, batch = rows.shape
    if batch != layout.batch:
        raise ValueError(f"rows hold batches of {batch}, the layout {layout.batch}")
    rows = jnp.pad(rows.astype(jnp.int32), ((0, 0), (0, 0), (0, layout.padded_batch - batch)),
                   constant_values=-1)
    features = features.reshape(features.shape[0], -1)
    flat_start = [a for pair in _pad_layers(layout, layers) for a in pair]
    flat_anchor = [a for pair in _pad_layers(layout, anchors) for a in pair]
    out_shape = []
    for rows_l, cols_l in zip(layout.padded_in, layout.padded_out, strict=True):
        out_shape.append(jax.ShapeDtypeStruct((num_clients, rows_l, cols_l), jnp.float32))
        out_shape.append(jax.ShapeDtypeStruct((num_clients, cols_l), jnp.float32))
    out_shape.append(jax.ShapeDtypeStruct((num_clients,), jnp.float32))
    kernel = functools.partial(
        fused_local_sgd_kernel,
        layout=layout,
        start_per_client=layers[0][0].ndim == 3,
        tile_loop=schedule.tile_loop,
        interpret=interpret,
    )
    *flat_out, mean_loss = pl.pallas_call(
        kernel,
        out_shape=tuple(out_shape),
        grid=(num_clients,),
        interpret=interpret,
        compiler_params=None
        if interpret
        else plgpu.CompilerParams(num_warps=schedule.num_warps, num_stages=schedule.num_stages),
    )(rows, num_steps.astype(jnp.int32), _prepare_hparams(lr, l2, mu), features, labels,
      *flat_start, *flat_anchor)
    trained = list(zip(flat_out[0::2], flat_out[1::2], strict=True))
    return _unpad_layers(layout, trained), mean_loss


def _stack_logits(layers, x):
    hidden = x
    for index, (kernel, bias) in enumerate(layers):
        if index:
            hidden = jax.nn.relu(hidden)
        hidden = hidden @ kernel + bias[None, :]
    return hidden


@functools.partial(jax.jit, static_argnames=("layout", "interpret", "schedule"))
def fused_local_sgd_reference(
    layers, anchors, features, labels, rows, num_steps, lr, l2=0.0, mu=0.0, *,
    layout: DenseLayout, interpret: bool = False, schedule: Schedule = Schedule(),  # noqa: B008
):
    """Pure-jnp reference of `fused_local_sgd`, with the same signature.

    Each client (under `vmap`) runs a `fori_loop` of its own steps, with
    `jax.value_and_grad` of the mean optax loss over the valid rows
    (`interpret` and `schedule` are accepted and ignored).
    """
    del interpret, schedule  # Unused: no kernel here.
    features = features.reshape(features.shape[0], -1).astype(jnp.float32)
    layers = [(k.astype(jnp.float32), b.astype(jnp.float32)) for k, b in layers]

    def batch_loss(params, batch_rows):
        valid = batch_rows >= 0
        safe = jnp.where(valid, batch_rows, 0)
        logits = _stack_logits(params, features[safe])
        targets = labels[safe].astype(jnp.int32)
        if layout.loss == "softmax":
            losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
        else:
            losses = optax.sigmoid_binary_cross_entropy(logits[:, 0], targets.astype(jnp.float32))
        count = jnp.maximum(jnp.sum(valid.astype(jnp.float32)), 1.0)
        return jnp.sum(jnp.where(valid, losses, 0.0)) / count

    def one_client(start, client_rows, steps):
        def body(index, carry):
            params, loss_sum = carry
            loss, grads = jax.value_and_grad(batch_loss)(params, client_rows[index])
            params = jax.tree.map(
                lambda w, g, a: (1.0 - lr * l2) * w - lr * (g + mu * (w - a)), params, grads, anchors
            )
            return params, loss_sum + loss

        params, loss_sum = lax.fori_loop(0, steps, body, (start, jnp.zeros((), jnp.float32)))
        return params, loss_sum / jnp.maximum(steps, 1).astype(jnp.float32)

    start_axis = 0 if layers[0][0].ndim == 3 else None
    return jax.vmap(one_client, in_axes=(start_axis, 0, 0))(layers, rows, num_steps.astype(jnp.int32))
