"""Eager checks of Python-valued arguments shared by the primitives.

The rule (from jax_privacy's `clip_pytree`): an argument given as a Python or
NumPy number is checked here and a bad value raises `ValueError` at call time;
a traced (or any JAX) array cannot be inspected without a host round trip, so
each primitive instead documents the numeric result it gives for bad traced
values (usually NaN).
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np


def is_static_number(x) -> bool:
    """True for Python / NumPy scalars and NumPy arrays (values known now)."""
    return isinstance(x, (numbers.Number, np.ndarray, np.generic)) and not isinstance(
        x, bool
    )


def check_open_closed_unit(x, name: str) -> None:
    """Raises ValueError unless every static value of `x` is in (0, 1]."""
    if is_static_number(x):
        values = np.asarray(x, dtype=np.float64)
        if not np.all((values > 0) & (values <= 1)):
            raise ValueError(f"{name} must be in (0, 1], got {x!r}")


def check_open_unit(x, name: str) -> None:
    """Raises ValueError unless every static value of `x` is in (0, 1)."""
    if is_static_number(x):
        values = np.asarray(x, dtype=np.float64)
        if not np.all((values > 0) & (values < 1)):
            raise ValueError(f"{name} must be in (0, 1), got {x!r}")


def check_nonnegative(x, name: str) -> None:
    """Raises ValueError unless every static value of `x` is finite and >= 0."""
    if is_static_number(x):
        values = np.asarray(x, dtype=np.float64)
        if not np.all(np.isfinite(values) & (values >= 0)):
            raise ValueError(f"{name} must be finite and >= 0, got {x!r}")


def check_finite(x, name: str) -> None:
    """Raises ValueError unless every static value of `x` is finite."""
    if is_static_number(x):
        values = np.asarray(x, dtype=np.float64)
        if not np.all(np.isfinite(values)):
            raise ValueError(f"{name} must be finite, got {x!r}")


def check_power_of_two(value, name: str, minimum: int = 2) -> int:
    """Returns `value` as an int; raises unless it is a power of two >= minimum."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise ValueError(f"{name} must be a Python int, got {value!r}")
    value = int(value)
    if value < minimum or value & (value - 1):
        raise ValueError(f"{name} must be a power of two >= {minimum}, got {value}")
    return value


def check_positive_finite(x, name: str) -> None:
    """Raises ValueError unless every static value of `x` is finite and > 0."""
    if is_static_number(x):
        values = np.asarray(x, dtype=np.float64)
        if not np.all(np.isfinite(values) & (values > 0)):
            raise ValueError(f"{name} must be finite and > 0, got {x!r}")


def losses_and_weights(losses, weights, name: str = "losses"):
    """Converts `losses` [n] and optional `weights` [n] to compute arrays.

    Returns:
      (losses, weights, out_dtype): both arrays in the compute dtype (the
      floating type of the inputs, at least float32 so that sums of 16-bit
      inputs do not lose the boundary client), `weights` all ones when None,
      and the floating dtype the public result is cast back to.

    Raises:
      ValueError: `losses` is not 1-D or `weights` has another shape.
    """
    losses = jnp.asarray(losses)
    if losses.ndim != 1:
        raise ValueError(
            f"{name} must be 1-D (batch with jax.vmap), got shape {losses.shape}"
        )
    out_dtype = losses.dtype
    if weights is not None:
        weights = jnp.asarray(weights)
        if weights.shape != losses.shape:
            raise ValueError(
                f"weights must have the shape of {name} {losses.shape}, "
                f"got {weights.shape}"
            )
        out_dtype = jnp.result_type(losses.dtype, weights.dtype)
    if not jnp.issubdtype(out_dtype, jnp.floating):
        out_dtype = jnp.dtype(jnp.float32)
    compute_dtype = jnp.promote_types(out_dtype, jnp.float32)
    losses = losses.astype(compute_dtype)
    if weights is None:
        weights = jnp.ones(losses.shape, compute_dtype)
    else:
        weights = weights.astype(compute_dtype)
    return losses, weights, jnp.dtype(out_dtype)


def as_compute_scalar(x, dtype) -> jax.Array:
    """`x` as a 0-d array of `dtype` (raises ValueError unless x is a scalar)."""
    x = jnp.asarray(x)
    if x.ndim != 0:
        raise ValueError(
            f"expected a scalar (batch with jax.vmap), got shape {x.shape}"
        )
    return x.astype(dtype)


def nan_like(dtype) -> jax.Array:
    return jnp.asarray(math.nan, dtype)
