r"""Privacy accounting of DP-FedAvg and DP Delta-FL with Google's dp-accounting.

Unit of privacy and adjacency. Client-level (user-level) DP (Li 2023
(thesis), Definition 4 in Section 2.5): two training populations are
neighbours when they differ in the *whole data of one client*, replaced by
arbitrary data; the number n of training clients is public (`REPLACE_ONE`
in dp-accounting). This is the adjacency under which
the amplification of sampling a fixed-size cohort without replacement is
proved (Wang, Balle, Kasiviswanathan, Subsampled Renyi Differential Privacy
and Analytical Moments Accountant, AISTATS 2019, Theorem 27), and the only
one dp-accounting accepts for `SampledWithoutReplacementDpEvent`.

What one round releases, and its sensitivity (per round t):

1. sampling: a cohort S of m of the n clients, uniformly without replacement
   (m, n public; the draw is the server's secret randomness);
2. the update: the noisy sum s_t = sum_{i in S} p_i clip(u_i, C) + N(0,
   sigma_w^2 I) (`jaxfl.privacy.noise`). Replacing one client's data changes
   at most one term, from a vector of norm <= C to another: the l2
   sensitivity is Delta = 2C (`sum_sensitivity`; it would be C under
   add/remove-one, as jax_privacy's `BoundedSensitivityCallable` also
   states). With sigma_w = z Delta the Gaussian mechanism is
   rho_w = Delta^2 / (2 sigma_w^2) = 1 / (2 z^2) zCDP (Bun and Steinke 2016).
   (Pillutla et al. 2023, Appendix D, Claim 20, writes sigma_w^2 / (2 C^2),
   the inverse; the form here is the Gaussian mechanism's.) The server then
   divides by a public count -- m for DP-FedAvg (the cohort size, which is
   also its expected size: McMahan et al. 2018's fixed denominator), theta m
   for DP Delta-FL (fixed before the round; with `--dp-count exact` the
   count m_t of clients that passed, which Pillutla et al. 2023, Appendix D,
   assumes public and which is then not accounted) -- and takes a server
   optimizer step: post-processing;
3. DP Delta-FL only: the noisy hierarchical histogram of the m cohort losses
   (Pillutla et al. 2023, Algorithm 2, `jaxfl.primitives.dp_quantile`), from
   which the server reads the threshold Q_t. Theorem 6(a) of Pillutla et al.
   2023 with n = m clients gives
   rho_q = eps_q^2 / 2 with eps_q = `dp_quantile_epsilon(b, m, sigma_q, c)`.
   Theorem 6 takes the sensitivity of the scaled histogram sum as
   c log2(b); under replacement one client's one-hot tree changes in at most
   2 log2(b) entries by c, an l2 change of c sqrt(2 log2 b) <= c log2 b when
   b >= 4 (so Theorem 6's value is an upper bound here; b = 2 is refused by
   `jaxfl.privacy.budget`). The modular secure sum is a function of the
   noisy sum, so the modulus M only matters for utility (Theorem 6(b)).

Budget split (Pillutla et al. 2023, Section 7.7 and Appendix D.2: "the
privacy budget for the quantile computation to be r times the privacy budget
of the weight update"). Here *budget* means the per-round, per-cohort zCDP
parameter rho (before amplification): rho_q = r rho_w, i.e.
eps_q = sqrt(2 r rho_w) = sqrt(r) / z (`quantile_epsilon_for`). The
quantile's share of a round's zCDP is r / (1 + r).

The accountant (`make_accountant`): dp-accounting's `RdpAccountant` with its
default Renyi orders and `NeighboringRelation.REPLACE_ONE`. A round is the
event

    SampledWithoutReplacementDpEvent(n, m,
        ComposedDpEvent([GaussianDpEvent(z), ZCDpEvent(eps_q^2 / 2)]))

(DP-FedAvg: the Gaussian alone; DP Delta-FL: the Gaussian and
`ZCDpEvent(eps_q^2 / 2)`, the quantile as what Theorem 6(a) proves of it), and
T rounds are `SelfComposedDpEvent(round, T)`; epsilon at a delta is
`get_epsilon(delta)`, with CKS20 Proposition 12's conversion.

Amplification, by mechanism. A round of the Gaussian alone (DP-FedAvg) is
amplified by dp-accounting's WBK19 Theorem 27, a refinement that holds for
mechanisms whose RDP one pair of inputs attains (the Gaussian's does). The
distributed discrete Gaussian of the quantile is only known through its zCDP
bound, so a round of DP Delta-FL is amplified by WBK19 Theorem 9, which holds
for *any* mechanism given an upper bound eps(j) on its RDP at integer orders:
here eps(j) = (rho_w + rho_q) j, the update's Gaussian and the quantile on the
same cohort composed (RDP adds). `zcdp_sampled_rdp` computes it, taking at each
order the smaller of Theorem 9 and the unsampled (rho_w + rho_q) alpha (a
sampled mechanism is never worse than the mechanism: joint quasi-convexity of
the Renyi divergence, van Erven and Harremoes 2014); fractional orders
interpolate the integer ones (WBK19 Corollary 10). The printed epsilon is
therefore proved for the discrete quantile as it is, with no assumption that
it amplifies like a Gaussian; at the same noise it is larger than the
Gaussian-only value (5.42 instead of 5.00 at the CLI's defaults: docs/privacy.md,
"The quantile's amplification").
`make_accountant` returns dp-accounting's `RdpAccountant` extended with this
one case; every other event is the library's.
`epsilon_spent(..., amplified=False)` is each round as `ZCDpEvent(rho_w +
rho_q)` with no amplification (the server, who knows the cohort). The two
mechanisms share the cohort, so their amplification is not split
(amplifying the update alone and adding an unamplified quantile is not
justified by composition: the threshold depends on the same cohort and can
reveal whether a client was sampled).

Everything here is host-side Python (float64), outside the compiled round.

References:
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks.
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
  [WBK19] Subsampled Renyi Differential Privacy and Analytical Moments Accountant. AISTATS 2019.
  [Bun and Steinke 2016] Concentrated Differential Privacy: Simplifications, Extensions, and Lower Bounds.
  [McMahan et al. 2018] Learning Differentially Private Recurrent Language Models. ICLR 2018.
  [Mironov et al. 2019] Renyi Differential Privacy of the Sampled Gaussian Mechanism. arXiv preprint, 2019.
  [CKS20] The Discrete Gaussian for Differential Privacy. NeurIPS 2020.
  [van Erven and Harremoes 2014] Renyi Divergence and Kullback-Leibler Divergence.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant


def _dp_accounting():
    """dp-accounting, imported on first use: importing it (and the SciPy it
    loads) is about half of a command's start-up, which runs without DP
    should not pay."""
    import dp_accounting
    import dp_accounting.mechanism_calibration
    import dp_accounting.rdp.rdp_privacy_accountant

    return dp_accounting

ACCOUNTANT_NAME = (
    "dp_accounting.rdp.RdpAccountant (Renyi DP, default orders, "
    "NeighboringRelation.REPLACE_ONE; sampling without replacement by "
    "Wang-Balle-Kasiviswanathan 2019 Thm. 27 for the Gaussian alone, Thm. 9 with the DP quantile)"
)
# The smallest noise multiplier the calibration's bracket starts from (the
# accountant returns a finite, huge epsilon there; 0 would divide by zero).
_SMALLEST_NOISE_MULTIPLIER = 1e-2


def sum_sensitivity(clip_norm):
    """l2 sensitivity 2C of a sum of updates clipped to C, under REPLACE_ONE.

    Works on Python numbers and traced arrays alike.
    """
    return 2 * clip_norm


class Sampling(NamedTuple):
    """Cohort sampling: m of n clients, uniformly without replacement.

    Attributes:
      num_clients: n, the training clients (public).
      clients_per_round: m, the cohort size (public).
    """

    num_clients: int
    clients_per_round: int

    @property
    def rate(self) -> float:
        """The sampling rate q = m / n."""
        return self.clients_per_round / self.num_clients


def check_sampling(sampling: Sampling) -> Sampling:
    """Returns `sampling` as ints; ValueError unless 1 <= m <= n."""
    n, m = int(sampling.num_clients), int(sampling.clients_per_round)
    if not 1 <= m <= n:
        raise ValueError(f"clients_per_round must be in [1, {n}], got {m}")
    return Sampling(n, m)


def _check_positive(value, name: str) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value}")
    return value


def _check_delta(delta) -> float:
    delta = float(delta)
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    return delta


def _check_rounds(rounds) -> int:
    if int(rounds) != rounds or rounds < 0:
        raise ValueError(f"rounds must be an integer >= 0, got {rounds}")
    return int(rounds)


def gaussian_rho(noise_multiplier: float) -> float:
    """The zCDP rho of a Gaussian mechanism with noise std z times the sensitivity.

    rho = Delta^2 / (2 sigma^2) = 1 / (2 z^2) (Bun and Steinke 2016, Prop. 1.6).
    """
    return 1.0 / (2.0 * _check_positive(noise_multiplier, "noise_multiplier") ** 2)


def quantile_epsilon_for(noise_multiplier: float, quantile_ratio: float) -> float:
    """eps_q with rho_q = r rho_w: the quantile's budget is r times the update's.

    eps_q = sqrt(2 r rho_w) = sqrt(r) / z (see the module docstring).

    Args:
      noise_multiplier: z > 0 of the update.
      quantile_ratio: r > 0.

    Returns:
      The zCDP epsilon of Theorem 6(a) (rho_q = eps_q^2 / 2) the quantile may
      spend per round.
    """
    rho_w = gaussian_rho(noise_multiplier)
    ratio = _check_positive(quantile_ratio, "quantile_ratio")
    return math.sqrt(2.0 * ratio * rho_w)


def round_event(
    sampling: Sampling, noise_multiplier: float, quantile_epsilon: float | None = None
) -> dp_accounting.DpEvent:
    """One round: sample m of n, then the update's Gaussian and the quantile.

    Args:
      sampling: n and m.
      noise_multiplier: z > 0 (update noise std over its sensitivity 2C).
      quantile_epsilon: the quantile's Theorem 6(a) epsilon per round, or None
        (DP-FedAvg: no quantile).

    Returns:
      `SampledWithoutReplacementDpEvent(n, m, Gaussian(z)
      [+ ZCDp(eps_q^2 / 2)])`.
    """
    dp_accounting = _dp_accounting()
    sampling = check_sampling(sampling)
    mechanism = dp_accounting.GaussianDpEvent(
        _check_positive(noise_multiplier, "noise_multiplier")
    )
    if quantile_epsilon is not None:
        # What Theorem 6(a) proves of the quantile: (eps_q^2 / 2)-zCDP.
        quantile = dp_accounting.ZCDpEvent(_check_positive(quantile_epsilon, "quantile_epsilon") ** 2 / 2.0)
        mechanism = dp_accounting.ComposedDpEvent([mechanism, quantile])
    return dp_accounting.SampledWithoutReplacementDpEvent(
        sampling.num_clients, sampling.clients_per_round, mechanism
    )


def unamplified_round_event(
    noise_multiplier: float, quantile_epsilon: float | None = None
) -> dp_accounting.DpEvent:
    """One round as plain zCDP, no amplification: `ZCDpEvent(rho_w + rho_q)`."""
    rho = gaussian_rho(noise_multiplier)
    if quantile_epsilon is not None:
        rho += _check_positive(quantile_epsilon, "quantile_epsilon") ** 2 / 2.0
    return _dp_accounting().ZCDpEvent(rho)


def training_event(
    rounds: int,
    sampling: Sampling,
    noise_multiplier: float,
    quantile_epsilon: float | None = None,
    *,
    amplified: bool = True,
) -> dp_accounting.DpEvent:
    """T rounds: `SelfComposedDpEvent(round, T)` (adaptive composition)."""
    rounds = _check_rounds(rounds)
    event = (
        round_event(sampling, noise_multiplier, quantile_epsilon)
        if amplified
        else unamplified_round_event(noise_multiplier, quantile_epsilon)
    )
    return _dp_accounting().SelfComposedDpEvent(event, rounds)


def make_accountant() -> rdp_privacy_accountant.RdpAccountant:
    """A fresh RDP accountant with the replace-one-client adjacency.

    dp-accounting's `RdpAccountant`, extended so that a cohort sampled
    without replacement around a zCDP mechanism (DP Delta-FL's quantile) is
    amplified by `zcdp_sampled_rdp` (WBK19 Theorem 9) instead of being
    refused; sampled Gaussians alone keep the library's Theorem 27.
    """
    dp_accounting = _dp_accounting()
    return _accountant_class()(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)


@functools.cache
def _accountant_class():
    dp_accounting = _dp_accounting()
    library = dp_accounting.rdp.rdp_privacy_accountant

    class ReplaceOneAccountant(library.RdpAccountant):
        def _maybe_compose(self, event, count, do_compose):
            if isinstance(event, dp_accounting.SampledWithoutReplacementDpEvent):
                rho = _zcdp_rho(event.event)
                if rho is not None and _has_zcdp_part(event.event):
                    if do_compose:
                        sampling = Sampling(event.source_dataset_size, event.sample_size)
                        self._rdp += count * zcdp_sampled_rdp(rho, sampling, tuple(self._orders))
                    return None
            return super()._maybe_compose(event, count, do_compose)

    return ReplaceOneAccountant


def _zcdp_rho(event) -> float | None:
    """The zCDP rho of Gaussians and (xi = 0) zCDP events composed; None for anything else."""
    dp_accounting = _dp_accounting()
    if isinstance(event, dp_accounting.GaussianDpEvent):
        return math.inf if event.noise_multiplier == 0 else gaussian_rho(event.noise_multiplier)
    if isinstance(event, dp_accounting.ZCDpEvent):
        return float(event.rho) if event.xi == 0 and event.rho >= 0 else None
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        inner = _zcdp_rho(event.event)
        return None if inner is None else event.count * inner
    if isinstance(event, dp_accounting.ComposedDpEvent):
        parts = [_zcdp_rho(part) for part in event.events]
        return None if any(part is None for part in parts) else sum(parts)
    return None


def _has_zcdp_part(event) -> bool:
    dp_accounting = _dp_accounting()
    if isinstance(event, dp_accounting.ZCDpEvent):
        return True
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        return _has_zcdp_part(event.event)
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return any(_has_zcdp_part(part) for part in event.events)
    return False


@functools.lru_cache(maxsize=1024)
def zcdp_sampled_rdp(rho: float, sampling: Sampling, orders: tuple[float, ...]):
    r"""RDP of a rho-zCDP mechanism run on m of n clients drawn without replacement.

    WBK19 Theorem 9 (replace-one adjacency), for a mechanism with RDP
    eps(j) <= rho j at every order j (rho-zCDP) and eps(inf) = inf: at
    integer alpha >= 2, with q = m / n,

        (alpha - 1) eps'(alpha) <= log(1 + q^2 C(alpha, 2) min(4 (e^{eps(2)} - 1), 2 e^{eps(2)})
                                     + sum_{j=3}^{alpha} 2 q^j C(alpha, j) e^{(j - 1) eps(j)}),

    at fractional alpha the linear interpolation of (alpha - 1) eps'(alpha)
    between the integer orders around it (Corollary 10; (alpha - 1) eps'(1)
    = 0), and at every order at most the unsampled rho alpha (joint
    quasi-convexity of the Renyi divergence). m = n gives rho alpha.

    Args:
      rho: the mechanism's zCDP parameter, >= 0.
      sampling: n and m.
      orders: Renyi orders > 1.

    Returns:
      float64 array of eps'(alpha), one per order.
    """
    from scipy.special import gammaln, logsumexp

    sampling = check_sampling(sampling)
    orders_array = np.asarray(orders, np.float64)
    unsampled = rho * orders_array
    if sampling.clients_per_round == sampling.num_clients or rho == 0 or not math.isfinite(rho):
        return unsampled
    log_q = math.log(sampling.rate)

    def log_moment(alpha: int) -> float:  # log of Theorem 9's bound on exp((alpha - 1) eps'(alpha))
        if alpha == 1:
            return 0.0
        k = np.arange(alpha + 1)
        log_comb = gammaln(alpha + 1) - gammaln(k + 1) - gammaln(alpha - k + 1)
        eps2 = 2 * rho
        log_expm1 = eps2 + math.log(-math.expm1(-eps2))  # log(e^eps2 - 1), no overflow
        second = 2 * log_q + log_comb[2] + min(math.log(4) + log_expm1, math.log(2) + eps2)
        j = np.arange(3, alpha + 1)
        higher = math.log(2) + (j - 1) * j * rho + j * log_q + log_comb[3:]
        return float(logsumexp(np.concatenate([[0.0, second], higher])))

    needed = {int(math.floor(a)) for a in orders} | {int(math.ceil(a)) for a in orders}
    moments = {alpha: log_moment(alpha) for alpha in needed}
    sampled = np.array([
        ((math.ceil(a) - a) * moments[math.floor(a)] + (a - math.floor(a)) * moments[math.ceil(a)]) / (a - 1)
        if a != math.floor(a) else moments[int(a)] / (a - 1)
        for a in orders
    ])  # fmt: skip
    return np.minimum(sampled, unsampled)


# Cached: a sweep reports every point (both trust models), and points share
# their noise, while one accountant evaluation is costly (measured:
# docs/privacy.md, section "Accounting", the "Cost" item).
@functools.lru_cache(maxsize=4096)
def epsilon_spent(
    rounds_done: int,
    sampling: Sampling,
    noise_multiplier: float,
    delta: float,
    *,
    quantile_epsilon: float | None = None,
    amplified: bool = True,
) -> float:
    """The epsilon of (epsilon, delta)-DP spent by `rounds_done` rounds.

    Args:
      rounds_done: rounds completed (0 gives 0).
      sampling: n and m.
      noise_multiplier: z > 0 of the update.
      delta: in (0, 1).
      quantile_epsilon: DP Delta-FL's per-round quantile epsilon (Theorem
        6(a)), or None for DP-FedAvg.
      amplified: True: the accountant of the module docstring; False: the
        assumption-free bound without amplification.

    Returns:
      epsilon from `make_accountant()` (results are cached).

    Raises:
      ValueError: arguments out of range.
    """
    rounds_done = _check_rounds(rounds_done)
    delta = _check_delta(delta)
    event = training_event(
        rounds_done, sampling, noise_multiplier, quantile_epsilon, amplified=amplified
    )
    if rounds_done == 0:
        return 0.0
    return float(make_accountant().compose(event).get_epsilon(delta))


@functools.lru_cache(maxsize=256)
def noise_multiplier_for(
    target_epsilon: float,
    delta: float,
    rounds: int,
    sampling: Sampling,
    *,
    quantile_ratio: float | None = None,
    quantile_epsilon: float | None = None,
    tolerance: float = 1e-5,
    amplified: bool = True,
) -> float:
    """The smallest update noise multiplier z whose run spends <= target_epsilon.

    The epsilon of `epsilon_spent(rounds, sampling, z, delta, ...)` is
    continuous and strictly decreasing in z (more noise, and with a ratio r
    also a smaller quantile epsilon sqrt(r)/z), so the solution is unique;
    it is found by dp-accounting's `calibrate_dp_mechanism` (a bracket by
    doubling, then Brent's method on the accountant's epsilon), which
    guarantees epsilon(z) <= target_epsilon and z within `tolerance` of the
    optimum. Results are cached.

    Args:
      target_epsilon: > 0.
      delta: in (0, 1).
      rounds: T >= 1.
      sampling: n and m.
      quantile_ratio: r > 0: the quantile gets eps_q = sqrt(r) / z
        (`quantile_epsilon_for`); DP Delta-FL's budget split.
      quantile_epsilon: a fixed per-round quantile epsilon instead (exclusive
        with `quantile_ratio`).
      tolerance: absolute tolerance on z.
      amplified: calibrate the epsilon that assumes the sampling secret
        (against an observer of the released models); False: the one without
        amplification (against the server, who samples), as `epsilon_spent`.

    Returns:
      z (a Python float).

    Raises:
      ValueError: arguments out of range, both quantile arguments given, or a
        fixed quantile epsilon that alone exceeds the target (no z reaches it).
    """
    target_epsilon = _check_positive(target_epsilon, "target_epsilon")
    delta = _check_delta(delta)
    rounds = _check_rounds(rounds)
    if rounds < 1:
        raise ValueError("rounds must be >= 1 to calibrate noise")
    sampling = check_sampling(sampling)
    if quantile_ratio is not None and quantile_epsilon is not None:
        raise ValueError("give quantile_ratio or quantile_epsilon, not both")
    if quantile_ratio is not None:
        _check_positive(quantile_ratio, "quantile_ratio")

    def event(z: float) -> dp_accounting.DpEvent:
        z = float(z)
        eps_q = quantile_epsilon
        if quantile_ratio is not None:
            eps_q = quantile_epsilon_for(z, quantile_ratio)
        return training_event(rounds, sampling, z, eps_q, amplified=amplified)

    if quantile_epsilon is not None:
        # With the quantile fixed, epsilon decreases to the quantile's own
        # value as z -> inf (the update is then a Gaussian of infinite noise).
        floor = epsilon_spent(
            rounds, sampling, 1e6, delta, quantile_epsilon=quantile_epsilon, amplified=amplified
        )
        if floor >= target_epsilon:
            raise ValueError(
                f"the quantile alone spends epsilon={floor:.4g} >= the target "
                f"{target_epsilon:g}: raise its noise or the target"
            )
    # Budgets outside what any noise multiplier in the calibrated range meets
    # are refused up front when they are far out (the calibration would take
    # seconds to fail), and by the calibration's failure otherwise.
    if target_epsilon > _FAR_EPSILON:
        _check_reachable(target_epsilon, delta, rounds, event, _SMALLEST_NOISE_MULTIPLIER)
    if quantile_ratio is not None and quantile_ratio > _FAR_QUANTILE_RATIO:
        _check_reachable(target_epsilon, delta, rounds, event, _LARGEST_NOISE_MULTIPLIER, quantile_ratio)
    dp_accounting = _dp_accounting()
    try:
        return float(
            dp_accounting.calibrate_dp_mechanism(
                make_accountant,
                event,
                target_epsilon,
                delta,
                bracket_interval=dp_accounting.LowerEndpointAndGuess(
                    _SMALLEST_NOISE_MULTIPLIER, 1.0
                ),
                tol=tolerance,
            )
        )
    except (ArithmeticError, ValueError, dp_accounting.mechanism_calibration.NoBracketIntervalFoundError):
        # Outside what the accountant can calibrate: say which end.
        _check_reachable(target_epsilon, delta, rounds, event, _SMALLEST_NOISE_MULTIPLIER)
        _check_reachable(target_epsilon, delta, rounds, event, math.inf, quantile_ratio)
        raise AssertionError("unreachable: one end refuses") from None


# Above these, `noise_multiplier_for` checks the ends of the calibrated range
# first (each check is one accountant evaluation).
_FAR_EPSILON = 50.0
_FAR_QUANTILE_RATIO = 1e6
# The largest noise multiplier the calibration's bracket search reaches.
_LARGEST_NOISE_MULTIPLIER = 2.0**30


def _check_reachable(target_epsilon, delta, rounds, event, noise_multiplier, quantile_ratio=None) -> None:
    """Raises the one-line ValueError of a target beyond an end of the calibrated range.

    At the smallest noise multiplier, a target epsilon at least what it
    spends protects nothing; at the largest (or math.inf: the failure path),
    a target below what it spends (the quantile's share alone exceeds it)
    is out of reach.
    """
    smallest = noise_multiplier == _SMALLEST_NOISE_MULTIPLIER
    try:
        at = min(noise_multiplier, _LARGEST_NOISE_MULTIPLIER)
        spent = make_accountant().compose(event(at)).get_epsilon(delta)
    except (ArithmeticError, ValueError):
        spent = math.inf
    if smallest and (target_epsilon >= spent or not math.isfinite(spent)):
        raise ValueError(
            f"epsilon={target_epsilon:g} is at least what the smallest noise multiplier calibrated "
            f"({_SMALLEST_NOISE_MULTIPLIER:g}) spends over {rounds} rounds at delta={delta:.3g}"
            + (f" ({spent:.4g})" if math.isfinite(spent) else "")
            + ": such a budget protects nothing; lower epsilon, or set the noise multiplier"
        )
    if not smallest and (target_epsilon < spent or noise_multiplier == math.inf):
        ratio_text = f" with quantile ratio {quantile_ratio:g}" if quantile_ratio is not None else ""
        raise ValueError(
            f"no noise multiplier up to 2^30 spends epsilon={target_epsilon:g} over {rounds} rounds at "
            f"delta={delta:.3g}{ratio_text}: raise epsilon or lower the quantile ratio"
        )
