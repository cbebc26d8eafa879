"""Every `jaxfl` command in the README and docs/ is one the CLI accepts as written.

Each command of a fenced code block is parsed by the CLI's own parser and its
settings resolved and checked as a run checks them (ranges, choices, the
settings' combinations, a sweep's grid), and its dataset options are checked
against the dataset's own (`jaxfl evaluate DIR --dataset-option ...` against
the dataset of the documented run that wrote DIR). Nothing is trained: a
command that reads files users have (`--data-dir`, `--config my_run.toml`)
is checked up to reading them.
"""

import pathlib
import re
import shlex

import pytest

from jaxfl.cli import build_parser, resolve_config
from jaxfl.data.registry import dataset_options
from jaxfl.experiment.sweep_main import parse_grid

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _commands(path):
    """The `jaxfl ...` commands of a document's code blocks, continuation lines joined, comments cut."""
    commands = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", path.read_text(), re.S):
        pending = ""
        for line in block.splitlines():
            line = line.strip()
            if not pending and not re.match(r"(\$ )?jaxfl ", line):
                continue
            pending = f"{pending} {line}".strip()
            if pending.endswith("\\"):
                pending = pending[:-1]
                continue
            commands.append(shlex.split(pending.removeprefix("$ "), comments=True)[1:])
            pending = ""
    return commands


COMMANDS = [(path.name, argv) for path in DOCUMENTS for argv in _commands(path)]


def test_the_documents_have_commands():
    assert len(COMMANDS) >= 30 and {argv[0] for _, argv in COMMANDS} >= {"run", "sweep", "evaluate", "report"}


def _written_datasets():
    """--out folder -> the dataset of the documented run that writes it (the ones `evaluate` reads)."""
    written = {}
    for _, argv in COMMANDS:
        if argv[0] in ("run", "sweep", "family") and "--out" in argv and "--config" not in argv:
            args = build_parser().parse_args(argv)
            written[args.out] = resolve_config(args).data.dataset
    return written


@pytest.mark.parametrize("document, argv", COMMANDS, ids=[f"{d}:{' '.join(a)[:60]}" for d, a in COMMANDS])
def test_a_documented_command_is_accepted_as_written(document, argv):
    args = build_parser().parse_args(argv)
    if argv[0] == "evaluate" and args.dataset_option:
        dataset = args.dataset or _written_datasets()[args.dir]
        assert set(dict(args.dataset_option)) <= set(dataset_options(dataset)), (dataset, args.dataset_option)
    if argv[0] not in ("run", "sweep", "family") or getattr(args, "resume", None):
        return
    if args.config and not pathlib.Path(args.config).exists():
        return  # The user's own file.
    config = resolve_config(args)
    data = config.data
    assert set(data.dataset_options) <= set(dataset_options(data.dataset)), data.dataset_options
    if argv[0] == "sweep":
        assert parse_grid(args.grid)
