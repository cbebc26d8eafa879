"""Clipping of client model updates to a bounded l2 norm.

The sensitivity of every DP release in `jaxfl.privacy` rests on one fact:
each client contributes an update of l2 norm at most C,

    clip(u, C) = u * min(1, C / ||u||_2),       ||clip(u, C)||_2 <= C,

where ||u||_2 is the norm of the whole update (all leaves of the model's
pytree concatenated), as in Pillutla et al. 2023, Algorithm 4 line 9
(Appendix D), and DP-FedAvg (McMahan et al. 2018, "flat clipping").

Non-finite entries (a diverged client) are set to zero *before* the norm is
taken, so that the bound holds for every input: a NaN could otherwise pass
through the clipping and make the released sum depend on one client without
bound (the same policy as jax_privacy's `clip_pytree(nan_safe=True)`).

References:
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
  [McMahan et al. 2018] Learning Differentially Private Recurrent Language Models. ICLR 2018.
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp

from jaxfl.types import PyTree


def clip_update(update: PyTree, clip_norm) -> tuple[PyTree, jax.Array]:
    """Scales one client's update down to l2 norm at most `clip_norm`.

    clip(u, C) = u * min(1, C / ||u||_2), with ||u||_2 the global norm over
    all leaves, after non-finite entries are replaced by 0.

    Formal guarantees:

    * ||output||_2 <= clip_norm for every input (up to float rounding of
      the scale factor: the returned norm is at most C (1 + 1e-6) in float32);
    * the output has the structure, shapes and dtypes of `update`;
    * an update already inside the ball is returned unchanged (bit for bit);
    * pure and jit/vmap-compatible; `clip_norm` may be traced.

    Edge cases:

    ===============================  ===========================================
    case                             output
    ===============================  ===========================================
    update = 0                       unchanged (zeros; no division by zero)
    clip_norm = +inf                 unchanged (after the non-finite -> 0 step)
    ||u|| <= clip_norm               unchanged
    NaN or +-inf entries             those entries are 0, then clipped as usual
    ||u||^2 overflows float32        zeros (the norm is inf)
    clip_norm < 0 or NaN (static)    ValueError
    clip_norm <= 0 (traced)          zeros
    clip_norm NaN (traced)           zeros
    ===============================  ===========================================

    Args:
      update: a pytree of float arrays (one client's w_i - w_t).
      clip_norm: C >= 0, a Python number or a traced scalar.

    Returns:
      `(clipped, norm)`: the clipped pytree and the float32 l2 norm of the
      input after non-finite entries were zeroed (before clipping).

    Raises:
      ValueError: a static `clip_norm` that is negative or NaN.
    """
    _check_clip_norm(clip_norm)
    finite = _finite(update)
    norm = _global_norm(finite)
    scale = _clip_scale(norm, clip_norm)
    # Multiplying by exactly 1.0 keeps updates inside the ball bit-identical.
    clipped = jax.tree.map(lambda x: x * scale.astype(x.dtype), finite)
    return clipped, norm


def _check_clip_norm(clip_norm) -> None:
    if isinstance(clip_norm, numbers.Real) and not clip_norm >= 0:
        raise ValueError(f"clip_norm must be >= 0, got {clip_norm}")


def _global_norm(update: PyTree) -> jax.Array:
    """The float32 l2 norm over all leaves."""
    squared = sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(update))
    return jnp.sqrt(jnp.asarray(squared, jnp.float32))


def _finite(update: PyTree) -> PyTree:
    """`update` with its non-finite entries replaced by 0."""
    return jax.tree.map(lambda x: jnp.where(jnp.isfinite(x), x, jnp.zeros((), x.dtype)), update)


def _clip_scale(norm: jax.Array, clip_norm) -> jax.Array:
    """min(1, C / ||u||), 0 where C <= 0 or the ratio is NaN (`clip_update`'s edge cases)."""
    clip_norm = jnp.asarray(clip_norm, jnp.float32)
    # C / 0 = inf and inf / finite = inf give 1 (unchanged); a traced C <= 0 or
    # NaN gives 0 (nothing released rather than a bound violated).
    scale = jnp.minimum(1.0, clip_norm / norm)
    scale = jnp.where(clip_norm > 0, scale, 0.0)
    return jnp.where(jnp.isnan(scale), 0.0, scale)


def clipped_sum(updates: PyTree, clip_norm, weights: jax.Array | None = None) -> tuple[PyTree, jax.Array]:
    """sum_i p_i clip(u_i, C) over the rows of a stacked pytree (leaves `[M, ...]`), and the `[M]` norms.

    `weights` p (`[M]`, default ones) multiply the clipped rows (0/1 masks them).

    The same clip as `clip_updates`, summed as one contraction of the rows with their scale
    factors, so that the clipped rows are never materialized (and XLA does not fuse each row's
    norm into every output element of the sum). Equal to `clip_updates` then a sum up to float
    reassociation.
    """
    _check_clip_norm(clip_norm)
    finite = _finite(updates)
    norms = jax.vmap(_global_norm)(finite)  # `clip_updates`'s norms, computed the same way
    scales = _clip_scale(norms, clip_norm)
    if weights is not None:
        scales = jnp.asarray(weights, jnp.float32) * scales
    # Full float32 products: a reduced-precision dot (TF32 on some GPUs) could leave rows beyond C.
    highest = jax.lax.Precision.HIGHEST
    total = jax.tree.map(
        lambda x: jnp.tensordot(scales.astype(x.dtype), x, axes=1, precision=highest), finite
    )
    return total, norms


def clip_updates(updates: PyTree, clip_norm) -> tuple[PyTree, jax.Array]:
    """`clip_update` applied to each client of a stacked cohort.

    Args:
      updates: a pytree whose leaves are `[M, ...]` (client i is index i).
      clip_norm: C >= 0 (shared by all clients).

    Returns:
      `(clipped, norms)`: the clipped stacked pytree and `[M]` float32 norms
      before clipping.
    """
    return jax.vmap(clip_update, in_axes=(0, None))(updates, clip_norm)
