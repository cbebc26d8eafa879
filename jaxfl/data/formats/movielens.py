"""MovieLens-100k's ratings: the `u.data` file of GroupLens's `ml-100k` folder.

`u.data` (from https://grouplens.org/datasets/movielens/100k/, the folder
`ml-100k` of `ml-100k.zip`) holds 100,000 ratings, one per line, four
tab-separated integers: user id (1..943), item id (1..1682), rating (1..5)
and a Unix timestamp. Ids are 1-based in the file and 0-based here. Either
the file itself or a folder holding it (or holding `ml-100k/u.data`) may be
given.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from jaxfl.data.errors import DataFileError, MissingDataError

__all__ = ["MovieLensRatings", "read_movielens_100k"]


class MovieLensRatings(NamedTuple):
    """The ratings as parallel arrays, in file order."""

    users: np.ndarray  # int32 [n], 0-based.
    items: np.ndarray  # int32 [n], 0-based.
    ratings: np.ndarray  # float32 [n].
    timestamps: np.ndarray  # int64 [n].

    @property
    def num_users(self) -> int:
        return int(self.users.max()) + 1

    @property
    def num_items(self) -> int:
        return int(self.items.max()) + 1


def _locate(path: str | os.PathLike[str]) -> Path:
    path = Path(path).expanduser()
    for candidate in (path, path / "u.data", path / "ml-100k" / "u.data"):
        if candidate.is_file():
            return candidate
    raise MissingDataError(
        f"no MovieLens-100k ratings at {path} (looked for {path}/u.data and {path}/ml-100k/u.data; "
        "GroupLens's ml-100k.zip holds them)"
    )


def read_movielens_100k(path: str | os.PathLike[str]) -> MovieLensRatings:
    """Reads `u.data` (module docstring).

    Raises:
      MissingDataError: no u.data at or under `path`.
      DataFileError: a line that is not four tab-separated integers, an id
        below 1, a rating outside 1..5, or no rating at all (the message
        names the file and the line).
    """
    path = _locate(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise DataFileError(f"{path}: unreadable as text ({error})") from None
    rows = np.empty((len(lines), 4), np.int64)
    count = 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        try:
            if len(fields) != 4:
                raise ValueError
            rows[count] = [int(field) for field in fields]
        except ValueError:
            raise DataFileError(
                f"{path}:{number}: expected user, item, rating and timestamp separated by tabs, "
                f"got {line[:40]!r}"
            ) from None
        user, item, rating, _ = rows[count]
        if user < 1 or item < 1 or not 1 <= rating <= 5:
            raise DataFileError(f"{path}:{number}: ids start at 1 and ratings are 1..5, got {line[:40]!r}")
        count += 1
    if count == 0:
        raise DataFileError(f"{path}: no ratings")
    rows = rows[:count]
    return MovieLensRatings(
        users=(rows[:, 0] - 1).astype(np.int32),
        items=(rows[:, 1] - 1).astype(np.int32),
        ratings=rows[:, 2].astype(np.float32),
        timestamps=rows[:, 3],
    )
