"""Local training of one client, as a `lax.scan` over its minibatch steps.

A client holds n_i examples (a slice of the packed population). It runs
`num_epochs` epochs of minibatch SGD of batch size B, each epoch over a fresh random
permutation of its examples, the last batch of an epoch keeping the
remainder: ceil(n_i / B) * num_epochs real steps, optionally capped by
`max_steps`. The scan has a static length S (the largest client's number of
steps); the steps past a client's own count are padding and leave its
parameters untouched (a `lax.cond`, which also skips their cost when clients
run one at a time; under `vmap` it becomes a select).

The SGD step is that of Pillutla et al. 2023 (Algorithm 1 line 8) and of
FedProx's local objective (Li 2023, eq. 3.2):

    w <- (1 - lr * l2) w - lr * (grad F_i(w; batch) + mu (w - w_server)).

References:
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks.
  [Abadi et al. 2016] Deep Learning with Differential Privacy. CCS 2016.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxfl.data.population import ClientPopulation
from jaxfl.models.losses import misclassification, multinomial_logistic_loss, symmetrized_kl
from jaxfl.models.networks import Model
from jaxfl.primitives.tail import tilted_risk
from jaxfl.privacy.optimizers import noisy_clipped_mean
from jaxfl.types import Key, Params


class ExampleStats(NamedTuple):
    """`[B]` per-example sums that per-client and per-batch means are made of.

    A one-label example scores one target (weights 1); a token sequence
    scores each of its real targets; a multi-label example has one loss
    target and its true labels as error targets. A mean over any set of examples is
    `sum(loss) / sum(loss_weight)` (and the same for the error), so a client's
    loss is the mean over its real tokens, as TFF and FedJAX report it.
    """

    loss: jax.Array  # Summed loss over the example's scored targets.
    loss_weight: jax.Array  # Number of targets in the loss.
    error: jax.Array  # Summed 0/1 errors over the targets accuracy counts.
    error_weight: jax.Array  # Number of targets accuracy counts.


class Task(NamedTuple):
    """A model with its per-example loss and error on a batch dict.

    Batches are dicts with features 'x' (`[B, *input_shape]`) and 'y'. The
    kind of target is read from the shapes at trace time:

    * one label per example, y `[B]`, logits `[B, C]`: the multinomial
      logistic loss and misclassification (Pillutla et al. 2023, Appendix C.1);
    * a binary label, y `[B]` in {0, 1}, logits `[B, 1]`: the logistic loss
      (binary cross-entropy of the logit) and the sign error (Sent140);
    * a token sequence, y `[B, L]` int32 ids, logits `[B, L, V]`: per-token
      cross-entropy over the real targets (y != `pad_id`), and the error over
      the real targets not in `excluded_target_ids` (Reddi et al. 2021 and
      FedJAX exclude pad, oov, bos and eos from next-token accuracy);
    * multi-label, y `[B, T]` indicator vectors (uint8, bool or float: not
      int32, which are token ids), logits `[B, T]`: the sigmoid binary
      cross-entropy averaged over the T outputs (Keras' `BinaryCrossentropy`
      per example), one loss target per example; the error counts the true
      labels missing from the `top_k` largest logits over the number of true
      labels, so that errors pooled over examples give 1 - recall@k as
      `tf.keras.metrics.Recall(top_k=k)` pools it (Reddi et al. 2021's
      StackOverflow tag prediction; an example without a true label counts
      nothing).

    Attributes:
      model: the model.
      excluded_target_ids: target ids that accuracy does not count.
      pad_id: the padding target of sequences (jaxfl's token datasets pad
        with 0); such targets count in neither the loss nor the error.
      top_k: k of multi-label recall@k.
    """

    model: Model
    excluded_target_ids: tuple[int, ...] = ()
    pad_id: int = 0
    top_k: int = 5

    def logits(self, params: Params, x: jax.Array, key: Key | None = None) -> jax.Array:
        """The model's outputs; `key` drives dropout and augmentation (training)."""
        if self.model.stochastic:
            return self.model.apply(params, x, key=key)
        return self.model.apply(params, x)

    def example_stats(self, params: Params, batch, key: Key | None = None) -> ExampleStats:
        """Per-example loss and error sums; `key` drives dropout and augmentation (training)."""
        logits = self.logits(params, batch["x"], key)
        return target_stats(logits, batch["y"], self.excluded_target_ids, self.pad_id, self.top_k)


