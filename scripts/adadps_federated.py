"""AdaDPS-FL against DP-FedAvg and DP-FedAdam on Fashion-MNIST clients, in the shape of Li 2023, Figure 6.7.

The thesis's Figure 6.7 (Section 6.4.2) runs AdaDPS in federated learning (Algorithm 10: each client
divides its local gradients by side information A, then clips its update; DP-FedAvg's Gaussian noise
on the sum) against DP-FedAvg and DP-FedAdam on StackOverflow's 400 users, 20 per round, noise
multiplier 0.3, user-level (34, 0.0025)-DP, server momentum 0.9 and learning rate 1, one local epoch of
batch 100; A from token frequencies; AdaDPS about 5 points more accurate. StackOverflow is not on this
machine; here the clients are Fashion-MNIST's 60,000 training images over 100 clients by Dirichlet(0.5)
labels (Debian's `dataset-fashion-mnist`, or `--data-dir`), the model softmax regression on the 784
pixels (the thesis's StackOverflow model is linear too), and A the pixels' frequency, the rule of the
thesis's option 2 (A_j = E|x_j| + eps): the mean of pixel j over the 10,000 *test* images (public in
this benchmark, labels unused, none of a training client's), plus 0.01, divided by its maximum, so
that rare pixels take larger steps; the bias's A is 1.

Everything else is the CLI's (`jaxfl run`), as a user would run it: 20 clients per round, 150 rounds,
one local epoch of batch 100, clip norm 0.5, user-level (10, 0.01)-DP against an observer of the
released models (delta = 1/n, n = 100 clients; the noise multiplier calibrated by the run),
`--server-optimizer avgm` (learning rate 1, momentum 0.9) for DP-FedAvg and AdaDPS-FL, adam for
DP-FedAdam. Each method's learning rate (the local one; DP-FedAdam's server one) is tuned on a grid by
the mean test error over the seeds, as the thesis tunes.

    python scripts/adadps_federated.py --seeds 0 1 2

References:
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks. PhD thesis, CMU, 2023,
    Section 6.4.2, Algorithm 10, Figure 6.7.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from jaxfl.cli import main as jaxfl_main
from jaxfl.data.registry import load_dataset

EPSILON, CLIP_NORM, ROUNDS = 10.0, 0.5, 150
COMMON = [
    "--dataset", "fashion-mnist", "--dataset-option", "partition=dirichlet", "--dataset-option", "alpha=0.5",
    "--dataset-option", "num_clients=100", "--model", "linear", "--clients-per-round", "20",
    "--batch-size", "100", "--local-epochs", "1", "--clip-norm", str(CLIP_NORM), "--epsilon", str(EPSILON),
    "--no-progress",
]  # fmt: skip
# method -> (its flags, the flag tuned, its grid). The local rates reach far: with updates clipped to C,
# a larger rate makes a longer local path of which the clip keeps the direction.
LOCAL_RATES = (1.0, 3.0, 10.0, 30.0, 100.0)
METHODS = {
    "dp-fedavg": (["--algorithm", "dp-fedavg", "--server-optimizer", "avgm"], "--lr", LOCAL_RATES),
    "adadps": (["--algorithm", "adadps", "--server-optimizer", "avgm"], "--lr", LOCAL_RATES),
    "dp-fedadam": (["--algorithm", "dp-fedadam", "--lr", "0.1"], "--server-lr", (0.003, 0.01, 0.03)),
}


def pixel_side_information(images: np.ndarray, path: Path) -> Path:
    """The .npz of A for `linear`: kernel rows (mean pixel + 0.01) / its max, the bias 1."""
    frequency = images.reshape(len(images), -1).astype(np.float64).mean(axis=0) + 0.01
    kernel = (frequency / frequency.max()).astype(np.float32)[:, None]  # [784, 1]: the same per class.
    np.savez(path, **{"dense/kernel": kernel, "dense/bias": np.ones((), np.float32)})
    return path


def run(method: str, value: float, seed: int, side_information: Path, out: Path, extra=()) -> dict:
    """One `jaxfl run` of a method; its summary.json."""
    flags, tuned, _ = METHODS[method]
    flags = [*flags, "--side-information", str(side_information)] if method == "adadps" else flags
    argv = ["run", *COMMON, "--rounds", str(ROUNDS), *flags, tuned, str(value), "--seed", str(seed),
            "--eval-every", str(ROUNDS), "--out", str(out), *extra]  # fmt: skip
    if jaxfl_main(argv) != 0:
        raise RuntimeError(f"jaxfl {' '.join(argv)} failed")
    return json.loads((out / "summary.json").read_text())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--data-dir", help="folder of Fashion-MNIST's IDX files (default: Debian's)")
    args = parser.parse_args(argv)
    extra = ["--data-dir", args.data_dir] if args.data_dir else []
    test_images = np.asarray(load_dataset("fashion-mnist", data_dir=args.data_dir).test.features["x"])
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        side_information = pixel_side_information(test_images, Path(folder) / "a.npz")
        for method, (_, tuned, grid) in METHODS.items():
            results = {}
            for value in grid:
                summaries = [
                    run(method, value, seed, side_information, Path(folder) / f"{method}-{value}-{seed}",
                        extra)
                    for seed in args.seeds
                ]
                errors = [s["test_error"]["mean"] for s in summaries]
                noise_multiplier = summaries[0]["privacy"]["noise_multiplier"]
                results[value] = (np.mean(errors), np.std(errors), noise_multiplier)
                print(f"{method} {tuned} {value}: test error {np.mean(errors):.4f} ± {np.std(errors):.4f}")
            best = min(results, key=lambda value: results[value][0])
            rows.append((method, tuned, best, *results[best]))
    print(f"\nuser-level ({EPSILON:g}, 0.01)-DP, seeds {args.seeds}: mean test error over test clients, "
          "mean ± std over seeds")
    print("| method | tuned | test accuracy | test error | noise multiplier |\n|---|---|---|---|---|")
    for method, tuned, best, mean, std, z in rows:
        print(f"| {method} | {tuned} {best:g} | {1 - mean:.4f} | {mean:.4f} ± {std:.4f} | {z:.4f} |")


if __name__ == "__main__":
    main()
