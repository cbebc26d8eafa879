"""The accountant: epsilon of the subsampled Gaussian against dp-accounting
called independently, the quantile's composition, the budget split, and the
calibration (epsilon <= target, near-optimal, monotone in epsilon)."""

import math

import dp_accounting
import pytest
from dp_accounting.rdp import rdp_privacy_accountant

from jaxfl.privacy import accounting
from jaxfl.privacy.accounting import (
    Sampling,
    epsilon_spent,
    noise_multiplier_for,
    quantile_epsilon_for,
    sum_sensitivity,
)

SAMPLING = Sampling(num_clients=2500, clients_per_round=100)
DELTA = 1 / 2500


def _independent_epsilon(event, delta):
    """What dp-accounting says, built here by hand (replace-one, RDP)."""
    accountant = rdp_privacy_accountant.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
    )
    return accountant.compose(event).get_epsilon(delta)


def test_plain_subsampled_gaussian_matches_dp_accounting():
    z, rounds = 1.3, 300
    expected = _independent_epsilon(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.SampledWithoutReplacementDpEvent(2500, 100, dp_accounting.GaussianDpEvent(z)),
            rounds,
        ),
        DELTA,
    )
    assert epsilon_spent(rounds, SAMPLING, z, DELTA) == pytest.approx(expected, rel=1e-12)
    # More rounds spend more; none spend nothing.
    assert epsilon_spent(rounds + 100, SAMPLING, z, DELTA) > expected
    assert epsilon_spent(0, SAMPLING, z, DELTA) == 0.0


def test_full_participation_is_the_gaussian_mechanism_with_sensitivity_2c():
    # m = n: no amplification; T rounds of noise std z * 2C on a sum of
    # sensitivity 2C are (T / (2 z^2))-zCDP, whatever C is.
    z, rounds = 4.0, 50
    zcdp = _independent_epsilon(dp_accounting.ZCDpEvent(rounds / (2 * z**2)), DELTA)
    assert epsilon_spent(rounds, Sampling(100, 100), z, DELTA) == pytest.approx(zcdp, rel=1e-9)
    assert sum_sensitivity(1.5) == 3.0


def test_the_quantile_enters_as_zcdp_amplified_by_the_general_theorem():
    # dp-accounting amplifies only Gaussians under sampling without
    # replacement; the quantile is (eps_q^2 / 2)-zCDP, so the round takes
    # WBK19 Theorem 9 (tests/privacy/test_independent_accounting.py
    # recomputes it), which is looser than Theorem 27 for a Gaussian of the
    # same zCDP and tighter than no amplification.
    z, eps_q, rounds = 2.0, 0.3, 200
    zcdp_round = dp_accounting.SampledWithoutReplacementDpEvent(
        2500,
        100,
        dp_accounting.ComposedDpEvent(
            [dp_accounting.GaussianDpEvent(z), dp_accounting.ZCDpEvent(eps_q**2 / 2)]
        ),
    )
    with pytest.raises(dp_accounting.UnsupportedEventError):
        _independent_epsilon(zcdp_round, DELTA)
    merged = (z**-2 + eps_q**2) ** -0.5  # a Gaussian of equal zCDP
    as_gaussian = _independent_epsilon(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.SampledWithoutReplacementDpEvent(2500, 100, dp_accounting.GaussianDpEvent(merged)),
            rounds,
        ),
        DELTA,
    )
    got = epsilon_spent(rounds, SAMPLING, z, DELTA, quantile_epsilon=eps_q)
    assert (
        as_gaussian < got < epsilon_spent(rounds, SAMPLING, z, DELTA, quantile_epsilon=eps_q, amplified=False)
    )
    assert got > epsilon_spent(rounds, SAMPLING, z, DELTA)
    # The extension leaves every other event to the library, bit for bit.
    plain = dp_accounting.SelfComposedDpEvent(
        dp_accounting.SampledWithoutReplacementDpEvent(2500, 100, dp_accounting.GaussianDpEvent(merged)),
        rounds,
    )
    assert accounting.make_accountant().compose(plain).get_epsilon(DELTA) == as_gaussian


