"""A synchronous round on the simulated clock: who is selected, who reports in time, how long it takes.

At simulated time t (the state's `clock`; if no client is online then, the
next time one is) the server selects M' = ceil(overselect * M) of the online
clients, uniformly without replacement (all online ones where fewer are). Each
selected client i that its algorithm lets train takes `duration_i`
(`jaxfl.clock.profiles.client_durations`) and completes unless

* it goes offline first: t + duration_i > its `online_until` (a dropout), or
* the report deadline D passes first: duration_i > D.

The first M clients to complete report; the others' updates are discarded
(over-selection with a reporting deadline: Bonawitz et al. 2019 select 130%
and keep the first 100%; their Section 2.2: devices that do not report in
time are ignored). Where the algorithm lets fewer than
M of them train (Delta-FL's tail), the server waits for all that train. The
round then lasts

* the last needed report's duration, when min(M, the training clients)
  report;
* else D, with a deadline (the server waits it out);
* else until the last selected client has completed or dropped.

So dropouts follow from the devices' speeds and availability, not from a
coin. The next round starts when this one ends.

References:
  [Bonawitz et al. 2019] K. Bonawitz et al. Towards Federated Learning at Scale: System Design.
    MLSys 2019.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxfl.clock.availability import Availability, next_online, online, online_until
from jaxfl.clock.profiles import DeviceProfiles, client_durations


@dataclasses.dataclass(frozen=True)
class Clock:
    """The simulated clock of a run's rounds (static: a round is compiled for it).

    Attributes:
      profiles: the training clients' devices.
      availability: their online windows, or None: always online.
      overselect: select ceil(overselect * M) clients for M reports, >= 1.
      deadline: seconds the server waits for reports, or None: no deadline.
    """

    profiles: DeviceProfiles
    availability: Availability | None = None
    overselect: float = 1.0
    deadline: float | None = None

    def __post_init__(self):
        if not (math.isfinite(self.overselect) and self.overselect >= 1.0):
            raise ValueError(
                f"overselect must be >= 1 (select at least the clients that report), got {self.overselect!r}"
            )
        if self.deadline is not None and not (math.isfinite(self.deadline) and self.deadline > 0):
            raise ValueError(
                f"the report deadline must be a positive number of seconds, got {self.deadline!r}"
            )

    def selected(self, clients_per_round: int) -> int:
        """M', the clients selected for M reports."""
        # The tolerance keeps 1.3 * 10 (13.000000000000002 in floating point) at 13.
        return math.ceil(self.overselect * clients_per_round - 1e-9)


class Selection(NamedTuple):
    """The round's selected clients on the clock.

    Attributes:
      start: [] the round's start time.
      client_ids: `[M']` the selected clients (padded with offline ones where fewer are online).
      selected: `[M']` bool, the entries that are online clients.
      online_count: [] int32, the clients online at `start`.
    """

    start: jax.Array
    client_ids: jax.Array
    selected: jax.Array
    online_count: jax.Array


def select_online(clock: Clock, t: jax.Array, key: jax.Array, num_clients: int, count: int) -> Selection:
    """`count` of the clients online at t (or at the next time one is), uniformly without replacement.

    Gumbel top-k over the online clients: each k-subset of them is equally
    likely; where fewer than `count` are online, all are selected and the
    rest of the entries are offline clients marked not selected.
    """
    if clock.availability is None:
        is_online = jnp.ones(num_clients, bool)
    else:
        t = next_online(clock.availability, t)
        is_online = online(clock.availability, t)
    scores = jnp.where(is_online, jax.random.gumbel(key, (num_clients,)), -jnp.inf)
    _, client_ids = jax.lax.top_k(scores, count)
    return Selection(
        t, client_ids.astype(jnp.int32), is_online[client_ids], jnp.sum(is_online).astype(jnp.int32)
    )


class Reports(NamedTuple):
    """Who reports and when the round ends.

    Attributes:
      reporting: `[M']` bool, the clients whose updates the server keeps.
      seconds: [] the round's duration.
      metrics: `round_seconds`, `clients_online`, `clients_dropped` (selected,
        training, and not reporting: offline, past the deadline or not among
        the first M).
    """

    reporting: jax.Array
    seconds: jax.Array
    metrics: dict


def reports(
    clock: Clock,
    selection: Selection,
    training: jax.Array,
    num_steps: jax.Array,
    clients_per_round: int,
    download_bytes: int,
    upload_bytes: int,
) -> Reports:
    """The first `clients_per_round` selected training clients to complete (see the module docstring).

    Args:
      clock: the clock.
      selection: `select_online`'s.
      training: `[M']` bool, the clients the algorithm let train.
      num_steps: `[M']` the local steps each ran.
      clients_per_round: M, the reports the server waits for.
      download_bytes, upload_bytes: a client's messages.
    """
    ids = selection.client_ids
    durations = client_durations(clock.profiles, ids, num_steps, download_bytes, upload_bytes)
    candidates = selection.selected & training
    if clock.availability is None:
        offline_at = jnp.full(durations.shape, jnp.inf)
    else:
        offline_at = online_until(clock.availability, selection.start)[ids] - selection.start
    completes = candidates & (durations <= offline_at)
    if clock.deadline is not None:
        completes &= durations <= clock.deadline
    # The first M to complete; ties go to the earlier entry.
    kept = min(clients_per_round, durations.shape[0])
    _, first = jax.lax.top_k(jnp.where(completes, -durations, -jnp.inf), kept)
    reporting = jnp.zeros(durations.shape, bool).at[first].set(completes[first])
    count = jnp.sum(reporting)
    needed = jnp.minimum(clients_per_round, jnp.sum(candidates))
    last_report = jnp.max(jnp.where(reporting, durations, 0.0))
    if clock.deadline is not None:
        waited = jnp.float32(clock.deadline)
    else:
        # Until every selected client has completed or gone offline.
        waited = jnp.max(jnp.where(candidates, jnp.minimum(durations, offline_at), 0.0))
    seconds = jnp.where(count >= needed, last_report, waited)
    metrics = {
        "round_seconds": seconds,
        "clients_online": selection.online_count,
        "clients_dropped": jnp.sum(candidates & ~reporting).astype(jnp.int32),
    }
    return Reports(reporting, seconds, metrics)


def check_someone_can_report(
    clock: Clock, counts: np.ndarray, steps: np.ndarray, download_bytes: int, upload_bytes: int
) -> None:
    """Refuses a clock under which no training client could ever report (host check, before training).

    A client can report if its duration fits within its longest online window
    and within the deadline; `steps` are its local steps.

    Raises:
      ValueError: one line giving the fastest client's duration and what it must fit in.
    """
    profiles = [np.asarray(q, np.float64) for q in clock.profiles]
    durations = download_bytes / profiles[1] + steps * profiles[0] + upload_bytes / profiles[2]
    durations = np.where(np.asarray(counts) > 0, durations, np.inf)
    longest = np.full(durations.shape, np.inf)
    if clock.availability is not None:
        longest = np.max(np.asarray(clock.availability.length, np.float64), axis=1)
    fits = (durations <= longest) & (durations <= (clock.deadline or np.inf))
    if not fits.any():
        fastest = int(np.argmin(durations))
        bounds = [f"the deadline is {clock.deadline:g} s"] if clock.deadline is not None else []
        if clock.availability is not None:
            bounds.append(f"its longest online window {longest[fastest]:g} s")
        raise ValueError(
            f"no training client can ever report: the fastest, client {fastest}, needs "
            f"{durations[fastest]:.4g} s "
            f"to download, train and upload, and {' and '.join(bounds)}"
        )
