"""Ditto on Fashion-MNIST: the rows of thesis Table 5.1, and robust aggregators (Tables 5.3 / 5.9).

Reproduces, with the `jaxfl` CLI, the Fashion-MNIST experiments of Li's
thesis chapter 5 (`shared/papers/002_*.txt`, digested in
`shared/notes/thesis-spec.md` sections 5.5-5.8, 8.3 and 9.7):

* Table 5.1 (Fashion MNIST rows): global (FedAvg), local (Ditto with
  λ = 0: each device's own model), fair (TERM, client-level tilt t = 1) and
  Ditto, clean and under the attacks A1 (random labels), A2 (random updates
  on random-label data) and A3 (model replacement, scale = clients per
  round, on random-label data) at the table's fractions of corrupted
  devices: A1 and A2 20/50/80%, A3 10/20/50%;
* robust aggregators in the style of Table 5.3 (columns: each attack at its
  smallest and largest fraction): median, Krum, multi-Krum, norm clipping,
  k-norm and geometric median, each for the global model and as Ditto's
  global solver (one Ditto run gives both: Ditto's global model is, bit for
  bit, the model FedAvg trains with that aggregator). The thesis publishes the
  global-model rows of these defences for Fashion MNIST in Table 5.9;
  "Ditto + defence" it publishes only for FEMNIST and CelebA (Table 5.6).

    python scripts/ditto_fashion_mnist.py                       # both tables, --rounds 500
    python scripts/ditto_fashion_mnist.py --rounds 5000         # the thesis's rounds
    python scripts/ditto_fashion_mnist.py --tables 5.1          # Table 5.1 only
    python scripts/ditto_fashion_mnist.py --quick               # smoke: 3 rounds, 2 settings
    python scripts/ditto_fashion_mnist.py --table-only          # tables from the runs made

Data and model: the `fashion-mnist` dataset with `partition=ditto` (the
authors' 500 devices, each split 72/8/20 train/validation/test, test client
k = training client k; `jaxfl.data.datasets.images.fashion_mnist`), and
jaxfl's `convnet` (two 5x5 convolutions, 32 and 64 channels, max-pooling,
one dense layer: 83,466 parameters). The authors' CNN
(litian96/ditto flearn/models/fmnist/cnn.py) has a further dense layer of
1,024 units (3.3M parameters); 500 personal copies of it (6.6 GB) and its
cost are beyond these CPUs.

Hyperparameters (thesis App. 5.7.4; the authors' code for what the thesis
leaves out): lr 0.05, batch 16, 10 devices per round, 2 local iterations
(`--max-local-steps 2`: the same 2 minibatches for the global and the
personal steps), 5,000 rounds in the thesis (here `--rounds`, default 500:
see docs/ditto-fashion-mnist.md for the time), λ fixed (`--lam`, default 1,
next to the thesis's Table 5.9 rows for fixed λ) or, with `--dynamic-lam`,
the thesis's Table 5.1 choice: dynamic λ, picked at every personal step on
each device's validation data (`jaxfl run --ditto-dynamic-lam`), and for
Krum, multi-Krum and k-norm the server knows f =
int(K * N_mal / N) = int(10 * fraction). The corrupted devices are the same
for every method of a setting (chosen from `--seed`).

Reported, as the thesis does: the mean over the benign devices of their test
accuracy, with the standard deviation across them in parentheses (jaxfl's
summaries count benign clients only under an attack, each test client
equally). The global rows are the global model's `test_error`; Ditto's
and local's are the personal models' `personal_test_error`.

Local models (λ = 0) do not depend on the global model, the aggregator or
the attack: with the same seed, a benign device's personal model is the
same in every setting (the cohorts and minibatches are the seed's; checked
bit for bit on `synthetic`). So `--local clean` (the default) trains them
once, on clean data, and scores each setting on that setting's benign
devices (those its Ditto run marks in clients.csv); `--local every` runs
λ = 0 in every setting instead.

Outputs (in `--out`, default runs/ditto-fmnist): runs/<setting>/<run>/ (each
jaxfl run's directory: summary.json, clients.csv, ...), table_5_1.{csv,md},
table_robust.{csv,md}, runs.csv (each run's status and times). A run whose
summary.json exists with the same settings is not run again, and an
interrupted one continues from its checkpoint (`jaxfl run --resume`), so the
script can be stopped (^C: the current run saves a checkpoint) and started
again; a run that fails is reported, and the others go on.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

DATASET = "fashion-mnist"
DATASET_OPTIONS = ("partition=ditto",)
MODEL = "convnet"
CLIENTS_PER_ROUND = 10
BATCH_SIZE = 16
LOCAL_STEPS = 2
LR = 0.05
TILT = 1.0
THESIS_ROUNDS = 5000
DEFAULT_ROUNDS = 500


class Setting(NamedTuple):
    label: str
    attack: tuple[str, ...]  # CLI words of the attack (without the fraction)
    fraction: float | None


_A1 = ("--attack", "random-labels")
_A2 = ("--attack", "random-updates", "--attack-data", "random-labels")
_A3 = ("--attack", "model-replacement", "--attack-data", "random-labels")

# Table 5.1's columns, in its order.
SETTINGS: dict[str, Setting] = {
    "clean": Setting("clean", (), None),
    "a1-20": Setting("A1 20%", _A1, 0.2),
    "a1-50": Setting("A1 50%", _A1, 0.5),
    "a1-80": Setting("A1 80%", _A1, 0.8),
    "a2-20": Setting("A2 20%", _A2, 0.2),
    "a2-50": Setting("A2 50%", _A2, 0.5),
    "a2-80": Setting("A2 80%", _A2, 0.8),
    "a3-10": Setting("A3 10%", _A3, 0.1),
    "a3-20": Setting("A3 20%", _A3, 0.2),
    "a3-50": Setting("A3 50%", _A3, 0.5),
}
# Table 5.3's columns: each attack at its smallest and largest fraction.
ROBUST_SETTINGS = ("a1-20", "a1-80", "a2-20", "a2-80", "a3-10", "a3-50")

# jaxfl aggregator -> the thesis's name of the defence.
AGGREGATORS: dict[str, str] = {
    "median": "median",
    "krum": "Krum",
    "multi-krum": "multi-Krum",
    "norm-clipping": "clipping",
    "k-norm": "k-norm",
    "geometric-median": "geometric median",
}
NEEDS_BYZANTINE = frozenset({"krum", "multi-krum", "k-norm"})

QUICK = {
    "rounds": 3,
    "settings": ("clean", "a3-10"),
    "robust_settings": ("a3-10",),
    "aggregators": ("median",),
}

# ---------------------------------------------------------------------------
# Published numbers: mean (std) of the benign devices' test accuracy, in the
# order of SETTINGS. Li, "Scalable and Trustworthy Learning in Heterogeneous
# Networks", CMU-CS-23-127, 2023: Table 5.1 (Fashion MNIST rows; their means
# are those of shared/notes/thesis-spec.md section 9.7) and Table 5.9 (full
# Fashion MNIST results), shared/papers/002_*.txt lines 1737-1743 and
# 2562-2578. Table 5.1's Ditto picks λ per device ("dynamic λ"); Table 5.9
# has fixed λ.
# ---------------------------------------------------------------------------


def _published(text: str) -> dict[str, tuple[float, float]]:
    values = text.replace("(", " ").replace(")", " ").split()
    pairs = [(float(values[i]), float(values[i + 1])) for i in range(0, len(values), 2)]
    assert len(pairs) == len(SETTINGS), text
    return dict(zip(SETTINGS, pairs, strict=True))


PUBLISHED: dict[str, dict[str, tuple[float, float]]] = {
    "global": _published(
        ".911 (.08) .897 (.08) .855 (.10) .753 (.13) .900 (.08) .882 (.09) .857 (.10) .753 (.10) .551 (.13) "
        ".275 (.12)"
    ),
    "local": _published(
        ".876 (.10) .874 (.10) .876 (.11) .879 (.10) .874 (.10) .876 (.11) .879 (.10) .877 (.10) .874 (.10) "
        ".876 (.11)"
    ),
    "fair": _published(
        ".909 (.07) .751 (.12) .637 (.13) .547 (.11) .731 (.13) .637 (.14) .635 (.14) .653 (.13) .601 (.12) "
        ".131 (.16)"
    ),
    "ditto-dynamic": _published(
        ".943 (.06) .944 (.07) .937 (.07) .907 (.10) .938 (.07) .930 (.08) .913 (.09) .921 (.09) .902 (.09) "
        ".873 (.11)"
    ),
    "ditto-lam0.1": _published(
        ".929 (.09) .920 (.09) .909 (.10) .897 (.10) .921 (.09) .914 (.09) .905 (.08) .914 (.09) .903 (.09) "
        ".873 (.09)"
    ),
    "ditto-lam1": _published(
        ".946 (.06) .944 (.08) .935 (.07) .925 (.07) .943 (.08) .930 (.07) .912 (.08) .887 (.09) .831 (.10) "
        ".740 (.12)"
    ),
    "ditto-lam2": _published(
        ".945 (.06) .942 (.06) .935 (.07) .917 (.07) .936 (.07) .923 (.08) .906 (.08) .871 (.09) .785 (.11) "
        ".606 (.14)"
    ),
    # Global model with a defence (Table 5.9); no geometric median in the thesis.
    "median": _published(
        ".884 (.09) .853 (.10) .818 (.12) .606 (.17) .885 (.09) .883 (.09) .864 (.10) .856 (.09) .829 (.11) "
        ".725 (.15)"
    ),
    "krum": _published(
        ".838 (.13) .864 (.11) .818 (.13) .768 (.15) .847 (.12) .870 (.11) .805 (.13) .868 (.11) .866 (.11) "
        ".640 (.18)"
    ),
    "multi-krum": _published(
        ".911 (.08) .907 (.08) .889 (.10) .793 (.12) .849 (.10) .827 (.12) .095 (.12) .804 (.11) .860 (.09) "
        ".823 (.13)"
    ),
    "norm-clipping": _published(
        ".913 (.07) .905 (.08) .875 (.10) .753 (.12) .904 (.08) .886 (.09) .856 (.11) .901 (.08) .844 (.11) "
        ".477 (.13)"
    ),
    "k-norm": _published(
        ".911 (.08) .908 (.08) .888 (.10) .118 (.08) .906 (.08) .893 (.09) .096 (.07) .765 (.14) .854 (.10) "
        ".828 (.12)"
    ),
}
THESIS_51 = "thesis Tab. 5.1"
THESIS_59 = "thesis Tab. 5.9"


# ---------------------------------------------------------------------------
# Runs.
# ---------------------------------------------------------------------------


class Run(NamedTuple):
    """One `jaxfl run`: its directory under runs/ and its CLI words."""

    setting: str
    name: str  # ditto, term, local, ditto-<aggregator>
    words: tuple[str, ...]  # Algorithm, attack and aggregator words.
    expected: dict[str, Any]  # config.json fields the run must have to be reused.


def byzantine(fraction: float | None) -> int:
    """f = int(K * N_mal / N), the corrupted devices expected per round (thesis-spec 5.7)."""
    return int(CLIENTS_PER_ROUND * (fraction or 0.0) + 1e-9)


# Dynamic λ's candidates and small-device λ (thesis section 5.3): strong attacks are
# every A3 and any attack corrupting more than half of the devices.
DYNAMIC_LAM = {"strong": ("0.05,0.1,0.2", 0.1), "other": ("0.1,1,2", 1.0)}


def is_strong(setting: str) -> bool:
    spec = SETTINGS[setting]
    return spec.attack == _A3 or (spec.fraction or 0.0) > 0.5


def ditto_lam(args: argparse.Namespace) -> float | None:
    """Ditto's λ for the runs: `--lam`, or None for dynamic λ (`--dynamic-lam`)."""
    return None if args.dynamic_lam else args.lam


