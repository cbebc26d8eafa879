"""The quantile with distributed differential privacy (Pillutla et al. 2023, Algorithm 2).

Every client one-hot encodes its value in a hierarchical histogram, adds
discrete Gaussian noise, scales and reduces modulo M; a secure sum modulo M
adds the clients' vectors, and the server decodes the noisy tree and reads
the quantile off its dyadic CDF. This module simulates that protocol exactly
(integer arithmetic modulo M, so wraparound really happens when M is small)
and gives the privacy parameter of Pillutla et al. 2023, Theorem 6, and its
inverses.

Modular arithmetic is done in uint32, so the supported moduli are
2 <= M <= 2^32 (bit widths up to 32); beyond that `dp_quantile` raises
ValueError. Per-client noise is int32.

References:
  [Pillutla et al. 2023] K. Pillutla, Y. Laguel, J. Malick, Z. Harchaoui.
    Federated Learning with Superquantile Aggregation for Heterogeneous
    Data. Machine Learning, 2023: Algorithm 2, eq. 8, Theorem 6 and
    Appendix B.
  [KLS21] The Distributed Discrete Gaussian Mechanism for Federated Learning with Secure Aggregation.
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxfl.primitives import _validation
from jaxfl.primitives.discrete_gaussian import discrete_gaussian
from jaxfl.primitives.histogram import bin_index, histogram_quantile, num_levels

MAX_MODULUS = 2**32


# ---------------------------------------------------------------------------
# Arithmetic modulo a static M <= 2^32 on uint32 arrays.


def check_modulus(modulus) -> int:
    """Returns M as an int; raises ValueError unless 2 <= M <= 2^32."""
    if not isinstance(modulus, numbers.Integral) or isinstance(modulus, bool):
        raise ValueError(f"modulus must be a Python int, got {modulus!r}")
    modulus = int(modulus)
    if not 2 <= modulus <= MAX_MODULUS:
        raise ValueError(
            f"modulus must be in [2, 2^32] (uint32 arithmetic), got {modulus}"
        )
    return modulus


def mod_signed(values: jax.Array, modulus: int) -> jax.Array:
    """int32 values -> uint32 residues in [0, M)."""
    values = jnp.asarray(values, jnp.int32)
    if modulus == MAX_MODULUS:
        # Two's complement is already the residue modulo 2^32.
        return lax.bitcast_convert_type(values, jnp.uint32)
    m = jnp.uint32(modulus)
    negative = values < 0
    # |x| as uint32; the bitcast also gets |-2^31| = 2^31 right.
    magnitude = lax.bitcast_convert_type(
        jnp.where(negative, -values, values), jnp.uint32
    )
    residue = magnitude % m
    return jnp.where(negative & (residue != 0), m - residue, residue)


def add_mod(a: jax.Array, b: jax.Array, modulus: int) -> jax.Array:
    """(a + b) mod M for uint32 residues a, b in [0, M), without overflow."""
    if modulus == MAX_MODULUS:
        return a + b  # uint32 wraps modulo 2^32
    m = jnp.uint32(modulus)
    room = m - b  # a + b >= M  <=>  a >= M - b
    return jnp.where(a >= room, a - room, a + b)


def sum_mod(residues: jax.Array, modulus: int, axis: int = 0) -> jax.Array:
    """Sum of uint32 residues along `axis`, modulo M (the secure sum)."""
    residues = jnp.moveaxis(jnp.asarray(residues, jnp.uint32), axis, 0)
    if modulus & (modulus - 1) == 0:
        # M divides 2^32: the wrapping uint32 sum is right modulo M.
        total = jnp.sum(residues, axis=0, dtype=jnp.uint32)
        return total if modulus == MAX_MODULUS else total & jnp.uint32(modulus - 1)
    # Otherwise a pairwise tree of modular additions (log2(n) vector steps).
    while residues.shape[0] > 1:
        if residues.shape[0] % 2:
            pad = jnp.zeros((1, *residues.shape[1:]), jnp.uint32)
            residues = jnp.concatenate([residues, pad])
        residues = add_mod(residues[0::2], residues[1::2], modulus)
    return residues[0]


def signed_representative(residues: jax.Array, modulus: int, dtype=jnp.float32):
    """Residues in [0, M) -> their representatives in (-M/2, M/2], as floats.

    Exact whenever the representative is below 2^24 in magnitude (float32).
    """
    residues = jnp.asarray(residues, jnp.uint32)
    negative = residues > jnp.uint32(modulus // 2)
    # M - s in uint32 (for M = 2^32, 0 - s wraps to 2^32 - s).
    m = jnp.uint32(modulus % MAX_MODULUS)
    magnitude = jnp.where(negative, m - residues, residues).astype(dtype)
    return jnp.where(negative, -magnitude, magnitude)


# ---------------------------------------------------------------------------
# Algorithm 2.


def tree_size(num_bins: int) -> int:
    """Number of stored nodes of a b-bin tree: 2b - 2 (the root left out)."""
    return 2 * num_bins - 2


def node_indices(bins: jax.Array, num_bins: int) -> jax.Array:
    """[..., n] level-0 bins -> [..., n, log2(b)] flat node index per level.

    Levels are laid out one after the other: level r starts at
    sum_{r' < r} b / 2^r' and node j of level r is at that offset plus j.
    """
    depth = num_levels(num_bins)
    sizes = [num_bins >> r for r in range(depth)]
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int32)
    shifts = np.arange(depth, dtype=np.int32)
    bins = jnp.asarray(bins, jnp.int32)[..., None]
    full_rank = (1,) * (bins.ndim - 1) + (depth,)  # no implicit rank promotion
    return jnp.reshape(offsets, full_rank) + (bins >> jnp.reshape(shifts, full_rank))


def split_levels(flat: jax.Array, num_bins: int) -> tuple[jax.Array, ...]:
    """[..., 2b - 2] flat tree -> tuple of levels [..., b / 2^r]."""
    levels = []
    start = 0
    for r in range(num_levels(num_bins)):
        size = num_bins >> r
        levels.append(flat[..., start : start + size])
        start += size
    return tuple(levels)


def client_histograms(values, num_bins: int, upper) -> jax.Array:
    """x_i of Pillutla et al. 2023, Algorithm 2 line 1: [n] values -> [n, 2b - 2] one-hot trees.

    Row i has a single 1 per level (in the nodes containing value i's bin);
    a NaN value gives an all-zero row.
    """
    bins = bin_index(values, num_bins, upper)
    nodes = node_indices(bins, num_bins)  # [n, L]
    valid = bins >= 0
    # One [n, 2b - 2] comparison per level (not an [n, L, 2b - 2] one-hot).
    column = jnp.arange(tree_size(num_bins), dtype=jnp.int32)[None, :]
    histograms = jnp.zeros((bins.shape[0], tree_size(num_bins)), jnp.uint32)
    for level in range(nodes.shape[-1]):
        hit = valid[:, None] & (column == nodes[:, level : level + 1])
        histograms = histograms + hit.astype(jnp.uint32)
    return histograms


def _scale_residue(scale, modulus: int) -> jax.Array:
    """The integer scale c modulo M, as uint32 (c rounded if traced)."""
    if _validation.is_static_number(scale):
        return jnp.uint32(int(np.asarray(scale).item()) % modulus)
    scale = jnp.asarray(scale)
    if jnp.issubdtype(scale.dtype, jnp.floating):
        scale = jnp.round(scale)
    scale = scale.astype(jnp.uint32)
    return scale if modulus == MAX_MODULUS else scale % jnp.uint32(modulus)


def _check_scale(scale) -> None:
    if _validation.is_static_number(scale):
        value = np.asarray(scale, dtype=np.float64)
        if value.ndim or not (
            value >= 1 and value < 2**32 and value == np.round(value)
        ):
            raise ValueError(f"scale must be an integer in [1, 2^32), got {scale!r}")


def secure_sum_of_noisy_histograms(
    key, values, *, num_bins: int, upper, sigma, scale, modulus: int, client_mask=None
) -> jax.Array:
    """Algorithm 2 lines 1-3: s = sum_i ((c x_i + xi_i) mod M) mod M.

    Client i's noise comes from `jax.random.fold_in(key, i)`, so it does not
    depend on the other clients. Clients with `client_mask` False take no
    part (no data, no noise).

    Returns:
      [2b - 2] uint32 residues in [0, M) (the levels laid out flat).
    """
    values = jnp.asarray(values)
    num_clients = values.shape[0]
    size = tree_size(num_bins)
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(num_clients))
    noise = jax.vmap(discrete_gaussian, in_axes=(0, None, None))(keys, sigma, (size,))
    histograms = client_histograms(values, num_bins, upper)  # [n, 2b - 2]
    scaled = histograms * _scale_residue(scale, modulus)  # c x_i mod M (x_i is 0/1)
    messages = add_mod(scaled, mod_signed(noise, modulus), modulus)
    if client_mask is not None:
        mask = jnp.asarray(client_mask, bool)[:, None]
        messages = jnp.where(mask, messages, jnp.zeros((), jnp.uint32))
    return sum_mod(messages, modulus, axis=0)


def dp_hierarchical_histogram(
    key, values, *, num_bins: int, upper, sigma, scale, modulus: int, client_mask=None
) -> tuple[jax.Array, ...]:
    r"""The server's noisy hierarchical histogram h_hat of Pillutla et al. 2023, Algorithm 2.

    Lines 1-4 up to the CDF: h_hat = signed(s) / c, where s is the secure sum
    of the clients' (c x_i + xi_i) mod M, xi_i ~ N_Z(0, sigma^2) i.i.d. per
    node, and signed() maps a residue to its representative in
    (-M/2, M/2]. Without wraparound h_hat = h + sum_i xi_i / c.

    Args: as `dp_quantile`.

    Returns:
      Tuple of log2(b) float32 arrays [b / 2^r] (noisy, possibly negative and
      inconsistent counts).
    """
    num_bins = _validation.check_power_of_two(num_bins, "num_bins")
    modulus = check_modulus(modulus)
    _check_scale(scale)
    _validation.check_nonnegative(sigma, "sigma")
    _validation.check_positive_finite(upper, "upper")
    values = jnp.asarray(values)
    if values.ndim != 1 or values.shape[0] == 0:
        raise ValueError(f"values must be 1-D and nonempty, got shape {values.shape}")
    residues = secure_sum_of_noisy_histograms(
        key,
        values,
        num_bins=num_bins,
        upper=upper,
        sigma=sigma,
        scale=scale,
        modulus=modulus,
        client_mask=client_mask,
    )
    scale_value = jnp.round(jnp.asarray(scale, jnp.float32))
    noisy = signed_representative(residues, modulus) / scale_value
    return split_levels(noisy, num_bins)


def dp_quantile(
    key,
    values,
    theta,
    *,
    num_bins: int,
    upper,
    sigma,
    scale,
    modulus: int,
    client_mask=None,
) -> jax.Array:
    r"""The (1 - theta)-quantile of the clients' values with distributed DP.

    Pillutla et al. 2023, Algorithm 2, end to end, as the protocol runs:

    1. client i builds its one-hot hierarchical histogram x_i of its value
       (clipped to [0, upper], b = `num_bins` bins; 2b - 2 nodes, the root
       left out);
    2. it adds xi_i ~ N_Z(0, sigma^2) i.i.d. per node and sends
       xt_i = (c x_i + xi_i) mod M (c = `scale`, M = `modulus`);
    3. the secure sum gives s = (sum_i xt_i) mod M;
    4. the server maps s to its signed representative in (-M/2, M/2], divides
       by c, and returns `histogram_quantile` of that noisy tree with
       num_values = the number of (unmasked) clients: l_{j*} with
       j* = argmin_j |H_hat(j) - (1 - theta) n| (Pillutla et al. 2023, eq. 8).

    With sigma = 0 and M > 2 c n the result is exactly `histogram_quantile`
    of the true histogram. With a small M the sum wraps around: a node whose
    scaled noisy count leaves (-M/2, M/2] is decoded as a wrong, possibly
    negative, count (Pillutla et al. 2023, Section 7.6, Figure 5 at bit
    width 10). Privacy: (epsilon^2 / 2)-zCDP with `dp_quantile_epsilon`,
    given M >= `dp_quantile_modulus` (Pillutla et al. 2023, Theorem 6).

    Jittable with static `num_bins` and `modulus`; `theta`, `sigma`, `scale`
    and `upper` may be traced (a traced float scale is rounded to an integer).
    A vmap over theta with one key reuses one noisy histogram, as a server
    answering several quantile queries would (post-processing).

    Args:
      key: PRNG key; client i uses `jax.random.fold_in(key, i)`.
      values: [n] one scalar per client (e.g. its loss).
      theta: tail fraction in (0, 1]: the (1 - theta)-quantile is estimated.
      num_bins: b, a power of two >= 2 (static).
      upper: the values' range is [0, upper] (they are clipped).
      sigma: discrete Gaussian parameter sigma >= 0 per client and node.
      scale: the integer scaling factor c >= 1.
      modulus: M, a Python int in [2, 2^32] (static).
      client_mask: optional [n] bool; False clients take no part (padding).

    Returns:
      Scalar float32 estimate in {upper / b, 2 upper / b, ..., upper}.

    Raises:
      ValueError: `num_bins` not a power of two >= 2; `modulus` not an int in
        [2, 2^32]; a static `scale` not an integer in [1, 2^32); a static
        `sigma` < 0, `theta` not in (0, 1] or `upper` not > 0; `values` not
        1-D and nonempty.

    Edge cases: NaN values contribute no data (only noise); a traced theta
    outside (0, 1] gives NaN; a traced sigma <= 0 adds no noise.
    """
    _validation.check_open_closed_unit(theta, "theta")
    levels = dp_hierarchical_histogram(
        key,
        values,
        num_bins=num_bins,
        upper=upper,
        sigma=sigma,
        scale=scale,
        modulus=modulus,
        client_mask=client_mask,
    )
    if client_mask is None:
        num_values = jnp.asarray(values).shape[0]
    else:
        num_values = jnp.sum(jnp.asarray(client_mask, jnp.int32))
    return histogram_quantile(levels, theta, num_values, upper)


# ---------------------------------------------------------------------------
# Privacy accounting (host side, float64).


def _check_counts(num_bins, num_clients) -> tuple[int, int]:
    num_bins = _validation.check_power_of_two(num_bins, "num_bins")
    if not isinstance(num_clients, numbers.Integral) or num_clients < 1:
        raise ValueError(f"num_clients must be an int >= 1, got {num_clients!r}")
    return num_bins, int(num_clients)


def _psi(num_clients: int, sigma: float) -> float:
    """Psi = 10 sum_{i=1}^{n-1} exp(-2 pi^2 sigma^2 i / (i + 1)) (Pillutla et al. 2023, Theorem 6)."""
    i = np.arange(1, num_clients, dtype=np.float64)
    return float(10.0 * np.sum(np.exp(-2.0 * math.pi**2 * sigma**2 * i / (i + 1))))


def _check_sigma(sigma) -> float:
    sigma = float(sigma)
    if not (math.isfinite(sigma) and sigma >= 0.5):
        raise ValueError(f"Theorem 6 needs sigma >= 1/2 (and finite), got {sigma}")
    return sigma


def _check_positive(value, name) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value}")
    return value


def _branches(signal: float, psi: float, num_bins: int) -> tuple[float, float, float]:
    """The three squared epsilons of `dp_quantile_epsilon` (A, B, C there)."""
    return (
        signal**2 + 4.0 * psi * num_bins,
        signal**2 + 4.0 * psi * signal + 2.0 * psi**2 * num_bins,
        (signal + psi * math.sqrt(2.0 * num_bins)) ** 2,
    )


def dp_quantile_epsilon(
    num_bins: int, num_clients: int, sigma: float, scale: float
) -> float:
    r"""Privacy of `dp_quantile`: (epsilon^2 / 2)-zCDP, valid at every order.

    epsilon^2 = min( s^2 + 4 psi b,                       (A)
                     s^2 + 4 psi s + 2 psi^2 b,           (B)
                     (s + psi sqrt(2 b))^2 ),              (C)
    s = c log2(b) / (sqrt(n) sigma),
    psi = 10 sum_{i=1}^{n-1} exp(-2 pi^2 sigma^2 i / (i + 1)).

    Derivation (docs/privacy.md, "The quantile's epsilon"). The noisy tree
    sums n independent N_Z(0, sigma^2) per node over d = 2b nodes; one client
    replaced changes the sum by a vector of L2 norm <= Delta2 = c log2(b)
    (the value in Pillutla et al. 2023, an upper bound of the true
    c sqrt(2 log2 b) for b >= 4) and L1 norm <= Delta1 = 2 c log2(b). KLS21
    Proposition 14 (Pillutla et al. 2023, Lemma 18) bounds the Renyi
    divergence of order alpha >= 1 by the min of
      alpha/2 Delta2^2 / (n sigma^2) + psi d,
      alpha/2 (Delta2^2 / (n sigma^2) + 2 Delta1 psi / (sqrt(n) sigma) + psi^2 d),
      alpha/2 (Delta2 / (sqrt(n) sigma) + psi sqrt(d))^2.
    rho-zCDP needs D_alpha <= rho alpha for *every* alpha >= 1; the first
    bound's constant psi d is <= psi d alpha there, so it gives rho = s^2/2 +
    psi d, i.e. (A); the other two are already linear in alpha, (B) and (C).
    Pillutla et al. 2023, Theorem 6(a) (and KLS21 Theorem 1) print (A) as
    s^2 + psi b, which holds only at alpha >= 4: below sigma ~ 1 that
    understates epsilon (b = 32, n = 100, c = 1, sigma = 0.6: 6.86 there,
    11.84 here). From sigma ~ 2 psi is negligible and both agree with s.
    Host-side float64.

    The guarantee needs M >= `dp_quantile_modulus` and sigma >= 1/2.
    epsilon is decreasing in sigma and increasing in c.

    Args:
      num_bins: b, a power of two >= 2.
      num_clients: n >= 1.
      sigma: per-client noise parameter, >= 1/2.
      scale: c > 0.

    Returns:
      epsilon (a Python float); rho = epsilon^2 / 2.

    Raises:
      ValueError: sigma < 1/2, scale <= 0, b not a power of two >= 2 or n < 1.
    """
    num_bins, num_clients = _check_counts(num_bins, num_clients)
    sigma = _check_sigma(sigma)
    scale = _check_positive(scale, "scale")
    psi = _psi(num_clients, sigma)
    signal = scale * math.log2(num_bins) / (math.sqrt(num_clients) * sigma)
    return math.sqrt(min(_branches(signal, psi, num_bins)))


def dp_quantile_modulus(
    num_bins: int, num_clients: int, sigma: float, scale: float, delta: float
) -> int:
    r"""The smallest modulus that Theorem 6 of Pillutla et al. 2023 allows.

    M = ceil(2 + 2 c n + 2 n sqrt(2 sigma^2 log(16 n b / delta))): then no
    wraparound happens with probability >= 1 - delta/4 (Pillutla et al. 2023, Claim 16).

    Args:
      num_bins: b, a power of two >= 2.
      num_clients: n >= 1.
      sigma: noise parameter >= 0.
      scale: c > 0.
      delta: failure probability in (0, 1).

    Returns:
      M as a Python int (it may exceed 2^32, which `dp_quantile` rejects).

    Raises:
      ValueError: arguments outside those ranges.
    """
    num_bins, num_clients = _check_counts(num_bins, num_clients)
    sigma = float(sigma)
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma must be finite and >= 0, got {sigma}")
    scale = _check_positive(scale, "scale")
    delta = float(delta)
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    bound = (
        2
        + 2 * scale * num_clients
        + 2
        * num_clients
        * math.sqrt(2 * sigma**2 * math.log(16 * num_clients * num_bins / delta))
    )
    return math.ceil(bound)


def dp_quantile_sigma(
    epsilon: float,
    num_bins: int,
    num_clients: int,
    scale: float,
    *,
    rtol: float = 1e-12,
) -> float:
    r"""The sigma at which `dp_quantile_epsilon` equals a target epsilon.

    dp_quantile_epsilon is continuous and strictly decreasing in sigma on
    [1/2, inf) (both branches of the min are: the signal term is c log2(b) /
    (sqrt(n) sigma) and psi decreases with sigma), so the solution is unique
    and found by bisection on the host (after doubling an upper bracket).

    Args:
      epsilon: target zCDP epsilon > 0.
      num_bins: b.
      num_clients: n.
      scale: c > 0.
      rtol: relative tolerance on sigma.

    Returns:
      sigma >= 1/2 with dp_quantile_epsilon(b, n, sigma, c) <= epsilon within
      rtol (the upper end of the final bracket, so never above the target).

    Raises:
      ValueError: epsilon <= 0, or epsilon is above the value at sigma = 1/2
        (then no sigma allowed by Theorem 6 reaches it: increase `scale`).
    """
    epsilon = _check_positive(epsilon, "epsilon")
    low = 0.5
    at_low = dp_quantile_epsilon(num_bins, num_clients, low, scale)
    if at_low < epsilon:
        raise ValueError(
            f"epsilon={epsilon} exceeds {at_low:.6g}, the value at sigma = 1/2 "
            f"for scale={scale}: increase the scale"
        )
    high = 1.0
    while dp_quantile_epsilon(num_bins, num_clients, high, scale) > epsilon:
        high *= 2
    while high - low > rtol * high:
        mid = 0.5 * (low + high)
        if dp_quantile_epsilon(num_bins, num_clients, mid, scale) > epsilon:
            low = mid
        else:
            high = mid
    return high


def dp_quantile_scale(
    epsilon: float, num_bins: int, num_clients: int, sigma: float
) -> float:
    r"""The (real) scale c at which `dp_quantile_epsilon` equals epsilon.

    Each branch (A), (B), (C) of the min increases in s = c A with A =
    log2(b) / (sqrt(n) sigma), so min(...) <= epsilon^2 iff s is at most the
    largest of the branch solutions: s_A = sqrt(epsilon^2 - 4 psi b),
    s_B = -2 psi + sqrt(4 psi^2 - 2 psi^2 b + epsilon^2),
    s_C = epsilon - psi sqrt(2b) (each where positive). Algorithm 2 needs an
    integer c: round it down (epsilon stays below the target) and re-solve
    sigma with `dp_quantile_sigma` to reach the target exactly.

    Args:
      epsilon: target zCDP epsilon > 0.
      num_bins: b.
      num_clients: n.
      sigma: noise parameter >= 1/2.

    Returns:
      c > 0 (a Python float).

    Raises:
      ValueError: epsilon is not above the value as c -> 0 (no scale reaches it
        at this sigma).
    """
    num_bins, num_clients = _check_counts(num_bins, num_clients)
    sigma = _check_sigma(sigma)
    epsilon = _check_positive(epsilon, "epsilon")
    psi = _psi(num_clients, sigma)
    per_scale = math.log2(num_bins) / (math.sqrt(num_clients) * sigma)
    target = epsilon**2
    candidates = [
        math.sqrt(target - 4.0 * psi * num_bins) if target > 4.0 * psi * num_bins else 0.0,
        -2.0 * psi + math.sqrt(4.0 * psi**2 + max(target - 2.0 * psi**2 * num_bins, 0.0)),
        epsilon - psi * math.sqrt(2.0 * num_bins),
    ]
    signal = max(candidates)
    if not signal > 0:
        raise ValueError(
            f"epsilon={epsilon} is not reachable at sigma={sigma}: the noise "
            "floor psi alone exceeds it; increase sigma"
        )
    return signal / per_scale
