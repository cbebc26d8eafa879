"""Which clients are corrupted: chosen once per run, on the host.

Two rules, both drawn from one random order of the N clients (a permutation
made by NumPy from the run's key, so the choice is deterministic in the key
and costs no compilation):

* `unit="clients"` (Li's thesis, CMU-CS-23-127, Section 5.3.1 and Appendix
  5.7.2: a fraction of *all* devices, chosen once at the start; the authors'
  code `litian96/ditto : flearn/trainers_global/fedavg.py` draws
  `np.random.choice(N, num_corrupted, replace=False)`): the first
  k = floor(fraction * N + 1/2) clients of the order, i.e. exactly
  round(fraction * N) clients (halves rounded up), uniformly without
  replacement.
* `unit="examples"` (Pillutla, Kakade, Harchaoui, "Robust Aggregation for
  Federated Learning", IEEE TSP 2022, Section 5 (experiments); code
  `krishnap25/RFA : models/utils/main_utils.py`, `apply_corruption_all`):
  the shortest prefix of the order whose clients hold at least
  fraction * (total examples) examples, i.e. the smallest k with
  sum_{j < k} counts[order_j] >= fraction * sum_i counts_i (k = 0 when
  that target is 0). The comparison is RFA's: the float product
  fraction * total against integer partial sums.

Both rules take prefixes of the same order, so with one key a larger fraction
corrupts a superset of the clients a smaller one does (sweeps over the
fraction are nested), and the two units agree on which clients come first.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxfl.types import Key

UNITS = ("clients", "examples")


def _client_order(key: Key, num_clients: int) -> np.ndarray:
    """`[N]` a uniformly random permutation of the clients, a function of `key` only."""
    if isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.shape != ():
            raise ValueError(f"corrupted_clients needs one key, got a batch of shape {key.shape}")
        data = np.asarray(jax.random.key_data(key))
    else:
        data = np.asarray(key)
        if data.dtype != np.uint32 or data.ndim != 1:
            raise ValueError(
                "corrupted_clients needs a key from jax.random.key (or the raw uint32 [2] data of one), "
                f"got {data.dtype} {data.shape}"
            )
    rng = np.random.default_rng(np.random.SeedSequence([int(v) for v in data.ravel()]))
    return rng.permutation(num_clients)


def corrupted_clients(key: Key, counts, fraction: float, *, unit: str = "clients") -> np.ndarray:
    """`[N]` bool: which clients of the population are corrupted (host side, once per run).

    With `order` a uniformly random permutation of the N clients drawn from
    `key`, the corrupted clients are the first k of `order`, where

    * `unit="clients"`: k = floor(fraction * N + 1/2) (Li's thesis, Section
      5.3.1: a fraction of all devices);
    * `unit="examples"`: k = min{k : sum_{j < k} counts[order_j] >=
      fraction * sum_i counts_i} (RFA, Pillutla et al. 2022, Section 5:
      clients taken in a random order until the corrupted ones hold at
      least `fraction` of all the examples).

    See the module docstring.

    Args:
      key: a JAX PRNG key (`jax.random.key`); use one kept for this purpose
        (e.g. `fold_in(run_key, tag)`), since the choice is made once.
      counts: `[N]` non-negative ints, each client's number of (training)
        examples. Only its length matters for `unit="clients"`.
      fraction: in [0, 1].
      unit: "clients" or "examples".

    Returns:
      `[N]` NumPy bool array, True for corrupted clients.

    Raises:
      ValueError: a fraction outside [0, 1], an unknown unit, counts that
        are not a 1-D array of non-negative integers, or a batch of keys.
    """
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")
    if isinstance(fraction, bool) or not isinstance(fraction, int | float | np.integer | np.floating):
        raise ValueError(f"fraction must be a number in [0, 1], got {fraction!r}")
    fraction = float(fraction)
    if not 0.0 <= fraction <= 1.0:  # Also refuses NaN.
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    counts = np.asarray(counts)
    if counts.ndim != 1 or not (counts.size == 0 or np.issubdtype(counts.dtype, np.integer)):
        raise ValueError(f"counts must be a 1-D integer array [N], got {counts.dtype} {counts.shape}")
    if np.any(counts < 0):
        raise ValueError("counts must be non-negative")
    num_clients = counts.shape[0]
    order = _client_order(key, num_clients)
    if unit == "clients":
        k = math.floor(fraction * num_clients + 0.5)
    else:
        target = fraction * float(counts.sum(dtype=np.int64))
        held = np.cumsum(counts[order], dtype=np.int64)
        # First position whose partial sum reaches the target; the prefix ends there.
        k = 0 if target <= 0 else int(np.searchsorted(held, target, side="left")) + 1
    corrupted = np.zeros(num_clients, bool)
    corrupted[order[:k]] = True
    return corrupted