def test_the_bound_without_amplification_is_plain_zcdp_composition():
    z, eps_q, rounds = 2.0, 0.3, 200
    rho = rounds * (1 / (2 * z**2) + eps_q**2 / 2)
    expected = _independent_epsilon(dp_accounting.ZCDpEvent(rho), DELTA)
    got = epsilon_spent(rounds, SAMPLING, z, DELTA, quantile_epsilon=eps_q, amplified=False)
    assert got == pytest.approx(expected, rel=1e-9)
    assert got > epsilon_spent(rounds, SAMPLING, z, DELTA, quantile_epsilon=eps_q)


def test_budget_split_gives_the_quantile_r_times_the_update_rho():
    z, ratio = 1.7, 0.25
    eps_q = quantile_epsilon_for(z, ratio)
    assert eps_q**2 / 2 == pytest.approx(ratio * accounting.gaussian_rho(z))
    assert accounting.gaussian_rho(z) == pytest.approx(1 / (2 * z**2))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: epsilon_spent(10, SAMPLING, 1.0, 0.0), "delta"),
        (lambda: epsilon_spent(10, SAMPLING, 1.0, 1.0), "delta"),
        (lambda: epsilon_spent(10, SAMPLING, 0.0, DELTA), "noise_multiplier"),
        (lambda: epsilon_spent(10, Sampling(10, 11), 1.0, DELTA), "clients_per_round"),
        (lambda: epsilon_spent(-1, SAMPLING, 1.0, DELTA), "rounds"),
        (lambda: noise_multiplier_for(0.0, DELTA, 10, SAMPLING), "target_epsilon"),
        (
            lambda: noise_multiplier_for(5.0, DELTA, 10, SAMPLING, quantile_ratio=0.5, quantile_epsilon=0.1),
            "not both",
        ),
    ],
)
def test_invalid_arguments_raise(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# Small calibrations (the accountant's cost does not depend on T, n or m).
SMALL = Sampling(num_clients=200, clients_per_round=20)


@pytest.mark.slow
def test_calibration_meets_the_target_tightly_and_is_monotone_in_epsilon():
    multipliers = []
    for target in (1.0, 16.0):
        z = noise_multiplier_for(target, 1 / 200, 50, SMALL)
        spent = epsilon_spent(50, SMALL, z, 1 / 200)
        assert spent <= target
        # Near-optimal: a little less noise would overspend.
        assert epsilon_spent(50, SMALL, z * 0.99, 1 / 200) > target
        multipliers.append(z)
    assert multipliers[0] > multipliers[1]


def test_calibration_with_a_quantile_share():
    target, ratio = 4.0, 0.5
    z = noise_multiplier_for(target, 1 / 200, 50, SMALL, quantile_ratio=ratio)
    eps_q = quantile_epsilon_for(z, ratio)
    spent = epsilon_spent(50, SMALL, z, 1 / 200, quantile_epsilon=eps_q)
    assert target * 0.999 <= spent <= target
    # The update alone at this z spends less: the quantile has its share.
    assert epsilon_spent(50, SMALL, z, 1 / 200) < spent
    # Same total as one Gaussian of multiplier z / sqrt(1 + r).
    assert z / math.sqrt(1 + ratio) == pytest.approx(
        noise_multiplier_for(target, 1 / 200, 50, SMALL), rel=1e-3
    )


def test_a_fixed_quantile_that_alone_overspends_is_refused():
    with pytest.raises(ValueError, match="quantile alone"):
        noise_multiplier_for(1.0, 1 / 200, 50, SMALL, quantile_epsilon=5.0)


def test_runs_without_dp_do_not_import_the_accountant():
    # dp-accounting (and the SciPy it loads) is about half of a command's start-up.
    import subprocess
    import sys

    code = (
        "import sys, jaxfl.experiment.main, jaxfl.algorithms, jaxfl.privacy; "
        "sys.exit('dp_accounting' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
