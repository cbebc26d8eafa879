"""Output folders: nothing of the user's or of another run is ever lost (no training here)."""

import json
import os

import pytest

from jaxfl.experiment.config import ConfigError
from jaxfl.experiment.run_directory import LOCK, MARKER, OutputDirectory, check_out_path, is_locked


def _finished(folder):
    folder.mkdir()
    (folder / "summary.json").write_text("old")
    (folder / MARKER).write_text(json.dumps({"created_by": "jaxfl", "status": "finished"}))


def test_a_finished_run_moves_into_place_with_its_marker(tmp_path):
    output = OutputDirectory(tmp_path / "run")
    staging = output.open(rounds=5)
    assert staging.name == "run.partial" and is_locked(staging)
    (staging / "summary.json").write_text("new")
    output.commit()
    assert (tmp_path / "run" / "summary.json").read_text() == "new"
    marker = json.loads((tmp_path / "run" / MARKER).read_text())
    assert marker["status"] == "finished" and marker["created_by"] == "jaxfl"
    assert not (tmp_path / "run" / LOCK).exists() and not staging.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_second_run_on_the_same_out_is_refused_while_the_first_runs(tmp_path):
    first = OutputDirectory(tmp_path / "run")
    first.open()
    with pytest.raises(ConfigError, match="another jaxfl run"):
        OutputDirectory(tmp_path / "run")
    with pytest.raises(ConfigError, match="another jaxfl run"):
        OutputDirectory(tmp_path / "run", overwrite=True)
    assert (tmp_path / "run.partial" / MARKER).exists()
    first.commit()


def test_users_partial_folder_is_never_touched(tmp_path):
    mine = tmp_path / "run.partial"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    for overwrite in (False, True):
        with pytest.raises(ConfigError, match="not made by jaxfl"):
            OutputDirectory(tmp_path / "run", overwrite=overwrite)
    assert (mine / "notes.txt").read_text() == "mine"


def test_users_replaced_folder_survives_an_overwrite(tmp_path):
    _finished(tmp_path / "run")
    keep = tmp_path / "run.replaced"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    output = OutputDirectory(tmp_path / "run", overwrite=True)
    (output.open() / "summary.json").write_text("new")
    output.commit()
    assert (keep / "notes.txt").read_text() == "mine"
    assert (tmp_path / "run" / "summary.json").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "run.replaced"]


