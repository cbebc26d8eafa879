"""Point estimation with outliers: TERM (t = -2) against the mean (ERM), Huber and the medians.

Li 2023, Section 7.1, Figure 7.1a: a point estimate of 2D samples centred at (1, 1) with outliers; ERM
(t = 0) gives the sample mean, biased toward the outliers, while t < 0 suppresses them, approximately
recovering the geometric median. The thesis does not give the figure's data; here, per seed, n = 500
samples of which a fraction p in {20, 40, 80}% are outliers drawn from N((5, 5), 5^2 I) (diffuse, as the
N(5, 5) outlier targets of its robust regression, Section 7.7.1) and the rest inliers from N((1, 1), 0.5^2
I). The loss of sample x at theta is f = ||x - theta||^2 / 2. Estimators:

* ERM: the mean;
* TERM: full-batch gradient descent on the tilted risk (Algorithm 13, `jaxfl.training.tilted_erm`) with
  the thesis's continuation for negative tilts (Section 7.5: t from 0 to -2 over the first half of the
  steps), step 0.5, 400 steps from the origin;
* Huber (delta = 1, on the distance ||x - theta||): iteratively reweighted least squares from the mean;
* the geometric median (Weiszfeld's iteration, 500 steps from the mean) and the coordinate-wise median.

It reports the distance of each estimate to the inliers' centre (1, 1), mean (standard deviation) over
seeds; the thesis's claim is qualitative (no table).

    python scripts/term_point_estimation.py --seeds 0 1 2 3 4

References:
  [Li 2023] T. Li. Scalable and Trustworthy Learning in Heterogeneous Networks. PhD thesis, Carnegie
    Mellon University, 2023 (Section 7.1, Figure 7.1a; Algorithm 13; Section 7.5).
  [Huber 1964] P. J. Huber. Robust Estimation of a Location Parameter. The Annals of Mathematical
    Statistics, 1964.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxfl.training.tilted_erm import per_example_losses_and_grads, tilted_erm

CENTRE = np.array([1.0, 1.0])
OUTLIER_FRACTIONS = (0.2, 0.4, 0.8)
ESTIMATORS = ("ERM (mean)", "TERM t=-2", "Huber", "geometric median", "coordinate median")
STEPS, STEP_SIZE, TILT = 400, 0.5, -2.0


def samples(seed: int, fraction: float, n: int = 500) -> np.ndarray:
    """[n, 2]: inliers N((1, 1), 0.5^2 I), then a `fraction` of outliers N((5, 5), 5^2 I)."""
    rng = np.random.default_rng(seed)
    outliers = int(round(fraction * n))
    inliers = CENTRE + 0.5 * rng.standard_normal((n - outliers, 2))
    return np.concatenate([inliers, 5.0 + 5.0 * rng.standard_normal((outliers, 2))])


def term_estimate(points: np.ndarray) -> np.ndarray:
    def loss(theta, x):
        return 0.5 * jnp.sum((x - theta) ** 2)

    tilt = optax.linear_schedule(0.0, TILT, STEPS // 2)
    optimizer = optax.chain(tilted_erm(tilt), optax.sgd(STEP_SIZE))
    x = jnp.asarray(points, jnp.float32)

    def step(carry, _):
        theta, state = carry
        losses, grads = per_example_losses_and_grads(loss, theta, x)
        updates, state = optimizer.update(grads, state, theta, losses=losses)
        return (optax.apply_updates(theta, updates), state), None

    theta = jnp.zeros(2, jnp.float32)
    (theta, _), _ = jax.lax.scan(step, (theta, optimizer.init(theta)), None, length=STEPS)
    return np.asarray(theta, np.float64)


def huber_estimate(points: np.ndarray, delta: float = 1.0, iterations: int = 200) -> np.ndarray:
    theta = points.mean(axis=0)
    for _ in range(iterations):
        distance = np.linalg.norm(points - theta, axis=1)
        weights = np.where(distance <= delta, 1.0, delta / np.maximum(distance, 1e-12))
        theta = weights @ points / weights.sum()
    return theta


def weiszfeld(points: np.ndarray, iterations: int = 500) -> np.ndarray:
    theta = points.mean(axis=0)
    for _ in range(iterations):
        inverse = 1.0 / np.maximum(np.linalg.norm(points - theta, axis=1), 1e-12)
        theta = inverse @ points / inverse.sum()
    return theta


def estimates(points: np.ndarray) -> dict[str, np.ndarray]:
    return {
        "ERM (mean)": points.mean(axis=0),
        "TERM t=-2": term_estimate(points),
        "Huber": huber_estimate(points),
        "geometric median": weiszfeld(points),
        "coordinate median": np.median(points, axis=0),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    args = parser.parse_args(argv)
    errors = {(name, p): [] for name in ESTIMATORS for p in OUTLIER_FRACTIONS}
    for p in OUTLIER_FRACTIONS:
        for seed in args.seeds:
            for name, value in estimates(samples(seed, p)).items():
                errors[name, p].append(float(np.linalg.norm(value - CENTRE)))
    print(f"distance to the inliers' centre (1, 1), mean (std) over seeds {args.seeds}; n = 500")
    print("| estimator | " + " | ".join(f"{int(100 * p)}% outliers" for p in OUTLIER_FRACTIONS) + " |")
    print("|---|" + "---|" * len(OUTLIER_FRACTIONS))
    for name in ESTIMATORS:
        cells = [f"{np.mean(errors[name, p]):.3f} ({np.std(errors[name, p]):.3f})" for p in OUTLIER_FRACTIONS]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
