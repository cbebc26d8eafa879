"""The simulated clock from the command line: simulated time in metrics.jsonl and summary.json from the
rounds' durations, traces read from files, and runs that could not work refused in one line."""

import json

import pytest
from reference import TINY_LABEL_SHIFT, assert_cli_refuses

from jaxfl.cli import main

TINY = [*TINY_LABEL_SHIFT, "--rounds", "3", "--clients-per-round", "8", "--eval-every", "1", "--no-progress"]
PROFILES_HEADER = "client,step_seconds,download_bytes_per_s,upload_bytes_per_s\n"


def _trace(path, windows):
    path.write_text("client,start,end\n" + "".join(f"{c},{s},{e}\n" for c, s, e in windows))
    return str(path)


@pytest.mark.slow
def test_simulated_time_adds_up_the_rounds_durations(tmp_path, capsys):
    # Client k online for 1000 s from 10 k (period 2000 s); devices twice as slow for odd clients.
    trace = _trace(tmp_path / "trace.csv", [(k, 10 * k, 10 * k + 1000) for k in range(40)])
    profiles = tmp_path / "profiles.csv"
    profiles.write_text(PROFILES_HEADER + "".join(f"{k},{0.5 * (1 + k % 2)},1e6,1e5\n" for k in range(40)))
    out = tmp_path / "run"
    status = main([
        "run", *TINY, "--algorithm", "fedavg", "--availability", trace, "--availability-period", "2000",
        "--device-profiles", str(profiles), "--overselect", "1.5", "--report-deadline", "30",
        "--out", str(out),
    ])  # fmt: skip
    assert status == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    times = [r["simulated_time"] for r in records]
    # Someone is always online here, so each round starts when the last ended.
    increments = [b - a for a, b in zip([0.0, *times], times)]
    assert increments == pytest.approx([r["round_metrics"]["round_seconds"] for r in records], rel=1e-5)
    assert all(0 < s <= 30 for s in increments)
    for record in records:
        metrics = record["round_metrics"]
        assert metrics["clients_uploading"] <= 8 and metrics["clients_online"] <= 40
        # Over-selection sends the model to 12 clients a round.
        assert record["bytes_down"] == record["round"] * 12 * (record["bytes_up"] // record["client_uploads"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["simulated_time"] == times[-1]
    from jaxfl.experiment.report import error_against, read_folder, write_report

    (run,) = read_folder(out).runs
    assert error_against(run, "simulated_time")[0].tolist() == times
    assert (write_report([out]).parent / "error_vs_time.png").exists()


@pytest.mark.parametrize(
    "args, words",
    [
        (["--availability", "{trace_never}"], ["client 39", "never online", "trace.csv"]),
        (["--availability", "{trace_bad}"], ["trace.csv", "line 2", "not a number"]),
        (["--availability", "always", "--report-deadline", "1e-6"], ["no training client can ever report"]),
        (["--availability", "always", "--algorithm", "l2sgd"], ["l2sgd", "simulated clock"]),
        (["--availability", "always", "--algorithm", "scaffold"], ["scaffold", "clock drops clients"]),
        (["--availability", "always", "--overselect", "6"], ["overselect=6", "more than the 40"]),
        (["--availability", "always", "--device-profiles", "{missing}"], ["cannot be read"]),
        (
            ["--algorithm", "fedbuff", "--concurrency", "5"],
            ["fedbuff", "buffer of 8 arrivals", "concurrency 5"],
        ),
    ],
)
def test_clocks_that_cannot_run_are_refused_in_one_line(tmp_path, capsys, args, words):
    files = {
        "trace_never": _trace(tmp_path / "trace.csv", [(k, 0, 100) for k in range(39)]),
        "missing": str(tmp_path / "absent.csv"),
    }
    if "{trace_bad}" in args:
        (tmp_path / "trace.csv").write_text("client,start,end\n0,noon,5\n")
        files["trace_bad"] = str(tmp_path / "trace.csv")
    out = tmp_path / "run"
    argv = ["run", *TINY, *[a.format(**files) for a in args], "--out", str(out)]
    assert_cli_refuses(argv, words, out, capsys)


@pytest.mark.slow
def test_an_asynchronous_run_on_online_windows_resumes_bit_for_bit(tmp_path, monkeypatch, capsys):
    from reference import StopAfter

    from jaxfl.experiment import training_loop

    argv = [*TINY, "--rounds", "8", "--eval-every", "2", "--checkpoint-every", "2", "--algorithm", "fedbuff",
            "--availability", "diurnal", "--diurnal-hours", "4"]  # fmt: skip
    assert main(["run", *argv, "--out", str(tmp_path / "whole")]) == 0
    request = StopAfter(2)
    monkeypatch.setattr(training_loop, "current_request", lambda: request)
    assert main(["run", *argv, "--out", str(tmp_path / "stopped")]) == 130
    monkeypatch.undo()
    assert main(["run", "--resume", str(tmp_path / "stopped"), "--no-progress"]) == 0
    capsys.readouterr()
    for name in ("metrics.jsonl", "summary.json"):
        assert (tmp_path / "stopped" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()
