"""Reproduce Figure 5 of 004 (Section 7.6): the error of the DP quantile.

n = 256 values from Uniform[0, 10] or chi-square(4) clipped to [0, 10] are
summarized by 004 Algorithm 2 (`jaxfl.primitives.dp_quantile`) with b bins
and a secure sum modulo M = 2^bits. The quantile error of 004 eq. 19,
|H(j*(H_hat)) / n - (1 - theta)|, is averaged over theta = 0.1, ..., 0.9;
mean and standard deviation are over independent runs (fresh data and noise).

Privacy calibration (the choices are printed into the CSV):

* The x-axis epsilon is (epsilon, delta)-DP with delta = 1e-5 (the caption of
  Figure 5). Algorithm 2 is (epsilon_z^2 / 2)-zCDP (Theorem 6(a)); rho =
  epsilon_z^2 / 2 is the largest rho whose zCDP -> (epsilon, delta)
  conversion stays within epsilon. The conversion is the tight one of
  Canonne, Kamath and Steinke (2020, Proposition 12 / Corollary 13), as in
  the distributed discrete Gaussian paper the algorithm builds on; `--conversion
  bun-steinke` uses epsilon = rho + 2 sqrt(rho log(1/delta)) instead.
* Theorem 6 fixes only sigma / c. Following 004 ("take sigma = O(1) and
  c = O(epsilon sqrt(n))", and c is there to keep sigma away from the
  degenerate sigma -> 0), the scale c is the smallest integer for which the
  sigma reaching epsilon_z is at least `--sigma-floor` (default 1, where the
  psi term of Theorem 6 is negligible), and sigma is then solved exactly by
  `dp_quantile_sigma`. So c grows with epsilon, and with it the scaled counts
  c h that must fit in (-M/2, M/2]: that is why small bit widths wrap around
  at large epsilon.

Usage:
  python scripts/figure5_dp_quantile.py            # the full protocol
  python scripts/figure5_dp_quantile.py --quick    # a 1-minute subset
Writes <out>/figure5.csv and <out>/figure5.png (default out: runs/figure5).
"""

from __future__ import annotations

import argparse
import csv
import functools
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from scipy.optimize import brentq, minimize_scalar

from jaxfl.primitives import (
    dp_hierarchical_histogram,
    dp_quantile_epsilon,
    dp_quantile_modulus,
    dp_quantile_scale,
    dp_quantile_sigma,
    hierarchical_histogram,
    histogram_quantile,
)

UPPER = 10.0
THETAS = np.round(np.arange(1, 10) / 10, 1).astype(np.float32)


# ---------------------------------------------------------------------------
# zCDP -> (epsilon, delta)-DP


def approx_dp_epsilon(rho: float, delta: float, conversion: str) -> float:
    """The (epsilon, delta)-DP epsilon of a rho-zCDP mechanism."""
    if rho <= 0:
        return 0.0
    log_inv_delta = math.log(1 / delta)
    if conversion == "bun-steinke":  # Bun & Steinke 2016, Proposition 1.3
        return rho + 2 * math.sqrt(rho * log_inv_delta)

    # Canonne, Kamath, Steinke 2020: inf over alpha > 1 of
    # alpha rho + (log(1/delta) + (alpha-1) log(1 - 1/alpha) - log(alpha)) / (alpha-1).
    def bound(log_alpha_minus_one):
        alpha = 1 + math.exp(log_alpha_minus_one)
        return alpha * rho + (
            log_inv_delta + (alpha - 1) * math.log1p(-1 / alpha) - math.log(alpha)
        ) / (alpha - 1)

    result = minimize_scalar(
        bound, bounds=(-12, 12), method="bounded", options={"xatol": 1e-10}
    )
    return float(result.fun)


def zcdp_epsilon_for(epsilon: float, delta: float, conversion: str) -> float:
    """epsilon_z = sqrt(2 rho) with rho the largest zCDP within (epsilon, delta)."""
    rho = brentq(
        lambda r: approx_dp_epsilon(r, delta, conversion) - epsilon,
        1e-12,
        10 * epsilon + 10,
        xtol=1e-14,
    )
    return math.sqrt(2 * rho)


def calibrate(epsilon_z: float, num_bins: int, num_clients: int, sigma_floor: float):
    """(c, sigma): the smallest integer c whose sigma for epsilon_z is >= the floor."""
    scale = max(
        1,
        math.ceil(
            dp_quantile_scale(epsilon_z, num_bins, num_clients, sigma_floor) - 1e-9
        ),
    )
    sigma = dp_quantile_sigma(epsilon_z, num_bins, num_clients, scale)
    return scale, sigma


