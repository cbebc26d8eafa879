"""Availability and device traces read from CSV files.

Availability (`--availability FILE`): one online window per row,

    client,start,end
    0,3600,7200
    0,90000,93600
    1,0,86400

`client` a training client's index (0 to N - 1), `start` and `end` seconds
from the trace's origin, 0 <= start < end <= start + period. The trace
repeats with its period (`--availability-period`, default one week). A
client's windows that overlap or touch are merged; a training client without
a window is refused (it could never take part).

Device profiles (`--device-profiles FILE`): one row per training client,

    client,step_seconds,download_bytes_per_s,upload_bytes_per_s
    0,0.12,2500000,600000

Every error names the file and the line, in one line.
"""

from __future__ import annotations

import csv
import math
import os

import jax.numpy as jnp
import numpy as np

from jaxfl.clock.availability import Availability, check_availability
from jaxfl.clock.profiles import DeviceProfiles, check_profiles

WEEK_SECONDS = 7 * 86400.0
AVAILABILITY_COLUMNS = ("client", "start", "end")
PROFILE_COLUMNS = ("client", "step_seconds", "download_bytes_per_s", "upload_bytes_per_s")


def _rows(path: str | os.PathLike, columns: tuple[str, ...]):
    try:
        handle = open(path, newline="")
    except OSError as error:
        raise ValueError(f"{path}: cannot be read ({error.strerror or error})") from None
    with handle:
        reader = csv.reader(handle)
        header = [cell.strip() for cell in next(reader, [])]
        if tuple(header) != columns:
            raise ValueError(
                f"{path}: line 1 must be the header {','.join(columns)}, got {','.join(header)!r}"
            )
        for line, row in enumerate(reader, start=2):
            if not row or not "".join(row).strip():
                continue
            if len(row) != len(columns):
                raise ValueError(f"{path}: line {line} has {len(row)} fields, expected {len(columns)}")
            try:
                values = [float(cell) for cell in row]
            except ValueError:
                raise ValueError(f"{path}: line {line} holds a value that is not a number") from None
            if not all(math.isfinite(v) for v in values):
                raise ValueError(f"{path}: line {line} holds a value that is not finite")
            yield line, values


def _client(path, line: int, value: float, num_clients: int) -> int:
    if value != int(value) or not 0 <= value < num_clients:
        raise ValueError(f"{path}: line {line}: client must be an index in [0, {num_clients}), got {value:g}")
    return int(value)


def read_availability(
    path: str | os.PathLike, num_clients: int, period: float = WEEK_SECONDS
) -> Availability:
    """The online windows of `num_clients` training clients from a CSV trace (see the module docstring).

    Raises:
      ValueError: an unreadable or malformed file, a window outside its
        bounds, or a client without a window (one line).
    """
    if not (math.isfinite(period) and period > 0):
        raise ValueError(f"the availability period must be a positive number of seconds, got {period!r}")
    windows: list[list[tuple[float, float]]] = [[] for _ in range(num_clients)]
    for line, (client, start, end) in _rows(path, AVAILABILITY_COLUMNS):
        client = _client(path, line, client, num_clients)
        if not (0 <= start < period and start < end <= start + period):
            raise ValueError(
                f"{path}: line {line}: a window needs 0 <= start < {period:g} (the period) and "
                f"start < end <= start + period, got start={start:g}, end={end:g}"
            )
        windows[client].append((start, end))
    merged = [_union(client_windows, period) for client_windows in windows]
    width = max(1, max(len(w) for w in merged))
    start = np.zeros((num_clients, width), np.float32)
    length = np.zeros((num_clients, width), np.float32)
    for client, client_windows in enumerate(merged):
        for k, (s, e) in enumerate(client_windows):
            start[client, k], length[client, k] = s, e - s
    availability = Availability(jnp.asarray(start), jnp.asarray(length), jnp.float32(period))
    try:
        check_availability(availability)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    return availability


def _union(windows: list[tuple[float, float]], period: float) -> list[tuple[float, float]]:
    """The union of a client's windows on the circle of length `period`, as windows (start in [0, P))."""
    if not windows:
        return []
    # Unroll onto [0, 2P): a window crossing P continues at 0.
    pieces = sorted(windows)
    merged: list[list[float]] = []
    for start, end in pieces:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    # The last window may reach past P into the first ones.
    while len(merged) > 1 and merged[-1][1] - period >= merged[0][0]:
        first = merged.pop(0)
        merged[-1][1] = max(merged[-1][1], first[1] + period)
    if merged[-1][1] - merged[-1][0] >= period:
        return [(0.0, period)]
    return [(s, e) for s, e in merged]


def read_profiles(path: str | os.PathLike, num_clients: int) -> DeviceProfiles:
    """The devices of `num_clients` training clients from a CSV file, one row each (see the module docstring).

    Raises:
      ValueError: an unreadable or malformed file, a repeated or missing
        client, or a non-positive value (one line).
    """
    values = np.full((num_clients, 3), np.nan)
    for line, (client, *row) in _rows(path, PROFILE_COLUMNS):
        client = _client(path, line, client, num_clients)
        if not np.isnan(values[client, 0]):
            raise ValueError(f"{path}: line {line}: client {client} is given twice")
        if min(row) <= 0:
            raise ValueError(f"{path}: line {line}: step_seconds and the bandwidths must be positive")
        values[client] = row
    missing = np.isnan(values[:, 0])
    if missing.any():
        raise ValueError(
            f"{path}: {int(missing.sum())} training clients have no row "
            f"(first: client {int(np.argmax(missing))})"
        )
    profiles = DeviceProfiles(*(jnp.asarray(column, jnp.float32) for column in values.T))
    check_profiles(profiles, num_clients)
    return profiles
