"""The exact law of `jaxfl.primitives.discrete_gaussian`'s float32 arithmetic, and its distance from N_Z.

The sampler's random inputs are float32 uniforms on the grid {k 2^-23}, integer
random bits and a fair sign; every factor of a proposal's probability can be
enumerated, so its law is computed here exactly (float64 sums), not estimated:

  P(|Y| = u + t v, accepted) = (1 / t) P(U' < exp(-u / t)) P(floor(E) = v) P(U'' < g(u + t v)),

with t = floor(sigma) + 1, E = -log1p(-U) as `jax.random.exponential` computes
it, g the Gaussian acceptance probability evaluated by XLA in float32, and
P(U < p) = ceil(p 2^23) / 2^23 on the grid. The sign halves it, -0 is
rejected. The total variation distance from N_Z(0, sigma^2) (exact pmf) is
printed, with the largest ratio of pmfs on the bulk (|y| <= 6 sigma).

    python scripts/discrete_gaussian_law.py --sigma 0.5 1 5 50 5e4 1e6

(docs/privacy.md, "The discrete Gaussian sampler is a simulation sampler",
quotes its output.)
"""

from __future__ import annotations

import argparse

import jax.numpy as jnp
import numpy as np

GRID = 2**23


def probability_below(p32: np.ndarray) -> np.ndarray:
    """P(U < p) for U uniform on {k 2^-23}: ceil(p 2^23) / 2^23, from the float32 p itself."""
    return np.minimum(np.ceil(np.asarray(p32, np.float64) * GRID), GRID) / GRID


def geometric_law() -> np.ndarray:
    """P(floor(E) = v), E = -log1p(-U) in float32 as jax.random.exponential computes it."""
    uniforms = jnp.arange(GRID, dtype=jnp.float32) * jnp.float32(2.0**-23)
    whole = np.asarray(jnp.floor(-jnp.log1p(-uniforms))).astype(np.int64)
    return np.bincount(whole) / GRID


def sampler_law(sigma: float, geometric: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Support y >= 0 and the sampler's P(|X| = y) (signs are symmetric)."""
    sigma32 = np.float32(sigma)
    scale = np.floor(sigma32) + np.float32(1)
    t = int(scale)
    variance, shift = sigma32**2, sigma32**2 / scale
    remainder = np.arange(t, dtype=np.float32)
    keep = probability_below(jnp.exp(-jnp.asarray(remainder) / scale))
    magnitude = (remainder[None, :] + scale * np.arange(geometric.size, dtype=np.float32)[:, None]).ravel()
    accept = probability_below(jnp.exp(-((jnp.asarray(magnitude) - shift) ** 2) / (2 * variance)))
    mass = (geometric[:, None] * keep[None, :] / t).ravel() * accept
    mass[0] *= 0.5  # -0 rejected: 0 comes only with the positive sign
    return magnitude.astype(np.int64), mass / mass.sum()


def exact_law(sigma: float, support: np.ndarray) -> np.ndarray:
    """P(|X| = y) under N_Z(0, sigma^2) on `support` (float64; the rest is below 1e-300)."""
    weights = np.exp(-(support.astype(np.float64) ** 2) / (2 * sigma**2))
    weights[1:] *= 2
    normalizer = weights.sum()
    return weights / normalizer


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sigma", type=float, nargs="+", default=[0.5, 1.0, 5.0, 50.0, 5e4, 1e6])
    args = parser.parse_args(argv)
    geometric = geometric_law()
    for sigma in args.sigma:
        support, law = sampler_law(sigma, geometric)
        exact = exact_law(float(np.float32(sigma)), support)
        total_variation = 0.5 * np.abs(law - exact).sum()  # |X|'s law; the sign is a fair coin on both
        bulk = support <= 6 * sigma
        ratio = law[bulk] / exact[bulk]
        print(
            f"sigma {sigma:g}: total variation {total_variation:.2e}, "
            f"pmf ratio on |y| <= 6 sigma in [{ratio.min():.6f}, {ratio.max():.6f}]"
        )


if __name__ == "__main__":
    main()
