"""The point-estimation script's estimators on a small sample: each against its definition."""

from pathlib import Path

import numpy as np
from reference import imported_script
from scipy import optimize

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "term_point_estimation.py"


def test_the_estimators_meet_their_definitions():
    with imported_script(SCRIPT) as script:
        points = script.samples(3, 0.4, n=120)
        found = script.estimates(points)
    assert points.shape == (120, 2)
    np.testing.assert_allclose(found["ERM (mean)"], points.mean(axis=0))
    # The geometric median and the Huber estimate minimize their objectives (checked by SciPy).
    distance = lambda theta: np.linalg.norm(points - theta, axis=1)
    huber = lambda d: np.where(d <= 1.0, 0.5 * d**2, d - 0.5)
    for name, objective in (("geometric median", lambda t: distance(t).sum()),
                            ("Huber", lambda t: huber(distance(t)).sum())):
        best = optimize.minimize(objective, points.mean(axis=0), method="Nelder-Mead",
                                 options={"xatol": 1e-8, "fatol": 1e-10, "maxiter": 4000}).x
        np.testing.assert_allclose(found[name], best, atol=1e-3)
    # TERM at t = -2 is a stationary point of the tilted risk: its weighted residuals cancel.
    theta = found["TERM t=-2"]
    losses = 0.5 * distance(theta) ** 2
    weights = np.exp(-2.0 * (losses - losses.min()))
    gradient = (weights[:, None] * (theta - points)).sum(axis=0) / weights.sum()
    assert np.linalg.norm(gradient) < 1e-3
    assert np.linalg.norm(theta - script.CENTRE) < 0.5 * np.linalg.norm(found["ERM (mean)"] - script.CENTRE)