def ditto_label(args: argparse.Namespace) -> str:
    return "Ditto, dynamic λ" if args.dynamic_lam else f"Ditto λ={args.lam:g}"


def make_run(setting: str, name: str, lam: float | None, aggregator: str = "mean") -> Run:
    """`lam` None: Ditto with dynamic λ, the setting's candidates (`DYNAMIC_LAM`)."""
    spec = SETTINGS[setting]
    if name == "term":
        words = ["--algorithm", "term", "--tilt", f"{TILT:g}"]
        expected: dict[str, Any] = {"algorithm": "term", "tilt": TILT}
    elif name == "local" or lam is not None:
        lam = 0.0 if name == "local" else lam
        words = ["--algorithm", "ditto", "--lam", f"{lam:g}"]
        expected = {"algorithm": "ditto", "lam": lam}
    else:
        candidates, small = DYNAMIC_LAM["strong" if is_strong(setting) else "other"]
        words = ["--algorithm", "ditto", "--lam", f"{small:g}", "--ditto-dynamic-lam", candidates]
        expected = {"algorithm": "ditto", "lam": small, "ditto_dynamic_lam": candidates}
    if spec.fraction is not None:
        words += [*spec.attack, "--attack-fraction", f"{spec.fraction:g}"]
        expected["attack_fraction"] = spec.fraction
    attack = dict(zip(spec.attack[::2], spec.attack[1::2], strict=True))
    expected["attack"] = attack.get("--attack")
    expected["attack_data"] = attack.get("--attack-data")
    expected["aggregator"] = aggregator
    if aggregator != "mean":
        words += ["--aggregator", aggregator]
        name = f"{name}-{aggregator}"
        if aggregator in NEEDS_BYZANTINE:
            words += ["--byzantine", str(byzantine(spec.fraction))]
            expected["byzantine"] = byzantine(spec.fraction)
    return Run(setting, name, tuple(words), expected)