# ---------------------------------------------------------------------------
# The experiment


def sample_values(distribution: str, num_clients: int, rng: np.random.Generator):
    """Draws n values: Uniform[0, 10] or chi-square(4) clipped to [0, 10]."""
    if distribution == "uniform":
        return rng.uniform(0, UPPER, num_clients).astype(np.float32)
    return np.clip(rng.chisquare(4, num_clients), 0, UPPER).astype(np.float32)


@functools.cache
def error_fn(num_bins: int, modulus: int):
    """Jitted: mean over theta of the eq. 19 error, for batches of runs."""

    def one(key, values, sigma, scale):
        noisy = dp_hierarchical_histogram(
            key,
            values,
            num_bins=num_bins,
            upper=UPPER,
            sigma=sigma,
            scale=scale,
            modulus=modulus,
        )
        num_values = values.shape[0]
        estimates = jax.vmap(histogram_quantile, in_axes=(None, 0, None, None))(
            noisy, jnp.asarray(THETAS), num_values, UPPER
        )
        j_star = jnp.rint(estimates * num_bins / UPPER).astype(jnp.int32)  # 1-based
        exact_cdf = jnp.cumsum(hierarchical_histogram(values, num_bins, UPPER)[0])
        errors = jnp.abs(exact_cdf[j_star - 1] / num_values - (1 - jnp.asarray(THETAS)))
        return jnp.mean(errors)

    # vmap over (epsilon settings) x (runs).
    return jax.jit(
        jax.vmap(jax.vmap(one, in_axes=(0, 0, None, None)), in_axes=(0, None, 0, 0))
    )


def run_keys(base_key, dist_index: int, num_epsilons: int, num_runs: int):
    """[epsilons, runs] keys: fold_in(fold_in(fold_in(key, dist), eps), run)."""
    dist_key = jax.random.fold_in(base_key, dist_index)
    return jnp.stack(
        [
            jnp.stack(
                [
                    jax.random.fold_in(jax.random.fold_in(dist_key, e), r)
                    for r in range(num_runs)
                ]
            )
            for e in range(num_epsilons)
        ]
    )


def run(args) -> list[dict]:
    """The whole sweep; one CSV row per (distribution, b, bit width, epsilon)."""
    rows = []
    settings = {}
    for num_bins in args.bins:
        for epsilon in args.epsilons:
            epsilon_z = zcdp_epsilon_for(epsilon, args.delta, args.conversion)
            scale, sigma = calibrate(
                epsilon_z, num_bins, args.num_clients, args.sigma_floor
            )
            achieved = dp_quantile_epsilon(num_bins, args.num_clients, sigma, scale)
            assert achieved <= epsilon_z * (1 + 1e-9)
            settings[num_bins, epsilon] = (epsilon_z, scale, sigma)
    base_key = jax.random.key(args.seed)
    for dist_index, distribution in enumerate(args.distributions):
        rng = np.random.default_rng([args.seed, dist_index])
        values = np.stack(
            [
                sample_values(distribution, args.num_clients, rng)
                for _ in range(args.runs)
            ]
        )
        for num_bins in args.bins:
            sigmas = np.array(
                [settings[num_bins, e][2] for e in args.epsilons], np.float32
            )
            scales = np.array(
                [settings[num_bins, e][1] for e in args.epsilons], np.float32
            )
            # Same noise for every bit width (common random numbers): the
            # differences between bit widths are the wraparound alone.
            keys = run_keys(base_key, dist_index, len(args.epsilons), args.runs)
            for bits in args.bit_widths:
                start = time.time()
                errors = np.asarray(
                    error_fn(num_bins, 2**bits)(keys, values, sigmas, scales)
                )
                for e_index, epsilon in enumerate(args.epsilons):
                    epsilon_z, scale, sigma = settings[num_bins, epsilon]
                    needed = dp_quantile_modulus(
                        num_bins, args.num_clients, sigma, scale, args.delta
                    )
                    rows.append(
                        dict(
                            distribution=distribution,
                            num_bins=num_bins,
                            bit_width=bits,
                            epsilon=epsilon,
                            delta=args.delta,
                            conversion=args.conversion,
                            zcdp_epsilon=round(epsilon_z, 6),
                            scale=scale,
                            sigma=round(sigma, 6),
                            theorem6_bit_width=round(math.log2(needed), 2),
                            mean_error=float(errors[e_index].mean()),
                            std_error=float(errors[e_index].std(ddof=1))
                            if args.runs > 1
                            else 0.0,
                            runs=args.runs,
                        )
                    )
                print(
                    f"{distribution:8s} b={num_bins:4d} bits={bits:2d}: "
                    + " ".join(
                        f"{e:g}:{errors[i].mean():.3f}"
                        for i, e in enumerate(args.epsilons)
                    )
                    + f"  ({time.time() - start:.1f}s)",
                    flush=True,
                )
    return rows


