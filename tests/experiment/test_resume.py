"""Checkpoints and --resume: a stopped run, resumed, ends bit for bit as the uninterrupted one.

Stops are simulated in-process (a SIGINT seen after a random number of
compiled calls, or the state `kill -9` leaves: the latest checkpoints gone,
evaluation records past the checkpoint and a cut last line), and done for
real with SIGTERM and SIGKILL on a `jaxfl` process.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from reference import TINY_LABEL_SHIFT, StopAfter, csv_rows, slow_after

from jaxfl.cli import main
from jaxfl.experiment import training_loop
from jaxfl.experiment.run_directory import MARKER
from jaxfl.experiment.saved_model import load_model

BASE = [
    *TINY_LABEL_SHIFT,
    "--rounds", "8", "--clients-per-round", "5", "--eval-every", "2",
    "--no-progress", "--checkpoint-every", "2",
]
RESULT_FILES = ("summary.json", "metrics.jsonl", "clients.csv", "config.json")


def _assert_same_files(folder, reference):
    """`_files` of both equal; a difference is shown as the first differing line of each differing file."""
    got, want = _files(folder), _files(reference)
    assert sorted(got) == sorted(want), (sorted(got), sorted(want))
    for name in got:
        if got[name] != want[name]:
            lines = zip(got[name].splitlines(), want[name].splitlines(), strict=False)
            first = next(((i, a, b) for i, (a, b) in enumerate(lines) if a != b), None)
            raise AssertionError(f"{name} differs at line {first[0] if first else 'end'}:\n{first}")


def _files(folder):
    """The result files, byte for byte (config.json without its `out`, which names the folder)."""
    files = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name in (*RESULT_FILES, "results.csv", "comparison.csv"):
            content = p.read_bytes()
            if p.name == "config.json":
                config = json.loads(content)
                config.pop("out", None)
                content = json.dumps(config).encode()
            files[str(p.relative_to(folder))] = content
    return files


def _params(folder, algorithm=None):
    return jax.tree.leaves(load_model(folder, algorithm).params)


def _assert_same_params(a, b):
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


def _interrupt(monkeypatch, argv, calls, number=signal.SIGINT):
    request = StopAfter(calls, number)
    monkeypatch.setattr(training_loop, "current_request", lambda: request)
    status = main(argv)
    monkeypatch.undo()
    return status


def _uninterrupted(tmp_path_factory, layout):
    out = tmp_path_factory.mktemp("reference") / layout
    assert main(["run", *BASE, "--algorithm", "fedavg", "--strategy", layout, "--out", str(out)]) == 0
    return out


# The reference runs, one per layout; apart, so that a worker of `pytest -n` runs only those its
# tests use.
@pytest.fixture(scope="module")
def uninterrupted_vmap(tmp_path_factory):
    return _uninterrupted(tmp_path_factory, "vmap")


@pytest.fixture(scope="module")
def uninterrupted_sharded(tmp_path_factory):
    return _uninterrupted(tmp_path_factory, "sharded")


# The vmap layout is stopped by SIGINT in test_resume_from_the_state_kill_9_leaves (the state
# it leaves, then cut as kill -9 would): a second vmap stop here added 5 s and nothing else.
@pytest.mark.slow
def test_resume_after_sigint_at_random_rounds_is_bitwise_identical_sharded(
    uninterrupted_sharded, tmp_path, monkeypatch, capsys
):
    rng = np.random.default_rng(12)
    # Sharded rounds run 2 per call here (8 CPU devices): 4 calls in all. One
    # stop keeps the suite short; the kill tests add more.
    for stop_after in rng.choice(np.arange(1, 4), size=1):
        out = tmp_path / f"stopped-{stop_after}"
        argv = ["run", *BASE, "--algorithm", "fedavg", "--strategy", "sharded", "--out", str(out)]
        assert _interrupt(monkeypatch, argv, int(stop_after)) == 130
        marker = _assert_stopped_by_sigint(out, capsys)
        assert main(["run", "--resume", str(out), "--no-progress"]) == 0
        _assert_same_files(out, uninterrupted_sharded)
        _assert_same_params(_params(out), _params(uninterrupted_sharded))
        timing = json.loads((out / "timing.json").read_text())
        assert timing["resumed_from_round"] == marker["round"]
        assert not (out / "checkpoints").exists()


def _assert_stopped_by_sigint(out, capsys):
    """One line saying how to resume, an 'interrupted' marker past round 0, nothing at `out`."""
    err = capsys.readouterr().err
    assert f"jaxfl run --resume {out}" in err and err.count("\n") == 1
    marker = json.loads((out.parent / (out.name + ".partial") / MARKER).read_text())
    assert marker["status"] == "interrupted" and marker["round"] > 0
    assert not out.exists()
    return marker


@pytest.mark.parametrize("latest", slow_after(["missing", "damaged"]))
@pytest.mark.slow
def test_resume_from_the_state_kill_9_leaves(latest, uninterrupted_vmap, tmp_path, monkeypatch, capsys):
    # A SIGINT stop of the vmap layout, checked as such; then its state cut as kill -9 between
    # checkpoints leaves it: the latest checkpoint never written (or damaged on disk: the one before
    # it is restored, and the metrics recorded past that one go), evaluation records past the last
    # one, and a half-written line.
    out = tmp_path / "killed"
    argv = ["run", *BASE, "--algorithm", "fedavg", "--strategy", "vmap", "--out", str(out)]
    assert _interrupt(monkeypatch, argv, 5) == 130
    assert _assert_stopped_by_sigint(out, capsys)["round"] == 6
    staging = out.parent / (out.name + ".partial")
    checkpoints = sorted(int(p.name) for p in (staging / "checkpoints").iterdir() if p.name.isdigit())
    assert checkpoints == [4, 6]  # Stopped at round 6; two kept.
    shutil.rmtree(staging / "checkpoints" / "6")
    if latest == "damaged":
        (staging / "checkpoints" / "6" / "state").mkdir(parents=True)
    assert [json.loads(line)["round"] for line in (staging / "metrics.jsonl").read_text().splitlines()] == [
        2, 4, 6
    ]
    with (staging / "metrics.jsonl").open("a") as f:
        f.write('{"algorithm": "fedavg", "round": 8, "round_me')
    assert main(["run", "--resume", str(out), "--no-progress"]) == 0
    _assert_same_files(out, uninterrupted_vmap)
    _assert_same_params(_params(out), _params(uninterrupted_vmap))
    assert json.loads((out / "timing.json").read_text())["resumed_from_round"] == 4
    assert not (out / "checkpoints").exists()


@pytest.mark.slow
def test_several_algorithms_resume_the_unfinished_one_a_dp_one_with_its_privacy_spent(tmp_path, monkeypatch):
    # One run for both: the unfinished algorithm is the DP one (a run of its own each cost 15 s).
    # A given seed: without one, each DP run draws its own (tests/experiment/test_cli_privacy.py).
    argv = ["--algorithm", "deltafl,dp-fedavg", "--epsilon", "8", "--strategy", "vmap", "--seed", "3"]
    reference = tmp_path / "reference"
    assert main(["run", *BASE, *argv, "--out", str(reference)]) == 0
    out = tmp_path / "stopped"
    # deltafl finishes (8 calls of one round), dp-fedavg stops after three.
    assert _interrupt(monkeypatch, ["run", *BASE, *argv, "--out", str(out)], 10) == 130
    staging = tmp_path / "stopped.partial"
    marker = json.loads((staging / MARKER).read_text())
    assert marker["algorithm"] == "dp-fedavg"
    checkpoints = staging / "dp-fedavg" / "checkpoints"
    latest = max(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit())
    meta = json.loads((checkpoints / str(latest) / "meta" / "metadata").read_text())
    assert meta["privacy_spent"]["rounds"] == latest
    spent = json.loads((reference / "dp-fedavg" / "summary.json").read_text())["privacy"]["epsilon"]
    assert meta["privacy_spent"]["epsilon"] < spent
    assert main(["run", "--resume", str(out), "--no-progress"]) == 0
    _assert_same_files(out, reference)
    for name in ("deltafl", "dp-fedavg"):
        _assert_same_params(_params(out, name), _params(reference, name))
    assert json.loads((out / "dp-fedavg" / "summary.json").read_text())["privacy"]["rounds"] == 8


@pytest.mark.slow
def test_sweep_resumes_the_points_that_did_not_finish(tmp_path, monkeypatch):
    grid = ["--grid", "theta=0.3,0.7", "--grid", "batch_size=5,10"]
    argv = [*BASE, "--algorithm", "deltafl", "--strategy", "vmap", *grid]
    reference = tmp_path / "reference"
    assert main(["sweep", *argv, "--out", str(reference)]) == 0
    # The CLI's rows: one per point of the grid.
    rows = csv_rows(reference / "results.csv")
    assert len(rows) == 4
    assert {(r["theta"], r["batch_size"]) for r in rows} == {
        (t, b) for t in ("0.3", "0.7") for b in ("5", "10")
    }
    out = tmp_path / "stopped"
    # The first outer group (batch_size=5) finishes in 8 calls; the second stops at round 3.
    assert _interrupt(monkeypatch, ["sweep", *argv, "--out", str(out)], 11) == 130
    staging = tmp_path / "stopped.partial"
    assert (staging / "points" / "000" / "summary.json").exists()
    assert not (staging / "points" / "002" / "summary.json").exists()
    assert main(["sweep", "--resume", str(out), "--no-progress"]) == 0
    _assert_same_files(out, reference)
    assert not (out / "checkpoints").exists() and not (reference / "checkpoints").exists()

    # A point's config (the second point of the second group, resumed above) reruns as a single
    # run, without the sweep's out, and reproduces the point's model and summary (test_sweep.py
    # checks points of other hyperparameters and seeds against their single runs).
    for sweep in (reference, out):
        config = json.loads((sweep / "points" / "003" / "config.json").read_text())
        assert config["out"] is None and config["algorithm"] == "deltafl"
        assert (config["theta"], config["batch_size"]) == (0.7, 10)
    point = out / "points" / "003"
    single = tmp_path / "single"
    assert main(["run", "--config", str(point / "config.json"), "--out", str(single)]) == 0
    for x, y in zip(_params(single), _params(point), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)
    swept = json.loads((point / "summary.json").read_text())
    alone = json.loads((single / "summary.json").read_text())
    assert alone["test_error"]["mean"] == pytest.approx(swept["test_error"]["mean"], abs=1e-6)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--rounds", "9"], ["--resume", "--rounds"]),
        (["--dataset-option", "seed=1"], ["--resume", "--dataset-option"]),
    ],
)
def test_resume_takes_no_other_settings(argv, words, tmp_path, capsys):
    status = main(["run", "--resume", str(tmp_path / "x"), *argv])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1
    for word in words:
        assert word in err


def test_resume_refuses_what_cannot_be_resumed(uninterrupted_vmap, tmp_path, capsys):
    assert main(["run", "--resume", str(tmp_path / "nothing")]) == 2
    assert "no unfinished run" in capsys.readouterr().err
    assert main(["run", "--resume", str(uninterrupted_vmap)]) == 2
    assert "finished" in capsys.readouterr().err
    assert main(["sweep", "--resume", str(uninterrupted_vmap)]) == 2
    capsys.readouterr()


def _spawn(argv, env_extra=None):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAXFL_CPU_DEVICES": "1", **(env_extra or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "jaxfl.cli", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env,
    )


def _wait_for_checkpoint(staging, at_least, process, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        folder = staging / "checkpoints"
        rounds = [int(p.name) for p in folder.iterdir() if p.name.isdigit()] if folder.is_dir() else []
        if rounds and max(rounds) >= at_least:
            return
        if process.poll() is not None:
            pytest.fail(f"the run ended before a checkpoint: {process.communicate()}")
        time.sleep(0.05)
    pytest.fail("no checkpoint in time")


KILLED = ["run", *BASE, "--rounds", "200", "--eval-every", "50", "--checkpoint-every", "10",
          "--algorithm", "fedavg", "--strategy", "vmap"]


@pytest.fixture(scope="module")
def uninterrupted_process(tmp_path_factory):
    """The reference of the killed processes, run as a process too (the test process compiles
    with other XLA settings)."""
    out = tmp_path_factory.mktemp("process") / "reference"
    process = _spawn([*KILLED, "--out", str(out)])
    _, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    return out


def _signal_after_checkpoint(process, staging, at_least, number):
    """`number` sent once a checkpoint of round >= `at_least` exists; the process's stderr."""
    _wait_for_checkpoint(staging, at_least, process)
    process.send_signal(number)
    _, err = process.communicate(timeout=120)
    if process.returncode == 0:
        pytest.skip("the run finished before the signal arrived")
    return err


