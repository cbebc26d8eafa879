"""Private optimizers as optax transformations: DP-SGD, DP-Adam, DP-RMSProp, AdaDPS and DP^2.

Every transformation here that privatizes takes **per-example gradients**, a
pytree whose leaves carry a leading batch axis b (`jax.vmap(jax.grad(loss),
in_axes=(None, 0))(params, batch)`), and returns one update shaped like the
parameters. The private step is the Gaussian mechanism of DP-SGD (Li 2023,
Section 6.2, after Abadi et al. 2016):

    g~ = (1 / k) (sum_{j <= k} clip(g_j, C) + N(0, z^2 C^2 I)),

g_j the k rows (examples, or the means of microbatches of examples),
clip(g, C) = g min(1, C / ||g||_2). Adding or removing one example changes
the sum by at most C (its row), so g~ is the Gaussian mechanism with noise
multiplier z under `ADD_OR_REMOVE_ONE` adjacency, the relation of
`dp_sgd_epsilon`. Noise of step t comes from `fold_in(key, t)`. A row with
a non-finite entry counts as zeros there (`jaxfl.privacy.clipping`).

The compositions (chain them with `optax.chain`, the privatizing part first
unless a preconditioner comes before it):

* DP-SGD: `privatize(C, z, key)`, then `optax.sgd(lr)`;
* DP-Adam, DP-RMSProp (Li 2023, Algorithm 9; Zhou et al. 2020): privatize,
  then Adam or RMSProp on g~: `dp_adam`, `dp_rmsprop`;
* AdaDPS (Li 2023, Algorithm 8): precondition each example's gradient by
  side information A, then privatize: `scale_by_side_information(A)` (option
  2, a fixed A such as token frequencies) or `scale_by_public_moments(...)`
  (option 1, A from the gradients of public data, given each step as the
  extra argument `public_gradient`), then `privatize`. A never reads private
  data, so the privacy is DP-SGD's at the same z (post-processing);
* DP-R-Pub, DP-Adam-Pub (the baselines of Algorithm 8): privatize first, then
  `scale_by_public_moments`;
* DP^2 (Li 2023, Algorithm 11): `dp2`, delayed preconditioners built from the
  privatized gradients themselves (so also DP-SGD's privacy).

References:
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks. PhD thesis, CMU, 2023, chapter 6.
  [Abadi et al. 2016] Deep Learning with Differential Privacy. CCS 2016.
  [Zhou et al. 2020] Private Stochastic Non-Convex Optimization: Adaptive Algorithms and Tighter
    Generalization Bounds. arXiv:2006.13501.
  [Zaheer et al. 2018] Adaptive Methods for Nonconvex Optimization. NeurIPS 2018 (Yogi).
  [Mironov et al. 2019] Renyi Differential Privacy of the Sampled Gaussian Mechanism. arXiv:1908.10530.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxfl.privacy.clipping import clipped_sum
from jaxfl.privacy.noise import gaussian_noise_like
from jaxfl.types import Key, PyTree
from jaxfl.validation import check_choice, check_fraction, check_int, check_number

PRECONDITIONER_KINDS = ("rmsprop", "adagrad", "adam")
DP2_VARIANTS = ("rmsprop", "adagrad", "yogi")


def _leading(value: jax.Array, like: jax.Array) -> jax.Array:
    """`value` (parameter-shaped) with unit axes in front, to meet `like`'s leading batch axes."""
    return value.reshape((1,) * (like.ndim - value.ndim) + value.shape)


