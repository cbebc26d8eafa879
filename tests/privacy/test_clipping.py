"""Clipping bounds every contribution: a property grid over update norms and
clip norms (zero update, inf clip norm, non-finite entries), jit and vmap."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfl.privacy import clip_update, clip_updates


def _update(norm, *, seed=0):
    """A two-leaf pytree of global l2 norm `norm` (a random direction)."""
    rng = np.random.default_rng(seed)
    kernel, bias = rng.normal(size=(5, 3)), rng.normal(size=(3,))
    total = np.sqrt(np.sum(kernel**2) + np.sum(bias**2))
    return {
        "kernel": jnp.asarray(kernel * norm / total, jnp.float32),
        "bias": jnp.asarray(bias * norm / total, jnp.float32),
    }


def _norm(tree):
    return float(
        np.sqrt(
            sum(np.sum(np.asarray(x, np.float64) ** 2) for x in jax.tree.leaves(tree))
        )
    )


NORMS = [0.0, 1e-6, 0.3, 1.0, 2.5, 1e3, 1e6]
CLIPS = [1e-3, 0.5, 1.0, 3.0, np.inf]
jitted_clip = jax.jit(clip_update)


@pytest.mark.parametrize("norm, clip_norm", list(itertools.product(NORMS, CLIPS)))
def test_every_output_is_inside_the_ball_and_keeps_its_direction(norm, clip_norm):
    update = _update(norm, seed=int(norm * 7) % 5)
    clipped, measured = jitted_clip(update, clip_norm)
    out_norm = _norm(clipped)
    assert out_norm <= clip_norm * (1 + 1e-6) + 1e-30
    np.testing.assert_allclose(float(measured), norm, rtol=1e-5, atol=1e-12)
    if norm <= clip_norm:  # Inside the ball (zero update, inf C): unchanged.
        for a, b in zip(jax.tree.leaves(clipped), jax.tree.leaves(update), strict=True):
            np.testing.assert_array_equal(a, b)
    else:  # On the sphere, same direction.
        np.testing.assert_allclose(out_norm, clip_norm, rtol=1e-5)
        scale = clip_norm / norm
        for a, b in zip(jax.tree.leaves(clipped), jax.tree.leaves(update), strict=True):
            np.testing.assert_allclose(a, np.asarray(b) * scale, rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_entries_are_zeroed_before_clipping(bad):
    update = _update(2.0)
    kernel = np.array(update["kernel"])
    kernel[0, 0] = bad
    update = {**update, "kernel": jnp.asarray(kernel)}
    clipped, norm = jitted_clip(update, 1.0)
    assert np.all(np.isfinite(np.asarray(clipped["kernel"])))
    assert clipped["kernel"][0, 0] == 0
    assert _norm(clipped) <= 1.0 * (1 + 1e-6)
    assert np.isfinite(float(norm))


def test_overflowing_norm_gives_zeros_not_nan():
    update = {"w": jnp.full((4,), 3e38, jnp.float32)}
    clipped, _ = jitted_clip(update, 1.0)
    np.testing.assert_array_equal(clipped["w"], np.zeros(4))


@pytest.mark.parametrize("clip_norm", [0.0, -1.0, np.nan])
def test_traced_nonpositive_or_nan_clip_norm_releases_nothing(clip_norm):
    clipped, _ = jitted_clip(_update(2.0), jnp.float32(clip_norm))
    assert _norm(clipped) == 0.0


@pytest.mark.parametrize("clip_norm", [-1.0, np.nan])
def test_static_invalid_clip_norm_raises(clip_norm):
    with pytest.raises(ValueError, match="clip_norm"):
        clip_update(_update(1.0), clip_norm)


def test_clip_updates_is_clip_update_per_client_and_keeps_dtypes():
    norms = np.array([0.0, 0.5, 4.0, 40.0])
    stacked = jax.tree.map(
        lambda *xs: jnp.stack(xs), *[_update(n, seed=i) for i, n in enumerate(norms)]
    )
    clipped, measured = jax.jit(clip_updates)(stacked, 1.0)
    np.testing.assert_allclose(measured, norms, rtol=1e-5)
    for i, n in enumerate(norms):
        one, _ = clip_update(_update(n, seed=i), 1.0)
        for a, b in zip(jax.tree.leaves(clipped), jax.tree.leaves(one), strict=True):
            np.testing.assert_allclose(a[i], b, rtol=1e-6, atol=1e-12)
            assert a.dtype == b.dtype == jnp.float32
