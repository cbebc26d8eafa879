"""The point-estimation sanity check of Ditto's lambda (thesis section 5.2.3,
App. 5.4; `shared/notes/thesis-spec.md` section 5.4).

Device k observes n values x_{k,i} = w_k + z with z ~ N(0, sigma^2) and
w_k = theta + zeta_k, zeta_k ~ N(0, tau^2) (benign) or N(0, tau_a^2)
(adversarial). With F_k(w) = (w - xbar_k)^2 / 2, Ditto's personal solution
is (Lemma 16) w_k(lambda) = lambda/(1 + lambda) w* + xbar_k/(1 + lambda),
w* = mean_k xbar_k. The benign devices' mean squared error is smallest at
lambda* = sigma^2 / (n tau^2) (clean) and at lambda_a* (eq. 5.60) under
attack, with minimum sigma_{w,a}^2 (eq. 5.68-5.83).
"""

import numpy as np
import pytest

LAMBDAS = np.concatenate([np.arange(0, 3.0001, 0.2), np.arange(3.5, 10.0001, 0.5), np.arange(20, 191, 10)])


def personal_estimate(xbar, lam):
    """Lemma 16: the minimizer of F_k(v) + lambda/2 (v - w*)^2, F_k = (v - xbar_k)^2 / 2."""
    w_star = xbar.mean(axis=-1, keepdims=True)
    return lam / (1 + lam) * w_star + xbar / (1 + lam)


def lambda_star(sigma, n, tau, num_devices, num_adversaries=0, tau_a=0.0):
    return sigma**2 / n * num_devices / (
        num_devices * tau**2 + num_adversaries / (num_devices - 1) * (tau_a**2 - tau**2)
    )


def minimum_error(sigma, n, tau, num_devices, num_adversaries=0, tau_a=0.0):
    sigma_n2 = sigma**2 / n
    spread = num_devices * tau**2 + sigma_n2 + num_adversaries / (num_devices - 1) * (tau_a**2 - tau**2)
    return 1.0 / (1.0 / sigma_n2 + (num_devices - 1) / spread)


@pytest.mark.parametrize(
    "num_devices, num_adversaries, tau_a, expected_lambda",
    [(8, 0, 0.0, 2.133), (16, 8, 0.5, 1.185)],
    ids=["clean", "adversarial"],
)
def test_empirical_best_lambda_is_the_theoretical_one(num_devices, num_adversaries, tau_a, expected_lambda):
    sigma, n, tau, trials = 0.8, 30, 0.1, 40_000
    lam_star = lambda_star(sigma, n, tau, num_devices, num_adversaries, tau_a)
    assert lam_star == pytest.approx(expected_lambda, abs=1e-3)  # The thesis's values.
    rng = np.random.default_rng(0)
    spread = np.full(num_devices, tau)
    spread[:num_adversaries] = tau_a
    w = rng.normal(size=(trials, num_devices)) * spread  # theta = 0: the estimates are equivariant.
    xbar = w + rng.normal(size=(trials, num_devices)) * sigma / np.sqrt(n)
    benign = slice(num_adversaries, None)
    errors = np.array([
        np.mean((personal_estimate(xbar, lam)[:, benign] - w[:, benign]) ** 2) for lam in LAMBDAS
    ])  # fmt: skip
    best = LAMBDAS[np.argmin(errors)]
    # The grid steps by 0.2 below 3: the empirical best is the grid point next to lambda*.
    assert abs(best - lam_star) <= 0.2
    # And the error there is the theory's minimum (1000 trials in the thesis; 40,000 here).
    at_star = np.mean((personal_estimate(xbar, lam_star)[:, benign] - w[:, benign]) ** 2)
    theory = minimum_error(sigma, n, tau, num_devices, num_adversaries, tau_a)
    assert at_star == pytest.approx(theory, rel=0.03)
    # Neither extreme is as good: local (lambda = 0) and global (lambda = 190).
    assert errors[0] > 1.5 * at_star and errors[-1] > 1.1 * at_star