def test_overwrite_replaces_only_jaxfl_folders(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("years of work")
    with pytest.raises(ConfigError, match="not written by jaxfl"):
        OutputDirectory(home, overwrite=True)
    assert (home / "thesis.tex").exists()


@pytest.mark.parametrize("where", ["finished", "unfinished"])
def test_overwrite_never_deletes_files_a_user_put_in_a_jaxfl_folder(where, tmp_path):
    # A finished folder records what it held when committed; an unfinished one holds jaxfl's names only.
    output = OutputDirectory(tmp_path / "run")
    staging = output.open(rounds=4)
    for name in ("config.json", "metrics.jsonl", "lambda-per-client-0-0.csv"):
        (staging / name).write_text("{}")
    (staging / "fedavg").mkdir()
    if where == "finished":
        output.commit()
        folder = tmp_path / "run"
        assert json.loads((folder / MARKER).read_text())["entries"] == [
            "config.json", "fedavg", MARKER, "lambda-per-client-0-0.csv", "metrics.jsonl",
        ]
        (folder / "report").mkdir()  # `jaxfl report`'s default folder is jaxfl's too.
    else:
        output.keep("interrupted", round=2)
        folder = staging
    replaced = OutputDirectory(tmp_path / "run", overwrite=True)  # Only jaxfl's: allowed.
    replaced.abandon()
    (folder / "notes.txt").write_text("mine")
    (folder / "plots").mkdir()
    with pytest.raises(ConfigError, match=r"jaxfl did not write \(notes.txt, plots\).*move them away"):
        OutputDirectory(tmp_path / "run", overwrite=True)
    assert (folder / "notes.txt").read_text() == "mine" and (folder / "metrics.jsonl").exists()


def test_leftovers_of_a_killed_run_are_reported_and_resumable(tmp_path):
    killed = OutputDirectory(tmp_path / "run")
    staging = killed.open(rounds=100)
    killed.update(round=40)
    killed._release_lock()  # What the kernel does when the process dies (kill -9).
    with pytest.raises(ConfigError, match=r"run \(killed; last checkpoint: round 40 of 100\).*--resume"):
        OutputDirectory(tmp_path / "run")
    resumed = OutputDirectory(tmp_path / "run", resuming=True)
    assert resumed.resume() == staging and is_locked(staging)
    assert json.loads((staging / MARKER).read_text())["status"] == "running"
    resumed.keep("interrupted", round=50)
    # --overwrite discards the dead run's folder (it is jaxfl's and unlocked).
    fresh = OutputDirectory(tmp_path / "run", overwrite=True)
    assert not (fresh.open() / "checkpoints").exists()
    fresh.abandon()
    assert not staging.exists()


def test_abandoning_a_resumed_run_keeps_its_checkpoints(tmp_path):
    output = OutputDirectory(tmp_path / "run")
    staging = output.open()
    (staging / "checkpoints").mkdir()
    output.keep("interrupted")
    resumed = OutputDirectory(tmp_path / "run", resuming=True)
    resumed.resume()
    resumed.abandon()
    assert (staging / "checkpoints").is_dir() and not is_locked(staging)


def test_resuming_a_finished_or_missing_run_is_refused(tmp_path):
    _finished(tmp_path / "done")
    with pytest.raises(ConfigError, match="finished run; there is nothing to resume"):
        OutputDirectory(tmp_path / "done", resuming=True)
    with pytest.raises(ConfigError, match="no unfinished run"):
        OutputDirectory(tmp_path / "nothing", resuming=True)


@pytest.mark.parametrize(
    "make_path, words",
    [
        (lambda tmp: "", "empty"),
        (lambda tmp: ".", "current or a parent"),
        (lambda tmp: str(tmp / "a" / ".."), "current or a parent"),
        (lambda tmp: str(tmp / "file.txt" / "run"), "which is a file"),
        (lambda tmp: str(tmp / "file.txt"), "not a directory"),
        (lambda tmp: str(tmp / ("x" * 250)), "bytes"),
        (lambda tmp: str(tmp / "run.partial"), ".partial"),
        (lambda tmp: str(tmp / "dangling"), "symbolic link"),
        (lambda tmp: str(tmp / "linked"), "symbolic link"),
    ],
)
def test_out_paths_that_cannot_be_a_run_folder(make_path, words, tmp_path):
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "folder").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "folder")
    with pytest.raises(ConfigError, match=words):
        check_out_path(make_path(tmp_path))


def test_out_refusals_from_the_cli_write_nothing(tmp_path, capsys):
    from jaxfl.cli import main

    (tmp_path / "file.txt").write_text("x")
    before = sorted(os.listdir(tmp_path))
    for out in ("", ".", str(tmp_path / "file.txt" / "run")):
        assert main(["run", "--rounds", "1", "--out", out, "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("jaxfl: error: out") and err.count("\n") == 1
    assert sorted(os.listdir(tmp_path)) == before


def test_a_staging_link_is_never_followed_even_with_overwrite(tmp_path):
    # A user's folder behind X.partial, even one holding a jaxfl marker, is not written or deleted.
    users = tmp_path / "users"
    _finished(users)
    (tmp_path / "run.partial").symlink_to(users)
    with pytest.raises(ConfigError, match="symbolic link"):
        OutputDirectory(tmp_path / "run", overwrite=True)
    assert sorted(os.listdir(users)) == sorted([MARKER, "summary.json"])


def test_a_folder_that_cannot_be_created_is_one_line(tmp_path, monkeypatch):
    import tempfile

    def refused(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(tempfile, "mkdtemp", refused)
    with pytest.raises(ConfigError, match=r"cannot create a folder in .* \(Operation not permitted\)"):
        OutputDirectory(tmp_path / "run").open(rounds=1)


def test_a_data_dir_too_long_for_the_file_system_is_one_line():
    from jaxfl.data.datasets.common import check_data_dir
    from jaxfl.data.errors import MissingDataError

    with pytest.raises(MissingDataError, match=r"--data-dir a{80}\.\.\.\(5000 characters\) cannot be read"):
        check_data_dir("a" * 5000, "mnist")

