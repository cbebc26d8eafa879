"""The `jaxfl` command: the quick-start run's files, determinism, and every bad input."""

import csv
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from reference import assert_cli_refuses

from jaxfl.cli import main
from jaxfl.evaluation import SUMMARY_KEYS
from jaxfl.experiment.config import ConfigError
from jaxfl.experiment.run_directory import MARKER, OutputDirectory

TINY = [
    "--dataset-option", "num_train_clients=40",
    "--dataset-option", "num_validation_clients=0",
    "--dataset-option", "num_test_clients=20",
    "--dataset-option", "pool_size=20000",
    "--rounds", "4", "--clients-per-round", "5", "--eval-every", "2",
    "--no-progress", "--strategy", "vmap", "--algorithm", "fedavg",
]


def _run(args, capsys):
    status = main(["run", *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "first"
    assert main(["run", *TINY, "--out", str(out), "--seed", "3"]) == 0
    return out


RUN_FILES = [
    "clients.csv", "config.json", "jaxfl-run.json", "metrics.jsonl", "model", "summary.json", "timing.json",
]


def test_run_writes_its_files(finished_run):
    assert sorted(p.name for p in finished_run.iterdir()) == RUN_FILES
    summary = json.loads((finished_run / "summary.json").read_text())
    for group in ("test_loss", "test_error"):
        assert set(SUMMARY_KEYS) <= set(summary[group])
    assert 0.0 <= summary["test_error"]["mean"] <= 1.0
    lines = (finished_run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["round"] for line in lines] == [2, 4]
    # The training clients are evaluated only when asked (--eval-train): no train_* summaries or rows.
    assert not any(key.startswith("train_") for line in lines for key in json.loads(line))
    assert not any(key.startswith("train_") for key in summary)
    rows = (finished_run / "clients.csv").read_text().splitlines()
    assert rows[0] == "population,client,num_examples,loss,error,targets"
    assert len(rows) == 1 + 20 and all(row.startswith("test,") for row in rows[1:])
    config = json.loads((finished_run / "config.json").read_text())
    assert config["rounds"] == 4 and config["seed"] == 3


def test_default_compares_fedavg_and_deltafl(tmp_path, capsys):
    # No --algorithm: the quick-start run's comparison, one subdirectory per
    # algorithm (each with the four files) and a comparison table.
    out = tmp_path / "both"
    args = [a for a in TINY if a not in ("--algorithm", "fedavg")]
    status, stdout, _ = _run([*args, "--out", str(out)], capsys)
    assert status == 0
    lines = stdout.splitlines()
    # The header says the training clients are left out, and how to ask for them; no train loss column.
    assert "evaluation not on the training clients (--eval-train adds them)" in stdout
    assert "train loss" not in stdout
    assert any(line.startswith("fedavg ") for line in lines)
    assert any(line.startswith("deltafl ") for line in lines)
    for name in ("fedavg", "deltafl"):
        assert sorted(p.name for p in (out / name).iterdir()) == [
            f for f in RUN_FILES if f != "jaxfl-run.json"
        ]
        assert json.loads((out / name / "config.json").read_text())["algorithm"] == name
    assert (out / "comparison.csv").read_text().count("\n") == 3


def test_config_json_reruns_identically(finished_run, tmp_path, capsys):
    # The written config is a valid --config file, and the same seed gives
    # identical metrics.
    again = tmp_path / "again"
    status, out, _ = _run(["--config", str(finished_run / "config.json"), "--out", str(again)], capsys)
    assert status == 0
    assert "test misclassification error" in out
    assert (again / "metrics.jsonl").read_text() == (finished_run / "metrics.jsonl").read_text()
    assert (again / "clients.csv").read_text() == (finished_run / "clients.csv").read_text()


def test_the_training_clients_are_evaluated_only_when_asked():
    from jaxfl.cli import build_parser, resolve_config

    def eval_train(*flags):
        return resolve_config(build_parser().parse_args(["run", *flags])).evaluation.eval_train

    # --no-eval-train, the default, is still accepted (scripts/ pass it).
    assert (eval_train(), eval_train("--no-eval-train"), eval_train("--eval-train")) == (False, False, True)


def test_eval_clients_evaluates_the_same_models_on_a_sample(finished_run, tmp_path, capsys):
    # The same run evaluated on 7 test clients and, asked for with --eval-train, 7 training clients
    # (left out by default): the header says so, the summary records it, and clients.csv holds those
    # clients' rows, the test clients' those of the full evaluation, under their ids.
    sampled = tmp_path / "sampled"
    args = ["--config", str(finished_run / "config.json"), "--eval-clients", "7", "--eval-train"]
    status, out, _ = _run([*args, "--out", str(sampled)], capsys)
    assert status == 0
    assert (
        "evaluation on a fixed sample of clients (--eval-clients): 7 of 40 train, 7 of 20 test; `jaxfl "
        "evaluate DIR`" in out
    )
    assert "not on the training clients" not in out and "train loss" in out
    summary = json.loads((sampled / "summary.json").read_text())
    assert summary["evaluated_clients"] == {
        "train": {"evaluated": 7, "of": 40}, "test": {"evaluated": 7, "of": 20}
    }
    assert {"train_loss", "train_error", "test_loss"} <= set(summary)

    def rows(folder):
        with (folder / "clients.csv").open() as f:
            return {(r["population"], int(r["client"])): r for r in csv.DictReader(f)}

    full, got = rows(finished_run), rows(sampled)
    assert len(got) == 14 and sorted({p for p, _ in got}) == ["test", "train"]
    got = {key: row for key, row in got.items() if key[0] == "test"}
    for key, row in got.items():
        assert row["num_examples"] == full[key]["num_examples"]
        for column in ("loss", "error"):
            assert float(row[column]) == pytest.approx(float(full[key][column]), rel=1e-5, abs=1e-6)
    errors = [float(row["error"]) for row in got.values()]
    assert summary["test_error"]["mean"] == pytest.approx(sum(errors) / 7, rel=1e-5)


@pytest.mark.slow
def test_flags_override_config_file(tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text('rounds = 1000\nlr = 0.5\n[dataset_options]\nnum_train_clients = 40\n'
                      'num_validation_clients = 0\nnum_test_clients = 20\npool_size = 20000\n')
    out = tmp_path / "o"
    status, _, _ = _run(["--config", str(config), "--rounds", "2", "--clients-per-round", "3",
                         "--no-progress", "--out", str(out)], capsys)
    assert status == 0
    resolved = json.loads((out / "config.json").read_text())
    assert resolved["rounds"] == 2 and resolved["lr"] == 0.5


@pytest.mark.parametrize(
    "args, words",
    [
        (["--clients-per-round", "41"], ["clients_per_round", "[1, 40]", "41"]),
        (["--clients-per-round", "0"], ["clients_per_round", ">= 1"]),
        (["--batch-size", "0"], ["batch_size", ">= 1"]),
        (["--batch-size", "-3"], ["batch_size", ">= 1"]),
        (["--lr", "0"], ["lr", "> 0"]),
        (["--lr", "-0.1"], ["lr", "> 0"]),
        (["--lr", "fast"], ["lr", "number"]),
        (["--rounds", "0"], ["rounds", ">= 1"]),
        (["--rounds", "2.5"], ["rounds", "integer"]),
        (["--local-epochs", "0"], ["local_epochs"]),
        (["--dataset", "mnst"], ["dataset", "mnst", "label-shift", "shakespeare"]),
        (["--model", "resnet"], ["model", "linear"]),
        (["--algorithm", "fedfoo"], ["algorithm", "fedfoo", "fedavg"]),
        (["--strategy", "pmap"], ["strategy", "pmap"]),
        (["--dataset-option", "num_train_clients=0"], ["num_train_clients"]),
        (["--dataset-option", "colour=red"], ["colour"]),
        (["--server-optimizer", "lbfgs"], ["server_optimizer", "sgd"]),
        (["--lr-decay", "1.5"], ["lr_decay", "(0.0, 1.0]"]),
        (["--bogus-flag", "1"], ["bogus"]),
    ],
)
def test_bad_values_exit_2_with_one_line_and_write_nothing(args, words, tmp_path, capsys):
    out = tmp_path / "out"
    assert_cli_refuses(["run", *TINY, *args, "--out", str(out)], words, out, capsys)


@pytest.mark.parametrize(
    "name, text, words",
    [
        ("bad.json", "{rounds: 3", ["malformed"]),
        ("bad.toml", "rounds = = 3", ["malformed"]),
        ("list.json", "[1, 2]", ["table"]),
        ("unknown.toml", "roundz = 3", ["roundz"]),
        ("typed.toml", 'rounds = "many"', ["rounds", "integer"]),
    ],
)
def test_malformed_config_files(name, text, words, tmp_path, capsys):
    path = tmp_path / name
    path.write_text(text)
    status, _, err = _run(["--config", str(path), "--out", str(tmp_path / "o")], capsys)
    assert status == 2 and err.count("\n") == 1
    for word in words:
        assert word in err
    assert not (tmp_path / "o").exists()


def test_missing_config_file(tmp_path, capsys):
    status, _, err = _run(["--config", str(tmp_path / "nope.toml")], capsys)
    assert status == 2 and "nope.toml" in err


def _contents(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_existing_output_is_never_overwritten_without_flag(finished_run, capsys):
    before = _contents(finished_run)
    status, _, err = _run([*TINY, "--out", str(finished_run)], capsys)
    assert status == 2 and "--overwrite" in err
    assert _contents(finished_run) == before


def test_overwrite_replaces_only_after_success(finished_run, tmp_path, capsys):
    target = tmp_path / "target"
    shutil.copytree(finished_run, target)
    status, _, _ = _run([*TINY, "--seed", "4", "--out", str(target), "--overwrite"], capsys)
    assert status == 0
    assert json.loads((target / "config.json").read_text())["seed"] == 4


def test_failed_run_keeps_earlier_results(tmp_path):
    target = tmp_path / "kept"
    target.mkdir()
    (target / "summary.json").write_text("{}")
    (target / MARKER).write_text('{"created_by": "jaxfl", "status": "finished"}')
    output = OutputDirectory(target, overwrite=True)
    staging = output.open()
    (staging / "summary.json").write_text('{"half": true}')
    output.abandon()  # What run_main does when training raises.
    assert (target / "summary.json").read_text() == "{}"
    assert not staging.exists()


def test_out_must_not_exist_without_overwrite(tmp_path):
    with pytest.raises(ConfigError, match="--overwrite"):
        OutputDirectory(tmp_path)


def test_console_script_exit_status():
    # The installed `jaxfl` entry point, in a fresh process.
    script = Path(sys.executable).with_name("jaxfl")
    result = subprocess.run(
        [str(script), "run", "--batch-size", "0"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert result.stderr.strip() == "jaxfl: error: batch_size must be >= 1, got 0"


def test_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "label-shift" in out and "fedavg" in out


def test_the_timing_line_keeps_compilation_training_and_evaluation_apart():
    from jaxfl.experiment.main import timing_text

    timing = {"compile_s": 2.04, "train_s": 2.54, "evaluation_s": 1.25, "rounds_per_call": 10}
    assert timing_text(timing) == (
        "first call 2.0 s (compiling, and 10 rounds), later rounds 0.5 s, evaluation 1.2 s"
    )
    assert "(compiling, and 1 round)" in timing_text({**timing, "rounds_per_call": 1})


def test_run_help_groups_flags_by_section_and_lists_choices(capsys):
    from jaxfl.experiment.config import FIELDS, section_fields

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = capsys.readouterr().out
    sections = section_fields()
    assert None not in sections and sum(map(len, sections.values())) == len(FIELDS)
    starts = [text.index(f"\n{title}:\n") for title in sections]
    assert starts == sorted(starts)  # In the config's order.
    for (title, names), start, end in zip(sections.items(), starts, [*starts[1:], len(text)], strict=True):
        part = text[start:end]
        for name in names:
            meta = FIELDS[name].metadata
            if not meta["flag"]:
                continue
            assert re.search(f"--{name.replace('_', '-')}[ ,\n]", part), (title, name)
    flat = " ".join(text.split())
    assert "one of: num_examples, uniform (default: num_examples)" in flat
    assert "geometric-median" in flat and "sign-flip" in flat
    assert "(default: the dataset's, see `jaxfl list`)" in flat and "(default: linear)" not in flat