def target_stats(
    logits: jax.Array,
    targets: jax.Array,
    excluded_target_ids: tuple[int, ...] = (),
    pad_id: int = 0,
    top_k: int = 5,
) -> ExampleStats:
    """`ExampleStats` of logits against targets (the four kinds of `Task`)."""
    if targets.ndim == 2 and logits.ndim == 2:
        if targets.dtype == jnp.int32:
            raise ValueError(
                f"int32 targets {targets.shape} are token ids, which need logits [B, L, V] "
                f"(got {logits.shape}); multi-label targets are uint8, bool or float indicators"
            )
        return multi_label_stats(logits, targets, top_k)
    targets = targets.astype(jnp.int32)
    counted = jnp.ones(targets.shape, jnp.float32)
    for excluded in excluded_target_ids:
        counted = counted * (targets != excluded)
    if targets.ndim == 2:
        real = (targets != pad_id).astype(jnp.float32)
        losses = multinomial_logistic_loss(logits, targets) * real
        errors = misclassification(logits, targets) * real * counted
        counted = counted * real
        return ExampleStats(
            loss=jnp.sum(losses, axis=1),
            loss_weight=jnp.sum(real, axis=1),
            error=jnp.sum(errors, axis=1),
            error_weight=jnp.sum(counted, axis=1),
        )
    if logits.shape[-1] == 1:
        logit = logits[..., 0]
        losses = optax.sigmoid_binary_cross_entropy(logit, targets.astype(logit.dtype))
        errors = ((logit > 0) != (targets == 1)).astype(jnp.float32)
    else:
        losses = multinomial_logistic_loss(logits, targets)
        errors = misclassification(logits, targets)
    ones = jnp.ones_like(losses)
    return ExampleStats(loss=losses, loss_weight=ones, error=errors * counted, error_weight=counted)


def multi_label_stats(logits: jax.Array, targets: jax.Array, top_k: int = 5) -> ExampleStats:
    """Multi-label `ExampleStats`: mean sigmoid cross-entropy, and true labels missed by the top k.

    Args:
      logits: `[B, T]`.
      targets: `[B, T]` indicators (nonzero: a true label).
      top_k: k (Keras' `Recall(top_k=5)` for StackOverflow tags).
    """
    if logits.shape != targets.shape:
        raise ValueError(f"multi-label logits {logits.shape} and targets {targets.shape} differ in shape")
    k = min(top_k, logits.shape[-1])
    truth = (targets != 0).astype(jnp.float32)
    losses = jnp.mean(optax.sigmoid_binary_cross_entropy(logits, truth.astype(logits.dtype)), axis=-1)
    _, top = jax.lax.top_k(logits, k)
    hits = jnp.sum(jnp.take_along_axis(truth, top, axis=-1), axis=-1)
    num_true = jnp.sum(truth, axis=-1)
    return ExampleStats(
        loss=losses.astype(jnp.float32),
        loss_weight=jnp.ones_like(num_true),
        error=num_true - hits,
        error_weight=num_true,
    )


LOOPS = ("scan", "while", "fused")


