"""When each client is online: periodic availability windows, queried inside the compiled round.

Client i is online during windows [s_ik, s_ik + l_ik) that repeat with the
period P: at simulated time t, with tau = t mod P, it is online iff for some
window k

    (tau - s_ik) mod P < l_ik,

and then stays online until t + l_ik - ((tau - s_ik) mod P). A window may
cross the period's end (s + l > P); padding windows have l = 0. Windows of
one client must not overlap.

* `diurnal_availability`: each client online `hours_on` hours a day (P = one
  day), starting at an hour drawn uniformly per client: the on/off pattern of
  phones that train while charging at night in their own time zone
  (Bonawitz et al. 2019 describe availability following the time of day).
* `jaxfl.clock.traces.read_availability`: the windows of a trace, which
  repeat with the trace's period.

Times are float32 seconds: at a simulated time of 10^7 s (four months) their
resolution is 1 s.

References:
  [Bonawitz et al. 2019] K. Bonawitz et al. Towards Federated Learning at Scale: System Design.
    MLSys 2019.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

DAY_SECONDS = 86400.0


class Availability(NamedTuple):
    """Client i's online windows: `[start[i, k], start[i, k] + length[i, k])`, repeating every `period`.

    Attributes:
      start: `[N, K]` float32 seconds in [0, period).
      length: `[N, K]` float32 seconds in [0, period]; 0 pads.
      period: float32 [] seconds.
    """

    start: jax.Array
    length: jax.Array
    period: jax.Array


def diurnal_availability(key: jax.Array, num_clients: int, hours_on: float) -> Availability:
    """Each client online `hours_on` hours a day from a start hour uniform in [0, 24), drawn with `key`."""
    if not 0.0 < hours_on <= 24.0:
        raise ValueError(f"hours_on must be in (0, 24], got {hours_on!r}")
    start = jax.random.uniform(key, (num_clients, 1), jnp.float32, 0.0, DAY_SECONDS)
    length = jnp.full((num_clients, 1), hours_on * 3600.0, jnp.float32)
    return Availability(start, length, jnp.float32(DAY_SECONDS))


def _offsets(availability: Availability, t: jax.Array) -> jax.Array:
    """`[N, K]` (tau - s) mod P: how long since each window last opened."""
    period = availability.period
    return jnp.mod(jnp.mod(t, period) - availability.start, period)


def online(availability: Availability, t: jax.Array) -> jax.Array:
    """`[N]` bool: the clients online at time t."""
    return jnp.any(_offsets(availability, t) < availability.length, axis=1)


def online_until(availability: Availability, t: jax.Array) -> jax.Array:
    """`[N]` the time each client goes offline (t for a client offline at t)."""
    offsets = _offsets(availability, t)
    remaining = jnp.where(offsets < availability.length, availability.length - offsets, 0.0)
    return t + jnp.max(remaining, axis=1)


def next_online(availability: Availability, t: jax.Array) -> jax.Array:
    """[] the earliest time >= t at which some client is online (t if one is; inf if none ever is)."""
    offsets = _offsets(availability, t)
    opens_in = jnp.where(offsets < availability.length, 0.0, availability.period - offsets)
    opens_in = jnp.where(availability.length > 0, opens_in, jnp.inf)
    return t + jnp.min(opens_in)


def check_availability(availability: Availability) -> None:
    """Refuses windows outside the period, negative, or overlapping, and clients never online (host check).

    Raises:
      ValueError: one line naming the first client at fault.
    """
    start, length = np.asarray(availability.start, np.float64), np.asarray(availability.length, np.float64)
    period = float(availability.period)
    if not (np.isfinite(period) and period > 0):
        raise ValueError(f"the availability period must be a positive number of seconds, got {period}")
    bad = ~((start >= 0) & (start < period) & (length >= 0) & (length <= period))
    if bad.any():
        client = int(np.argwhere(bad)[0, 0])
        raise ValueError(
            f"client {client} has an online window outside [0, {period:g}) s or of negative length"
        )
    never = ~(length > 0).any(axis=1)
    if never.any():
        raise ValueError(
            f"{int(never.sum())} training clients are never online (first: client {int(np.argmax(never))})"
        )
    for client in range(start.shape[0]):
        windows = sorted((s, s + l) for s, l in zip(start[client], length[client], strict=True) if l > 0)
        ends = [end for _, end in windows]
        overlapping = any(windows[k + 1][0] < ends[k] for k in range(len(windows) - 1))
        wraps = windows and windows[-1][1] - period > windows[0][0]
        if overlapping or wraps:
            raise ValueError(f"client {client}'s online windows overlap")