def write_csv(rows, path):
    """Writes the rows with a header."""
    with open(path, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path):
    """Reads rows written by `write_csv` back, with numeric columns typed."""
    types = dict(
        num_bins=int,
        bit_width=int,
        epsilon=float,
        mean_error=float,
        std_error=float,
        runs=int,
    )
    with open(path, newline="") as file:
        return [
            {k: types.get(k, str)(v) for k, v in row.items()}
            for row in csv.DictReader(file)
        ]


def plot(rows, args, path):
    """Error vs epsilon, one panel per (distribution, b), one line per width."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(
        len(args.distributions),
        len(args.bins),
        figsize=(3.2 * len(args.bins), 2.8 * len(args.distributions)),
        sharex=True,
        sharey=True,
        squeeze=False,
    )
    for i, distribution in enumerate(args.distributions):
        for j, num_bins in enumerate(args.bins):
            ax = axes[i][j]
            for bits in args.bit_widths:
                sel = [
                    r
                    for r in rows
                    if r["distribution"] == distribution
                    and r["num_bins"] == num_bins
                    and r["bit_width"] == bits
                ]
                eps = np.array([r["epsilon"] for r in sel])
                mean = np.array([r["mean_error"] for r in sel])
                std = np.array([r["std_error"] for r in sel])
                ax.plot(eps, mean, marker="o", ms=3, label=f"{bits} bits")
                ax.fill_between(eps, mean - std, mean + std, alpha=0.15)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xticks(args.epsilons)
            ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.tick_params(axis="x", labelsize=7)
            ax.set_title(f"{distribution}, b = {num_bins}", fontsize=9)
            if i == len(args.distributions) - 1:
                ax.set_xlabel(r"$\varepsilon$ ($\delta = 10^{-5}$)")
            if j == 0:
                ax.set_ylabel("quantile error (eq. 19)")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(
        f"DP quantile (004 Algorithm 2), n = {args.num_clients}, {args.runs} runs",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=130)


def parse_args(argv=None):
    """The command-line flags (--quick shrinks the grid)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/figure5")
    parser.add_argument(
        "--quick", action="store_true", help="b = 64, 3 bit widths, 4 epsilons, 3 runs"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-clients", type=int, default=256)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--bins", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    parser.add_argument(
        "--bit-widths", type=int, nargs="+", default=[10, 12, 14, 16, 20, 32]
    )
    parser.add_argument(
        "--epsilons", type=float, nargs="+", default=[0.5, 1, 2, 3, 4, 5, 6, 8, 10]
    )
    parser.add_argument("--distributions", nargs="+", default=["uniform", "chi2"])
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--sigma-floor", type=float, default=1.0)
    parser.add_argument("--conversion", choices=["cks", "bun-steinke"], default="cks")
    parser.add_argument(
        "--replot",
        action="store_true",
        help="redraw the PNG from an existing CSV in --out",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.bins, args.bit_widths, args.epsilons, args.runs = (
            [64],
            [10, 16, 32],
            [1, 2, 5, 8],
            3,
        )
    return args


def main(argv=None):
    """Runs the sweep (or redraws the plot) and writes CSV and PNG."""
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.replot:
        rows = read_csv(os.path.join(args.out, "figure5.csv"))
        args.distributions = list(dict.fromkeys(r["distribution"] for r in rows))
        args.bins = sorted({r["num_bins"] for r in rows})
        args.bit_widths = sorted({r["bit_width"] for r in rows})
        args.epsilons = sorted({r["epsilon"] for r in rows})
        args.runs = rows[0]["runs"]
        plot(rows, args, os.path.join(args.out, "figure5.png"))
        print(f"redrew {args.out}/figure5.png")
        return
    rows = run(args)
    write_csv(rows, os.path.join(args.out, "figure5.csv"))
    plot(rows, args, os.path.join(args.out, "figure5.png"))
    print(f"wrote {args.out}/figure5.csv and {args.out}/figure5.png")


if __name__ == "__main__":
    main()