def plan(args: argparse.Namespace) -> list[Run]:
    """Every run the chosen tables need, Table 5.1's first, without repeats."""
    runs: list[Run] = []
    if "5.1" in args.tables:
        for setting in args.settings:
            runs.append(make_run(setting, "ditto", ditto_lam(args)))
            runs.append(make_run(setting, "term", ditto_lam(args)))
            if args.local == "every":
                runs.append(make_run(setting, "local", ditto_lam(args)))
        if args.local == "clean":
            # Scored on each setting's benign devices.
            runs.append(make_run("clean", "local", ditto_lam(args)))
    if "robust" in args.tables:
        for setting in args.robust_settings:
            runs.append(make_run(setting, "ditto", ditto_lam(args)))
            for aggregator in args.aggregators:
                runs.append(make_run(setting, "ditto", ditto_lam(args), aggregator))
    unique: dict[tuple[str, str], Run] = {}
    for run in runs:
        unique.setdefault((run.setting, run.name), run)
    return list(unique.values())


def common_words(args: argparse.Namespace) -> list[str]:
    words = ["--dataset", args.dataset]
    for option in args.dataset_option:
        words += ["--dataset-option", option]
    if args.data_dir:
        words += ["--data-dir", args.data_dir]
    return [
        *words,
        "--model", args.model,
        "--rounds", str(args.rounds),
        "--eval-every", str(args.eval_every or args.rounds),
        "--clients-per-round", str(CLIENTS_PER_ROUND),
        "--batch-size", str(BATCH_SIZE),
        "--max-local-steps", str(LOCAL_STEPS),
        "--lr", f"{LR:g}",
        "--seed", str(args.seed),
        "--no-progress",
        *args.jaxfl_arg,
    ]


