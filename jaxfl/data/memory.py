"""How much memory a dataset or a round would take, against what the machine has.

Settings that size arrays (a dataset's number of clients or features, a
sequence length, a batch size, a model's widths) are checked before anything
is allocated: their estimate (a lower bound of what the arrays will take, so
that a refusal is never wrong by more than the estimate's slack) is compared
with the memory available, and a setting that cannot fit is refused with a
one-line `ValueError` naming it, instead of a `MemoryError`, an XLA
allocation failure or the machine swapping minutes later.

The available memory is `MemAvailable` of /proc/meminfo (what new allocations
can take without swapping), or the physical memory where that file does not
exist. Every check takes `available=` so that tests can inject it.
"""

from __future__ import annotations

import os

__all__ = ["available_disk", "available_memory", "check_memory", "format_bytes"]


def available_memory() -> int:
    """Bytes of host memory new allocations can take now.

    `MemAvailable` of /proc/meminfo (Linux), else the physical memory
    (`os.sysconf('SC_PHYS_PAGES') * SC_PAGE_SIZE`).
    """
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return 2**63 - 1  # Unknown: nothing is refused for lack of memory.


def format_bytes(nbytes: float) -> str:
    """`nbytes` in the largest unit that keeps it >= 1 (e.g. '3.2 GB')."""
    for unit in ("bytes", "kB", "MB", "GB", "TB", "PB"):
        if abs(nbytes) < 1000 or unit == "PB":
            return f"{nbytes:.0f} {unit}" if unit == "bytes" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    raise AssertionError("unreachable")


def check_memory(
    nbytes: float, what: str, *, available: int | None = None, hint: str = "", resource: str = "memory"
) -> None:
    """Raises ValueError when `nbytes` exceeds the available memory.

    Args:
      nbytes: the estimate (a lower bound) of what the allocation needs.
      what: the settings that ask for it, e.g. 'num_clients=1000000000000'
        (the message starts with it).
      available: bytes available (default: `available_memory()`).
      hint: what to change, appended to the message.
      resource: what is short, for the message ('memory', 'device memory',
        'disk space in DIR').
    """
    if available is None:
        available = available_memory()
    if nbytes > available:
        advice = f": {hint}" if hint else ""
        raise ValueError(
            f"{what} needs at least {format_bytes(nbytes)} of {resource} and this machine has "
            f"{format_bytes(available)} available{advice}"
        )


def available_disk(path: str | os.PathLike) -> int:
    """Free bytes on the file system of `path` (or of its nearest existing parent)."""
    import shutil
    from pathlib import Path

    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return 2**63 - 1
