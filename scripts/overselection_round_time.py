"""Over-selection and a report deadline against round duration, under diurnal availability.

Runs FedAvg with the CLI's defaults otherwise (the label-shift data, 2,500
training clients, 100 reports a round) on the simulated clock: clients online
8 hours a day from a start hour drawn per client, log-normal devices
(jaxfl.clock.profiles), for 200 rounds, once per setting and seed:

* `1.0`: select 100 clients, wait for all of them to report or drop;
* `1.3`, `1.6`: select 130 or 160 and keep the first 100 reports
  (Bonawitz et al. 2019 select 130%);
* `1.3, deadline`: the same with the server waiting at most the deadline.

Bonawitz et al. over-select so that stragglers and dropouts do not hold a
round back: rounds should get shorter as more clients are selected, at the
cost of more clients trained and models sent. The table gives per setting
the mean round duration, the clients dropped per round (the mean over
every 10th round, where round metrics are recorded), the simulated
time of the 200 rounds and the final mean test error (mean over seeds).

    python scripts/overselection_round_time.py --seeds 0 1 2 --out /tmp/overselection

References:
  [Bonawitz et al. 2019] K. Bonawitz et al. Towards Federated Learning at Scale: System Design.
    MLSys 2019.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from jaxfl.cli import main as jaxfl_main

SETTING = ["--algorithm", "fedavg", "--rounds", "200", "--eval-every", "10", "--availability", "diurnal",
           "--no-progress"]  # fmt: skip
DEADLINE = 20.0
VARIANTS = {
    "1.0": ["--overselect", "1.0"],
    "1.3": ["--overselect", "1.3"],
    "1.6": ["--overselect", "1.6"],
    f"1.3, deadline {DEADLINE:g} s": ["--overselect", "1.3", "--report-deadline", str(DEADLINE)],
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    rows = {name: [] for name in VARIANTS}
    for seed in args.seeds:
        for name, flags in VARIANTS.items():
            run_dir = args.out / f"{name.split(',')[0]}{'-deadline' if 'deadline' in name else ''}-seed{seed}"
            if not (run_dir / "summary.json").exists():
                argv = ["run", *SETTING, *flags, "--seed", str(seed), "--overwrite", "--out", str(run_dir)]
                if jaxfl_main(argv) != 0:
                    return 1
            summary = json.loads((run_dir / "summary.json").read_text())
            records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            rows[name].append({
                "seconds_per_round": summary["simulated_time"] / summary["rounds"],
                # Round metrics are recorded at the evaluations: every 10th round.
                "dropped": statistics.fmean(r["round_metrics"]["clients_dropped"] for r in records),
                "simulated_time": summary["simulated_time"],
                "test_error": summary["test_error"]["mean"],
                "reports": summary["client_uploads"] / summary["rounds"],
            })  # fmt: skip
    lines = [
        f"FedAvg, label-shift (2,500 clients), 100 reports a round, diurnal availability (8 h a day), "
        f"200 rounds, seeds {' '.join(map(str, args.seeds))} (mean over seeds)",
        "",
        "| overselect | s per round | reports per round | dropped per round (every 10th) | "
        "simulated time (h) | "        "mean test error (%) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, per_seed in rows.items():
        mean = {key: statistics.fmean(row[key] for row in per_seed) for key in per_seed[0]}
        lines.append(
            f"| {name} | {mean['seconds_per_round']:.1f} | {mean['reports']:.1f} | "
            f"{mean['dropped']:.1f} | {mean['simulated_time'] / 3600:.2f} | "
            f"{100 * mean['test_error']:.2f} |"
        )
    print("\n".join(lines))
    (args.out / "overselection.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