@pytest.mark.slow
def test_a_real_process_terminated_then_killed_then_resumed(uninterrupted_process, tmp_path):
    # One chain for both signals (a fresh run each cost 14-16 s): SIGTERM on a fresh process,
    # SIGKILL on the process that resumed it, and a last process resumes what that left.
    out = tmp_path / "killed"
    staging = tmp_path / "killed.partial"
    process = _spawn([*KILLED, "--out", str(out)])
    at_least = int(np.random.default_rng(4).integers(10, 100))
    err = _signal_after_checkpoint(process, staging, at_least, signal.SIGTERM)
    assert process.returncode == 143, err
    assert "--resume" in err
    marker = json.loads((staging / MARKER).read_text())
    assert marker["status"] == "interrupted"

    # SIGKILL past a checkpoint of the resumed process's own (one at least 10 rounds before the end).
    at_least = max(int(np.random.default_rng(3).integers(10, 100)), marker["round"] + 10)
    if at_least > 190:
        pytest.skip("the SIGTERM arrived too late to leave the resumed run a checkpoint")
    resumed = _spawn(["run", "--resume", str(out), "--no-progress"])
    _signal_after_checkpoint(resumed, staging, at_least, signal.SIGKILL)
    assert resumed.returncode == -signal.SIGKILL
    assert json.loads((staging / MARKER).read_text())["status"] == "running"

    resumed = _spawn(["run", "--resume", str(out), "--no-progress"])
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    _assert_same_files(out, uninterrupted_process)
    _assert_same_params(_params(out), _params(uninterrupted_process))
