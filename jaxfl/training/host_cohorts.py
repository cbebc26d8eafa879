"""Feeding the compiled round from a host-resident population, one call ahead.

`CohortStream` computes each round's cohort on the host exactly as the round
would (`sampled_cohorts`: the same keys, the same sampler), gathers those
clients' examples from the `jaxfl.data.host.HostPopulation` and places them
on the device, in a background thread one compiled call ahead of the device
(double-buffered). The round, given the `GatheredCohort`, trains the same
clients with the same keys on the same examples as it would on the whole
population on the device.
"""

from __future__ import annotations

import concurrent.futures
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxfl.data.host import HostPopulation, to_cohort
from jaxfl.data.population import GatheredCohort
from jaxfl.training.sampling import round_keys, sample_without_replacement
from jaxfl.types import Key


@functools.partial(jax.jit, static_argnames=("num_rounds", "num_clients", "clients_per_round"))
def sampled_cohorts(
    run_key: Key, *, first_round: jax.Array, num_rounds: int, num_clients: int, clients_per_round: int
):
    """`[num_rounds, M]` the cohorts of rounds first_round, first_round + 1, ...

    Exactly the ids the round itself draws from `round_keys(run_key,
    round).sampling` (`jaxfl.training.cohort.select_cohort`).
    """

    def one(round_index):
        keys = round_keys(run_key, round_index)
        return sample_without_replacement(keys.sampling, num_clients, clients_per_round)

    return jax.vmap(one)(first_round + jnp.arange(num_rounds, dtype=jnp.int32))


class CohortStream:
    """The gathered cohorts of consecutive compiled calls, prepared one call ahead.

    Call `next_call()` once per compiled call: it returns the cohorts of the
    call's `rounds_per_call` rounds (stacked on a leading axis when more than
    one) placed by `place` (e.g. replicated over a device mesh), and starts
    gathering the following call's in a background thread, so the host's
    gathering and copying overlaps the device's computing (double-buffering).

    With a batch of G run keys (a sweep, `jaxfl.experiment.sweep`), each
    round's cohorts are stacked on an axis G after the rounds' axis: the
    points of a sweep have their own cohorts, as when run alone.

    Args:
      population: the host-resident training clients.
      run_key: the run's key (as given to the round), or `[G]` keys.
      clients_per_round: M.
      rounds_per_call: rounds each compiled call runs.
      first_round: the round index of the first call's first round.
      place: applied to each call's cohorts (default: `jax.device_put`).
      read_ahead: calls whose clients are asked from disk ahead of time
        (`HostPopulation.prefetch`), for populations whose file is not in
        the page cache.
      held_out: optional, the same N clients' own held-out examples (Ditto's
        dynamic lambda chooses on them): each cohort carries its clients'
        as its `held_out`, client j's in slot j.
    """

    def __init__(
        self,
        population: HostPopulation,
        run_key: Key,
        clients_per_round: int,
        *,
        rounds_per_call: int = 1,
        first_round: int = 0,
        place: Callable[[Any], Any] | None = None,
        read_ahead: int = 4,
        held_out: HostPopulation | None = None,
    ):
        if held_out is not None and held_out.num_clients != population.num_clients:
            raise ValueError(
                f"held_out has {held_out.num_clients} clients, the population {population.num_clients}"
            )
        self.population = population
        self.held_out = held_out
        self.held_out_rows = None if held_out is None else held_out.cohort_rows(clients_per_round)
        self.run_key = run_key
        self.batched = jnp.ndim(run_key) == 1
        self.clients_per_round = clients_per_round
        self.rounds_per_call = rounds_per_call
        self.num_rows = population.cohort_rows(clients_per_round)
        self.place = place or jax.device_put
        self.read_ahead = read_ahead
        self._next_round = first_round
        self._ids: dict[int, np.ndarray] = {}
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="jaxfl-cohorts")
        self._pending = self._executor.submit(self._prepare, self._next_round)

    def _cohort_ids(self, first_round: int) -> np.ndarray:
        """`[K, G, M]` the ids of the call starting at `first_round` (computed once)."""
        if first_round not in self._ids:
            sample = functools.partial(
                sampled_cohorts,
                first_round=jnp.asarray(first_round, jnp.int32),
                num_rounds=self.rounds_per_call,
                num_clients=self.population.num_clients,
                clients_per_round=self.clients_per_round,
            )
            if self.batched:
                self._ids[first_round] = np.stack([np.asarray(sample(key)) for key in self.run_key], axis=1)
            else:
                self._ids[first_round] = np.asarray(sample(self.run_key))[:, None]
        return self._ids[first_round]

    def _prepare(self, first_round: int) -> Any:
        ids = self._cohort_ids(first_round)
        # The calls after this one start reading from disk now (a hint the
        # kernel serves asynchronously), so that their gathers find the page
        # cache warm even when the population is far larger than memory.
        for ahead in range(1, self.read_ahead + 1):
            later = first_round + ahead * self.rounds_per_call
            if later not in self._ids:
                self.population.prefetch(self._cohort_ids(later))
        self._ids.pop(first_round)
        gathered = [[self._gather(point_ids) for point_ids in round_ids] for round_ids in ids]
        per_round = [
            jax.tree.map(lambda *leaves: np.stack(leaves), *points) if self.batched else points[0]
            for points in gathered
        ]
        if self.rounds_per_call == 1:
            host = per_round[0]
        else:
            host = jax.tree.map(lambda *leaves: np.stack(leaves), *per_round)
        held_out_max = None if self.held_out is None else self.held_out.max_count
        cohort = to_cohort(host, self.population.max_count, self.population.num_clients, held_out_max)
        return self.place(cohort)

    def _gather(self, client_ids: np.ndarray) -> dict[str, Any]:
        host = self.population.gather_host(client_ids, self.num_rows)
        if self.held_out is not None:
            held_out = self.held_out.gather_host(client_ids, self.held_out_rows)
            host["held_out"] = {k: held_out[k] for k in ("features", "offsets", "counts")}
        return host

    def next_call(self) -> GatheredCohort:
        cohort = self._pending.result()
        self._next_round += self.rounds_per_call
        self._pending = self._executor.submit(self._prepare, self._next_round)
        return cohort

    def close(self) -> None:
        self._pending.cancel()
        self._executor.shutdown(wait=True)

    def __enter__(self) -> CohortStream:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
