"""A cohort's local training as one fused kernel, where the model allows it.

With `LocalTraining(loop='fused')`, `train_cohort` and
`train_personal_models` run all local steps of all the cohort's clients in
one Pallas kernel (`jaxfl.kernels.local_training`: one program per client,
its weights kept in its own output buffer from the first step to the last)
when every condition below holds, and `local_sgd` client by client (as
'scan') when one does not:

* the model is a dense ReLU stack (`Model.dense_layers`: the linear model
  and the MLP on real-valued features) and deterministic;
* one label per example: integer labels `[N]` with logits `[B, C]`, C >= 2
  (softmax cross-entropy), or C = 1 (the logistic loss of a binary label);
* layer widths up to `MAX_WIDTH` (256) after the first, batch up to 256;
* one device (not a `sharded` strategy over several), a GPU (or the CPU's
  interpreter), and a proximal term of one weight (not EWC's per-coordinate
  `LocalHParams.prox_weights`).

The result is the same as `local_sgd`'s, step for step: the minibatches are
the same rows (`minibatch_rows`, from the same epoch orders), the loss is
the mean over the batch's real examples, and the update is
`w <- (1 - lr l2) w - lr (grad + mu (w - anchor))`; only the order of float
additions differs (tests/training/test_fused.py). On CPU the kernel runs in
the Pallas interpreter, which is for tests: slow.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxfl.data.population import ClientPopulation, GatheredCohort
from jaxfl.kernels.local_training import DenseLayout, Schedule, fused_local_sgd, supports
from jaxfl.training.local import LocalHParams, LocalTraining, Task, minibatch_rows
from jaxfl.training.strategies import ClientStrategy
from jaxfl.types import Params

# How the kernel runs on a GPU: the fastest of benchmarks/fused_kernel.py's
# schedules for emnist-linear's cohort (faster than the tiles unrolled at 8
# or 4 warps), and the quickest to compile (the tile loop is not unrolled);
# measured: benchmarks/RESULTS.md, section
# "NVIDIA H200 (JAX 0.11.2, CUDA 13), 2026-11-26: the fused local-training kernel (issue 14)".
SCHEDULE = Schedule(num_warps=8, tile_loop=True)


def _layer(params: Params, path) -> dict:
    node = params
    for step in path:
        node = node[step]
    return node


def fused_layout(
    task: Task,
    local: LocalTraining,
    strategy: ClientStrategy,
    params: Params,
    population: ClientPopulation | GatheredCohort,
) -> DenseLayout | None:
    """The kernel's layout for this round, or None where local training is not fused."""
    return _layout_or_reason(task, local, strategy, params, population)[0]


def why_not_fused(task, local, strategy, params, population) -> str | None:
    """Why `fused_layout` is None (None where it is not)."""
    return _layout_or_reason(task, local, strategy, params, population)[1]


def _layout_or_reason(task, local, strategy, params, population):
    model = task.model
    if local.loop != "fused":
        return None, f"the local loop is {local.loop!r}"
    backend = jax.default_backend()
    if backend not in ("gpu", "cpu"):
        return None, f"the kernel is a Triton one (GPU; the interpreter on CPU), the backend is {backend}"
    if not model.dense_layers:
        return None, f"the model {model.name!r} is not a dense stack"
    if model.stochastic:
        return None, f"the model {model.name!r} draws dropout or augmentation"
    mesh = strategy.mesh
    if mesh is not None and mesh.size > 1:
        return None, f"the strategy {strategy.describe()} spreads clients over devices"
    features = population.features
    if set(features) != {"x", "y"}:
        return None, f"the data has features {sorted(features)}, not x and y"
    x, y = features["x"], features["y"]
    if y.ndim != 1 or not (jnp.issubdtype(y.dtype, jnp.integer) or y.dtype == jnp.bool_):
        return None, f"the labels are {y.dtype} {y.shape[1:]}, not one integer per example"
    layers = [_layer(params, path) for path in model.dense_layers]
    if any(set(layer) != {"kernel", "bias"} for layer in layers) or len(jax.tree.leaves(params)) != 2 * len(
        layers
    ):
        return None, "the parameters hold more than the dense layers' kernels and biases"
    widths = (layers[0]["kernel"].shape[0], *(layer["kernel"].shape[1] for layer in layers))
    if int(np.prod(x.shape[1:])) != widths[0]:
        return None, f"the features {x.shape[1:]} do not flatten to the model's {widths[0]} inputs"
    loss = "logistic" if widths[-1] == 1 else "softmax"
    reason = supports(widths, local.batch_size, loss)
    if reason is not None:
        return None, reason
    return DenseLayout(widths, local.batch_size, loss), None


def train_fused(
    task: Task,
    local: LocalTraining,
    layout: DenseLayout,
    start: Params,
    anchor: Params,
    population: ClientPopulation | GatheredCohort,
    slots: jax.Array,
    keys: jax.Array,
    hparams: LocalHParams,
    *,
    num_epochs: jax.Array | None = None,
    active: jax.Array | None = None,
) -> tuple[Params, jax.Array, jax.Array]:
    """Local SGD of a cohort in one kernel.

    Args:
      task: the model (its `dense_layers` locate the layers in `start`).
      local: the static shape of local training.
      layout: `fused_layout(...)`.
      start: where every client starts (the server model, leaves without a
        client axis), or each client's own start (leaves `[M, ...]`: Ditto's
        personal models).
      anchor: the proximal term's center (no client axis).
      population: the clients' examples.
      slots: `[M]` where each client's examples are in `population`.
      keys: `[M]` the clients' keys (their epoch orders).
      hparams: lr, and l2 and prox_mu (None: off).
      num_epochs: optional `[M]` per-client epochs (stragglers).
      active: optional `[M]` bool; inactive clients run no steps.

    Returns:
      (the trained parameters, leaves `[M, ...]` with the structure of
      `start`; `[M]` int32 real steps; `[M]` mean minibatch loss).
    """
    counts = population.counts[slots]
    num_steps = local.num_steps(counts, num_epochs)
    if active is not None:
        num_steps = jnp.where(active, num_steps, 0)
    num_steps = num_steps.astype(jnp.int32)
    rows = jax.vmap(minibatch_rows, in_axes=(None, 0, 0, 0, None))(
        population, slots, keys, num_steps, local
    )
    paths = task.model.dense_layers
    start_layers = [(_layer(start, p)["kernel"], _layer(start, p)["bias"]) for p in paths]
    anchor_layers = [(_layer(anchor, p)["kernel"], _layer(anchor, p)["bias"]) for p in paths]
    zero = jnp.zeros((), jnp.float32)
    with jax.named_scope("local_steps"):
        trained, mean_loss = fused_local_sgd(
            start_layers,
            anchor_layers,
            population.features["x"],
            population.features["y"],
            rows,
            num_steps,
            hparams.lr,
            zero if hparams.l2 is None else hparams.l2,
            zero if hparams.prox_mu is None else hparams.prox_mu,
            layout=layout,
            interpret=jax.default_backend() == "cpu",
            schedule=SCHEDULE,
        )
    # The parameter tree with a client axis (every leaf of a dense stack is a
    # layer's kernel or bias, all replaced below).
    stacked = jax.tree.map(lambda leaf: leaf, start)
    for path, (kernel, bias) in zip(paths, trained, strict=True):
        layer = _layer(stacked, path)
        layer["kernel"] = kernel.astype(layer["kernel"].dtype)
        layer["bias"] = bias.astype(layer["bias"].dtype)
    return stacked, num_steps, mean_loss

