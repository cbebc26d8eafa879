"""The `jaxfl` command.

    jaxfl run [--config FILE] [--algorithm NAME[,NAME...]] [--rounds N] ...
    jaxfl sweep [run settings] --grid NAME=V1,V2,... [--grid ...]
    jaxfl family --thetas T1,T2,... [run settings]
    jaxfl run --resume DIR          (also jaxfl sweep --resume DIR)
    jaxfl evaluate DIR [--dataset NAME] [--dataset-option KEY=VALUE ...] [--out DIR2]
    jaxfl report DIR [DIR ...] [--out REPORT_DIR]
    jaxfl list

`jaxfl run` with no arguments is the quick-start run: FedAvg on the label-shift
dataset, printing a table of the test-error summary. Every setting of
`jaxfl.experiment.config.RunConfig` is a flag and a config-file key; flags
override the file. Invalid settings exit with status 2 and one line naming
the setting and its allowed range, before anything is written. `jaxfl
report` draws learning curves and per-client error figures (PNG files and one
self-contained HTML page) from finished or running output folders.

Exit statuses (docs/reliability.md): 0 done, 2 refused input, 3 a run
diverged, 130 on SIGINT and 143 on SIGTERM (after saving a checkpoint when
the run has --out; `--resume` continues it).
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jaxfl.algorithms.registry import PRIVATE_ALGORITHMS
from jaxfl.experiment.config import (
    DEFAULTS,
    FIELDS,
    ConfigError,
    RunConfig,
    check_value,
    defer_warning,
    discard_warnings,
    make_config,
    read_config_file,
    section_fields,
    section_title,
)
from jaxfl.experiment.interrupts import Terminated, sigterm_as_interrupt
from jaxfl.xla_cpu import configure_cpu

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (status 2) instead of usage dumps.

    Negative numbers in exponent notation (`--server-lr -1e39`) are values,
    not flags, so that their range check names them.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")

    def error(self, message: str):  # noqa: D102
        raise ConfigError(message)


def _flag_value(name: str):
    """An argparse `type` that turns a flag's text into the field's type."""
    kind = str(FIELDS[name].type)

    def convert(text: str):
        try:
            if kind.startswith("int"):
                return int(text)
            if kind.startswith("float"):
                return float(text)
        except ValueError:
            try:
                check_value(name, text)
            except ConfigError as error:  # Names the allowed range.
                raise argparse.ArgumentTypeError(str(error)) from None
        return text

    convert.__name__ = name
    return convert


def _dataset_option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"--dataset-option must be KEY=VALUE, got {text!r}")
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        parsed = value
    return key.strip().replace("-", "_"), parsed


def _add_run_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument("--config", help="JSON or TOML file of settings")
    groups = {}
    for title, names in section_fields().items():
        group = groups[title] = run.add_argument_group(title)
        for name in names:
            field = FIELDS[name]
            meta = field.metadata
            if not meta["flag"]:
                continue
            flag = "--" + name.replace("_", "-")
            help_text = meta["help"]
            if meta["choices"]:
                help_text += f"; one of: {', '.join(map(str, meta['choices']))}"
            help_text += f" (default: {meta['default_text'] or DEFAULTS.setting(name)})"
            if str(field.type).startswith("bool"):
                group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
            else:
                group.add_argument(flag, type=_flag_value(name), default=None, help=help_text)
    groups[section_title("data")].add_argument(
        "--dataset-option",
        action="append",
        type=_dataset_option,
        default=None,
        metavar="KEY=VALUE",
        help="a dataset generator option, e.g. alpha=0.5 (repeatable)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="jaxfl", description="Federated learning simulation in JAX.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = commands.add_parser("run", help="train and evaluate (with no arguments: the quick-start run)")
    _add_run_arguments(run)
    _add_resume_argument(run)
    sweep = commands.add_parser(
        "sweep", help="a grid of settings; numeric ones vmapped in one compiled round"
    )
    _add_run_arguments(sweep)
    _add_resume_argument(sweep)
    sweep.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="NAME=V1,V2,...",
        help="values of one setting (repeatable; the grid is their product)",
    )
    family = commands.add_parser(
        "family", help="the Δ-FL model family: one model per theta, clients served the best"
    )
    _add_run_arguments(family)
    family.add_argument(
        "--thetas", required=True, type=_theta_list, metavar="T1,T2,...",
        help="tail fractions of the family's models, each in (0, 1]",
    )
    family.add_argument(
        "--selection-fraction", type=float, default=0.5,
        help="share of each test client's examples used to choose its model (default 0.5)",
    )
    evaluate = commands.add_parser(
        "evaluate", help="evaluate a finished run's saved model(s) on a population"
    )
    evaluate.add_argument("dir", metavar="DIR", help="a finished run's output folder (or its model/)")
    evaluate.add_argument("--dataset", help="the population (default: the run's own dataset)")
    evaluate.add_argument("--data-dir", help="directory holding the dataset's files")
    evaluate.add_argument(
        "--dataset-option", action="append", type=_dataset_option, default=None, metavar="KEY=VALUE",
        help="a dataset option (repeatable; with --dataset, replaces the run's options)",
    )
    evaluate.add_argument("--algorithm", help="which model, when DIR holds several algorithms'")
    evaluate.add_argument("--out", help="write summary.json and clients.csv into this new folder")
    evaluate.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    report = commands.add_parser(
        "report", help="figures (PNG and one HTML page) from finished or running output folders"
    )
    report.add_argument(
        "dirs", nargs="+", metavar="DIR",
        help="output folders of run or sweep (DIR.partial is read while DIR does not exist yet)",
    )
    report.add_argument(
        "--out", metavar="REPORT_DIR",
        help="folder of the report: new, empty or an earlier report (default for one DIR: DIR/report)",
    )
    commands.add_parser("list", help="list datasets, models, algorithms and task presets")
    return parser


def _add_resume_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--resume", metavar="DIR",
        help="continue the unfinished run whose --out was DIR, with its saved settings (bit for bit as "
        "if never stopped)",
    )


def resume_settings(args: argparse.Namespace) -> tuple[RunConfig, dict[str, list[Any]] | None]:
    """The saved config (and a sweep's grid) of the unfinished run at `--resume DIR`.

    Only `--progress/--no-progress` may be given with it: any other setting
    would make the resumed run another run.
    """
    from jaxfl.experiment.run_directory import STAGING_SUFFIX, OutputDirectory

    given = [name for name in FIELDS if name != "progress" and getattr(args, name, None) is not None]
    if args.config or args.dataset_option or getattr(args, "grid", None):
        given.insert(0, "config" if args.config else ("dataset_option" if args.dataset_option else "grid"))
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise ConfigError(f"--resume continues the run's saved settings; {flag} cannot be given with it")
    path = Path(args.resume)
    if path.name.endswith(STAGING_SUFFIX):
        path = path.with_name(path.name[: -len(STAGING_SUFFIX)])
    output = OutputDirectory(path, command=args.command, resuming=True)
    try:
        saved = json.loads((output.staging / "config.json").read_text())
    except (OSError, ValueError):
        raise ConfigError(
            f"{output.staging / 'config.json'} is missing or damaged; the run cannot resume"
        ) from None
    grid = saved.pop("grid", None)
    saved["out"] = str(path)
    if args.progress is not None:
        saved["progress"] = args.progress
    config = make_config(saved)
    if grid is not None:
        if not isinstance(grid, dict):
            raise ConfigError(f"{output.staging / 'config.json'}: grid must be a table of lists")
        grid = {name: [check_value(name, v) for v in values] for name, values in grid.items()}
    return config, grid


def _theta_list(text: str) -> list[float]:
    try:
        thetas = [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        thetas = []
    if not thetas or any(not 0.0 < t <= 1.0 for t in thetas):
        raise argparse.ArgumentTypeError(
            f"thetas must be a comma-separated list of numbers in (0, 1], got {text!r}"
        )
    for theta in thetas:
        try:
            check_value("theta", theta)  # float32: no theta that computes as 0.
        except ConfigError as error:
            raise argparse.ArgumentTypeError(f"thetas: {error}") from None
    if len(set(thetas)) < len(thetas):
        raise argparse.ArgumentTypeError(f"thetas must be distinct (one model each), got {text!r}")
    return thetas


def resolve_config(args: argparse.Namespace) -> RunConfig:
    """Defaults, then the config file, then the flags."""
    discard_warnings()  # Printed once the run is checked (`held_warnings` in setup).
    values: dict[str, Any] = {}
    if args.config:
        values.update(read_config_file(args.config))
    for name in FIELDS:
        value = getattr(args, name, None)
        if value is not None:
            values[name] = value
    if args.dataset_option:
        options = dict(values.get("dataset_options") or {})
        options.update(dict(args.dataset_option))
        values["dataset_options"] = options
    return make_config(with_secret_seed(values), on_warning=defer_warning)


def with_secret_seed(values: dict[str, Any]) -> dict[str, Any]:
    """`values` with a seed drawn from the OS when a DP algorithm runs and no seed was given.

    The observer's epsilon of the DP algorithms assumes the cohort sampling is
    secret; with the default seed (0, public) it is not. A drawn seed is
    recorded (config.json has it, with `seed_drawn`), so the run stays
    reproducible by whoever holds its files.
    """
    algorithm = values.get("algorithm", DEFAULTS.algorithm)
    names = [name.strip() for name in algorithm.split(",")] if isinstance(algorithm, str) else []
    if "seed" in values or not set(names) & set(PRIVATE_ALGORITHMS):
        return values
    return {**values, "seed": secrets.randbelow(2**31 - 1), "seed_drawn": True}


def _list() -> None:
    from jaxfl.algorithms.registry import SPECS
    from jaxfl.data.registry import dataset_listing
    from jaxfl.experiment.presets import PRESETS
    from jaxfl.models.networks import model_names

    print("datasets (--dataset NAME; docs/datasets.md):")
    for name, spec in dataset_listing():
        print(f"  {name:16s} {spec.summary}")
        model = spec.run_defaults.get("model", "linear")
        status = spec.status() if spec.status else "generated"
        print(f"  {'':16s}   source: {spec.source}; default model: {model}; {status}")
    print("algorithms:")
    for name, spec in SPECS.items():
        print(f"  {name:16s} {spec.description}")
    print("models:", ", ".join(model_names()))
    print("tasks (--task NAME: a published protocol; flags override its settings; docs/tasks.md):")
    for name, preset in PRESETS.items():
        dataset = preset.settings["dataset"]
        print(f"  {name:20s} {preset.summary}")
        print(f"  {'':20s}   from: {preset.source}; dataset {dataset}")
        if preset.published:
            print(f"  {'':20s}   published: {preset.published}")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    with sigterm_as_interrupt():
        return _main(argv)


def _main(argv: list[str]) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.command == "list":
            _list()
            return 0
        if args.command == "report":
            from jaxfl.experiment.report import report_main

            return report_main(args.dirs, args.out)
        configure_cpu()
        if args.command == "evaluate":
            from jaxfl.experiment.evaluate_main import evaluate_main

            options = dict(args.dataset_option) if args.dataset_option else None
            return evaluate_main(
                args.dir, dataset=args.dataset, data_dir=args.data_dir, dataset_options=options,
                algorithm=args.algorithm, out=args.out, overwrite=args.overwrite,
            )
        if args.command == "family" and args.algorithm is None:
            args.algorithm = "deltafl"
        if getattr(args, "resume", None):
            config, grid = resume_settings(args)
            if args.command == "sweep":
                from jaxfl.experiment.sweep_main import run_sweep_main

                return run_sweep_main(config, grid or {}, resume=True)
            from jaxfl.experiment.main import run_main

            return run_main(config, resume=True)
        config = resolve_config(args)
        if args.command == "family":
            from jaxfl.experiment.family import run_family_main

            if not 0.0 < args.selection_fraction < 1.0:
                raise ConfigError(
                    f"selection_fraction must be in (0, 1), got {args.selection_fraction}"
                )
            return run_family_main(config, args.thetas, args.selection_fraction)
        if args.command == "sweep":
            from jaxfl.experiment.sweep_main import parse_grid, run_sweep_main

            return run_sweep_main(config, parse_grid(args.grid))
        from jaxfl.experiment.main import run_main

        return run_main(config)
    except ConfigError as error:
        print(f"jaxfl: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as stop:
        terminated = isinstance(stop, Terminated)
        print(
            f"jaxfl: {'terminated' if terminated else 'interrupted'}; earlier results are untouched "
            "(an unfinished --out keeps its checkpoints: --resume continues it)",
            file=sys.stderr,
        )
        return 128 + (signal.SIGTERM if terminated else signal.SIGINT)


if __name__ == "__main__":
    sys.exit(main())
