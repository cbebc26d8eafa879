"""Tail-risk functionals of a (weighted) vector of per-client losses.

All functions take a 1-D `losses` vector a_1..a_n and optional nonnegative
`weights` w_1..w_n (None means uniform), normalized internally to
wbar_i = w_i / sum_j w_j. Batch them with `jax.vmap`. They are pure and work
under `jit`/`vmap`; `theta`, `nu` and `t` may be traced (a sweep vmaps over
them), so they are never branched on in Python.

Shared conventions (each docstring repeats what applies to it):

* Zero weights are allowed. An entry with w_i = 0 gets pi_i = 0 and does not
  affect any result, *whatever its loss* (NaN and inf included): padding
  clients can carry garbage losses.
* NaN: a NaN loss with positive weight makes every output NaN (values and
  weights). Non-finite or negative weights also make every output NaN. A
  traced `theta` outside (0, 1] gives NaN; a Python `theta` there raises.
* All weights zero: there is nothing to summarize; values and thresholds are
  NaN and the weight vectors are all zero (so that a masked aggregation
  `sum_i pi_i x_i` of an all-padding cohort is zero, not NaN).
* Infinite losses with positive weight follow the formulas: +inf makes the
  superquantile +inf (pi puts mass on it for every theta > 0); the threshold
  is +inf only if the +inf entries carry more than theta of the mass.
* Rounding: the tail mass theta * sum(w) is compared with cumulative weights
  with a tolerance of 8 float eps (relative), so that theta * n that is an
  integer in exact arithmetic (theta = 0.1 as float32, n = 100) is treated as
  one: the boundary client then has exactly zero weight, as in Pillutla et
  al. 2023, Proposition 3(c).

References:
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
  [Laguel et al. 2020] Y. Laguel, K. Pillutla, J. Malick, Z. Harchaoui.
    Device Heterogeneity in Federated Learning: A Superquantile Approach.
    arXiv preprint, 2020 (the weighted superquantile with data weights
    alpha_k: Property 2 and eq. 2).
  [TERM] Tilted Empirical Risk Minimization. ICLR 2021.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero

from jaxfl.primitives import _validation

# Relative tolerance, in float eps, of comparisons against the tail mass.
_MASS_TOL_EPS = 8


def _is_zero(tangent) -> bool:
    return isinstance(tangent, SymbolicZero)


def _inputs(losses, weights, *scalars):
    """(losses, weights, output dtype, *scalars): the arrays in compute dtype, `losses` nonempty.

    The public functions check their scalars' static values first, then call
    this; the scalars come back as arrays of the losses' compute dtype.
    """
    losses, weights, out_dtype = _validation.losses_and_weights(losses, weights)
    _check_nonempty(losses)
    scalars = (_validation.as_compute_scalar(x, losses.dtype) for x in scalars)
    return losses, weights, out_dtype, *scalars


def _support(losses: jax.Array, weights: jax.Array):
    """(positive, invalid, empty) of a weighted loss vector.

    positive: `[n]` w_i > 0; invalid: a negative or non-finite weight, or a
    NaN loss of positive weight (the NaN convention of the module docstring);
    empty: no positive weight.
    """
    positive = weights > 0
    weights_ok = jnp.all(jnp.isfinite(weights) & (weights >= 0))
    has_nan = jnp.any(positive & jnp.isnan(losses))
    return positive, ~weights_ok | has_nan, ~jnp.any(positive)


def _theta_ok(theta: jax.Array) -> jax.Array:
    """theta in (0, 1]; False also for a NaN theta."""
    return (theta > 0) & (theta <= 1)


def _mass_before(sorted_weights: jax.Array) -> jax.Array:
    """The mass strictly before each position: an exclusive cumsum.

    Not cumsum - w, which would round differently from the inclusive sums.
    """
    zero = jnp.zeros((1,), sorted_weights.dtype)
    return jnp.concatenate([zero, jnp.cumsum(sorted_weights)[:-1]])


def _losses_tangent(value: jax.Array, pi: jax.Array, losses_dot) -> jax.Array:
    """sum_i pi_i da_i, the JVP in the losses (Danskin: pi maximizes); 0 for a symbolic zero."""
    value_dot = jnp.zeros_like(value)
    if not _is_zero(losses_dot):
        value_dot += jnp.sum(pi * losses_dot)
    return value_dot


class _Tail(NamedTuple):
    """Exact tail of a weighted loss vector (all fields in compute dtype)."""

    threshold: jax.Array  # Q_theta, shape=()
    weights: jax.Array  # maximizing pi, shape=[n]
    target: jax.Array  # tail mass theta * W, shape=()
    invalid: jax.Array  # bool, shape=(): NaN loss, bad weights or bad theta
    empty: jax.Array  # bool, shape=(): no positive weight


def _tail(losses: jax.Array, theta: jax.Array, weights: jax.Array) -> _Tail:
    """Threshold and maximizing weights by one sort of the n losses."""
    n = losses.shape[0]
    dtype = losses.dtype
    nan = _validation.nan_like(dtype)
    positive, invalid, empty = _support(losses, weights)
    invalid = invalid | ~_theta_ok(theta)

    total = jnp.sum(weights)
    target = theta * total
    tol = _MASS_TOL_EPS * jnp.finfo(dtype).eps * target

    # Descending losses; zero-weight entries sort last whatever their loss.
    keys = jnp.where(positive, -losses, jnp.inf)
    _, sorted_losses, sorted_weights = lax.sort((keys, losses, weights), num_keys=1)
    mass_before = _mass_before(sorted_weights)
    # Q = the smallest support value whose strictly-larger mass is <= theta*W,
    # i.e. the value at the last position whose preceding mass is <= theta*W
    # (ties need no special care: the mass before any member of a tie group is
    # at least the mass strictly above the group).
    candidate = (sorted_weights > 0) & (mass_before <= target + tol)
    index = jnp.max(jnp.where(candidate, jnp.arange(n), -1))
    threshold = jnp.where(index >= 0, sorted_losses[jnp.maximum(index, 0)], nan)

    above = positive & (losses > threshold)
    at = positive & (losses == threshold)
    mass_above = jnp.sum(jnp.where(above, weights, 0))
    mass_at = jnp.sum(jnp.where(at, weights, 0))
    # The tie group at Q shares what is left of theta*W, in proportion to the
    # weights: a maximizer that is symmetric in tied entries, so pi does not
    # depend on the (arbitrary) order of ties.
    remainder = target - mass_above
    remainder = jnp.where(jnp.abs(remainder) <= tol, 0, remainder)
    remainder = jnp.where(jnp.abs(remainder - mass_at) <= tol, mass_at, remainder)
    remainder = jnp.clip(remainder, 0, mass_at)
    safe_target = jnp.where(target > 0, target, 1)
    safe_mass_at = jnp.where(mass_at > 0, mass_at, 1)
    pi = jnp.where(above, weights / safe_target, 0) + jnp.where(
        at, weights * (remainder / safe_mass_at) / safe_target, 0
    )
    threshold = jnp.where(invalid, nan, threshold)
    pi = jnp.where(invalid, nan, pi)
    return _Tail(threshold, pi, target, invalid, empty)


def _weighted_sum(pi: jax.Array, losses: jax.Array) -> jax.Array:
    """sum_i pi_i a_i, where pi_i = 0 entries contribute 0 even if a_i = inf."""
    active = pi > 0
    return jnp.sum(jnp.where(active, pi * jnp.where(active, losses, 0), 0))


def _superquantile_value_from(tail: _Tail, losses: jax.Array) -> jax.Array:
    value = _weighted_sum(tail.weights, losses)
    return jnp.where(
        tail.invalid | tail.empty, _validation.nan_like(losses.dtype), value
    )


@jax.custom_jvp
def _superquantile(losses, theta, weights):
    return _superquantile_value_from(_tail(losses, theta, weights), losses)


def _superquantile_jvp(primals, tangents):
    losses, theta, weights = primals
    losses_dot, theta_dot, weights_dot = tangents
    tail = _tail(losses, theta, weights)
    value = _superquantile_value_from(tail, losses)
    # Danskin: the derivative in the losses is the (unique off ties) maximizer.
    value_dot = _losses_tangent(value, tail.weights, losses_dot)
    # Envelope theorem on S = min_eta eta + sum_i w_i (a_i - eta)_+ / (theta W),
    # whose minimizer is eta = Q: dS/dtheta = -(S - Q) / theta and
    # dS/dw_j = ((a_j - Q)_+ - theta (S - Q)) / (theta W).
    excess = value - tail.threshold
    if not _is_zero(theta_dot):
        value_dot += -(excess / theta) * theta_dot
    if not _is_zero(weights_dot):
        grad_weights = (
            jnp.maximum(losses - tail.threshold, 0) - theta * excess
        ) / tail.target
        value_dot += jnp.sum(grad_weights * weights_dot)
    return value, value_dot


_superquantile.defjvp(_superquantile_jvp, symbolic_zeros=True)


def superquantile(losses, theta, weights=None) -> jax.Array:
    r"""The (1 - theta)-superquantile (CVaR) of weighted losses.

    S_theta(a; w) = max { sum_i pi_i a_i : pi in the simplex,
                          0 <= pi_i <= wbar_i / theta }
                  = min_eta  eta + (1 / theta) sum_i wbar_i (a_i - eta)_+,

    the dual (Pillutla et al. 2023, eq. 5, 7; Laguel et al. 2020, Property 2
    with weights alpha_k) and the Rockafellar-Uryasev form (Laguel et al.
    2020, eq. 2); the minimizing eta is `tail_threshold`. Sorting the losses
    in decreasing order, the maximizer gives wbar_i / theta to every loss
    above Q_theta and the rest of the mass to the losses equal to Q_theta
    (the fractional boundary client, Pillutla et al. 2023, Proposition 3),
    so the result is exact for every theta, also when theta * n is not an
    integer. theta = 1 gives the weighted mean; as theta -> 0 it tends to the
    largest loss of positive weight.

    Differentiable: the derivative with respect to `losses` is
    `superquantile_weights(losses, theta, weights)` (Danskin's theorem; at
    ties it is the tie-symmetric subgradient), and derivatives with respect
    to `theta` and `weights` follow from the envelope theorem on the
    Rockafellar-Uryasev form: -(S - Q) / theta and
    ((a_j - Q)_+ - theta (S - Q)) / (theta sum(w)).

    Args:
      losses: [n] losses a_i (n >= 1), any float dtype.
      theta: scalar tail fraction in (0, 1]; may be traced.
      weights: optional [n] nonnegative weights; None means uniform.

    Returns:
      Scalar superquantile, in the floating dtype of `losses` and `weights`
      (computed in at least float32).

    Raises:
      ValueError: `losses` is not 1-D or empty, `weights` has another shape,
        or a Python/NumPy `theta` is not in (0, 1].

    Edge cases:
      ===============================  =====================================
      case                             result
      ===============================  =====================================
      n = 1                            a_1 (for every theta)
      theta = 1                        weighted mean sum_i wbar_i a_i
      theta <= min_i wbar_i            max of the losses of positive weight
      zero weight w_i = 0              entry ignored (even if a_i is NaN)
      all weights zero                 NaN
      NaN loss with w_i > 0            NaN (gradient NaN too)
      +inf loss with w_i > 0           +inf
      traced theta not in (0, 1]       NaN
      negative / non-finite weight     NaN
      ===============================  =====================================
    """
    _validation.check_open_closed_unit(theta, "theta")
    losses, weights, out_dtype, theta = _inputs(losses, weights, theta)
    return _superquantile(losses, theta, weights).astype(out_dtype)


def superquantile_weights(losses, theta, weights=None) -> jax.Array:
    r"""The maximizing mixture weights pi of the superquantile.

    pi = argmax { sum_i pi_i a_i : pi in the simplex, 0 <= pi_i <= wbar_i/theta }
    (Pillutla et al. 2023, eq. 10 and Algorithm 3 line 3; Laguel et al.
    2020, Property 2). With Q = Q_theta the `tail_threshold`,
    m_> = sum_{a_j > Q} wbar_j and m_= = sum_{a_j = Q} wbar_j:

      pi_i = wbar_i / theta                           if a_i > Q,
      pi_i = wbar_i (theta - m_>) / (theta m_=)       if a_i = Q,
      pi_i = 0                                        if a_i < Q.

    Exactly ceil(theta n) entries are nonzero for distinct losses and uniform
    weights (Pillutla et al. 2023, Remark 1); the boundary entry carries the
    fractional weight (theta n - floor(theta n)) / (theta n) when theta n is
    not an integer.
    Tied losses at Q share the boundary mass in proportion to their weights,
    so the result does not depend on the order of ties (any maximizer is a
    valid subgradient of the superquantile, this is the symmetric one).
    pi sums to 1 up to float rounding and is the gradient of `superquantile`.

    Args:
      losses: [n] losses (n >= 1).
      theta: scalar tail fraction in (0, 1]; may be traced.
      weights: optional [n] nonnegative weights; None means uniform.

    Returns:
      [n] weights pi in the floating dtype of the inputs.

    Raises:
      ValueError: as `superquantile`.

    Edge cases:
      ===============================  =====================================
      case                             result
      ===============================  =====================================
      theta = 1                        wbar
      zero weight w_i = 0              pi_i = 0 (even if a_i is NaN)
      all weights zero                 all zeros
      NaN loss with w_i > 0            all NaN
      +inf losses with w_i > 0         they get wbar_i / theta first (or
                                       share all the mass if they carry
                                       more than theta)
      traced theta not in (0, 1]       all NaN
      negative / non-finite weight     all NaN
      ===============================  =====================================
    """
    _validation.check_open_closed_unit(theta, "theta")
    losses, weights, out_dtype, theta = _inputs(losses, weights, theta)
    return _tail(losses, theta, weights).weights.astype(out_dtype)


def tail_threshold(losses, theta, weights=None) -> jax.Array:
    r"""The tail threshold Q_theta: the weighted (1 - theta)-quantile.

    Q_theta = inf { eta in support : sum_{i: a_i > eta} wbar_i <= theta }

    (Pillutla et al. 2023, Section 3.3, the quantile
    "inf{eta : P(Z > eta) <= theta}" of the weighted empirical distribution;
    Laguel et al. 2020, Property 2: the minimizing eta of the
    Rockafellar-Uryasev form). For theta < 1 the restriction to the support
    (the losses of positive weight) changes nothing; at theta = 1 it makes Q
    the smallest loss instead of -inf. This is the "inverted CDF" quantile:
    the smallest loss a with P(Z <= a) >= 1 - theta: with uniform weights
    `tail_threshold(x, 1 - p / 100)` is the k-th smallest loss,
    k = ceil(p n / 100), i.e. `np.percentile(x, p, method="inverted_cdf")`
    in exact arithmetic (NumPy's own p n / 100 can round up past an integer).

    Derivative: 1 with respect to the loss equal to Q (one of them at ties),
    0 elsewhere and with respect to theta and the weights (piecewise constant).

    Args:
      losses: [n] losses (n >= 1).
      theta: scalar tail fraction in (0, 1]; may be traced.
      weights: optional [n] nonnegative weights; None means uniform.

    Returns:
      Scalar threshold, one of the losses (or NaN), in the inputs' float dtype.

    Raises:
      ValueError: as `superquantile`.

    Edge cases:
      ===============================  =====================================
      case                             result
      ===============================  =====================================
      theta = 1                        smallest loss of positive weight
      tiny theta                       largest loss of positive weight
      theta * n integer (uniform)      the (theta n + 1)-th largest loss
      zero weight w_i = 0              entry ignored (even if a_i is NaN)
      all weights zero                 NaN
      NaN loss with w_i > 0            NaN
      +inf losses carrying > theta     +inf
      traced theta not in (0, 1]       NaN
      negative / non-finite weight     NaN
      ===============================  =====================================
    """
    _validation.check_open_closed_unit(theta, "theta")
    losses, weights, out_dtype, theta = _inputs(losses, weights, theta)
    return _tail(losses, theta, weights).threshold.astype(out_dtype)


def _check_nonempty(losses: jax.Array) -> None:
    if losses.shape[0] == 0:
        raise ValueError("losses must have at least one entry")


# ---------------------------------------------------------------------------
# KL-smoothed superquantile (Pillutla et al. 2023, eq. 14-15).


class _Smoothed(NamedTuple):
    value: jax.Array  # shape=()
    weights: jax.Array  # pi, shape=[n]
    ratio: jax.Array  # pi_i / wbar_i (defined also where wbar_i = 0), [n]
    multiplier: jax.Array  # cap multipliers mu_i >= 0 (0 if uncapped), [n]
    kl: jax.Array  # KL(pi || wbar), shape=()
    normalized: jax.Array  # wbar, [n]
    total: jax.Array  # W = sum(w), shape=()


def _smoothed(losses, theta, nu, weights) -> _Smoothed:
    """Closed form of the KL-smoothed maximizer, by one sort.

    KKT: pi_i = min(wbar_i / theta, wbar_i exp((a_i - lam) / nu)) with the
    scalar lam fixing sum(pi) = 1. The capped entries are the k largest losses;
    for a guess k, lam_k = nu log( sum_{i > k} wbar_i e^{a_i/nu}
    / (1 - sum_{i <= k} wbar_i / theta) ) and the right k is the first one
    whose next entry is not over its cap under lam_k (capping an entry lowers
    lam, so the greedy scan is exact).
    """
    n = losses.shape[0]
    dtype = losses.dtype
    nan = _validation.nan_like(dtype)
    positive, invalid, empty = _support(losses, weights)
    invalid = invalid | ~_theta_ok(theta) | ~(nu > 0)

    total = jnp.sum(weights)
    normalized = weights / jnp.where(total > 0, total, 1)
    keys = jnp.where(positive, -losses, jnp.inf)
    _, order = lax.sort((keys, jnp.arange(n)), num_keys=1)
    sorted_losses = jnp.where(positive[order], losses[order], -jnp.inf)
    sorted_weights = normalized[order]
    sorted_positive = positive[order]

    log_weights = jnp.where(sorted_positive, jnp.log(sorted_weights), -jnp.inf)
    logits = log_weights + jnp.where(sorted_positive, sorted_losses / nu, -jnp.inf)
    tail_logsumexp = lax.cumlogsumexp(logits, reverse=True)  # over i >= k
    free_mass = 1 - _mass_before(sorted_weights) / theta  # mass left for the uncapped entries
    lam = nu * (tail_logsumexp - jnp.log(free_mass))
    cap_level = nu * jnp.log(1 / theta)  # a_i - lam >= this  <=>  capped
    over = (sorted_losses - lam >= cap_level) | (sorted_losses == jnp.inf)
    over = over & sorted_positive
    num_capped = jnp.where(jnp.all(over), n, jnp.argmin(over))
    some_free = num_capped < n
    safe_k = jnp.minimum(num_capped, n - 1)
    # With everything capped (theta = 1) the multiplier of the sum is any
    # lam <= min_i a_i - cap_level; the limit theta -> 1 selects the largest.
    min_loss = jnp.min(jnp.where(sorted_positive, sorted_losses, jnp.inf))
    lam_star = jnp.where(some_free, lam[safe_k], min_loss - cap_level)
    free_star = jnp.where(some_free, free_mass[safe_k], 0)

    capped = (jnp.arange(n) < num_capped) & sorted_positive
    ratio_sorted = jnp.where(
        capped, 1 / theta, jnp.exp((sorted_losses - lam_star) / nu)
    )
    pi_sorted = jnp.where(sorted_positive, sorted_weights * ratio_sorted, 0)
    capped_value = jnp.sum(
        jnp.where(capped, sorted_weights / theta * (sorted_losses - cap_level), 0)
    )
    value = capped_value + jnp.where(free_star > 0, lam_star * free_star, 0)
    uncapped_terms = jnp.where(
        sorted_positive & ~capped, pi_sorted * (sorted_losses - lam_star) / nu, 0
    )
    kl = jnp.sum(jnp.where(capped, sorted_weights / theta, 0)) * jnp.log(
        1 / theta
    ) + jnp.sum(uncapped_terms)
    multiplier_sorted = jnp.where(
        capped, jnp.maximum(sorted_losses - cap_level - lam_star, 0), 0
    )

    # Back to the input order. Zero-weight entries: pi = 0, and their ratio is
    # the uncapped exp((a_i - lam) / nu), the one-sided derivative's ingredient.
    inverse = jnp.zeros((n,), order.dtype).at[order].set(jnp.arange(n))
    pi = pi_sorted[inverse]
    ratio = jnp.where(
        positive, ratio_sorted[inverse], jnp.exp((losses - lam_star) / nu)
    )
    multiplier = multiplier_sorted[inverse]

    any_inf = jnp.any(positive & (losses == jnp.inf))
    value = jnp.where(any_inf, jnp.inf, value)
    bad = invalid | empty
    value = jnp.where(bad, nan, value)
    pi = jnp.where(invalid, nan, pi)
    return _Smoothed(value, pi, ratio, multiplier, kl, normalized, total)


@jax.custom_jvp
def _smoothed_superquantile(losses, theta, nu, weights):
    return _smoothed(losses, theta, nu, weights).value


def _smoothed_superquantile_jvp(primals, tangents):
    losses, theta, nu, weights = primals
    losses_dot, theta_dot, nu_dot, weights_dot = tangents
    sm = _smoothed(losses, theta, nu, weights)
    # Envelope theorem on the Lagrangian
    # pi.a - nu KL(pi||wbar) - lam'(sum pi - 1) - sum_i mu_i (pi_i - wbar_i/theta).
    value_dot = _losses_tangent(sm.value, sm.weights, losses_dot)
    if not _is_zero(nu_dot):
        value_dot += -sm.kl * nu_dot
    if not _is_zero(theta_dot):
        value_dot += -jnp.sum(sm.multiplier * sm.normalized) / theta**2 * theta_dot
    if not _is_zero(weights_dot):
        # dF/dwbar_i = nu pi_i / wbar_i + mu_i / theta, then through wbar = w/W.
        grad_normalized = nu * sm.ratio + sm.multiplier / theta
        mean = jnp.sum(jnp.where(sm.normalized > 0, sm.normalized * grad_normalized, 0))
        value_dot += jnp.sum((grad_normalized - mean) / sm.total * weights_dot)
    return sm.value, value_dot


_smoothed_superquantile.defjvp(_smoothed_superquantile_jvp, symbolic_zeros=True)


def _smoothed_or_exact(nu, smoothed, exact):
    """`smoothed(nu)` where nu > 0, `exact()` (the superquantile's) where nu = 0, else NaN.

    The smoothed branch gets nu = 1 where it is not selected, so that its
    unselected derivatives stay finite under `where`.
    """
    smooth = nu > 0
    value = smoothed(jnp.where(smooth, nu, 1))
    return jnp.where(smooth, value, jnp.where(nu == 0, exact(), jnp.nan))


def smoothed_superquantile(losses, theta, nu, weights=None) -> jax.Array:
    r"""The KL-smoothed superquantile of weighted losses.

    S^nu_theta(a; w) = max { sum_i pi_i a_i - nu KL(pi || wbar) :
                             pi in the simplex, pi_i <= wbar_i / theta }

    with KL(pi || wbar) = sum_i pi_i log(pi_i / wbar_i) (Pillutla et al.
    2023, eq. 14-15, where wbar is uniform and the KL is D(pi)). The
    maximizer is pi_i = min(wbar_i / theta, wbar_i exp((a_i - lam) / nu)) for
    the scalar lam that makes pi sum to one; it is computed exactly (no
    iteration) by one sort. 0 <= S_theta - S^nu_theta <= nu log(1 / theta)
    (the KL of any feasible pi is at most log(1/theta)), so it tends to
    `superquantile` as nu -> 0, and nu = 0 returns the superquantile itself.
    theta = 1 gives the weighted mean for every nu.

    Smooth in the losses (gradient `smoothed_superquantile_weights`, with
    Lipschitz constant 1/nu) and in theta, nu and the weights, by the
    envelope theorem on the Lagrangian of the problem.

    Args:
      losses: [n] losses (n >= 1).
      theta: scalar tail fraction in (0, 1]; may be traced.
      nu: scalar smoothing >= 0; may be traced.
      weights: optional [n] nonnegative weights; None means uniform.

    Returns:
      Scalar smoothed superquantile in the inputs' float dtype.

    Raises:
      ValueError: as `superquantile`, or a Python/NumPy `nu` < 0.

    Edge cases:
      ===============================  =====================================
      case                             result
      ===============================  =====================================
      nu = 0                           `superquantile`
      theta = 1                        weighted mean
      zero weight / all zero / NaN     as `superquantile`
      +inf loss with w_i > 0           +inf
      traced nu < 0 or NaN             NaN
      traced theta not in (0, 1]       NaN
      ===============================  =====================================
    """
    _validation.check_open_closed_unit(theta, "theta")
    _validation.check_nonnegative(nu, "nu")
    losses, weights, out_dtype, theta, nu = _inputs(losses, weights, theta, nu)
    value = _smoothed_or_exact(
        nu,
        lambda safe_nu: _smoothed_superquantile(losses, theta, safe_nu, weights),
        lambda: _superquantile(losses, theta, weights),
    )
    return value.astype(out_dtype)


def smoothed_superquantile_weights(losses, theta, nu, weights=None) -> jax.Array:
    r"""The maximizing pi of `smoothed_superquantile` (Pillutla et al. 2023, eq. 15).

    pi_i = min(wbar_i / theta, wbar_i exp((a_i - lam) / nu)), with lam such
    that sum(pi) = 1: the gradient of `smoothed_superquantile` with respect to
    the losses. Every entry of positive weight gets positive mass (unless its
    loss is -inf); nu = 0 returns `superquantile_weights`; nu -> infinity
    tends to wbar.

    Args:
      losses: [n] losses (n >= 1).
      theta: scalar tail fraction in (0, 1]; may be traced.
      nu: scalar smoothing >= 0; may be traced.
      weights: optional [n] nonnegative weights; None means uniform.

    Returns:
      [n] weights in the inputs' float dtype.

    Raises:
      ValueError: as `smoothed_superquantile`.

    Edge cases: as `superquantile_weights` (NaN loss -> all NaN, zero weight
    -> 0, all weights zero -> zeros); with +inf losses the +inf entries get
    their cap wbar_i / theta, and the weights are NaN if those caps exceed 1.
    """
    _validation.check_open_closed_unit(theta, "theta")
    _validation.check_nonnegative(nu, "nu")
    losses, weights, out_dtype, theta, nu = _inputs(losses, weights, theta, nu)
    pi = _smoothed_or_exact(
        nu,
        lambda safe_nu: _smoothed(losses, theta, safe_nu, weights).weights,
        lambda: _tail(losses, theta, weights).weights,
    )
    return pi.astype(out_dtype)


# ---------------------------------------------------------------------------
# Tilted (entropic) risk, TERM.


class _Tilted(NamedTuple):
    value: jax.Array  # shape=()
    weights: jax.Array  # softmax(t a + log wbar), [n]
    normalized: jax.Array  # wbar, [n]
    total: jax.Array  # shape=()


def _tilted(losses, t, weights) -> _Tilted:
    dtype = losses.dtype
    nan = _validation.nan_like(dtype)
    positive, invalid, empty = _support(losses, weights)
    invalid = invalid | jnp.isnan(t)
    total = jnp.sum(weights)
    normalized = weights / jnp.where(total > 0, total, 1)

    largest = jnp.max(jnp.where(positive, losses, -jnp.inf))
    smallest = jnp.min(jnp.where(positive, losses, jnp.inf))
    # Shift by the loss that dominates exp(t a): the max for t > 0, the min for
    # t < 0; entries equal to it (inf included) get exp(0) = 1.
    pivot = jnp.where(t >= 0, largest, smallest)
    gap = jnp.where(positive & (losses != pivot), losses - pivot, 0)
    scaled = jnp.exp(t * gap)
    partition = jnp.sum(jnp.where(positive, normalized * scaled, 0))
    pi = jnp.where(positive, normalized * scaled / partition, 0)
    safe_t = jnp.where(t == 0, 1, t)
    value_far = pivot + jnp.log(partition) / safe_t

    # For |t| (max - min) <= 1, shift by the weighted mean instead and use
    # expm1/log1p: (1/t) log sum wbar e^{t a} then loses no digits as t -> 0.
    mean = _weighted_sum_signed(normalized, losses)
    spread = largest - smallest
    near = jnp.abs(t) * spread <= 1  # False if spread is inf or NaN
    centred = jnp.where(positive & near, losses - jnp.where(near, mean, 0), 0)
    correction = jnp.log1p(jnp.sum(normalized * jnp.expm1(t * centred)))
    value_near = mean + correction / safe_t
    value = jnp.where(near, value_near, value_far)
    value = jnp.where(t == 0, mean, value)

    value = jnp.where(invalid | empty, nan, value)
    pi = jnp.where(invalid, nan, pi)
    return _Tilted(value, pi, normalized, total)


def _weighted_sum_signed(normalized, losses):
    """sum_i wbar_i a_i over positive weights (zero-weight entries ignored)."""
    return jnp.sum(jnp.where(normalized > 0, normalized * losses, 0))


def _expm1_over_t(t, x):
    """expm1(t x) / t, accurate as t -> 0 (where it is x)."""
    tx = t * x
    small = jnp.abs(tx) < 1e-4
    safe_t = jnp.where(small, 1, t)
    return jnp.where(
        small, x * (1 + tx / 2), jnp.expm1(jnp.where(small, 0, tx)) / safe_t
    )


def _psi(u):
    """((1 + u) log1p(u) - u) / u^2, with its series near 0 and psi(-1) = 1."""
    small = jnp.abs(u) < 1e-2
    safe_u = jnp.where(small | (u <= -1), 0.5, u)
    direct = ((1 + safe_u) * jnp.log1p(safe_u) - safe_u) / safe_u**2
    series = 0.5 - u / 6 + u**2 / 12 - u**3 / 20
    return jnp.where(small, series, jnp.where(u <= -1, 1.0, direct))


@jax.custom_jvp
def _tilted_risk(losses, t, weights):
    return _tilted(losses, t, weights).value


def _tilted_risk_jvp(primals, tangents):
    losses, t, weights = primals
    losses_dot, t_dot, weights_dot = tangents
    tl = _tilted(losses, t, weights)
    value_dot = _losses_tangent(tl.value, tl.weights, losses_dot)
    positive = tl.normalized > 0
    # With x_i = a_i - R and u_i = expm1(t x_i) = pi_i / wbar_i - 1:
    # dR/dt = KL(pi || wbar) / t^2 = sum_i wbar_i (u_i / t)^2 psi(u_i), where
    # psi(u) = ((1 + u) log1p(u) - u) / u^2 (the identity sum_i wbar_i u_i = 0
    # removes the first-order term). Every term is >= 0, so there is no
    # cancellation as t -> 0, where it tends to Var_wbar(a) / 2.
    # dR/dw_j = (u_j / t) / W.
    gap = jnp.where(positive, losses - tl.value, 0)
    scaled_gap = _expm1_over_t(t, gap)  # u / t
    if not _is_zero(t_dot):
        u = t * scaled_gap
        grad_t = jnp.sum(
            jnp.where(positive, tl.normalized * scaled_gap**2 * _psi(u), 0)
        )
        value_dot += grad_t * t_dot
    if not _is_zero(weights_dot):
        grad = _expm1_over_t(t, losses - tl.value) / tl.total
        value_dot += jnp.sum(grad * weights_dot)
    return tl.value, value_dot


_tilted_risk.defjvp(_tilted_risk_jvp, symbolic_zeros=True)


def tilted_risk(losses, t, weights=None) -> jax.Array:
    r"""The tilted (entropic) risk of weighted losses (TERM).

    R_t(a; w) = (1/t) log sum_i wbar_i exp(t a_i),

    the objective of Tilted ERM and of the entropic risk measure of Pillutla
    et al. 2023, Section 6 (there with uniform weights and parameter nu = t).
    t = 0 is the weighted mean (the limit), t -> +inf tends to the max and
    t -> -inf to the min of the losses of positive weight. Computed without overflow and
    without cancellation for small |t|: shifted by the extreme loss when
    |t| (max - min) > 1, else by the mean with expm1/log1p.

    Differentiable in the losses (gradient `tilted_risk_weights`), in t
    (dR/dt = (E_pi[a] - R) / t = KL(pi || wbar) / t^2, evaluated as a sum of
    nonnegative terms so that it stays accurate as t -> 0, where it is
    Var_wbar(a) / 2) and in the weights (expm1(t (a_j - R)) / (t sum(w))).

    Args:
      losses: [n] losses (n >= 1).
      t: scalar tilt, any real; may be traced.
      weights: optional [n] nonnegative weights; None means uniform.

    Returns:
      Scalar tilted risk in the inputs' float dtype.

    Raises:
      ValueError: `losses` not 1-D or empty, shapes differ, or a Python/NumPy
        `t` is not finite.

    Edge cases:
      ===============================  =====================================
      case                             result
      ===============================  =====================================
      t = 0                            weighted mean
      zero weight / all zero / NaN     as `superquantile`
      +inf loss, w_i > 0, t > 0        +inf
      -inf loss, w_i > 0, t > 0        ignored unless all losses are -inf
      traced t = NaN                   NaN
      ===============================  =====================================
    """
    _validation.check_finite(t, "t")
    losses, weights, out_dtype, t = _inputs(losses, weights, t)
    return _tilted_risk(losses, t, weights).astype(out_dtype)


def tilted_risk_weights(losses, t, weights=None) -> jax.Array:
    r"""The tilted weights pi = softmax(t a + log wbar) (TERM).

    pi_i = wbar_i exp(t a_i) / sum_j wbar_j exp(t a_j), the gradient of
    `tilted_risk` with respect to the losses and the maximizer of
    pi.a - (1/t) KL(pi || wbar) over the simplex for t > 0. t = 0 gives wbar.

    Args:
      losses: [n] losses (n >= 1).
      t: scalar tilt, any real; may be traced.
      weights: optional [n] nonnegative weights; None means uniform.

    Returns:
      [n] weights in the inputs' float dtype.

    Raises:
      ValueError: as `tilted_risk`.

    Edge cases: zero weight -> 0, all weights zero -> zeros, NaN loss with
    positive weight -> all NaN; with t > 0 and +inf losses the mass is shared
    by the +inf entries in proportion to their weights (the limit).
    """
    _validation.check_finite(t, "t")
    losses, weights, out_dtype, t = _inputs(losses, weights, t)
    return _tilted(losses, t, weights).weights.astype(out_dtype)
