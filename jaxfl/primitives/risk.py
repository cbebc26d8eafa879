"""Risk measures beside the superquantile: VaR, EVaR, TiVaR, the inverse superquantile, hierarchical tilting.

Each takes a 1-D `losses` vector a_1..a_n, optional nonnegative `weights`
(None: uniform; normalized to wbar) and, where it has one, a tail fraction
`theta` in (0, 1] with the superquantile's convention (`jaxfl.primitives.tail`:
theta is the share of the mass in the tail; the thesis's alpha is theta, its
level 1 - alpha). The conventions of `jaxfl.primitives.tail` hold: zero
weights ignore their entries (NaN included), a NaN loss of positive weight or
a bad weight gives NaN, all weights zero gives NaN, a traced theta outside
(0, 1] gives NaN and a Python one raises.

Orderings (Li 2023, Theorem 28): VaR <= TiVaR <= EVaR and VaR <= superquantile
<= EVaR at the same theta; TiVaR and the superquantile are not ordered in
general. As theta goes from 1 to 0, the superquantile and EVaR sweep from the
mean to the max, TiVaR from the min to the max, and the inverse superquantile
is the mean of the lowest theta share (from the mean at theta = 1 to the min).

EVaR and TiVaR minimize over the tilt t: the minimizer is found by a search
on log |t| (golden section; a grid first for TiVaR, whose objective need not
be unimodal) with its gradient stopped, and the value is the tilted risk at it,
so their gradients are the tilted weights at the optimal tilt (the envelope
theorem).

References:
  [Li 2023] T. Li. Scalable and Trustworthy Learning in Heterogeneous Networks.
    PhD thesis, Carnegie Mellon University, 2023 (Chapter 7: VaR eq. 7.53,
    EVaR eq. 7.62, TiVaR Definition 15 / eq. 7.64, inverse CVaR eq. 7.196,
    Theorem 28; hierarchical tilting eqs. 7.82-7.85, Lemmas 31-32).
  [Ahmadi-Javid 2012] A. Ahmadi-Javid. Entropic Value-at-Risk: A New Coherent
    Risk Measure. Journal of Optimization Theory and Applications, 2012.
  [Rockafellar and Uryasev 2000] R. T. Rockafellar, S. Uryasev. Optimization
    of Conditional Value-at-Risk. Journal of Risk, 2000.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxfl.primitives import _validation
from jaxfl.primitives.tail import _check_nonempty, _tilted, _tilted_risk, superquantile, tail_threshold

# The tilt search: t = exp(u) / spread for u in [_LOG_T_LOW, _LOG_T_HIGH] (spread: the losses' range), so
# that it does not depend on the losses' scale; golden-section steps shrink the bracket 0.618x each.
_LOG_T_LOW, _LOG_T_HIGH = -12.0, 16.0
_GOLDEN_STEPS = 80
_TIVAR_GRID = 64
_GOLDEN = 0.6180339887498949


def value_at_risk(losses, theta, weights=None) -> jax.Array:
    r"""VaR at tail fraction theta: the weighted (1 - theta)-quantile of the losses.

    VaR_theta = inf { eta : sum_{i: a_i > eta} wbar_i <= theta } (Li 2023,
    eq. 7.53, with alpha = theta), the smallest loss above which at most a
    theta share of the mass lies; the same function as
    `jaxfl.primitives.tail_threshold` (its docstring gives the edge cases).
    """
    return tail_threshold(losses, theta, weights)


def inverse_superquantile(losses, theta, weights=None) -> jax.Array:
    r"""The mean of the lowest theta share of the losses (Li 2023's inverse CVaR, eq. 7.196).

    -CVaR of the negated losses: -min_eta { eta + (1/theta) sum_i wbar_i
    [-a_i - eta]_+ }. theta = 1 gives the weighted mean, theta -> 0 the
    smallest loss. Gradient: the superquantile weights of the negated losses.
    """
    return -superquantile(-jnp.asarray(losses), theta, weights)


def _golden_min(objective, low, high):
    """The minimizer over [low, high] of a unimodal scalar function, by golden-section search.

    One new evaluation per step: the kept interior point is the next bracket's other one (the golden ratio's
    property 1 - g = g^2).
    """

    def step(_, search):
        a, b, c, d, f_c, f_d = search
        left = f_c <= f_d  # The minimum is in [a, d]: c becomes its upper interior point; else in [c, b].
        a, b = jnp.where(left, a, c), jnp.where(left, d, b)
        new = jnp.where(left, b - _GOLDEN * (b - a), a + _GOLDEN * (b - a))
        f_new = objective(new)
        return (
            a, b, jnp.where(left, new, d), jnp.where(left, c, new),
            jnp.where(left, f_new, f_d), jnp.where(left, f_c, f_new),
        )

    c, d = high - _GOLDEN * (high - low), low + _GOLDEN * (high - low)
    search = (low, high, c, d, objective(c), objective(d))
    a, b, *_ = lax.fori_loop(0, _GOLDEN_STEPS, step, search)
    return (a + b) / 2


def _prepared(losses, theta, weights):
    _validation.check_open_closed_unit(theta, "theta")
    losses, weights, out_dtype = _validation.losses_and_weights(losses, weights)
    _check_nonempty(losses)
    theta = _validation.as_compute_scalar(theta, losses.dtype)
    # A traced theta outside (0, 1] gives NaN, as the superquantile's.
    losses = jnp.where((theta > 0) & (theta <= 1), losses, jnp.nan)
    positive = weights > 0
    largest = jnp.max(jnp.where(positive, losses, -jnp.inf))
    smallest = jnp.min(jnp.where(positive, losses, jnp.inf))
    spread = largest - smallest
    # A tilt scale that makes t * (max - min) independent of the losses' units (1 for equal losses).
    scale = jnp.where(jnp.isfinite(spread) & (spread > 0), spread, 1)
    return losses, weights, out_dtype, theta, largest, smallest, scale


def _evar_objective(losses, weights, theta, scale, u):
    t = jnp.exp(u) / scale
    return _tilted_risk(losses, t, weights) - jnp.log(theta) / t


def evar(losses, theta, weights=None) -> jax.Array:
    r"""Entropic value-at-risk at tail fraction theta (Li 2023, eq. 7.62; Ahmadi-Javid 2012).

    EVaR_theta = min_{t > 0} { R_t(a; w) - log(theta) / t },  R_t the tilted
    risk (`jaxfl.primitives.tilted_risk`).

    theta = 1 gives the weighted mean (the limit t -> 0), theta -> 0 the
    largest loss; it bounds the superquantile and TiVaR from above. The
    objective is unimodal in log t (with s = 1/t it is s (log E e^{a/s} -
    log theta), the perspective of a convex function), so a golden-section
    search on log t finds the minimizer; the value is clipped to [mean, max],
    where EVaR lies.

    Derivative: the tilted risk's at the optimal tilt (the envelope theorem):
    with respect to the losses, the tilted weights there.

    Args:
      losses: [n] losses (n >= 1).
      theta: scalar tail fraction in (0, 1]; may be traced.
      weights: optional [n] nonnegative weights; None means uniform.

    Returns:
      Scalar EVaR in the inputs' float dtype.

    Raises:
      ValueError: `losses` not 1-D or empty, shapes differ, or a Python theta
        outside (0, 1].
    """
    losses, weights, out_dtype, theta, largest, _, scale = _prepared(losses, theta, weights)
    frozen = lax.stop_gradient((losses, weights, theta, scale))
    u_star = lax.stop_gradient(
        _golden_min(lambda u: _evar_objective(*frozen, u), _LOG_T_LOW, _LOG_T_HIGH)
    )
    mean = _tilted_risk(losses, jnp.zeros_like(theta), weights)
    value = jnp.clip(_evar_objective(losses, weights, theta, scale, u_star), mean, largest)
    return jnp.where(theta >= 1, mean, value).astype(out_dtype)


def _tivar_objective(losses, weights, theta, floor, t):
    """(1/t) log([(E_wbar exp(t (a - floor)) - (1 - theta)) / theta]_+); +inf where the bracket is <= 0."""
    log_moment = t * (_tilted_risk(losses, t, weights) - floor)  # log E exp(t (a - floor)), no overflow
    ratio = jnp.exp(-log_moment) * (1 - theta)  # (1 - theta) / E exp(...)
    log_excess = log_moment + jnp.log1p(-jnp.minimum(ratio, 1 - jnp.finfo(losses.dtype).eps))
    return jnp.where(ratio < 1, (log_excess - jnp.log(theta)) / t, jnp.inf)


def tivar(losses, theta, weights=None, floor=None) -> jax.Array:
    r"""Tilted value-at-risk at tail fraction theta (Li 2023, Definition 15, eq. 7.64).

    TiVaR_theta = F + min_{t != 0} (1/t) log( [ (E_wbar e^{t (a - F)} - (1 -
    theta)) / theta ]_+ ),

    F = `floor`, a lower bound of the losses (the thesis's F(-inf), the least
    loss over all models; default: the smallest loss of positive weight,
    held constant under differentiation). It is the Chernoff-type bound of
    Li 2023, Theorem 27, solved for the level: theta = 1 gives F (the minimum),
    theta -> 0 the largest loss, and VaR <= TiVaR <= EVaR (Theorem 28). The
    t -> 0 limit, E[a - F] / theta, is a candidate too. The objective need
    not be unimodal in t: a grid of tilts of both signs on a log scale finds
    the basin, and a golden-section search on log |t| the minimizer in it.

    Derivative: the objective's at the optimal tilt (the envelope theorem).

    Args:
      losses: [n] losses (n >= 1).
      theta: scalar tail fraction in (0, 1]; may be traced.
      weights: optional [n] nonnegative weights; None means uniform.
      floor: optional scalar lower bound F of the losses (<= every loss of
        positive weight); None: the smallest of them.

    Returns:
      Scalar TiVaR in the inputs' float dtype.

    Raises:
      ValueError: as `evar`.
    """
    losses, weights, out_dtype, theta, largest, smallest, scale = _prepared(losses, theta, weights)
    floor = lax.stop_gradient(smallest) if floor is None else jnp.asarray(floor, losses.dtype)
    frozen = lax.stop_gradient((losses, weights, theta, floor))

    def at(u, sign, inputs=frozen):
        return _tivar_objective(*inputs, sign * jnp.exp(u) / scale)

    grid = jnp.linspace(_LOG_T_LOW, _LOG_T_HIGH, _TIVAR_GRID)
    values = jnp.stack([jax.vmap(lambda u: at(u, 1.0))(grid), jax.vmap(lambda u: at(u, -1.0))(grid)])
    best = jnp.argmin(jnp.where(jnp.isnan(values), jnp.inf, values))
    sign = jnp.where(best < _TIVAR_GRID, 1.0, -1.0).astype(losses.dtype)
    index = best % _TIVAR_GRID
    step = grid[1] - grid[0]
    low = grid[0] + jnp.maximum(index - 1, 0) * step
    high = grid[0] + jnp.minimum(index + 1, _TIVAR_GRID - 1) * step
    u_star = lax.stop_gradient(_golden_min(lambda u: at(u, sign), low, high))
    mean = _tilted_risk(losses, jnp.zeros_like(theta), weights)
    at_zero = (mean - floor) / theta  # The t -> 0 limit.
    value = floor + jnp.minimum(at(u_star, sign, (losses, weights, theta, floor)), at_zero)
    value = jnp.where(jnp.isnan(mean), mean, jnp.clip(value, smallest, largest))
    return value.astype(out_dtype)


def _group_tilted(losses, groups, num_groups, tau, weights):
    """Per group g: (R_g(tau) the tau-tilted risk of its losses, W_g its weight, within-group weights)."""
    positive = weights > 0
    segment_sum = lambda x: jax.ops.segment_sum(x, groups, num_groups)  # noqa: E731
    group_weight = segment_sum(jnp.where(positive, weights, 0))
    normalized = jnp.where(positive, weights / jnp.where(group_weight > 0, group_weight, 1)[groups], 0)
    mean = segment_sum(jnp.where(positive, normalized * losses, 0))
    largest = jax.ops.segment_max(jnp.where(positive, losses, -jnp.inf), groups, num_groups)
    smallest = jax.ops.segment_min(jnp.where(positive, losses, jnp.inf), groups, num_groups)
    # As `jaxfl.primitives.tail._tilted`, per group: shift by the extreme loss when |tau| (max - min) > 1,
    # else by the group's mean with expm1/log1p (no cancellation as tau -> 0).
    near = jnp.abs(tau) * (largest - smallest) <= 1
    pivot = jnp.where(near, mean, jnp.where(tau >= 0, largest, smallest))
    pivot = jnp.where(jnp.isfinite(pivot), pivot, 0)
    gap = jnp.where(positive, losses - pivot[groups], 0)
    safe_tau = jnp.where(tau == 0, 1, tau)
    far_sum = segment_sum(jnp.where(positive, normalized * jnp.exp(tau * gap), 0))
    near_sum = segment_sum(jnp.where(positive, normalized * jnp.expm1(tau * gap), 0))
    value = pivot + jnp.where(near, jnp.log1p(near_sum), jnp.log(far_sum)) / safe_tau
    value = jnp.where(tau == 0, mean, value)
    within = jnp.where(positive, normalized * jnp.exp(tau * gap), 0)
    within = within / jnp.where(far_sum > 0, far_sum, 1)[groups]
    return value, group_weight, within


def _hierarchical(losses, groups, num_groups, t, tau, weights):
    _validation.check_finite(t, "t")
    _validation.check_finite(tau, "tau")
    losses, weights, out_dtype = _validation.losses_and_weights(losses, weights)
    _check_nonempty(losses)
    groups = jnp.asarray(groups)
    if groups.shape != losses.shape or not jnp.issubdtype(groups.dtype, jnp.integer):
        raise ValueError(
            f"groups must be integer group ids shaped like losses {losses.shape}, got {groups.shape}"
        )
    t = _validation.as_compute_scalar(t, losses.dtype)
    tau = _validation.as_compute_scalar(tau, losses.dtype)
    # Entries with an id outside [0, num_groups) belong to no group: weight 0.
    inside = (groups >= 0) & (groups < num_groups)
    weights = jnp.where(inside, weights, 0)
    groups = jnp.where(inside, groups, 0)
    group_risk, group_weight, within = _group_tilted(losses, groups, num_groups, tau, weights)
    invalid = ~jnp.all(jnp.isfinite(weights) & (weights >= 0)) | jnp.any((weights > 0) & jnp.isnan(losses))
    return losses, groups, t, group_risk, group_weight, within, invalid, out_dtype


def hierarchical_tilted_risk(losses, groups, num_groups: int, t, tau, weights=None) -> jax.Array:
    r"""Two-level tilted risk: tilt tau within each group, tilt t across groups (Li 2023, eqs. 7.82-7.83).

    J(t, tau) = (1/t) log( sum_g W_g e^{t R_g(tau)} ),   R_g(tau) = (1/tau) log( sum_{x in g} wbar_{x|g}
    e^{tau a_x} ),

    with W_g the normalized total weight of group g and wbar_{x|g} the
    weights normalized within it (uniform weights: W_g = |g| / N, as in the
    thesis). tau = t is the sample-level tilted risk (Lemma 32); tau = 0 makes
    each group's risk its mean (group-level TERM, e.g. client-level tilting
    with groups = clients); t = 0 averages the groups' risks; t -> +inf
    (-inf) takes the worst (best) group. Groups with no weight are left out.

    Derivative: with respect to the losses, `hierarchical_tilted_weights`.

    Args:
      losses: [n] losses (n >= 1).
      groups: [n] integer group ids in [0, num_groups) (other ids: no group,
        entry ignored).
      num_groups: G, static.
      t: scalar tilt across groups, any real; may be traced.
      tau: scalar tilt within groups, any real; may be traced.
      weights: optional [n] nonnegative weights; None means uniform.

    Returns:
      Scalar risk in the inputs' float dtype (NaN for a NaN loss of positive
      weight, a bad weight, or no weight at all).

    Raises:
      ValueError: `losses` not 1-D or empty, `groups` not integer ids of its
        shape, or a Python t or tau not finite.
    """
    _, _, t, group_risk, group_weight, _, invalid, out_dtype = _hierarchical(
        losses, groups, num_groups, t, tau, weights
    )
    value = _tilted_risk(jnp.where(group_weight > 0, group_risk, 0), t, group_weight)
    return jnp.where(invalid, jnp.nan, value).astype(out_dtype)


def hierarchical_tilted_weights(losses, groups, num_groups: int, t, tau, weights=None) -> jax.Array:
    r"""The gradient of `hierarchical_tilted_risk` in the losses (Li 2023, Lemma 31).

    w_x = w_g(t) w_{x|g}(tau), with

    w_g = W_g e^{t R_g(tau)} / sum_g' W_g' e^{t R_g'(tau)} (the tilted weights of
    the groups' risks) and w_{x|g} = wbar_{x|g} e^{tau a_x} / sum_{y in g}
    wbar_{y|g} e^{tau a_y}; they sum to 1. Arguments as
    `hierarchical_tilted_risk`.

    Returns:
      [n] weights in the inputs' float dtype (all NaN where the risk is NaN
      for a bad input; 0 for entries of no weight or no group).
    """
    losses, groups, t, group_risk, group_weight, within, invalid, out_dtype = _hierarchical(
        losses, groups, num_groups, t, tau, weights
    )
    group_weights = _tilted(jnp.where(group_weight > 0, group_risk, 0), t, group_weight).weights
    result = group_weights[groups] * within
    return jnp.where(invalid, jnp.nan, result).astype(out_dtype)
