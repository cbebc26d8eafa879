"""A run's output folder: written through a locked staging folder, never losing one.

A run with `--out DIR` works in `DIR.partial`, a folder it creates, marks
and locks, and moves it to `DIR` only when it has finished. So:

* a crash, `kill -9`, SIGINT or SIGTERM leaves any earlier `DIR` untouched,
  and `DIR.partial` holds the run's checkpoints and its marker file
  (`jaxfl-run.json`: who made it, its status, the round it reached), from
  which `jaxfl run --resume DIR` continues;
* two runs with the same `--out` cannot destroy each other: the staging
  folder is locked (`flock`, released by the kernel when its process dies,
  `kill -9` included) and the second run is refused in one line;
* a run deletes only folders it made: a `DIR.partial` without jaxfl's marker
  is never touched, replacing `DIR` needs `overwrite=True` and a `DIR` that
  holds a jaxfl marker (a finished run's), and the old `DIR` is retired
  through a fresh uniquely named folder, never a fixed name that could be a
  user's.

The marker stays in the finished `DIR` (status `finished` or `diverged`):
it is how a later `--overwrite` knows the folder is jaxfl's. It holds the
wall-clock facts (host, process, times); the result files never do.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

from jaxfl.experiment.config import ConfigError
from jaxfl.experiment.outputs import write_json

MARKER = "jaxfl-run.json"
LOCK = ".jaxfl-lock"
STAGING_SUFFIX = ".partial"


def check_out_path(path: str | os.PathLike) -> Path:
    """Refuses, in one line, an `--out` that cannot become a run's folder.

    Empty, `.`/`..`/`/` or the current directory, a name ending in
    `.partial` (the staging folders' suffix), a name or path too long for
    the file system, a path under an existing file, or a parent that cannot
    be created or written.
    """
    text = os.fspath(path)
    if not text.strip():
        raise ConfigError("out must be a directory path, got an empty string")
    out = Path(text)
    if out.name in ("", ".", "..") or out.resolve() == Path.cwd().resolve():
        raise ConfigError(
            f"out {text!r} names the current or a parent directory; give a new folder, e.g. runs/NAME"
        )
    if out.name.endswith(STAGING_SUFFIX):
        raise ConfigError(f"out {text!r} ends in {STAGING_SUFFIX}, the suffix of jaxfl's staging folders")
    name_max = _pathconf(out, "PC_NAME_MAX", 255)
    if len(os.fsencode(out.name + STAGING_SUFFIX)) > name_max:
        raise ConfigError(
            f"out folder name is {len(os.fsencode(out.name))} bytes; this file system allows "
            f"{name_max - len(STAGING_SUFFIX)} (with the {STAGING_SUFFIX} staging suffix)"
        )
    path_max = _pathconf(out, "PC_PATH_MAX", 4096)
    if len(os.fsencode(str(out.absolute()))) + 64 > path_max:
        raise ConfigError(f"out path is too long for this file system ({path_max} bytes at most)")
    ancestor = out.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(f"out {text!r} lies under {str(ancestor)!r}, which is a file")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ConfigError(f"out {text!r}: cannot create folders in {str(ancestor)!r} (permission denied)")
    if out.is_symlink():
        raise ConfigError(
            f"out {text!r} is a symbolic link; give the folder itself (jaxfl never writes through a link)"
        )
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out {text!r} exists and is not a directory")
    return out


def _pathconf(path: Path, name: str, default: int) -> int:
    directory = path.absolute().parent
    while not directory.exists():
        directory = directory.parent
    try:
        return os.pathconf(directory, name)
    except (OSError, ValueError):
        return default


# What jaxfl writes at the top of an output folder (runs, sweeps, the family, `jaxfl report`'s default
# folder), besides one subfolder per algorithm and what a finished folder's marker lists.
JAXFL_ENTRIES = frozenset({
    MARKER, MARKER + ".tmp", LOCK, "config.json", "metrics.jsonl", "clients.csv", "summary.json",
    "timing.json", "model", "checkpoints", "comparison.csv", "comparison.md", "points", "results.csv",
    "family.json", "report",
})


def foreign_entries(directory: Path, marker: dict[str, Any]) -> list[str]:
    """The names at the top of `directory` that jaxfl did not write (a user's notes, say), sorted.

    Known: `JAXFL_ENTRIES`, the algorithms' subfolders, a sweep's
    `lambda-per-client-*.csv`, and the `entries` a finished folder's marker
    recorded when it was committed.
    """
    from jaxfl.algorithms.registry import SPECS  # JAX-free.

    known = JAXFL_ENTRIES | set(SPECS) | set(marker.get("entries") or ())
    return sorted(
        name for name in os.listdir(directory)
        if name not in known and not (name.startswith("lambda-per-client-") and name.endswith(".csv"))
    )


def _refuse_foreign(directory: Path, marker: dict[str, Any]) -> None:
    foreign = foreign_entries(directory, marker)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ConfigError(
            f"{str(directory)!r} holds files jaxfl did not write ({shown}); --overwrite never deletes "
            "them: move them away first"
        )


def read_marker(directory: Path) -> dict[str, Any] | None:
    """The marker of a folder jaxfl made, or None (no marker, or not jaxfl's)."""
    try:
        marker = json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and marker.get("created_by") == "jaxfl" else None


def _write_marker(directory: Path, marker: dict[str, Any]) -> None:
    temporary = directory / (MARKER + ".tmp")
    temporary.write_text(json.dumps(marker, indent=2) + "\n")
    os.replace(temporary, directory / MARKER)


def is_locked(directory: Path) -> bool:
    """Whether a live process holds the folder's run lock."""
    try:
        fd = os.open(directory / LOCK, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EAGAIN, errno.EACCES):
            return True
        raise
    finally:
        os.close(fd)  # Closing drops the lock this probe took.
    return False


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def describe_leftover(marker: dict[str, Any]) -> str:
    """E.g. 'run (killed; last checkpoint: round 40 of 100)'."""
    status = marker.get("status", "unfinished")
    if status == "running":  # Its lock is free: the process died without a word (kill -9, a crash).
        status = "killed"
    reached = marker.get("round")
    where = f"last checkpoint: round {reached} of {marker.get('rounds')}" if reached else "no checkpoint"
    return f"{marker.get('command', 'run')} ({status}; {where})"


class OutputDirectory:
    """A destination folder written through a locked, marked staging folder.

    Construct it while validating (it refuses, in one line, an `--out` that
    cannot be used or is in use), `open()` (or `resume()`) it when training
    starts, then `commit()` a finished run, `keep(status)` an interrupted or
    failed one (resumable), or `abandon()` one that never trained.
    """

    def __init__(
        self, path: str | os.PathLike, *, overwrite: bool = False, command: str = "run",
        resuming: bool = False,
    ):
        self.path = check_out_path(path)
        self.staging = self.path.with_name(self.path.name + STAGING_SUFFIX)
        self.overwrite = overwrite
        self.command = command
        self._lock_fd: int | None = None
        self._created = False  # Whether this process made the staging folder.
        self._marker: dict[str, Any] = {}
        if resuming:
            self._check_resumable()
            return
        if self.path.exists():
            if not overwrite:
                raise ConfigError(f"out directory {str(self.path)!r} exists; pass --overwrite to replace it")
            existing = read_marker(self.path)
            if existing is None:
                raise ConfigError(
                    f"out directory {str(self.path)!r} was not written by jaxfl; --overwrite replaces "
                    "only jaxfl's output folders"
                )
            _refuse_foreign(self.path, existing)
        self._check_staging_free()

    def _check_staging_free(self) -> None:
        if not os.path.lexists(self.staging):
            return
        if self.staging.is_symlink():
            raise ConfigError(
                f"{str(self.staging)!r} is a symbolic link (jaxfl never writes or deletes through one); "
                f"move it away to use --out {str(self.path)!r}"
            )
        marker = read_marker(self.staging) if self.staging.is_dir() else None
        if marker is None:
            raise ConfigError(
                f"{str(self.staging)!r} exists and was not made by jaxfl; move it away to use --out "
                f"{str(self.path)!r}"
            )
        if is_locked(self.staging):
            raise ConfigError(
                f"another jaxfl run (process {marker.get('pid')} on {marker.get('host')}) is writing "
                f"{str(self.path)!r}"
            )
        if not self.overwrite:
            raise ConfigError(
                f"{str(self.staging)!r} holds an unfinished {describe_leftover(marker)}: "
                f"continue it with `jaxfl {self.command} --resume {self.path}`, or pass --overwrite to "
                "discard it"
            )
        _refuse_foreign(self.staging, marker)

    def _check_resumable(self) -> None:
        if not self.staging.is_dir():
            marker = read_marker(self.path) if self.path.is_dir() else None
            if marker is not None and marker.get("status") in ("finished", "diverged"):
                raise ConfigError(
                    f"{str(self.path)!r} holds a {marker['status']} {marker.get('command', 'run')}; "
                    "there is nothing to resume"
                )
            raise ConfigError(f"no unfinished run to resume at {str(self.path)!r} (no {self.staging.name})")
        marker = read_marker(self.staging)
        if marker is None:
            raise ConfigError(f"{str(self.staging)!r} was not made by jaxfl; there is nothing to resume")
        if marker.get("command", "run") != self.command:
            raise ConfigError(
                f"{str(self.path)!r} holds a {marker.get('command')} run; resume it with "
                f"`jaxfl {marker.get('command')} --resume {self.path}`"
            )
        if is_locked(self.staging):
            raise ConfigError(
                f"another jaxfl run (process {marker.get('pid')} on {marker.get('host')}) is writing "
                f"{str(self.path)!r}"
            )

    @property
    def marker(self) -> dict[str, Any]:
        return dict(self._marker)

    def _take_lock(self, directory: Path) -> None:
        fd = os.open(directory / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise ConfigError(f"another jaxfl run is writing {str(self.path)!r}") from None
        self._lock_fd = fd

    def open(self, rounds: int | None = None) -> Path:
        """Creates, marks and locks a fresh staging folder, atomically.

        A leftover staging folder is removed only with `overwrite` and only
        when it is jaxfl's and no live process holds it.
        """
        self._check_staging_free()
        parent = self.staging.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
            fresh = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.starting-", dir=parent))
        except OSError as error:
            raise ConfigError(
                f"out {str(self.path)!r}: cannot create a folder in {str(parent)!r} ({error.strerror})"
            ) from None
        fresh.chmod(0o777 & ~_umask())  # mkdtemp makes it private; a run's folder is not.
        self._marker = {
            "created_by": "jaxfl",
            "command": self.command,
            "status": "running",
            "out": str(self.path),
            "rounds": rounds,
            "round": None,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": _now(),
        }
        _write_marker(fresh, self._marker)
        self._take_lock(fresh)
        if os.path.lexists(self.staging):  # A dead run's, checked above: ours to discard.
            shutil.rmtree(self.staging)
        try:
            os.rename(fresh, self.staging)
        except OSError:
            self._release_lock()
            shutil.rmtree(fresh, ignore_errors=True)
            raise ConfigError(f"another jaxfl run started writing {str(self.path)!r}") from None
        self._created = True
        return self.staging

    def start(self, *, resume: bool, rounds: int, config: dict[str, Any]) -> Path:
        """`resume()`, or `open()` and write the run's `config.json` (what `--resume` reads)."""
        if resume:
            return self.resume()
        staging = self.open(rounds=rounds)
        write_json(staging / "config.json", config)
        return staging

    def resume(self) -> Path:
        """Locks the staging folder of an unfinished run and marks it running again."""
        self._take_lock(self.staging)
        self._marker = {
            **(read_marker(self.staging) or {}),
            "status": "running",
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "resumed": _now(),
        }
        _write_marker(self.staging, self._marker)
        return self.staging

    def update(self, **fields: Any) -> None:
        """Records progress (e.g. the round of the latest checkpoint) in the marker."""
        self._marker.update(fields)
        _write_marker(self.staging, self._marker)

    def commit(self, status: str = "finished") -> Path:
        """Moves the finished staging folder to the destination."""
        # What it holds, so that a later --overwrite can tell a user's files from jaxfl's.
        entries = sorted(set(os.listdir(self.staging)) - {LOCK, MARKER + ".tmp"} | {MARKER})
        self._marker.update(status=status, finished=_now(), entries=entries)
        _write_marker(self.staging, self._marker)
        (self.staging / LOCK).unlink(missing_ok=True)
        if self.path.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.replaced-", dir=self.path.parent))
            os.replace(self.path, retired / self.path.name)
            os.replace(self.staging, self.path)
            shutil.rmtree(retired)
        else:
            os.replace(self.staging, self.path)
        self._release_lock()
        return self.path

    def keep(self, status: str, **fields: Any) -> None:
        """Leaves the staging folder for `--resume`, marked with why it stopped."""
        self.update(status=status, stopped=_now(), **fields)
        self._release_lock()

    def abandon(self) -> None:
        """Removes the staging folder of a run that never trained, if this process made it.

        A resumed run's folder holds earlier rounds' checkpoints: it is only
        unlocked, still resumable.
        """
        if self._created:
            shutil.rmtree(self.staging, ignore_errors=True)
        self._release_lock()

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
