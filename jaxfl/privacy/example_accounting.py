r"""Privacy accounting of example-level DP in federated rounds (clients that train by DP-SGD).

Unit of privacy and adjacency. Two training populations are neighbours when
one example of one client is replaced by another; every client's number of
examples, the number n of clients and the cohort size m are public. This is
the adjacency of `jaxfl.algorithms.dp_sgd_fedavg`.

One local step releases (to whoever sees the client's update) the noisy sum
of the batch's clipped per-example gradients, sum_j clip(g_j, C) + N(0,
(z 2C)^2 I): replacing one example moves the sum by at most 2C, so the step
is the Gaussian mechanism of multiplier z, of Renyi DP alpha / (2 z^2) at
order alpha (Mironov 2017, Proposition 7), whatever the other steps
released before it (adaptive composition). An example is in one batch per
epoch (each epoch visits a permutation of the client's examples), so one
round of a client that trains E epochs composes E such steps for each of its
examples: rho alpha with rho = E / (2 z^2). Stragglers and a step cap only
remove steps.

Two trust models, as for client-level DP (`jaxfl.privacy.budget`):

* **server**: the server draws the cohort and sees each client's update. No
  amplification: the example's client is counted in every round, so T rounds
  give T rho alpha.
* **observer**: sees the released models, not the (secret) cohorts. Round t
  draws the example's client with probability q = m / n, independently of
  the data. The round's output is then a mixture (1 - q) R + q P under one
  population and (1 - q) R + q Q under its neighbour, with the same R (the
  cohorts without that client) and P, Q within rho alpha of each other in
  Renyi divergence. (P, Q) -> int P^alpha Q^(1 - alpha) is jointly convex
  for alpha > 1 (the perspective of t^alpha), hence

      eps_round(alpha) <= log(1 - q + q exp((alpha - 1) rho alpha)) / (alpha - 1),

  never more than rho alpha, and T rounds compose to T eps_round(alpha). The
  sharper bounds for sampling without replacement (Wang, Balle and
  Kasiviswanathan 2019, Theorems 9 and 27, used for client-level DP) compare
  cohorts that differ in *which* client they hold, which example-level DP does
  not bound (those cohorts differ in a whole client's data), so they are not
  used here.

Epsilon at a delta comes from the Renyi DP of the whole run by dp-accounting's
conversion (`rdp_privacy_accountant.compute_epsilon`: Canonne, Kamath and
Steinke 2020, Proposition 12) at dp-accounting's default orders.

References:
  [Abadi et al. 2016] Deep Learning with Differential Privacy. CCS 2016.
  [Mironov 2017] Renyi Differential Privacy. CSF 2017.
  [Wang, Balle and Kasiviswanathan 2019] Subsampled Renyi Differential Privacy and Analytical Moments
    Accountant. AISTATS 2019.
  [Canonne, Kamath and Steinke 2020] The Discrete Gaussian for Differential Privacy. NeurIPS 2020.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from jaxfl.privacy.accounting import Sampling, check_sampling

ACCOUNTANT_NAME = (
    "Renyi DP of the example's local DP-SGD steps (Gaussian, replace-one-example sensitivity 2C), client "
    "sampling by joint convexity (observer) or none (server), converted by "
    "dp_accounting.rdp.compute_epsilon at its default orders"
)
# The calibration's bracket: the noise multipliers it searches between.
_SMALLEST_NOISE_MULTIPLIER = 1e-2
_LARGEST_NOISE_MULTIPLIER = 2.0**30


def _orders() -> np.ndarray:
    from dp_accounting.rdp import rdp_privacy_accountant

    return np.asarray(rdp_privacy_accountant.DEFAULT_RDP_ORDERS, np.float64)


def example_level_rdp(
    rounds: int,
    sampling: Sampling,
    noise_multiplier: float,
    steps_per_round: int,
    orders: np.ndarray,
    *,
    amplified: bool = True,
) -> np.ndarray:
    """Renyi DP at `orders` of `rounds` rounds for one example (module docstring).

    Args:
      rounds: T >= 0.
      sampling: n clients, m per round.
      noise_multiplier: z > 0, the noise std of a step over its sensitivity 2C.
      steps_per_round: E >= 1, the steps of a round that read the example (its client's epochs).
      orders: Renyi orders > 1.
      amplified: True: against an observer (client sampling secret); False: against the server.

    Returns:
      float64 array of the run's RDP, one entry per order.
    """
    sampling = check_sampling(sampling)
    orders = np.asarray(orders, np.float64)
    rho = steps_per_round / (2.0 * noise_multiplier**2)
    unsampled = rho * orders
    if not amplified or sampling.clients_per_round == sampling.num_clients:
        return rounds * unsampled
    q = sampling.rate
    # log(1 - q + q e^x), x = (alpha - 1) rho alpha, without overflow.
    log_moment = np.logaddexp(math.log1p(-q), math.log(q) + (orders - 1.0) * unsampled)
    return rounds * np.minimum(log_moment / (orders - 1.0), unsampled)


@functools.lru_cache(maxsize=4096)
def example_level_epsilon(
    rounds: int,
    sampling: Sampling,
    noise_multiplier: float,
    steps_per_round: int,
    delta: float,
    *,
    amplified: bool = True,
) -> float:
    """Epsilon of (epsilon, delta) example-level DP after `rounds` rounds (0 rounds: 0).

    Raises:
      ValueError: rounds < 0, steps_per_round < 1, z <= 0 or not finite, delta outside (0, 1).
    """
    _check(rounds, steps_per_round, delta)
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ValueError(f"noise_multiplier must be a finite number > 0, got {noise_multiplier:g}")
    if rounds == 0:
        return 0.0
    from dp_accounting.rdp import rdp_privacy_accountant

    orders = _orders()
    rdp = example_level_rdp(rounds, sampling, noise_multiplier, steps_per_round, orders, amplified=amplified)
    epsilon, _ = rdp_privacy_accountant.compute_epsilon(orders, rdp, delta)
    return float(epsilon)


@functools.lru_cache(maxsize=256)
def example_level_noise_multiplier(
    target_epsilon: float,
    delta: float,
    rounds: int,
    sampling: Sampling,
    steps_per_round: int,
    *,
    amplified: bool = True,
    tolerance: float = 1e-5,
) -> float:
    """The smallest z (to `tolerance`, relative) whose run spends at most `target_epsilon`.

    Epsilon decreases strictly in z, so bisection on log z finds it; the
    upper end is returned, whose epsilon is within the target.

    Raises:
      ValueError: a target no z in [1e-2, 2^30] meets, or one the smallest
        already meets (such a budget protects nothing), each in one line.
    """
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise ValueError(f"epsilon must be a finite number > 0, got {target_epsilon:g}")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1 to calibrate noise, got {rounds}")

    def spent(z: float) -> float:
        return example_level_epsilon(rounds, sampling, z, steps_per_round, delta, amplified=amplified)

    if spent(_SMALLEST_NOISE_MULTIPLIER) <= target_epsilon:
        raise ValueError(
            f"epsilon={target_epsilon:g} is at least what the smallest noise multiplier calibrated "
            f"({_SMALLEST_NOISE_MULTIPLIER:g}) spends over {rounds} rounds at delta={delta:.3g}: such a "
            "budget protects nothing; lower epsilon, or set the noise multiplier"
        )
    if spent(_LARGEST_NOISE_MULTIPLIER) > target_epsilon:
        raise ValueError(
            f"no noise multiplier up to 2^30 spends epsilon={target_epsilon:g} over {rounds} rounds at "
            f"delta={delta:.3g}: raise epsilon or delta"
        )
    low, high = _SMALLEST_NOISE_MULTIPLIER, _LARGEST_NOISE_MULTIPLIER
    while high - low > tolerance * high:
        middle = math.sqrt(low * high)
        if spent(middle) <= target_epsilon:
            high = middle
        else:
            low = middle
    return high


def _check(rounds, steps_per_round, delta) -> None:
    if int(rounds) != rounds or rounds < 0:
        raise ValueError(f"rounds must be an integer >= 0, got {rounds}")
    if int(steps_per_round) != steps_per_round or steps_per_round < 1:
        raise ValueError(f"steps_per_round must be an integer >= 1, got {steps_per_round}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta:g}")
