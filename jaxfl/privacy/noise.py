"""The Gaussian sum mechanism on clipped client updates.

What the server receives from a round's secure aggregate (Pillutla et al.
2023, Algorithm 4 lines 9-10; DP-FedAvg of McMahan et al. 2018):

    s = sum_{i in S} p_i clip(u_i, C) + xi,     xi ~ N(0, sigma^2 I_d),
    sigma = z * Delta,   Delta = sum_sensitivity(C) = 2 C,

with p_i in {0, 1} whether client i contributes (every sampled client for
DP-FedAvg; the clients at or above the DP quantile for DP Delta-FL), z the
noise multiplier and Delta the l2 sensitivity of the sum under the
replace-one-client adjacency (`jaxfl.privacy.accounting`). The noise is
added to the *sum*, so its scale does not depend on how many clients
contribute; the server's division by a public count is post-processing.
(Pillutla et al. 2023, Algorithm 4 line 10, adds N(0, sigma_w^2 I) to the
*average* over m_t clients instead, whose sensitivity 2C / m_t then varies
with m_t; adding it to the sum is the form whose privacy is
Delta^2 / (2 sigma^2) = 1 / (2 z^2) zCDP whatever m_t is.)

Randomness: one key per round (from the round's server key), split into one
key per leaf of the model; never reused across rounds or leaves.

References:
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
  [McMahan et al. 2018] Learning Differentially Private Recurrent Language Models. ICLR 2018.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxfl.privacy.accounting import sum_sensitivity
from jaxfl.privacy.clipping import clipped_sum
from jaxfl.types import Key, PyTree


def gaussian_noise_like(key: Key, tree: PyTree, stddev) -> PyTree:
    """i.i.d. N(0, stddev^2) entries shaped like `tree` (one key per leaf).

    Args:
      key: PRNG key, used once.
      tree: a pytree of float arrays (only shapes and dtypes are read).
      stddev: sigma >= 0, may be traced; 0 gives exact zeros.

    Returns:
      The noise pytree.
    """
    leaves, treedef = jax.tree.flatten(tree)
    keys = jax.random.split(key, len(leaves))
    stddev = jnp.asarray(stddev, jnp.float32)
    noise = [
        (jax.random.normal(k, x.shape, jnp.float32) * stddev).astype(x.dtype)
        for k, x in zip(keys, leaves, strict=True)
    ]
    return jax.tree.unflatten(treedef, noise)


class NoisySum(NamedTuple):
    """The released sum and what the simulation records about it.

    Attributes:
      total: the noisy sum s (a pytree like one client's update).
      noise_stddev: float32 [] sigma = z * 2C of each coordinate's noise.
      update_norms: `[M]` l2 norms of the updates before clipping (a
        simulation diagnostic, not a DP release).
      clipped: `[M]` bool, whether a contributing client's update was
        scaled down (diagnostic).
    """

    total: PyTree
    noise_stddev: jax.Array
    update_norms: jax.Array
    clipped: jax.Array


def noisy_clipped_sum(
    key: Key,
    updates: PyTree,
    contributes: jax.Array,
    *,
    clip_norm,
    noise_multiplier,
) -> NoisySum:
    """The noisy sum s = sum_i p_i clip(u_i, C) + N(0, (z 2C)^2 I).

    See the module docstring.

    Args:
      key: the round's noise key.
      updates: stacked per-client updates, leaves `[M, ...]`.
      contributes: `[M]` bool p_i (False clients add nothing, whatever their
        update holds).
      clip_norm: C > 0, may be traced.
      noise_multiplier: z >= 0, may be traced (0: no noise).

    Returns:
      The `NoisySum`.
    """
    mask = jnp.asarray(contributes, bool)
    total, norms = clipped_sum(updates, clip_norm, mask)
    noise_multiplier = jnp.asarray(noise_multiplier, jnp.float32)
    stddev = noise_multiplier * sum_sensitivity(jnp.asarray(clip_norm, jnp.float32))
    # z = 0 means no noise even with C = inf (0 * inf would be NaN).
    stddev = jnp.where(noise_multiplier == 0, 0.0, stddev)
    noise = gaussian_noise_like(key, total, stddev)
    total = jax.tree.map(jnp.add, total, noise)
    return NoisySum(total, stddev, norms, mask & (norms > clip_norm))
