"""Ditto's lambda per client from its validation data, against a plain loop."""

import math

import numpy as np

from jaxfl.experiment.lambda_selection import MIN_VALIDATION_EXAMPLES, select_lambda_per_client


def clients(validation_loss, test_error, validation_counts, attacked=None):
    test = {"num_examples": np.full(len(test_error), 10), "personal_error": np.asarray(test_error)}
    if attacked is not None:
        test["attacked"] = np.asarray(attacked, bool)
    validation = {"num_examples": np.asarray(validation_counts), "personal_loss": np.asarray(validation_loss)}
    return {"validation": validation, "test": test}


def test_each_client_takes_its_lowest_validation_loss():
    rng = np.random.default_rng(0)
    lams = [0.1, 1.0, 2.0]
    n = 30
    losses = rng.uniform(size=(3, n))
    losses[:, 0] = [0.5, 0.5, 0.7]  # A tie: the first candidate in grid order.
    losses[1, 1] = np.nan  # A diverged candidate never wins.
    errors = rng.uniform(size=(3, n))
    counts = rng.integers(1, 9, size=n)
    attacked = rng.uniform(size=n) < 0.3
    candidates = [(lam, clients(losses[j], errors[j], counts, attacked)) for j, lam in enumerate(lams)]
    got = select_lambda_per_client(candidates)
    expected_lam, expected_error = [], []
    for k in range(n):
        if counts[k] < MIN_VALIDATION_EXAMPLES:
            best = 1  # The candidate closest to lambda = 1.
        else:
            best, value = None, math.inf
            for j in range(3):
                if np.isfinite(losses[j, k]) and losses[j, k] < value:
                    best, value = j, losses[j, k]
        expected_lam.append(lams[best])
        expected_error.append(errors[best, k])
    np.testing.assert_array_equal(got["lam"], expected_lam)
    np.testing.assert_array_equal(got["test_error"], expected_error)
    benign = np.asarray(expected_error)[~attacked]
    np.testing.assert_allclose(got["summary"]["mean"], benign.mean(), rtol=1e-6)
    np.testing.assert_allclose(got["summary"]["std"], benign.std(), rtol=1e-5)


def test_no_selection_without_personal_validation_or_with_one_candidate():
    one = clients([0.1], [0.2], [10])
    assert select_lambda_per_client([(1.0, one)]) is None
    no_validation = {"test": one["test"]}
    assert select_lambda_per_client([(1.0, no_validation), (2.0, no_validation)]) is None