def _microbatch_rows(per_example: PyTree, microbatch_size: int) -> PyTree:
    """The rows clipped: examples, or the means of consecutive microbatches of them."""
    if microbatch_size == 1:
        return per_example
    batch = jax.tree.leaves(per_example)[0].shape[0]
    if batch % microbatch_size:
        raise ValueError(f"the batch ({batch}) must be a multiple of microbatch_size ({microbatch_size})")
    return jax.tree.map(
        lambda g: g.reshape(batch // microbatch_size, microbatch_size, *g.shape[1:]).mean(axis=1), per_example
    )


def noisy_clipped_mean(
    key: Key, rows: PyTree, clip_norm, noise_multiplier, weights: jax.Array | None = None
) -> PyTree:
    """(1 / k) (sum_j p_j clip(row_j, C) + N(0, z^2 C^2 I)) over the k rows of `rows` (leading axis).

    `weights` p (`[k]`, default ones; 0/1 masks padding rows) do not change the divisor k.
    """
    total, _ = clipped_sum(rows, clip_norm, weights)
    # z = 0 means no noise even with C = inf (0 * inf would be NaN).
    stddev = jnp.where(jnp.asarray(noise_multiplier) == 0, 0.0, noise_multiplier * jnp.asarray(clip_norm))
    noise = gaussian_noise_like(key, total, stddev)
    count = jax.tree.leaves(rows)[0].shape[0]
    return jax.tree.map(lambda s, n: (s + n) / count, total, noise)


def _check_privatize(clip_norm, noise_multiplier, microbatch_size) -> None:
    """Python values checked here; traced ones are the caller's (they may come from a sweep)."""
    if isinstance(clip_norm, numbers.Real):
        check_number("clip_norm", clip_norm, low=0.0, low_open=True)
    if isinstance(noise_multiplier, numbers.Real):
        check_number("noise_multiplier", noise_multiplier, low=0.0)
    check_int("microbatch_size", microbatch_size)


class PrivatizeState(NamedTuple):
    """The step count t (the noise of step t comes from fold_in(key, t))."""

    count: jax.Array


def privatize(
    clip_norm, noise_multiplier, key: Key, *, microbatch_size: int = 1
) -> optax.GradientTransformation:
    """DP-SGD's Gaussian mechanism on per-example gradients (module docstring).

    Args:
      clip_norm: C > 0, the l2 bound of each row (may be traced).
      noise_multiplier: z >= 0, the noise std over C (may be traced; 0: clipping only).
      key: the noise's PRNG key (step t uses fold_in(key, t)).
      microbatch_size: examples averaged into one clipped row (Li 2023, App. 6.6: microbatches of 4).
        The batch must be a multiple. The unit of privacy is then the microbatch (the row added
        or removed), not the example: `dp_sgd_epsilon` holds for microbatches.

    Returns:
      An optax transformation from per-example gradients (leading axis b) to the noisy mean.

    Raises:
      ValueError: a Python clip_norm <= 0, a negative or non-finite noise multiplier, a
        microbatch size < 1, or (at update) a batch that is not a multiple of it.
    """
    _check_privatize(clip_norm, noise_multiplier, microbatch_size)

    def init(params):
        del params  # Unused.
        return PrivatizeState(jnp.zeros((), jnp.int32))

    def update(updates, state, params=None):
        del params  # Unused.
        rows = _microbatch_rows(updates, microbatch_size)
        noisy = noisy_clipped_mean(jax.random.fold_in(key, state.count), rows, clip_norm, noise_multiplier)
        return noisy, PrivatizeState(state.count + 1)

    return optax.GradientTransformation(init, update)


class SideInformationState(NamedTuple):
    """Nothing: the preconditioner is fixed."""


def scale_by_side_information(preconditioner: PyTree) -> optax.GradientTransformation:
    """AdaDPS option 2 (Li 2023, Algorithm 8): g -> g / A with a fixed A, shaped like the parameters.

    A comes from non-private side information (e.g. A_j = E|x_j| + eps from
    public token frequencies); it broadcasts over any leading batch axis, so
    it may precede `privatize`. Entries of A must be > 0.
    """

    def init(params):
        del params  # Unused.
        return SideInformationState()

    def update(updates, state, params=None):
        del params  # Unused.
        return jax.tree.map(lambda g, a: g / _leading(a, g), updates, preconditioner), state

    return optax.GradientTransformation(init, update)


class PublicMomentsState(NamedTuple):
    """Moments of the public gradients: `first` (Adam's M), `second` (v or the AdaGrad sum)."""

    first: PyTree
    second: PyTree


def scale_by_public_moments(
    kind: str = "rmsprop", *, beta: float = 0.9, beta2: float = 0.999, eps: float = 1e-8
) -> optax.GradientTransformationExtraArgs:
    """AdaDPS option 1 (Li 2023, Algorithm 8): a preconditioner from public gradients g^ (each step's
    `public_gradient` extra argument, shaped like the parameters).

    * rmsprop: v <- beta v + (1 - beta) g^^2, A = sqrt(v) + eps, g -> g / A;
    * adagrad: v <- v + g^^2, A = sqrt(v) + eps, g -> g / A;
    * adam: M <- beta M + (1 - beta) g^, v <- beta2 v + (1 - beta2) g^^2, A = sqrt(v) + eps,
      g -> (beta g + (1 - beta) M) / A.

    The state moves first, then scales this step's gradients (which may carry a
    leading batch axis). Before `privatize` it is AdaDPS; after it, DP-R-Pub
    (rmsprop) or DP-Adam-Pub (adam).

    Raises:
      ValueError: an unknown kind, or betas outside [0, 1), or eps <= 0.
    """
    check_choice("kind", kind, PRECONDITIONER_KINDS)
    check_number("beta", beta, low=0.0, high=1.0, high_open=True)
    check_number("beta2", beta2, low=0.0, high=1.0, high_open=True)
    check_number("eps", eps, low=0.0, low_open=True)

    def init(params):
        zeros = jax.tree.map(jnp.zeros_like, params)
        return PublicMomentsState(first=zeros, second=zeros)

    def update(updates, state, params=None, *, public_gradient=None, **extra_args):
        del params, extra_args  # Unused.
        if public_gradient is None:
            raise ValueError("scale_by_public_moments needs each step's public_gradient")
        if kind == "adagrad":
            second = jax.tree.map(lambda v, g: v + g**2, state.second, public_gradient)
        else:
            decay = beta if kind == "rmsprop" else beta2
            second = jax.tree.map(lambda v, g: decay * v + (1 - decay) * g**2, state.second, public_gradient)
        first = state.first
        if kind == "adam":
            first = jax.tree.map(lambda m, g: beta * m + (1 - beta) * g, state.first, public_gradient)
        scale = jax.tree.map(lambda v: jnp.sqrt(v) + eps, second)
        if kind == "adam":
            mixed = jax.tree.map(lambda g, m: beta * g + (1 - beta) * _leading(m, g), updates, first)
            scaled = jax.tree.map(lambda g, a: g / _leading(a, g), mixed, scale)
        else:
            scaled = jax.tree.map(lambda g, a: g / _leading(a, g), updates, scale)
        return scaled, PublicMomentsState(first=first, second=second)

    return optax.GradientTransformationExtraArgs(init, update)


def dp_adam(
    learning_rate, clip_norm, noise_multiplier, key: Key, *, b1: float = 0.9, b2: float = 0.999,
    eps: float = 1e-8, microbatch_size: int = 1,
) -> optax.GradientTransformation:
    """DP-Adam (Li 2023, Algorithm 9): privatize, then Adam with eps inside the root,
    w <- w - lr (m / (1 - b1^t)) / sqrt(v / (1 - b2^t) + eps)."""
    return optax.chain(
        privatize(clip_norm, noise_multiplier, key, microbatch_size=microbatch_size),
        optax.scale_by_adam(b1=b1, b2=b2, eps=0.0, eps_root=eps),
        optax.scale_by_learning_rate(learning_rate),
    )


def dp_rmsprop(
    learning_rate, clip_norm, noise_multiplier, key: Key, *, decay: float = 0.9, eps: float = 1e-8,
    microbatch_size: int = 1,
) -> optax.GradientTransformation:
    """DP-RMSProp (Li 2023, Algorithm 9): privatize, then v <- decay v + (1 - decay) g~^2,
    w <- w - lr g~ / sqrt(v + eps)."""
    return optax.chain(
        privatize(clip_norm, noise_multiplier, key, microbatch_size=microbatch_size),
        optax.scale_by_rms(decay=decay, eps=eps, initial_scale=0.0, eps_in_sqrt=True),
        optax.scale_by_learning_rate(learning_rate),
    )


TABLE_6_11_METHODS = ("sgd", "dp-sgd", "dp-rmsprop", "adadps", "dp2-rmsprop")


def table_6_11_method(
    name: str, learning_rate, clip_norm, noise_multiplier, key: Key, *,
    side_information: PyTree | None = None, phase_steps: int | None = None,
) -> optax.GradientTransformation:
    """One of the methods Li 2023, Table 6.11 compares, by name, over per-example gradients.

    'sgd' (not private: the rows' mean, then SGD, the floor), 'dp-sgd' (`privatize`, then SGD),
    'dp-rmsprop' (`dp_rmsprop`), 'adadps' (`scale_by_side_information(side_information)`, then
    `privatize` and SGD: Algorithm 8, option 2) and 'dp2-rmsprop' (`dp2` with phases of
    `phase_steps` steps, the same rate and clip in both, beta 0.9, eps 1e-3: the thesis's s1 = s2).

    Raises:
      ValueError: an unknown name, or adadps without side information, dp2 without phase_steps.
    """
    check_choice("name", name, TABLE_6_11_METHODS)
    private = privatize(clip_norm, noise_multiplier, key)
    if name == "sgd":
        mean = optax.GradientTransformation(
            lambda params: optax.EmptyState(),
            lambda updates, state, params=None: (jax.tree.map(lambda g: g.mean(axis=0), updates), state),
        )
        return optax.chain(mean, optax.sgd(learning_rate))
    if name == "dp-sgd":
        return optax.chain(private, optax.sgd(learning_rate))
    if name == "dp-rmsprop":
        return dp_rmsprop(learning_rate, clip_norm, noise_multiplier, key)
    if name == "adadps":
        if side_information is None:
            raise ValueError("adadps needs side_information")
        return optax.chain(scale_by_side_information(side_information), private, optax.sgd(learning_rate))
    if phase_steps is None:
        raise ValueError("dp2-rmsprop needs phase_steps")
    return dp2(
        (learning_rate, learning_rate), (clip_norm, clip_norm), noise_multiplier, key,
        sgd_steps=phase_steps, rmsprop_steps=phase_steps, beta=0.9, eps=1e-3,
    )


def delayed_second_moment(variant: str, beta, v: jax.Array, mean: jax.Array) -> jax.Array:
    """DP^2's refresh of the second moment v from the mean g of the last SGD phase's privatized gradients.

    rmsprop: beta v + (1 - beta) g^2; adagrad: v + g^2; yogi (Zaheer et al. 2018):
    v - (1 - beta) sign(v - g^2) g^2 (Li 2023, Algorithm 11 and Section 6.14).
    """
    if variant == "rmsprop":
        return beta * v + (1 - beta) * mean**2
    if variant == "adagrad":
        return v + mean**2
    return v - (1 - beta) * jnp.sign(v - mean**2) * mean**2


class Dp2State(NamedTuple):
    """DP^2's step t, delayed second moment v and privatized gradients G summed since the last reset."""

    count: jax.Array
    second: PyTree
    accumulated: PyTree


def dp2(
    learning_rates: tuple, clip_norms: tuple, noise_multiplier, key: Key, *, sgd_steps: int,
    rmsprop_steps: int, beta: float = 0.9, eps: float = 1e-8, variant: str = "rmsprop",
    noise_before_preconditioning: bool = False,
) -> optax.GradientTransformation:
    """DP^2 (Li 2023, Algorithm 11): private SGD and private RMSProp phases, the preconditioner of each
    RMSProp phase built from the preceding SGD phase's privatized gradients.

    Step t in the cycle of s1 + s2 steps (s1 = `sgd_steps`, s2 = `rmsprop_steps`), phase
    p = t mod (s1 + s2): at p = 0, G <- 0; at p = s1, v <- update(v, G / s1) and G <- 0, with
    update rmsprop: beta v + (1 - beta) g^2; adagrad: v + g^2; yogi (Zaheer et al. 2018):
    v - (1 - beta) sign(v - g^2) g^2. Then D = 1 in the SGD phase (p < s1), sqrt(v) + eps in the
    RMSProp phase, and

        g~ = (1 / b) (sum_i clip(g_i / D, C) + N(0, z^2 C^2 I)),   G <- G + g~,   w <- w - lr g~,

    with C and lr the phase's (`clip_norms`, `learning_rates`: (SGD phase, RMSProp phase); the
    thesis tunes them apart). One private release per step: the privacy of DP-SGD with z.
    `noise_before_preconditioning` is the thesis's second ablation (Section 6.14):
    g~ = ((1 / b)(sum_i clip(g_i, C) + N)) / D.

    Returns:
      An optax transformation from per-example gradients to the parameter update (learning rate in).

    Raises:
      ValueError: phase lengths < 1, an unknown variant, beta outside [0, 1), eps <= 0.
    """
    check_choice("variant", variant, DP2_VARIANTS)
    check_int("sgd_steps", sgd_steps)
    check_int("rmsprop_steps", rmsprop_steps)
    check_number("beta", beta, low=0.0, high=1.0, high_open=True)
    check_number("eps", eps, low=0.0, low_open=True)
    for clip_norm in clip_norms:
        _check_privatize(clip_norm, noise_multiplier, 1)
    cycle = sgd_steps + rmsprop_steps

    def init(params):
        zeros = jax.tree.map(jnp.zeros_like, params)
        return Dp2State(count=jnp.zeros((), jnp.int32), second=zeros, accumulated=zeros)

    def update(updates, state, params=None):
        del params  # Unused.
        phase = state.count % cycle
        accumulated = jax.tree.map(lambda g: jnp.where(phase == 0, 0.0, g), state.accumulated)
        refresh = phase == sgd_steps
        second = jax.tree.map(
            lambda v, g: jnp.where(refresh, delayed_second_moment(variant, beta, v, g / sgd_steps), v),
            state.second,
            accumulated,
        )
        accumulated = jax.tree.map(lambda g: jnp.where(refresh, 0.0, g), accumulated)
        rmsprop_phase = phase >= sgd_steps
        divisor = jax.tree.map(lambda v: jnp.where(rmsprop_phase, jnp.sqrt(v) + eps, 1.0), second)
        clip_norm = jnp.where(rmsprop_phase, clip_norms[1], clip_norms[0])
        step_key = jax.random.fold_in(key, state.count)
        if noise_before_preconditioning:
            noisy = noisy_clipped_mean(step_key, updates, clip_norm, noise_multiplier)
            noisy = jax.tree.map(lambda g, d: g / d, noisy, divisor)
        else:
            scaled = jax.tree.map(lambda g, d: g / _leading(d, g), updates, divisor)
            noisy = noisy_clipped_mean(step_key, scaled, clip_norm, noise_multiplier)
        accumulated = jax.tree.map(jnp.add, accumulated, noisy)
        learning_rate = jnp.where(rmsprop_phase, learning_rates[1], learning_rates[0])
        step = jax.tree.map(lambda g: -learning_rate * g, noisy)
        return step, Dp2State(count=state.count + 1, second=second, accumulated=accumulated)

    return optax.GradientTransformation(init, update)


def dp_sgd_event(noise_multiplier: float, sampling_rate: float, steps: int):
    """The DP event of `steps` releases of `privatize` on Poisson-sampled batches of rate q."""
    import dp_accounting

    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(sampling_rate, dp_accounting.GaussianDpEvent(noise_multiplier)),
        steps,
    )