@dataclasses.dataclass(frozen=True)
class LocalTraining:
    """Static shape of local training (these values fix compiled shapes).

    Attributes:
      batch_size: B, examples per minibatch.
      num_epochs: passes over the client's data.
      max_steps: optional cap on a client's number of steps.
      loop: 'scan' runs a `lax.scan` of the static length S, padding steps
        skipped by a `lax.cond`; 'while' runs a loop whose trip count is the
        client's own number of steps (under `vmap`: the largest in the
        batch), so that batches of similar clients waste nothing; 'fused'
        runs a whole cohort's local training as one kernel where the model
        is a dense stack (`jaxfl.training.fused`), and as 'scan' elsewhere.
        All give the same result; see docs/strategies.md for which is
        faster where.
      scan_unroll: with loop 'scan', steps per iteration of the compiled
        loop (`lax.scan`'s `unroll`; a value >= S unrolls the whole loop):
        fewer, longer iterations, the same result.
    """

    batch_size: int
    num_epochs: int = 1
    max_steps: int | None = None
    loop: str = "scan"
    scan_unroll: int = 1

    def __post_init__(self):
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.num_epochs < 1:
            raise ValueError(f"num_epochs must be >= 1, got {self.num_epochs}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.loop not in LOOPS:
            raise ValueError(f"loop must be one of {LOOPS}, got {self.loop!r}")
        if self.scan_unroll < 1:
            raise ValueError(f"scan_unroll must be >= 1, got {self.scan_unroll}")

    def num_steps(self, count: jax.Array, num_epochs: jax.Array | int | None = None):
        """Real steps of a client with `count` examples (traced)."""
        epochs = self.num_epochs if num_epochs is None else num_epochs
        steps = (count + self.batch_size - 1) // self.batch_size * epochs
        if self.max_steps is not None:
            steps = jnp.minimum(steps, self.max_steps)
        return steps

    def scan_length(self, max_count: int) -> int:
        """S: the static number of scanned steps for a population."""
        steps = -(-max_count // self.batch_size) * self.num_epochs
        return steps if self.max_steps is None else min(steps, self.max_steps)


class ExamplePrivacy(NamedTuple):
    """DP-SGD's per-example clipping and noise in local steps (scalars; may be traced).

    A private step's gradient is (1 / B) (sum_j clip(g_j, C) + N(0, (z 2C)^2 I))
    over the batch's real examples j (`example_private_gradient`): 2C is the
    sum's sensitivity to replacing one example, so z is the noise std over
    it (`jaxfl.privacy.accounting`, example-level adjacency).
    """

    clip_norm: jax.Array  # C > 0, the l2 bound of each example's gradient.
    noise_multiplier: jax.Array  # z >= 0; 0: clipping only.


class LocalHParams(NamedTuple):
    """Numeric hyperparameters of a local step (scalars; may be traced).

    `None` switches a term off at trace time (no cost), whereas a value,
    even 0.0, keeps it in the compiled step so that sweeps can vary it.
    `prox_weights` (a tree like the parameters) weighs the proximal term
    coordinate by coordinate: mu * F_i (w_i - anchor_i), EWC's diagonal
    Fisher F (Li 2023, Appendix 5.6.2). `kl_mu` adds kl_mu/2 times the batch's
    mean symmetrized KL divergence between the model's and the anchor's
    predictive distributions to the minimized loss (SKL, Li 2023, Appendix 5.6.2;
    `mean_symmetrized_kl`). `correction` (a tree like the parameters) is
    added to every step's gradient: a control variate, c - c_i in SCAFFOLD
    (Karimireddy et al. 2020, Algorithm 1), -g_i in FedDyn. `preconditioner`
    (a tree like the parameters, entries > 0) divides every step's gradient,
    the terms above included, coordinate by coordinate: w <- w - lr g / A,
    AdaDPS's local step with side information A (Li 2023, Algorithm 10); the
    l2 decay (1 - lr lambda) w is not divided. `sample_tilt` tau replaces the
    minibatch's mean loss by its tau-tilted risk over the batch's examples
    (`tilted_minibatch_loss`; tau = 0 is the mean, bit for bit): the
    within-group tilt of hierarchical TERM. `example_privacy` makes the
    step DP-SGD's: the minibatch gradient is replaced by the noisy mean of
    the examples' clipped gradients (`ExamplePrivacy`), before the proximal
    term, the correction and the preconditioner, which read no data. None of
    these applies where `local_sgd` is given its own `objective` or `step`;
    `example_privacy` refuses them and the terms that read the batch beyond
    one example's loss (KL, sample tilt).
    """

    lr: jax.Array
    l2: jax.Array | None = None
    prox_mu: jax.Array | None = None
    prox_weights: Params | None = None
    kl_mu: jax.Array | None = None
    correction: Params | None = None
    preconditioner: Params | None = None
    sample_tilt: jax.Array | None = None
    example_privacy: ExamplePrivacy | None = None


class LocalResult(NamedTuple):
    """What one client's local training returns."""

    params: Params  # The client's model after local training.
    num_steps: jax.Array  # int32 [], real steps taken.
    mean_batch_loss: jax.Array  # [], mean minibatch loss over real steps.


# `fold_in` data of the client key's dropout/augmentation stream, and of its
# stream of example-level DP noise.
_MODEL_STREAM = 0x7FFFFFFF
_NOISE_STREAM = 0x7FFFFFFE


def epoch_orders(key: Key, count, max_count: int, num_epochs: int):
    """`[num_epochs, max_count]`: row e starts with a random permutation of [0, count).

    The order in which a client visits its examples in each epoch.

    Each epoch's order comes from `fold_in(key, epoch)`: the positions sorted
    by random keys (ties, which are rare, broken by position). Positions past
    `count` sort last, so the first `count` entries are the permutation.

    For clients of at most 2^10 examples the random key and the position are
    packed into one uint32 (position in the low bits, >= 21 random bits above,
    the top bit marking padding), and one array is sorted instead of a
    key-value pair, which XLA:CPU sorts several times faster (measured:
    benchmarks/RESULTS.md, section
    "Real sequence workloads and the emnist-linear ratio, measured quietly (2026-11-26)").
    The keys' resolution matches the float32 keys of the general path (23
    random bits).
    """
    positions = jnp.arange(max_count, dtype=jnp.uint32)
    position_bits = max(1, (max_count - 1).bit_length())

    def packed(epoch):
        random_bits = 31 - position_bits
        draws = jax.random.bits(jax.random.fold_in(key, epoch), (max_count,), jnp.uint32)
        keys = ((draws >> (32 - random_bits)) << position_bits) | positions
        keys = jnp.where(positions < count, keys, jnp.uint32(1 << 31) | positions)
        return (jnp.sort(keys) & jnp.uint32((1 << position_bits) - 1)).astype(jnp.int32)

    def general(epoch):
        u = jax.random.uniform(jax.random.fold_in(key, epoch), (max_count,))
        u = jnp.where(jnp.arange(max_count) < count, u, 2.0)
        return jnp.argsort(u).astype(jnp.int32)

    one = packed if position_bits <= _PACKED_POSITION_BITS else general
    with jax.named_scope("epoch_orders"):
        return jax.vmap(one)(jnp.arange(num_epochs))


# Up to this many position bits, `epoch_orders` sorts packed uint32 keys.
_PACKED_POSITION_BITS = 10


def minibatch_rows(
    population: ClientPopulation,
    client_id: jax.Array,
    key: Key,
    num_steps: jax.Array,
    config: LocalTraining,
) -> jax.Array:
    """`[S, B]` int32: the population rows of each of a client's minibatches.

    The minibatches `local_sgd` visits with the same key (the same epoch
    orders, step by step), as row indices into the packed population; -1
    marks an empty slot (the short last batch of an epoch, and every slot of
    the steps from `num_steps` on). The fused kernel
    (`jaxfl.kernels.local_training`) reads its minibatches from these.
    """
    max_count = population.max_count
    offset = population.offsets[client_id]
    count = population.counts[client_id]
    perms = epoch_orders(key, count, max_count, config.num_epochs)
    steps = jnp.arange(config.scan_length(max_count))
    rows, valid = jax.vmap(_step_rows, in_axes=(0, None, None, None, None, None, None))(
        steps, perms, offset, count, _steps_per_epoch(count, config), max_count, config
    )
    valid = valid & (steps < num_steps)[:, None]
    return jnp.where(valid, rows, -1).astype(jnp.int32)


def _steps_per_epoch(count, config: LocalTraining):
    """ceil(n / B), at least 1 (a client without examples, never trained, must not divide by 0)."""
    return jnp.maximum((count + config.batch_size - 1) // config.batch_size, 1)


def _step_rows(step, perms, offset, count, steps_per_epoch, max_count: int, config: LocalTraining):
    """(`[B]` population rows of local step `step`, `[B]` which of them are real).

    Step s of epoch e = s // ceil(n / B) takes positions (s mod ceil(n / B)) B
    .. + B - 1 of that epoch's order; positions past the client's n examples
    are padding (their rows clamped to the client's last order entry).
    """
    batch_size = config.batch_size
    epoch = step // steps_per_epoch
    position = (step - epoch * steps_per_epoch) * batch_size + jnp.arange(batch_size)
    order = perms[jnp.minimum(epoch, config.num_epochs - 1)]
    return offset + order[jnp.minimum(position, max_count - 1)], position < count


def diagonal_fisher(task: Task, params: Params, population: ClientPopulation, rows: jax.Array) -> Params:
    """The diagonal empirical Fisher of `params` on one minibatch (EWC, Li 2023, Appendix 5.6.2).

    F_i = mean over the batch's real examples e of (d/dw_i log p(y_e | x_e; w))^2:
    the squared per-example gradients of the loss (one example's summed
    loss over its scored targets), averaged. `rows` is `[B]` population
    rows, -1 for an empty slot (`minibatch_rows`); a batch without an
    example gives zeros.
    """
    valid = rows >= 0
    count = jnp.maximum(jnp.sum(valid.astype(jnp.float32)), 1.0)

    def example_loss(p, row):
        example = {name: feature[row][None] for name, feature in population.features.items()}
        return task.example_stats(p, example).loss[0]

    # One example at a time: a client holds one gradient, not B of them (a
    # vmap over the batch held B x params per client, N B params under vmap).
    def add_example(index, total):
        gradient = jax.grad(example_loss)(params, jnp.maximum(rows[index], 0))
        weight = valid[index].astype(jnp.float32) / count
        return jax.tree.map(lambda t, g: t + weight * g * g, total, gradient)

    zeros = jax.tree.map(jnp.zeros_like, params)
    return jax.lax.fori_loop(0, rows.shape[0], add_example, zeros)


def minibatch_loss(task: Task, params: Params, batch, valid: jax.Array, key: Key | None = None) -> jax.Array:
    """The minibatch loss local SGD minimizes: the mean over the batch's real targets.

    `valid` (`[B]` bool) marks the batch's real examples (a short last batch
    is padded); one target per example for labels, the real tokens of
    sequences.
    """
    return _mean_loss(task.example_stats(params, batch, key), valid)


def _mean_loss(stats: ExampleStats, valid: jax.Array) -> jax.Array:
    total_weight = jnp.sum(jnp.where(valid, stats.loss_weight, 0.0))
    return jnp.sum(jnp.where(valid, stats.loss, 0.0)) / jnp.maximum(total_weight, 1.0)


def tilted_minibatch_loss(
    task: Task, params: Params, batch, valid: jax.Array, tilt: jax.Array, key: Key | None = None
) -> jax.Array:
    """The tau-tilted risk of the batch's real examples, (1/tau) log(sum_x w_x exp(tau f_x) / sum_x w_x).

    f_x is example x's mean loss over its scored targets and w_x their number
    (`ExampleStats`), so that tau -> 0 is `minibatch_loss`'s mean over targets;
    at tau = 0 the result *is* `minibatch_loss` (selected, so its value and
    gradient are unchanged bit for bit). Li 2023, eq. 7.83: the group risk
    R_g(tau) of hierarchical TERM with the client as the group.
    """
    stats = task.example_stats(params, batch, key)  # One forward pass for both.
    mean = _mean_loss(stats, valid)
    weights = jnp.where(valid, stats.loss_weight, 0.0)
    per_example = stats.loss / jnp.maximum(stats.loss_weight, 1.0)
    # A tilt of 1 where tau = 0: that branch is not selected, and its gradient must stay finite. A batch
    # without a real target (padding) has the mean's value, 0.
    tilted = tilted_risk(per_example, jnp.where(tilt == 0, 1.0, tilt), weights)
    return jnp.where((tilt == 0) | (jnp.sum(weights) == 0), mean, tilted)


def example_private_gradient(
    task: Task,
    params: Params,
    batch,
    valid: jax.Array,
    privacy: ExamplePrivacy,
    key: Key,
    step_key: Key | None = None,
) -> tuple[Params, jax.Array]:
    """DP-SGD's minibatch gradient (Abadi et al. 2016, Algorithm 1), and the batch's mean loss.

        g~ = (1 / B) (sum_{j real} clip(grad f_j(w), C) + N(0, (z 2C)^2 I)),

    f_j example j's mean loss over its scored targets (`ExampleStats`), B the
    batch's size (public: a short last batch is padded, its padding rows
    masked, not divided out), clip(g, C) = g min(1, C / ||g||_2), the noise
    from `key` (`jaxfl.privacy.optimizers.noisy_clipped_mean`). Per-example
    gradients by `vmap`: B gradients held at once. `step_key` (dropout,
    augmentation) is split into one key per example.

    Returns:
      (g~, the mean loss over the batch's real targets as `minibatch_loss`
      defines it: a diagnostic computed from the data, not a DP release).
    """

    def example_loss(p, example, example_key):
        stats = task.example_stats(p, jax.tree.map(lambda feature: feature[None], example), example_key)
        return (stats.loss / jnp.maximum(stats.loss_weight, 1.0))[0], (stats.loss[0], stats.loss_weight[0])

    size = valid.shape[0]
    example_keys = None if step_key is None else jax.random.split(step_key, size)
    key_axis = None if step_key is None else 0
    per_example = jax.vmap(jax.grad(example_loss, has_aux=True), in_axes=(None, 0, key_axis))
    gradients, (losses, loss_weights) = per_example(params, batch, example_keys)
    # Replacing one example moves the clipped sum by at most 2C: the noise std is z 2C.
    noisy = noisy_clipped_mean(
        key, gradients, privacy.clip_norm, 2.0 * privacy.noise_multiplier, valid.astype(jnp.float32)
    )
    targets = jnp.sum(jnp.where(valid, loss_weights, 0.0))
    loss = jnp.sum(jnp.where(valid, losses, 0.0)) / jnp.maximum(targets, 1.0)
    return noisy, loss


def mean_symmetrized_kl(
    task: Task, params: Params, anchor: Params, batch, valid: jax.Array, key: Key | None = None
) -> jax.Array:
    """Mean over the batch's real targets of KL(p || q) + KL(q || p), p the model's, q the anchor's.

    The SKL regularizer of Li 2023, Appendix 5.6.2 (`symmetrized_kl`): p and q
    are the softmax outputs of `params` and `anchor` (held fixed: no
    gradient flows into it). Targets as `minibatch_loss` counts them: one
    per example for labels (a binary logit is a two-class distribution),
    the real tokens (y != pad_id) of sequences; multi-label outputs are T
    independent Bernoulli distributions, averaged over T.
    """
    logits = task.logits(params, batch["x"], key)
    reference = jax.lax.stop_gradient(task.logits(anchor, batch["x"], key))
    targets = batch["y"]
    multi_label = targets.ndim == 2 and logits.ndim == 2
    if multi_label:
        divergence = jnp.mean(symmetrized_kl(logits[..., None], reference[..., None]), axis=-1)
    else:
        divergence = symmetrized_kl(logits, reference)
    if divergence.ndim == 2:
        # Token sequences: the real targets of the real examples.
        weight = (targets != task.pad_id).astype(jnp.float32) * valid[:, None]
    else:
        weight = valid.astype(jnp.float32)
    return jnp.sum(divergence * weight) / jnp.maximum(jnp.sum(weight), 1.0)


def sgd_update(params: Params, direction: Params, hparams: LocalHParams) -> Params:
    """The SGD step of the module docstring: (1 - lr l2) w - lr direction (no l2 where it is None)."""
    if hparams.l2 is not None:
        params = jax.tree.map(lambda w: (1.0 - hparams.lr * hparams.l2) * w, params)
    return jax.tree.map(lambda w, d: w - hparams.lr * d, params, direction)


# objective(params, batch, valid, step_key) -> (value to minimize, loss to report).
BatchObjective = Callable[[Params, dict, jax.Array, "Key | None"], tuple[jax.Array, jax.Array]]
# step(params, batch, valid, step_key) -> (new params, loss to report).
LocalStep = Callable[[Params, dict, jax.Array, "Key | None"], tuple[Params, jax.Array]]


def local_sgd(
    task: Task,
    params: Params,
    population: ClientPopulation,
    client_id: jax.Array,
    key: Key,
    hparams: LocalHParams,
    config: LocalTraining,
    *,
    num_epochs: jax.Array | None = None,
    active: jax.Array | bool = True,
    anchor: Params | None = None,
    objective: BatchObjective | None = None,
    step: LocalStep | None = None,
) -> LocalResult:
    """Trains one client from `params` with minibatch SGD.

    Args:
      task: model and loss.
      params: where training starts (the server model w_t in rounds).
      population: packed clients.
      client_id: int32 scalar, which client.
      key: this client's key (`fold_in(round_key, client_id)` in rounds).
      hparams: learning rate, l2 regularization lambda, proximal mu.
      config: static batch size, epochs, step cap.
      num_epochs: optional traced number of epochs <= config.num_epochs
        (stragglers run fewer).
      active: False runs zero steps (padding clients).
      anchor: the proximal term's center (default `params`): Ditto trains a
        personal model v from v towards the server model w_t with the
        proximal term lambda/2 ||v - w_t||^2 (Li 2023, Algorithm 7); also the
        reference of `hparams.kl_mu`'s divergence.
      objective: replaces the minibatch loss: `(params, batch, valid,
        step_key) -> (value, reported loss)`, value differentiated (APFL's
        joint step over a global and a personal model); None: the mean
        batch loss (`minibatch_loss`), plus the KL term of `kl_mu`.
      step: replaces the whole step: `(params, batch, valid, step_key) ->
        (params, reported loss)` (Ditto's dynamic lambda picks among
        candidate steps, Per-FedAvg takes a meta-gradient step); None: the
        SGD step of the module docstring on `objective`, with `hparams`.

    Returns:
      The trained parameters, the number of real steps and the mean loss of
      the minibatches seen.
    """
    max_count = population.max_count
    offset = population.offsets[client_id]
    count = population.counts[client_id]
    num_steps = jnp.where(active, config.num_steps(count, num_epochs), 0)
    perms = epoch_orders(key, count, max_count, config.num_epochs)
    steps_per_epoch = _steps_per_epoch(count, config)
    anchor = params if anchor is None else anchor
    # Dropout and augmentation: a stream of the client's key apart from the
    # epoch orders (which fold in the epoch index).
    model_key = jax.random.fold_in(key, _MODEL_STREAM)
    privacy_key = None if hparams.example_privacy is None else jax.random.fold_in(key, _NOISE_STREAM)
    reads_batch = (objective, step, hparams.kl_mu, hparams.sample_tilt)
    if hparams.example_privacy is not None and any(term is not None for term in reads_batch):
        raise ValueError(
            "example_privacy clips each example's gradient of its own loss: it takes no objective, step, "
            "kl_mu or sample_tilt (they read the batch beyond one example)"
        )

    def train_step(step_index, params):
        rows, valid = _step_rows(step_index, perms, offset, count, steps_per_epoch, max_count, config)
        batch = {name: feature[rows] for name, feature in population.features.items()}

        step_key = jax.random.fold_in(model_key, step_index) if task.model.stochastic else None

        if step is not None:
            return step(params, batch, valid, step_key)

        def batch_objective(p):
            if objective is not None:
                return objective(p, batch, valid, step_key)
            if hparams.sample_tilt is None:
                loss = minibatch_loss(task, p, batch, valid, step_key)
            else:
                loss = tilted_minibatch_loss(task, p, batch, valid, hparams.sample_tilt, step_key)
            if hparams.kl_mu is None:
                return loss, loss
            divergence = mean_symmetrized_kl(task, p, anchor, batch, valid, step_key)
            return loss + 0.5 * hparams.kl_mu * divergence, loss

        if hparams.example_privacy is not None:
            noise_key = jax.random.fold_in(privacy_key, step_index)
            grads, loss = example_private_gradient(
                task, params, batch, valid, hparams.example_privacy, noise_key, step_key
            )
        else:
            (_, loss), grads = jax.value_and_grad(batch_objective, has_aux=True)(params)
        if hparams.prox_mu is not None and hparams.prox_weights is not None:
            grads = jax.tree.map(
                lambda g, w, w0, f: g + hparams.prox_mu * f * (w - w0),
                grads, params, anchor, hparams.prox_weights,
            )
        elif hparams.prox_mu is not None:
            grads = jax.tree.map(
                lambda g, w, w0: g + hparams.prox_mu * (w - w0), grads, params, anchor
            )
        if hparams.correction is not None:
            grads = jax.tree.map(jnp.add, grads, hparams.correction)
        if hparams.preconditioner is not None:
            grads = jax.tree.map(jnp.divide, grads, hparams.preconditioner)
        return sgd_update(params, grads, hparams), loss

    def skip_step(step, params):
        del step  # Unused.
        return params, jnp.zeros((), jnp.float32)

    zero = jnp.zeros((), jnp.float32)
    with jax.named_scope("local_steps"):
        if config.loop == "while":

            def while_body(step, carry):
                params, loss_sum = carry
                params, loss = train_step(step, params)
                return params, loss_sum + loss

            params, loss_sum = jax.lax.fori_loop(0, num_steps, while_body, (params, zero))
        else:

            def scan_body(carry, step):
                params, loss_sum = carry
                params, loss = jax.lax.cond(
                    step < num_steps, train_step, skip_step, step, params
                )
                return (params, loss_sum + loss), None

            length = config.scan_length(max_count)
            (params, loss_sum), _ = jax.lax.scan(
                scan_body, (params, zero), jnp.arange(length),
                unroll=min(config.scan_unroll, max(length, 1)),
            )
    mean_loss = loss_sum / jnp.maximum(num_steps, 1)
    return LocalResult(params, num_steps.astype(jnp.int32), mean_loss)


def client_loss_and_error(
    task: Task,
    params: Params,
    population: ClientPopulation,
    client_id: jax.Array,
    *,
    chunk_size: int = 128,
    tilt: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Mean loss F_i(w) and misclassification error of one client on all its data.

    Means over the client's scored targets (`ExampleStats`): its examples
    for one-label tasks, its real tokens for sequences.

    Runs over the client's examples in chunks, with a trip count set by the
    client's own size (a while loop), so small clients cost little when
    clients run one at a time. A client's examples are contiguous in the
    packed population, so each chunk is a contiguous slice (a copy XLA can
    fuse into the matrix product) rather than a gather: this pass is what a
    Δ-FL round adds to a FedAvg round.

    With `tilt` tau, the loss is the client's tau-tilted risk over its
    examples instead (`tilted_minibatch_loss` over all its data; tau = 0
    selects the mean, equal to the untilted one up to the order XLA adds its
    chunks in), combined chunk by chunk: the tilted risk of two sets is the
    tilted risk of their two tilted risks weighted by their sizes.

    Returns:
      (mean loss, mean error) as float32 scalars.
    """
    chunk = min(chunk_size, population.max_count)

    def body(i, carry):
        sums, tilted = carry
        batch, valid = _client_chunk(population, client_id, i, chunk)
        stats = task.example_stats(params, batch)
        sums = tuple(
            total + jnp.sum(jnp.where(valid, value, 0.0)) for total, value in zip(sums, stats, strict=True)
        )
        if tilt is not None:
            risk, weight = tilted
            chunk_weights = jnp.where(valid, stats.loss_weight, 0.0)
            per_example = stats.loss / jnp.maximum(stats.loss_weight, 1.0)
            chunk_risk = tilted_risk(per_example, safe_tilt, chunk_weights)
            chunk_weight = jnp.sum(chunk_weights)
            # The first chunk (weight 0 so far) or a chunk without targets adds nothing.
            combined = tilted_risk(
                jnp.stack([risk, jnp.where(chunk_weight > 0, chunk_risk, 0.0)]),
                safe_tilt, jnp.stack([weight, chunk_weight]),
            )
            risk = jnp.where(weight + chunk_weight > 0, combined, 0.0)
            tilted = (risk, weight + chunk_weight)
        return sums, tilted

    safe_tilt = None if tilt is None else jnp.where(tilt == 0, 1.0, tilt)
    num_chunks = (population.counts[client_id] + chunk - 1) // chunk
    zero = jnp.zeros((), jnp.float32)
    sums, (risk, _) = jax.lax.fori_loop(0, num_chunks, body, ((zero,) * 4, (zero, zero)))
    loss, error = client_means(ExampleStats(*sums))
    if tilt is not None:
        loss = jnp.where(tilt == 0, loss, risk)
    return loss, error


def client_loss_gradient(
    task: Task, params: Params, population: ClientPopulation, client_id: jax.Array, *, chunk_size: int = 128
) -> Params:
    """Grad F_i(w), the gradient of the client's mean loss over all its scored targets.

    Summed chunk by chunk as `client_loss_and_error` (each chunk's gradient
    taken inside the loop, whose trip count is the client's own), then
    divided by the number of targets; a client without a target gets zeros.
    """
    chunk = min(chunk_size, population.max_count)

    def body(i, carry):
        total, weight = carry
        batch, valid = _client_chunk(population, client_id, i, chunk)

        def chunk_loss(p):
            stats = task.example_stats(p, batch)
            targets = jnp.sum(jnp.where(valid, stats.loss_weight, 0.0))
            return jnp.sum(jnp.where(valid, stats.loss, 0.0)), targets

        gradient, chunk_weight = jax.grad(chunk_loss, has_aux=True)(params)
        return jax.tree.map(jnp.add, total, gradient), weight + chunk_weight

    num_chunks = (population.counts[client_id] + chunk - 1) // chunk
    start = (jax.tree.map(jnp.zeros_like, params), jnp.zeros((), jnp.float32))
    total, weight = jax.lax.fori_loop(0, num_chunks, body, start)
    return jax.tree.map(lambda g: g / jnp.maximum(weight, 1.0), total)


def _client_chunk(population: ClientPopulation, client_id: jax.Array, i: jax.Array, chunk: int):
    """(batch, `[chunk]` valid) of chunk i of a client's examples.

    The slice of chunk i starts at the client's row i * chunk, moved back
    where it would run past the population's end; `valid` keeps the rows of
    positions [i * chunk, min((i + 1) * chunk, count)). A client's examples
    are contiguous, so this is a slice (a copy XLA can fuse), not a gather.
    """
    offset = population.offsets[client_id]
    count = population.counts[client_id]
    start = jnp.minimum(offset + i * chunk, population.num_examples - chunk)
    position = start - offset + jnp.arange(chunk)
    valid = (position >= i * chunk) & (position < count)
    features = population.features.items()
    batch = {name: jax.lax.dynamic_slice_in_dim(feature, start, chunk) for name, feature in features}
    return batch, valid


def client_means(sums: ExampleStats) -> tuple[jax.Array, jax.Array]:
    """(mean loss, mean error) from summed `ExampleStats` (any leading shape).

    A client without a counted target (sequences whose targets are all
    excluded from accuracy, multi-label examples without a true label) gets
    error 0.
    """
    loss = sums.loss / jnp.maximum(sums.loss_weight, 1.0)
    error = jnp.where(sums.error_weight > 0, sums.error / jnp.maximum(sums.error_weight, 1.0), 0.0)
    return loss, error
