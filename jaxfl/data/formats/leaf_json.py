"""LEAF's JSON directories (LEAF, FedProx, simplicial-fl/Delta-FL).

Every file of a LEAF directory is one JSON object (TalwalkarLab/leaf
`data/femnist/preprocess/data_to_json.py`, `data/utils/split_data.py`,
`models/utils/model_utils.py`):

    {"users": [u, ...], "num_samples": [n, ...],
     "user_data": {u: {"x": [...], "y": [...]}, ...},
     "hierarchies": [h, ...]}          # optional: Shakespeare's play per user

and a dataset is every `*.json` of a directory merged. Layouts:
`<dataset>/data/{all_data,sampled_data,rem_user_data,train,test}/*.json`, and
FedProx's `data/train/mytrain.json` + `data/test/mytest.json`. FEMNIST writes at
most 100 writers per file, and the whole set is ~25 GB of JSON, so readers
here go one file at a time.

Quirks of LEAF's own writer (`split_data.py`, by-sample split) that this
reader accepts: `user_data` also holds users dropped from `users` (with empty
lists), and `hierarchies` is copied from the unsplit file, so it may be longer
than `users` when users were dropped; such a file's hierarchies cannot be
matched to users and come back as None. A by-user split (`-t user`, used by
Delta-FL) puts different users in train and test on purpose: check that the
two list the same users only for by-sample splits (`check_same_users`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from jaxfl.data.errors import DataFileError, MissingDataError
from jaxfl.data.formats._common import one_line, require_dir

__all__ = [
    "check_same_users",
    "compare_users",
    "find_leaf_splits",
    "iter_leaf_users",
    "leaf_json_files",
    "leaf_users",
]


def _has_json(directory: Path) -> bool:
    return directory.is_dir() and any(p.suffix == ".json" and p.is_file() for p in directory.iterdir())


def find_leaf_splits(root: str | os.PathLike[str]) -> dict[str, Path]:
    """Finds the LEAF split directories under `root`.

    Recognized (TalwalkarLab/leaf `data/utils/split_data.py`):
    `root/train` + `root/test`, `root/data/train` + `root/data/test` (also
    FedProx's `train/mytrain.json` + `test/mytest.json`), an unsplit
    `all_data` directory (`root/all_data`, `root/data/all_data`), and `root`
    itself when it holds `*.json` files.

    Args:
      root: a LEAF dataset directory (e.g. `leaf/data/femnist`), its `data/`
        directory, or a directory of JSON files.

    Returns:
      Split name -> directory, with keys among "train", "test" and "all"
      ("all" for an unsplit directory). Only directories holding `*.json`
      files count.

    Raises:
      MissingDataError: no LEAF layout found; the message lists where it looked.
    """
    root = require_dir(root)
    looked = []
    for base in (root, root / "data"):
        splits = {}
        for name in ("train", "test"):
            looked.append(base / name)
            if _has_json(base / name):
                splits[name] = base / name
        looked.append(base / "all_data")
        if _has_json(base / "all_data"):
            splits["all"] = base / "all_data"
        if splits:
            return splits
    if _has_json(root):
        return {"all": root}
    places = ", ".join(str(p) for p in looked)
    raise MissingDataError(f"{root}: no LEAF JSON directory found (looked for *.json in {places} and {root})")


def leaf_json_files(directory: str | os.PathLike[str]) -> list[Path]:
    """The `*.json` files of a LEAF directory, sorted by name.

    Raises:
      MissingDataError: the directory is missing or holds no `*.json` file.
    """
    directory = require_dir(directory)
    files = sorted(p for p in directory.iterdir() if p.suffix == ".json" and p.is_file())
    if not files:
        raise MissingDataError(f"{directory}: no *.json files (expected LEAF JSON data)")
    return files


def _load(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = json.load(f)
    except json.JSONDecodeError as err:
        raise DataFileError(
            f"{path}: not valid JSON ({err.msg} at line {err.lineno} column {err.colno}; truncated?)"
        ) from None
    except UnicodeDecodeError as err:
        raise DataFileError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except OSError as err:
        raise DataFileError(f"{path}: cannot read ({one_line(err.strerror or err)})") from None
    except RecursionError:
        raise DataFileError(f"{path}: JSON nested too deeply") from None
    if not isinstance(data, dict):
        found = type(data).__name__
        raise DataFileError(f"{path}: not a LEAF file (top level is a {found}, expected an object)")
    return data


def _file_users(path: Path, data: dict[str, Any]) -> tuple[list[str], list[Any] | None]:
    """Validates a loaded file's index; returns its users and aligned hierarchies (or None)."""
    for key, kind in (("users", list), ("num_samples", list), ("user_data", dict)):
        if key not in data:
            raise DataFileError(f"{path}: not a LEAF file (no key {key!r})")
        if not isinstance(data[key], kind):
            found = type(data[key]).__name__
            raise DataFileError(f"{path}: {key!r} is a {found}, expected a {kind.__name__}")
    users = data["users"]
    if len(data["num_samples"]) != len(users):
        raise DataFileError(
            f"{path}: 'num_samples' has {len(data['num_samples'])} entries for {len(users)} users"
        )
    if not all(isinstance(u, (str, int)) and not isinstance(u, bool) for u in users):
        raise DataFileError(f"{path}: 'users' must hold strings")
    # JSON object keys are strings, so a numeric user id can only be looked up as one.
    users = [str(u) for u in users]
    hierarchies = data.get("hierarchies")
    if hierarchies is not None and (not isinstance(hierarchies, list) or len(hierarchies) != len(users)):
        hierarchies = None
    return users, hierarchies


def iter_leaf_users(directory: str | os.PathLike[str]) -> Iterator[tuple[str, dict[str, list], Any]]:
    """Yields (user, {"x": [...], "y": [...]}, hierarchy or None) for every user of a LEAF directory.

    Files are read one at a time in sorted name order, users in each file's
    `users` order. The format is described in this module's docstring; it
    was checked against TalwalkarLab/leaf `data/utils/split_data.py` and
    `models/utils/model_utils.py` @ 09ec454a.

    Args:
      directory: a directory of LEAF `*.json` files (e.g. `data/train`).

    Raises:
      DataFileError: malformed JSON, a missing key, `num_samples` disagreeing
        with a user's `y`, `x` and `y` of different lengths, or a user listed
        twice (in one file or in two).
      MissingDataError: no `*.json` file in the directory.
    """
    seen: dict[str, Path] = {}
    for path in leaf_json_files(directory):
        data = _load(path)
        users, hierarchies = _file_users(path, data)
        user_data = data["user_data"]
        for i, (user, count) in enumerate(zip(users, data["num_samples"], strict=True)):
            if user in seen:
                where = "twice in this file" if seen[user] == path else f"also in {seen[user].name}"
                raise DataFileError(f"{path}: user {user!r} is {where}")
            seen[user] = path
            record = user_data.get(user)
            if not isinstance(record, dict) or "x" not in record or "y" not in record:
                raise DataFileError(f"{path}: user {user!r} has no {{'x', 'y'}} entry in 'user_data'")
            x, y = record["x"], record["y"]
            if not isinstance(x, list) or not isinstance(y, list):
                raise DataFileError(f"{path}: user {user!r}: 'x' and 'y' must be lists")
            if len(x) != len(y):
                raise DataFileError(f"{path}: user {user!r} has {len(x)} x but {len(y)} y")
            if count != len(y):
                raise DataFileError(f"{path}: user {user!r}: num_samples says {count}, 'y' has {len(y)}")
            yield user, {"x": x, "y": y}, hierarchies[i] if hierarchies is not None else None


def leaf_users(directory: str | os.PathLike[str]) -> list[str]:
    """The users of a LEAF directory in reading order (one validating pass, as `iter_leaf_users`)."""
    return [user for user, _, _ in iter_leaf_users(directory)]


def compare_users(
    train_users: Iterable[str],
    test_users: Iterable[str],
    *,
    train_name: str = "train",
    test_name: str = "test",
) -> None:
    """Raises DataFileError naming a user found in only one of two user lists.

    LEAF's by-sample split (`split_data.py --by_sample`) writes the same users
    to train and test; use this where a dataset is split that way.
    """
    train, test = set(train_users), set(test_users)
    if train == test:
        return
    only_train, only_test = sorted(train - test), sorted(test - train)
    if only_train:
        example, where, other = only_train[0], train_name, test_name
    else:
        example, where, other = only_test[0], test_name, train_name
    raise DataFileError(
        f"{where}: user {example!r} is not in {other} ({len(only_train)} users only in train, "
        f"{len(only_test)} only in test); LEAF train and test must list the same users"
    )


def check_same_users(train_dir: str | os.PathLike[str], test_dir: str | os.PathLike[str]) -> list[str]:
    """Checks that two LEAF directories list the same users; returns the train users in order.

    This reads both directories completely (one file at a time).

    Raises:
      DataFileError: a user is found in only one directory (the message names one).
    """
    train = leaf_users(train_dir)
    compare_users(train, leaf_users(test_dir), train_name=str(train_dir), test_name=str(test_dir))
    return train