def _check_accounting(sampling_rate, steps, delta) -> None:
    check_number("sampling_rate", sampling_rate, low=0.0, high=1.0, low_open=True)
    check_int("steps", steps)
    check_fraction("delta", delta)


def dp_sgd_epsilon(noise_multiplier: float, sampling_rate: float, steps: int, delta: float) -> float:
    """Epsilon of (epsilon, delta)-DP of `steps` DP-SGD steps (any of this module's optimizers).

    dp-accounting's `RdpAccountant` (Renyi DP of the Poisson-sampled Gaussian, Mironov et al. 2019,
    `ADD_OR_REMOVE_ONE`, its default orders), as the thesis's accountant. Batches of b drawn
    uniformly from n are accounted as Poisson sampling at q = b / n, the usual practice (and the
    thesis's), which such batches only approximate. The bound is exact for Poisson-sampled batches
    padded with zero rows to a fixed public size k (zero rows add nothing, so the divisor is k).
    """
    _check_accounting(sampling_rate, steps, delta)
    check_number("noise_multiplier", noise_multiplier, low=0.0, low_open=True)
    from dp_accounting.rdp import rdp_privacy_accountant

    accountant = rdp_privacy_accountant.RdpAccountant()
    return float(accountant.compose(dp_sgd_event(noise_multiplier, sampling_rate, steps)).get_epsilon(delta))


def dp_sgd_noise_multiplier(
    target_epsilon: float, sampling_rate: float, steps: int, delta: float, *, tolerance: float = 1e-4
) -> float:
    """The smallest z whose `dp_sgd_epsilon` is at most `target_epsilon` (dp-accounting's calibration)."""
    _check_accounting(sampling_rate, steps, delta)
    check_number("target_epsilon", target_epsilon, low=0.0, low_open=True)
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant

    return float(
        dp_accounting.calibrate_dp_mechanism(
            rdp_privacy_accountant.RdpAccountant,
            lambda z: dp_sgd_event(float(z), sampling_rate, steps),
            target_epsilon,
            delta,
            bracket_interval=dp_accounting.LowerEndpointAndGuess(1e-2, 1.0),
            tol=tolerance,
        )
    )


def power_of_ten_delta(num_examples: int) -> float:
    """10^-k for the smallest integer k with 10^-k <= 1 / n: DP^2's delta (Li 2023, Section 6.12)."""
    check_int("num_examples", num_examples, minimum=2)
    return 10.0 ** -math.ceil(math.log10(num_examples) - 1e-12)
