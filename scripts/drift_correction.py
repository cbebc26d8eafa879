"""Does drift correction help on heterogeneous data? SCAFFOLD and FedNova against FedAvg.

SCAFFOLD (Karimireddy et al. 2020) corrects each local step by control
variates c - c_i, and FedNova (Wang et al. 2020) normalizes each client's
update by its number of local steps; both papers report that on
heterogeneous clients with many local steps they reach a lower training
objective than FedAvg in the same rounds. This script runs the three side by
side, on the same cohorts (one `jaxfl run` per seed compares them), on

* `synthetic`: Synthetic(1,1) of Li et al. (FedProx), 100 clients of
  power-law sizes, softmax regression, 10 clients per round, E = 20, B = 10,
  lr 0.01 (the FedProx paper's setting), 200 rounds;
* `synthetic-e2`: the same with E = 2;
* `fashion-mnist`: Fashion-MNIST over 100 clients by Dirichlet(0.1) label
  proportions (at least 2 examples each), a 64-unit MLP, 10 clients per
  round, E = 5, B = 32, lr 0.05, 100 rounds, and the dataset's default cap
  of 10 local steps (so nearly every client runs 10: FedNova is FedAvg);
* `fashion-mnist-uncapped`: the same with E = 1 and no cap, so client i
  runs ceil(n_i / 32) steps (1 to 120);

and reports per algorithm, mean and standard deviation over seeds, the
training objective sum_i n_i F_i(w) / sum_i n_i over the training clients,
the test accuracy over all test examples and the mean test-client error.

    python scripts/drift_correction.py --setting synthetic --seeds 0 1 2 --out /tmp/drift
    python scripts/drift_correction.py --setting fashion-mnist --seeds 0 1 2 --out /tmp/drift

References:
  [Karimireddy et al. 2020] S. P. Karimireddy et al. SCAFFOLD: Stochastic
    Controlled Averaging for Federated Learning. ICML 2020.
  [Wang et al. 2020] J. Wang et al. Tackling the Objective Inconsistency
    Problem in Heterogeneous Federated Optimization. NeurIPS 2020.
  [Li et al. 2020] T. Li, A. K. Sahu, M. Zaheer, M. Sanjabi, A. Talwalkar,
    V. Smith. Federated Optimization in Heterogeneous Networks. MLSys 2020.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path

from jaxfl.cli import main as jaxfl_main

ALGORITHMS = ("fedavg", "scaffold", "fednova")
SETTINGS = {
    "synthetic": [
        "--dataset", "synthetic", "--rounds", "200", "--clients-per-round", "10", "--local-epochs", "20",
        "--batch-size", "10", "--lr", "0.01", "--eval-every", "200",
    ],
    # The same with E = 2: fewer local steps between corrections.
    "synthetic-e2": [
        "--dataset", "synthetic", "--rounds", "200", "--clients-per-round", "10", "--local-epochs", "2",
        "--batch-size", "10", "--lr", "0.01", "--eval-every", "200",
    ],
    "fashion-mnist": [
        "--dataset", "fashion-mnist", "--dataset-option", "alpha=0.1", "--dataset-option", "min_size=2",
        "--model", "mlp", "--rounds", "100",
        "--clients-per-round", "10", "--local-epochs", "5", "--batch-size", "32", "--lr", "0.05",
        "--eval-every", "100",
    ],
    # Without the dataset's default cap of 10 local steps: tau_i = ceil(n_i / B), from 1 to 120.
    "fashion-mnist-uncapped": [
        "--dataset", "fashion-mnist", "--dataset-option", "alpha=0.1", "--dataset-option", "min_size=2",
        "--model", "mlp", "--rounds", "100", "--clients-per-round", "10", "--local-epochs", "1",
        "--batch-size", "32", "--max-local-steps", "100000", "--lr", "0.05", "--eval-every", "100",
    ],
}  # fmt: skip


def run_results(run_dir: Path, algorithm: str) -> dict[str, float]:
    """Training objective, test accuracy over examples and mean test-client error of one algorithm's run."""
    with (run_dir / algorithm / "clients.csv").open() as f:
        rows = list(csv.DictReader(f))
    train = [r for r in rows if r["population"] == "train"]
    test = [r for r in rows if r["population"] == "test"]
    examples = sum(int(r["num_examples"]) for r in train)
    test_examples = sum(int(r["num_examples"]) for r in test)
    return {
        "train_objective": sum(int(r["num_examples"]) * float(r["loss"]) for r in train) / examples,
        "test_accuracy": 1.0 - sum(int(r["num_examples"]) * float(r["error"]) for r in test) / test_examples,
        "mean_client_test_error": statistics.fmean(float(r["error"]) for r in test),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", choices=sorted(SETTINGS), required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    results = {name: [] for name in ALGORITHMS}
    for seed in args.seeds:
        run_dir = args.out / f"{args.setting}-seed{seed}"
        if not (run_dir / "comparison.csv").exists():
            # --eval-train: the training objective is read from the training clients' rows of clients.csv.
            argv = ["run", *SETTINGS[args.setting], "--algorithm", ",".join(ALGORITHMS), "--seed", str(seed),
                    "--eval-train", "--no-progress", "--overwrite", "--out", str(run_dir)]  # fmt: skip
            if jaxfl_main(argv) != 0:
                return 1
        for name in ALGORITHMS:
            results[name].append(run_results(run_dir, name))
    table = [f"{args.setting}, seeds {' '.join(map(str, args.seeds))} (mean ± std over seeds)", ""]
    table.append("| algorithm | training objective | test accuracy | mean test-client error |")
    table.append("|---|---|---|---|")
    for name, per_seed in results.items():
        cells = []
        for key in ("train_objective", "test_accuracy", "mean_client_test_error"):
            values = [r[key] for r in per_seed]
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{statistics.fmean(values):.4f} ± {spread:.4f}")
        table.append(f"| {name} | " + " | ".join(cells) + " |")
    print("\n".join(table))
    (args.out / f"{args.setting}.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
