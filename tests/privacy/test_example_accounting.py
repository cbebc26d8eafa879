"""Example-level accounting: the server's epsilon is dp-accounting's composed Gaussian, the observer's
is the joint-convexity bound recomputed by hand and checked against Renyi divergences integrated
numerically, and the calibration meets its target tightly."""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant
from privacy.test_independent_accounting import eps_from_rdp
from scipy import integrate

from jaxfl.privacy.accounting import Sampling
from jaxfl.privacy.example_accounting import (
    example_level_epsilon,
    example_level_noise_multiplier,
    example_level_rdp,
)

DELTA = 1e-5


@pytest.mark.parametrize("z, steps, rounds", [(0.8, 1, 10), (1.5, 3, 40), (4.0, 2, 200)])
def test_against_the_server_it_is_the_library_composing_every_step(z, steps, rounds):
    library = rdp_privacy_accountant.RdpAccountant()
    library.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), rounds * steps))
    ours = example_level_epsilon(rounds, Sampling(100, 10), z, steps, DELTA, amplified=False)
    assert ours == pytest.approx(library.get_epsilon(DELTA), rel=1e-12)


@pytest.mark.parametrize(
    "z, steps, rounds, n, m", [(0.8, 1, 10, 100, 10), (1.5, 3, 40, 50, 5), (3.0, 2, 300, 1000, 10)]
)
def test_against_an_observer_it_is_the_joint_convexity_bound_by_hand(z, steps, rounds, n, m):
    orders = np.asarray(rdp_privacy_accountant.DEFAULT_RDP_ORDERS, np.float64)
    q, rho = m / n, steps / (2 * z * z)

    def log_moment(x):  # log(1 - q + q e^x), its large-x form where e^x overflows
        return math.log((1 - q) + q * math.exp(x)) if x < 700 else math.log(q) + x

    per_round = [min(log_moment((a - 1) * a * rho) / (a - 1), a * rho) for a in orders]
    hand = eps_from_rdp(orders, rounds * np.array(per_round), DELTA)
    ours = example_level_epsilon(rounds, Sampling(n, m), z, steps, DELTA)
    assert ours == pytest.approx(hand, rel=1e-9)
    server = example_level_epsilon(rounds, Sampling(n, m), z, steps, DELTA, amplified=False)
    assert ours < server  # Sampling secret: smaller.
    assert example_level_epsilon(rounds, Sampling(n, n), z, steps, DELTA) == pytest.approx(server)


def _renyi(p, q, alpha, grid):
    """D_alpha(P || Q) of densities on a grid, by quadrature."""
    values = np.exp(alpha * np.log(p) + (1 - alpha) * np.log(q))
    return math.log(integrate.trapezoid(values, grid)) / (alpha - 1)


@pytest.mark.parametrize("shared", [-12.0, -6.0, 0.0, 0.5, 4.0])
@pytest.mark.parametrize("alpha", [2.0, 3.5, 8.0])
def test_the_bound_holds_for_mixtures_with_any_shared_component(shared, alpha):
    # One round seen by an observer: (1 - q) R + q N(0, s^2) against (1 - q) R + q N(1, s^2), R whatever
    # the cohorts without the example's client release (here N(shared, s^2)); the bound must hold for all R.
    q, s = 0.2, 1.3
    grid = np.linspace(-30, 30, 60_001)

    def normal(mean):
        return np.exp(-((grid - mean) ** 2) / (2 * s * s)) / (s * math.sqrt(2 * math.pi))

    p = (1 - q) * normal(shared) + q * normal(0.0)
    other = (1 - q) * normal(shared) + q * normal(1.0)
    divergence = max(_renyi(p, other, alpha, grid), _renyi(other, p, alpha, grid))
    # The sensitivity-1 Gaussian of std s is the multiplier-s mechanism with one step.
    bound = example_level_rdp(1, Sampling(5, 1), s, 1, np.array([alpha]))[0]
    assert divergence <= bound * (1 + 1e-9)
    # Tight: a shared part far from the mechanism's outputs (the cohorts reveal whether the client was in).
    if shared == -12.0:
        assert divergence == pytest.approx(bound, rel=1e-3)
    # And the amplification is real where the shared part sits on the mechanism's outputs.
    if shared in (0.0, 0.5):
        assert divergence < 0.6 * alpha / (2 * s * s)


@pytest.mark.parametrize("amplified", [True, False])
def test_calibration_meets_the_target_tightly(amplified):
    sampling = Sampling(200, 20)
    z = example_level_noise_multiplier(3.0, DELTA, 30, sampling, 2, amplified=amplified)
    assert example_level_epsilon(30, sampling, z, 2, DELTA, amplified=amplified) <= 3.0
    assert example_level_epsilon(30, sampling, z * (1 - 1e-4), 2, DELTA, amplified=amplified) > 3.0


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: example_level_noise_multiplier(1e9, DELTA, 3, Sampling(10, 2), 1), ["protects nothing"]),
        (lambda: example_level_noise_multiplier(-1.0, DELTA, 3, Sampling(10, 2), 1), ["epsilon", "> 0"]),
        (lambda: example_level_epsilon(3, Sampling(10, 2), 1.0, 0, DELTA), ["steps_per_round", ">= 1"]),
        (lambda: example_level_epsilon(3, Sampling(10, 2), 0.0, 1, DELTA), ["noise_multiplier", "> 0"]),
        (lambda: example_level_epsilon(3, Sampling(10, 2), 1.0, 1, 1.0), ["delta", "(0, 1)"]),
    ],
)
def test_bad_arguments_are_refused_in_one_line(call, words):
    with pytest.raises(ValueError) as error:
        call()
    message = str(error.value)
    assert "\n" not in message and all(word in message for word in words), message
