"""SIGINT and SIGTERM: finish the round, checkpoint, stop; a second signal stops at once.

While a training loop runs, either signal only sets `StopRequest.signal`;
the loop sees it between compiled calls, saves a checkpoint (when the run
has an output folder) and raises `RunInterrupted`, so a cluster's SIGTERM
(preemption) loses nothing. A second signal, or one outside a training
loop, raises `KeyboardInterrupt` right away (for SIGTERM the subclass
`Terminated`). The CLI exits with 128 + the signal's number (130 for
SIGINT, 143 for SIGTERM), as shells do.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class Terminated(KeyboardInterrupt):
    """SIGTERM outside a training loop (or a second one inside)."""


class RunInterrupted(Exception):
    """A training loop stopped on a signal after saving what it could.

    Attributes:
      signal_number: the signal (SIGINT or SIGTERM).
      round: the rounds completed.
      checkpointed: whether a checkpoint of that round was saved.
    """

    def __init__(self, signal_number: int, round_index: int, checkpointed: bool):
        super().__init__(f"interrupted at round {round_index}")
        self.signal_number = signal_number
        self.round = round_index
        self.checkpointed = checkpointed


class StopRequest:
    """Set by a signal handler; read by the training loop between calls."""

    def __init__(self):
        self.signal: int | None = None


_active: list[StopRequest] = []


def current_request() -> StopRequest | None:
    """The stop request of the innermost `stop_on_signals` block, if any."""
    return _active[-1] if _active else None


def _raise_now(signal_number: int) -> None:
    if signal_number == signal.SIGTERM:
        raise Terminated()
    raise KeyboardInterrupt()


@contextlib.contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """Within the block, SIGINT/SIGTERM set the request instead of raising.

    Outside the main thread (where Python cannot install handlers) the
    block does nothing and signals behave as usual.
    """
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def handler(signal_number, frame):
        if request.signal is not None:
            _raise_now(signal_number)
        request.signal = signal_number

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    _active.append(request)
    try:
        yield request
    finally:
        _active.remove(request)
        for s, old in previous.items():
            signal.signal(s, old)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises `Terminated` (a KeyboardInterrupt) instead of killing the process."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda number, frame: _raise_now(number))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
