"""scripts/ditto_fashion_mnist.py: its plan of runs, its tables, and its quick mode end to end.

The tables are built from fabricated run directories (summary.json,
config.json, clients.csv as `jaxfl run` writes them). The end-to-end test
runs `--quick` on the small `synthetic` dataset (whose test clients are the
training clients' own held-out examples, as the Ditto partition's), with the
CLI called in-process: Fashion-MNIST's 500 personal ConvNets take minutes to
evaluate on a CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from reference import csv_rows, imported_script

# The scripts' and benchmarks' harnesses run in the end-to-end tier (`pytest -m slow`).
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ditto_fashion_mnist.py"


@pytest.fixture(scope="module")
def script():
    with imported_script(SCRIPT) as module:
        yield module




def test_full_plan_and_its_cli_words(script):
    args = script.parse_args(["--out", "unused"])
    assert args.rounds == script.DEFAULT_ROUNDS and args.lam == 1.0
    runs = script.plan(args)
    # Table 5.1: Ditto and TERM per setting, one clean λ = 0 run; robust: 6 settings x 6 aggregators.
    assert len(runs) == 10 * 2 + 1 + 6 * 6
    names = {(r.setting, r.name) for r in runs}
    assert ("clean", "local") in names and ("a1-20", "local") not in names
    assert ("a3-50", "ditto-geometric-median") in names
    by_name = {(r.setting, r.name): r.words for r in runs}
    assert by_name[("a2-80", "ditto-krum")] == (
        "--algorithm", "ditto", "--lam", "1", "--attack", "random-updates", "--attack-data", "random-labels",
        "--attack-fraction", "0.8", "--aggregator", "krum", "--byzantine", "8",
    )
    assert by_name[("a3-10", "term")] == (
        "--algorithm", "term", "--tilt", "1", "--attack", "model-replacement", "--attack-data",
        "random-labels", "--attack-fraction", "0.1",
    )
    assert by_name[("clean", "local")] == ("--algorithm", "ditto", "--lam", "0")
    assert by_name[("a1-20", "ditto-median")][-2:] == ("--aggregator", "median")  # No f for the median.
    assert [script.byzantine(f) for f in (None, 0.1, 0.2, 0.5, 0.8)] == [0, 1, 2, 5, 8]
    common = script.common_words(args)
    for pair in (("--dataset-option", "partition=ditto"), ("--lr", "0.05"), ("--batch-size", "16"),
                 ("--max-local-steps", "2"), ("--clients-per-round", "10"), ("--eval-every", "500")):
        assert common[common.index(pair[0]) + 1] == pair[1]
    every = script.plan(script.parse_args(["--local", "every", "--tables", "5.1"]))
    assert len(every) == 10 * 3


def test_dynamic_lambda_plan_uses_the_thesis_candidates_per_setting(script):
    args = script.parse_args(["--dynamic-lam", "--tables", "5.1"])
    by_name = {(r.setting, r.name): r.words for r in script.plan(args)}
    ordinary = ("--lam", "1", "--ditto-dynamic-lam", "0.1,1,2")
    strong = ("--lam", "0.1", "--ditto-dynamic-lam", "0.05,0.1,0.2")
    for setting, expected in (("clean", ordinary), ("a1-50", ordinary), ("a1-80", strong), ("a3-10", strong)):
        assert by_name[(setting, "ditto")][2:6] == expected, setting
    # Local models keep λ = 0, without dynamic λ; the table labels the row as the thesis does.
    assert by_name[("clean", "local")] == ("--algorithm", "ditto", "--lam", "0")
    assert {row["method"] for row in script.table_51(args)} >= {"Ditto, dynamic λ"}


def test_published_numbers_are_the_thesis(script):
    assert script.PUBLISHED["ditto-dynamic"]["clean"] == (0.943, 0.06)
    assert script.PUBLISHED["global"]["a3-50"] == (0.275, 0.12)
    assert script.PUBLISHED["fair"]["a2-20"] == (0.731, 0.13)
    assert script.PUBLISHED["local"]["a3-10"] == (0.877, 0.10)
    assert script.PUBLISHED["multi-krum"]["a2-80"] == (0.095, 0.12)
    assert set(script.PUBLISHED["ditto-lam1"]) == set(script.SETTINGS)


def fabricate(script, args, setting, name, summary, clients=None, config=None):
    run = next(r for r in script.plan(args) if (r.setting, r.name) == (setting, name))
    directory = script.run_directory(args.out, run)
    directory.mkdir(parents=True)
    full = {**script.common_expected(args), **run.expected, **(config or {})}
    (directory / "config.json").write_text(json.dumps(full))
    (directory / "summary.json").write_text(json.dumps({"status": "finished", **summary}))
    if clients is not None:
        lines = ["population,client,num_examples,loss,error,targets,personal_loss,personal_error,attacked"]
        lines += [f"test,{k},10,1.0,0.5,10,1.0,{error},{attacked}" for k, error, attacked in clients]
        (directory / "clients.csv").write_text("\n".join(lines) + "\n")
    return directory


def test_tables_from_fabricated_runs(script, tmp_path):
    argv = ["--out", str(tmp_path), "--settings", "clean,a1-80", "--robust-settings", "a1-80",
            "--aggregators", "median,krum"]
    args = script.parse_args(argv)
    error = lambda mean, std: {"mean": mean, "std": std}  # noqa: E731
    fabricate(script, args, "clean", "ditto", {"test_error": error(0.1, 0.08),
                                               "personal_test_error": error(0.05, 0.06)})
    fabricate(script, args, "clean", "term", {"test_error": error(0.2, 0.07)})
    # The clean λ = 0 run: four devices with personal errors 0.1, 0.2, 0.3, 0.4.
    fabricate(script, args, "clean", "local", {"personal_test_error": error(0.25, 0.1)},
              clients=[(0, 0.1, 0), (1, 0.2, 0), (2, 0.3, 0), (3, 0.4, 0)])
    # A1 80%: devices 1 and 3 corrupted, so its local row is devices 0 and 2 of the clean run.
    fabricate(script, args, "a1-80", "ditto", {"test_error": error(0.3, 0.1),
                                               "personal_test_error": error(0.1, 0.1)},
              clients=[(0, 0.9, 0), (1, 0.9, 1), (2, 0.9, 0), (3, 0.9, 1)])
    fabricate(script, args, "a1-80", "ditto-median", {"test_error": error(0.4, 0.2),
                                                       "personal_test_error": error(0.15, 0.1)})
    # A diverged run still shows, marked.
    diverged = fabricate(script, args, "a1-80", "ditto-krum", {"test_error": error(0.9, 0.01),
                                                               "personal_test_error": error(0.2, 0.1)})
    summary = json.loads((diverged / "summary.json").read_text())
    (diverged / "summary.json").write_text(json.dumps({**summary, "status": "diverged"}))
    # a1-80/term is missing.
    assert script.main(["--table-only", *argv]) == 0

    rows = {(r["method"], r["source"], r["setting"]): r for r in csv_rows(tmp_path / "table_5_1.csv")}
    assert rows[("global", "jaxfl (FedAvg)", "clean")]["mean"] == "0.9000"
    assert rows[("global", "jaxfl (FedAvg)", "clean")]["std"] == "0.0800"
    assert rows[("Ditto λ=1", "jaxfl", "clean")]["mean"] == "0.9500"
    assert rows[("fair (TERM, t=1)", "jaxfl", "clean")]["mean"] == "0.8000"
    assert rows[("fair (TERM, t=1)", "jaxfl", "a1-80")]["mean"] == ""
    assert rows[("local", "jaxfl (Ditto λ=0)", "clean")]["mean"] == "0.7500"
    assert rows[("local", "jaxfl (Ditto λ=0)", "clean")]["std"] == f"{0.05 * 5 ** 0.5:.4f}"
    assert rows[("local", "jaxfl (Ditto λ=0)", "a1-80")]["mean"] == "0.8000"  # (0.9 + 0.7) / 2.
    assert rows[("local", "jaxfl (Ditto λ=0)", "a1-80")]["std"] == "0.1000"
    assert rows[("global", "thesis Tab. 5.1", "a1-80")]["mean"] == "0.7530"
    assert rows[("Ditto λ=1", "thesis Tab. 5.9", "a1-80")]["mean"] == "0.9250"
    markdown = (tmp_path / "table_5_1.md").read_text()
    assert "| global | jaxfl (FedAvg) | .900 (.08) | .700 (.10) |" in markdown
    assert "| fair (TERM, t=1) | jaxfl | .800 (.07) | — |" in markdown
    assert "| Ditto, dynamic λ | thesis Tab. 5.1 | .943 (.06) | .907 (.10) |" in markdown

    robust = {(r["method"], r["source"]): r for r in csv_rows(tmp_path / "table_robust.csv")}
    assert robust[("global + median", "jaxfl")]["mean"] == "0.6000"
    assert robust[("Ditto λ=1 + median", "jaxfl")]["mean"] == "0.8500"
    assert robust[("global + median", "thesis Tab. 5.9")]["mean"] == "0.6060"
    assert robust[("global + Krum", "jaxfl")]["note"] == "diverged"
    assert robust[("Ditto λ=1 (mean)", "jaxfl")]["mean"] == "0.9000"
    assert "| global + Krum | jaxfl | .100 (.01) diverged |" in (tmp_path / "table_robust.md").read_text()


def test_reuses_finished_runs_with_the_same_settings_only(script, tmp_path, monkeypatch):
    argv = ["--out", str(tmp_path), "--tables", "5.1", "--settings", "clean", "--rounds", "7"]
    args = script.parse_args(argv)
    fabricate(script, args, "clean", "ditto", {"test_error": {"mean": 0.1, "std": 0.1}})
    fabricate(script, args, "clean", "term", {"test_error": {"mean": 0.1, "std": 0.1}}, config={"rounds": 9})
    calls = []
    monkeypatch.setattr(script, "call_jaxfl", lambda words: calls.append(list(words)) or 0)
    assert script.main(argv) == 0
    ran = [c[c.index("--out") + 1] for c in calls]
    assert ran == [str(tmp_path / "runs" / "clean" / "term"), str(tmp_path / "runs" / "clean" / "local")]
    assert all("--overwrite" in c and c[c.index("--rounds") + 1] == "7" for c in calls)
    records = {r["run"]: r["status"] for r in csv_rows(tmp_path / "runs.csv")}
    assert records == {"ditto": "reused", "term": "ran", "local": "ran"}


@pytest.mark.slow
def test_quick_mode_end_to_end(script, tmp_path, monkeypatch, capsys):
    from jaxfl.cli import main as jaxfl_main

    monkeypatch.setattr(script, "call_jaxfl", lambda words: jaxfl_main(list(words)))
    out = tmp_path / "quick"
    # One attacked setting (the clean λ = 0 run gives its local row): three runs. The robust table is built
    # from fabricated runs above; Ditto with an aggregator from the CLI is test_cli_robustness.py's.
    status = script.main(["--quick", "--dataset", "synthetic", "--model", "linear", "--out", str(out),
                          "--settings", "a3-10", "--tables", "5.1", "--jaxfl-arg=--strategy=vmap"])
    assert status == 0
    printed = capsys.readouterr()
    assert "wall time:" in printed.err
    table = csv_rows(out / "table_5_1.csv")
    measured = [r for r in table if r["source"].startswith("jaxfl")]
    assert {r["setting"] for r in measured} == {"a3-10"} and len(measured) == 4
    for row in measured:
        assert 0.0 <= float(row["mean"]) <= 1.0 and float(row["std"]) >= 0.0, row
    assert not (out / "table_robust.csv").exists()
    summary = json.loads((out / "runs" / "a3-10" / "ditto" / "summary.json").read_text())
    assert summary["attack"]["attack"] == "model-replacement" and summary["rounds"] == script.QUICK["rounds"]
    runs = [(r["setting"], r["run"], r["status"]) for r in csv_rows(out / "runs.csv")]
    assert runs == [("a3-10", "ditto", "ran"), ("a3-10", "term", "ran"), ("clean", "local", "ran")]