def common_expected(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "dataset": args.dataset,
        "model": args.model,
        "rounds": args.rounds,
        "clients_per_round": CLIENTS_PER_ROUND,
        "batch_size": BATCH_SIZE,
        "max_local_steps": LOCAL_STEPS,
        "lr": LR,
        "seed": args.seed,
    }


def run_directory(out: Path, run: Run) -> Path:
    return out / "runs" / run.setting / run.name


def _same(value: Any, want: Any) -> bool:
    if isinstance(want, float) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return math.isclose(value, want, rel_tol=1e-9, abs_tol=1e-12)
    return value == want


def matches(config_path: Path, expected: Mapping[str, Any]) -> bool:
    """Whether the run's config.json has the expected settings."""
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError):
        return False
    return all(_same(config.get(key), value) for key, value in expected.items())


# Exit statuses of a jaxfl run stopped by SIGINT / SIGTERM (it saves a checkpoint first): stop there.
INTERRUPTED = frozenset({130, 143, -2, -15})


def call_jaxfl(argv: Sequence[str]) -> int:
    """`jaxfl ARGV` in a new process; its exit status (tests call the CLI in-process instead)."""
    return subprocess.run([sys.executable, "-m", "jaxfl.cli", *argv], check=False).returncode


def execute(args: argparse.Namespace, runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Runs what is not done yet; one record per run (status, wall time)."""
    records = []
    common, base_expected = common_words(args), common_expected(args)
    for index, run in enumerate(runs, 1):
        directory = run_directory(args.out, run)
        expected = {**base_expected, **run.expected}
        partial = directory.with_name(directory.name + ".partial")
        record = {"setting": run.setting, "run": run.name, "directory": str(directory)}
        head = f"[{index}/{len(runs)}] {run.setting}/{run.name}"
        if (directory / "summary.json").is_file() and matches(directory / "config.json", expected):
            print(f"{head}: done, reused", file=sys.stderr)
            records.append({**record, "status": "reused", "wall_s": ""})
            continue
        if partial.is_dir() and matches(partial / "config.json", expected):
            argv = ["run", "--resume", str(directory)]
        else:
            argv = ["run", *common, *run.words, "--out", str(directory), "--overwrite"]
        print(f"{head}: jaxfl {' '.join(argv)}", file=sys.stderr)
        if args.dry_run:
            records.append({**record, "status": "planned", "wall_s": ""})
            continue
        directory.parent.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        status = call_jaxfl(argv)
        if status != 0 and argv[1] == "--resume":
            print(f"{head}: could not resume (exit {status}); starting again", file=sys.stderr)
            argv = ["run", *common, *run.words, "--out", str(directory), "--overwrite"]
            status = call_jaxfl(argv)
        wall = time.perf_counter() - start
        print(f"{head}: exit {status}, {wall:.0f} s", file=sys.stderr)
        outcome = "ran" if status == 0 else f"failed ({status})"
        if status in INTERRUPTED:
            outcome = "interrupted"
        records.append({**record, "status": outcome, "wall_s": f"{wall:.1f}"})
        if status in INTERRUPTED:
            print(f"{head}: interrupted; run the script again to resume it", file=sys.stderr)
            break
    return records


# ---------------------------------------------------------------------------
# Tables.
# ---------------------------------------------------------------------------


class Cell(NamedTuple):
    mean: float  # Benign devices' mean test accuracy.
    std: float  # Their standard deviation.
    note: str = ""  # E.g. 'diverged'.


def read_summary(directory: Path) -> dict[str, Any] | None:
    try:
        return json.loads((directory / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def accuracy_cell(directory: Path, metric: str) -> Cell | None:
    """1 - the summary's mean `metric` (test_error, personal_test_error) and its std."""
    summary = read_summary(directory)
    if summary is None or metric not in summary:
        return None
    error = summary[metric]
    status = summary.get("status", "finished")
    return Cell(1.0 - float(error["mean"]), float(error["std"]), "" if status == "finished" else str(status))


def _clients(directory: Path) -> list[dict[str, str]]:
    with (directory / "clients.csv").open() as f:
        return [row for row in csv.DictReader(f) if row["population"] == "test"]


def local_cell(local_dir: Path, setting_dir: Path | None) -> Cell | None:
    """The clean λ = 0 run's personal test accuracy over a setting's benign devices.

    The benign devices are those the setting's run marks `attacked` = 0 in
    its clients.csv (None: every device, the clean setting). Mean and
    population standard deviation over devices, as jaxfl's summaries.
    """
    try:
        local = _clients(local_dir)
        benign = None
        if setting_dir is not None:
            benign = {row["client"] for row in _clients(setting_dir) if row.get("attacked", "0") == "0"}
    except (OSError, KeyError):
        return None
    values = [
        1.0 - float(row["personal_error"])
        for row in local
        if row.get("personal_error") not in (None, "") and (benign is None or row["client"] in benign)
    ]
    if not values:
        return None
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return Cell(mean, std)


def measured_51(args: argparse.Namespace) -> dict[str, dict[str, Cell | None]]:
    """Row -> setting -> the measured cell, for Table 5.1."""
    rows: dict[str, dict[str, Cell | None]] = {"global": {}, "local": {}, "fair": {}, "ditto": {}}
    for setting in args.settings:
        ditto = run_directory(args.out, make_run(setting, "ditto", ditto_lam(args)))
        rows["global"][setting] = accuracy_cell(ditto, "test_error")
        rows["ditto"][setting] = accuracy_cell(ditto, "personal_test_error")
        term = run_directory(args.out, make_run(setting, "term", ditto_lam(args)))
        rows["fair"][setting] = accuracy_cell(term, "test_error")
        if args.local == "every":
            rows["local"][setting] = accuracy_cell(
                run_directory(args.out, make_run(setting, "local", ditto_lam(args))), "personal_test_error"
            )
        else:
            clean_local = run_directory(args.out, make_run("clean", "local", ditto_lam(args)))
            rows["local"][setting] = local_cell(clean_local, None if setting == "clean" else ditto)
    return rows


def _lam_key(lam: float) -> str | None:
    key = f"ditto-lam{lam:g}"
    return key if key in PUBLISHED else None


def table_51(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Long-format rows (method, source, setting, mean, std) of Table 5.1."""
    measured = measured_51(args)
    label = ditto_label(args)
    layout = [
        ("global", "jaxfl (FedAvg)", measured["global"]),
        ("global", THESIS_51, PUBLISHED["global"]),
        ("local", "jaxfl (Ditto λ=0)", measured["local"]),
        ("local", THESIS_51, PUBLISHED["local"]),
        ("fair (TERM, t=1)", "jaxfl", measured["fair"]),
        ("fair (TERM, t=1)", THESIS_51, PUBLISHED["fair"]),
        (label, "jaxfl", measured["ditto"]),
    ]
    if _lam_key(args.lam) and not args.dynamic_lam:
        layout.append((label, THESIS_59, PUBLISHED[_lam_key(args.lam)]))
    layout.append(("Ditto, dynamic λ", THESIS_51, PUBLISHED["ditto-dynamic"]))
    return _long_rows("5.1", layout, args.settings)


def table_robust(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Long-format rows of the robust-aggregator table."""
    settings = args.robust_settings
    label = ditto_label(args)

    def cells(aggregator: str, metric: str) -> dict[str, Cell | None]:
        return {
            s: accuracy_cell(
                run_directory(args.out, make_run(s, "ditto", ditto_lam(args), aggregator)), metric
            )
            for s in settings
        }

    layout = [
        ("global (mean)", "jaxfl", cells("mean", "test_error")),
        ("global (mean)", THESIS_51, PUBLISHED["global"]),
    ]
    for aggregator in args.aggregators:
        name = AGGREGATORS[aggregator]
        layout.append((f"global + {name}", "jaxfl", cells(aggregator, "test_error")))
        if aggregator in PUBLISHED:
            layout.append((f"global + {name}", THESIS_59, PUBLISHED[aggregator]))
        layout.append((f"{label} + {name}", "jaxfl", cells(aggregator, "personal_test_error")))
    layout.append((f"{label} (mean)", "jaxfl", cells("mean", "personal_test_error")))
    if _lam_key(args.lam) and not args.dynamic_lam:
        layout.append((f"{label} (mean)", THESIS_59, PUBLISHED[_lam_key(args.lam)]))
    return _long_rows("robust", layout, settings)


def _long_rows(table: str, layout, settings: Sequence[str]) -> list[dict[str, Any]]:
    rows = []
    for method, source, cells in layout:
        for setting in settings:
            cell = cells.get(setting)
            if isinstance(cell, tuple) and not isinstance(cell, Cell):
                cell = Cell(*cell)
            rows.append({
                "table": table,
                "method": method,
                "source": source,
                "setting": setting,
                "column": SETTINGS[setting].label,
                "mean": "" if cell is None else f"{cell.mean:.4f}",
                "std": "" if cell is None else f"{cell.std:.4f}",
                "note": "" if cell is None else cell.note,
            })
    return rows


def _format(row: Mapping[str, str]) -> str:
    if row["mean"] == "":
        return "—"
    mean, std = float(row["mean"]), float(row["std"])
    if math.isnan(mean):
        return "nan"
    text = f"{mean:.3f} ({std:.2f})".replace("0.", ".")
    return f"{text} {row['note']}".strip()


def markdown(rows: Sequence[Mapping[str, str]], settings: Sequence[str], title: str) -> str:
    """One line per (method, source), one column per setting."""
    columns = [SETTINGS[s].label for s in settings]
    lines = [title, "", "| method | source | " + " | ".join(columns) + " |"]
    lines.append("|---|---|" + "---|" * len(columns))
    order: list[tuple[str, str]] = []
    cells: dict[tuple[str, str], dict[str, str]] = {}
    for row in rows:
        key = (row["method"], row["source"])
        if key not in cells:
            order.append(key)
            cells[key] = {}
        cells[key][row["setting"]] = _format(row)
    for key in order:
        values = " | ".join(cells[key].get(s, "—") for s in settings)
        lines.append(f"| {key[0]} | {key[1]} | {values} |")
    return "\n".join(lines) + "\n"


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    if not rows:
        return
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def run_times(directory: Path) -> dict[str, str]:
    try:
        timing = json.loads((directory / "timing.json").read_text())
    except (OSError, ValueError):
        return {"rounds_per_s": "", "compile_s": "", "evaluation_s": ""}
    return {key: f"{timing.get(key) or 0:.3g}" for key in ("rounds_per_s", "compile_s", "evaluation_s")}


def write_tables(args: argparse.Namespace, records: Sequence[Mapping[str, Any]]) -> None:
    data = (
        "Fashion-MNIST, Ditto's partition (500 devices, 72/8/20)"
        if args.dataset == DATASET and list(args.dataset_option) == list(DATASET_OPTIONS)
        else f"{args.dataset} {' '.join(args.dataset_option)} (not the thesis's data)".replace("  ", " ")
    )
    header = (
        f"{data}, {args.model}, {args.rounds} rounds "
        f"(thesis: {THESIS_ROUNDS}), lr {LR:g}, batch {BATCH_SIZE}, {CLIENTS_PER_ROUND} devices per round, "
        f"{LOCAL_STEPS} local iterations, seed {args.seed}. Mean test accuracy of the benign devices "
        "(standard deviation across them); — : not run."
    )
    if "5.1" in args.tables:
        rows = table_51(args)
        write_csv(args.out / "table_5_1.csv", rows)
        text = markdown(rows, args.settings, f"### Table 5.1 (Fashion MNIST)\n\n{header}")
        (args.out / "table_5_1.md").write_text(text)
        print(text)
    if "robust" in args.tables:
        rows = table_robust(args)
        write_csv(args.out / "table_robust.csv", rows)
        title = f"### Robust aggregators (Tables 5.3 / 5.9 style)\n\n{header}"
        text = markdown(rows, args.robust_settings, title)
        (args.out / "table_robust.md").write_text(text)
        print(text)
    if records:
        write_csv(
            args.out / "runs.csv",
            [{**r, **run_times(Path(r["directory"]))} for r in records],
        )


# ---------------------------------------------------------------------------
# Command line.
# ---------------------------------------------------------------------------


def _names(text: str, valid: Sequence[str], what: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in valid]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{what} must be among {', '.join(valid)}; got {text!r}")
    return names


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="results directory (default: runs/ditto-fmnist, or runs/ditto-fmnist-quick)")
    parser.add_argument("--rounds", type=int, default=None,
                        help=f"rounds (default: {DEFAULT_ROUNDS}, --quick: {QUICK['rounds']}; "
                        f"thesis: {THESIS_ROUNDS})")
    parser.add_argument("--eval-every", type=int, default=None, help="evaluate every this many rounds "
                        "(default: only at the end; 500 personal models: ~1 min per evaluation here)")
    parser.add_argument("--lam", type=float, default=1.0,
                        help="Ditto's fixed λ (without --dynamic-lam)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the runs (and of the corrupted devices)")
    parser.add_argument("--dynamic-lam", action="store_true",
                        help="Ditto with the thesis's dynamic λ (section 5.3: candidates 0.1,1,2, or "
                        "0.05,0.1,0.2 under strong attacks, tried at every personal step on each device's "
                        "validation data; devices with fewer than 4 validation examples use 1, or 0.1) "
                        "instead of --lam")
    parser.add_argument("--tables", type=lambda t: _names(t, ("5.1", "robust"), "--tables"),
                        default=("5.1", "robust"), help="5.1 and/or robust (comma-separated)")
    parser.add_argument("--settings", type=lambda t: _names(t, list(SETTINGS), "--settings"), default=None,
                        help=f"Table 5.1's settings (default: all: {','.join(SETTINGS)})")
    parser.add_argument("--robust-settings", type=lambda t: _names(t, list(SETTINGS), "--robust-settings"),
                        default=None, help=f"robust table's settings (default: {','.join(ROBUST_SETTINGS)})")
    parser.add_argument("--aggregators", type=lambda t: _names(t, list(AGGREGATORS), "--aggregators"),
                        default=None, help=f"robust aggregators (default: {','.join(AGGREGATORS)})")
    parser.add_argument("--local", choices=("clean", "every"), default="clean",
                        help="local rows from one clean λ=0 run (default) or a λ=0 run per setting")
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke run: {QUICK['rounds']} rounds, settings {','.join(QUICK['settings'])}, "
                        f"robust {','.join(QUICK['robust_settings'])} with {','.join(QUICK['aggregators'])}")
    parser.add_argument("--table-only", "--replot", dest="table_only", action="store_true",
                        help="only rebuild the tables from the runs in --out")
    parser.add_argument("--dry-run", action="store_true", help="print the jaxfl commands, run nothing")
    parser.add_argument("--model", default=MODEL, help=f"jaxfl model (default: {MODEL})")
    parser.add_argument("--data-dir", default=None, help="directory of the IDX files (default: Debian's)")
    parser.add_argument("--jaxfl-arg", action="append", default=[],
                        help="a word added to every jaxfl run (repeatable), e.g. --jaxfl-arg=--strategy=vmap")
    # For tests: another (small) dataset, e.g. synthetic, whose test clients are the training clients'.
    parser.add_argument("--dataset", default=DATASET, help=argparse.SUPPRESS)
    parser.add_argument("--dataset-option", action="append", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else {
        "rounds": DEFAULT_ROUNDS,
        "settings": tuple(SETTINGS),
        "robust_settings": ROBUST_SETTINGS,
        "aggregators": tuple(AGGREGATORS),
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.out is None:
        args.out = Path("runs/ditto-fmnist-quick" if args.quick else "runs/ditto-fmnist")
    if args.dataset_option is None:
        args.dataset_option = list(DATASET_OPTIONS) if args.dataset == DATASET else []
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    records: list[dict[str, Any]] = []
    if not args.table_only:
        runs = plan(args)
        print(f"{len(runs)} jaxfl runs in {args.out / 'runs'}", file=sys.stderr)
        records = execute(args, runs)
    write_tables(args, records)
    failed = [r for r in records if r["status"].startswith("failed")]
    wall = time.perf_counter() - start
    summary = f"wall time: {wall:.0f} s ({wall / 3600:.2f} h); {len(records)} runs, {len(failed)} failed"
    print(summary, file=sys.stderr)
    if any(r["status"] == "interrupted" for r in records):
        return 130
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
