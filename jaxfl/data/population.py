"""A population of clients whose examples are stored packed, not padded.

Every feature of every example of the population lives in one flat array
(`[total_examples, ...]`), and clients are contiguous slices of it given by
per-client `offsets` and `counts`. Memory is therefore proportional to the
total number of examples, whatever the spread of client sizes; the compiled
round gathers the sampled clients' minibatches from these flat arrays (see
`jaxfl.training.local`).

Shapes use the vocabulary of `jaxfl.types`: N clients in the population,
E examples in total.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np


class PackedLayout:
    """The sizes of a packed population, read off its `features` and `counts`.

    N = len(counts), the number of clients; E = the rows of a feature (every
    feature has E). Shared by the device-resident `ClientPopulation` and the
    host-resident `jaxfl.data.host.HostPopulation`.
    """

    @property
    def num_clients(self) -> int:
        return int(self.counts.shape[0])

    @property
    def num_examples(self) -> int:
        return int(next(iter(self.features.values())).shape[0])


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class ClientPopulation(PackedLayout):
    """Packed examples of N clients.

    Attributes:
      features: feature name -> array `[E, ...]`; client i owns rows
        `offsets[i] : offsets[i] + counts[i]` of every feature.
      offsets: `[N]` int32, start row of each client.
      counts: `[N]` int32, number of examples of each client (>= 1).
      max_count: the largest client's number of examples (static: it fixes
        the shapes of the compiled round).
      held_out: optional, the same N clients' own held-out examples (client
        i's are client i of `held_out`), given to the compiled round with
        the training examples for algorithms that choose on them (Ditto's
        dynamic lambda), so that they are an argument of the round rather
        than constants compiled into it.
    """

    features: Mapping[str, jax.Array]
    offsets: jax.Array
    counts: jax.Array
    max_count: int = dataclasses.field(metadata=dict(static=True))
    held_out: ClientPopulation | None = None

    @property
    def example_client_ids(self) -> jax.Array:
        """`[E]` int32: the client that owns each example row."""
        return jnp.repeat(
            jnp.arange(self.num_clients, dtype=jnp.int32),
            self.counts,
            total_repeat_length=self.num_examples,
        )

    def client_weights(self, kind: str = "num_examples") -> jax.Array:
        """`[N]` client weights alpha_i: number of examples, or uniform."""
        if kind == "num_examples":
            return self.counts.astype(jnp.float32)
        if kind == "uniform":
            return jnp.ones(self.counts.shape, jnp.float32)
        raise ValueError(
            f"client weights must be 'num_examples' or 'uniform', got {kind!r}"
        )

    def cohort_weights(self, kind: str, client_ids: jax.Array) -> jax.Array:
        """`client_weights(kind)[client_ids]`, reading only the cohort's entries.

        Gathering before converting matters on CPU: XLA does not push the
        gather through the int-to-float conversion, so converting first
        touches all N counts every round, a cost that grows with N
        (measured: benchmarks/RESULTS.md, section
        "The suite on this CPU (`suite.py --preset cpu --devices 2`, 2026-11-26)").
        """
        if kind == "num_examples":
            return self.counts[client_ids].astype(jnp.float32)
        if kind == "uniform":
            return jnp.ones(client_ids.shape, jnp.float32)
        return self.client_weights(kind)  # Raises the unknown-kind error.

    def client(self, i: int) -> dict[str, np.ndarray]:
        """Client i's examples as NumPy arrays (host side; for tests and I/O)."""
        start, count = int(self.offsets[i]), int(self.counts[i])
        # Slice on the host: slicing device arrays with Python ints would
        # compile one slice per distinct client size.
        return {
            k: np.asarray(v)[start : start + count]
            for k, v in self.features.items()
        }

    @property
    def nbytes(self) -> int:
        """Device bytes held by the population (features and index arrays)."""
        leaves = [*self.features.values(), self.offsets, self.counts]
        return int(sum(leaf.nbytes for leaf in leaves))


def pack_clients(
    clients: Sequence[Mapping[str, np.ndarray]],
) -> ClientPopulation:
    """Packs per-client example arrays into one `ClientPopulation`.

    Args:
      clients: one mapping per client from feature name to an array whose
        leading axis indexes that client's examples. All clients must have
        the same feature names, trailing shapes and dtypes, and at least one
        example.

    Returns:
      The packed population, with arrays on the default device.

    Raises:
      ValueError: no clients, a client without examples, or mismatched
        features.
    """
    if not clients:
        raise ValueError("a population needs at least one client")
    names = sorted(clients[0])
    if not names:
        raise ValueError("clients must have at least one feature")
    counts = []
    for i, client in enumerate(clients):
        if sorted(client) != names:
            raise ValueError(
                f"client {i} has features {sorted(client)}, expected {names}"
            )
        sizes = {np.shape(client[k])[0] for k in names}
        if len(sizes) != 1:
            raise ValueError(
                f"client {i}: features have different numbers of examples "
                f"{sorted(sizes)}"
            )
        (size,) = sizes
        if size < 1:
            raise ValueError(f"client {i} has no examples")
        counts.append(size)
    features = {}
    for k in names:
        parts = [np.asarray(c[k]) for c in clients]
        trailing = {(p.shape[1:], p.dtype) for p in parts}
        if len(trailing) != 1:
            raise ValueError(
                f"feature {k!r} has different shapes or dtypes across clients"
            )
        features[k] = np.concatenate(parts, axis=0)
    return pack_arrays(features, np.asarray(counts))


def pack_arrays(
    features: Mapping[str, np.ndarray], counts: np.ndarray
) -> ClientPopulation:
    """Builds a population from already-concatenated features.

    Args:
      features: name -> `[E, ...]` array, clients stored one after another.
      counts: `[N]` positive integers summing to E.

    Returns:
      The population, with arrays on the default device.
    """
    counts = np.asarray(counts, dtype=np.int64)
    if counts.ndim != 1 or counts.size == 0 or np.any(counts < 1):
        raise ValueError("counts must be a non-empty vector of positive integers")
    total = int(counts.sum())
    for k, v in features.items():
        if np.shape(v)[0] != total:
            raise ValueError(
                f"feature {k!r} has {np.shape(v)[0]} rows, counts sum to {total}"
            )
    if total >= np.iinfo(np.int32).max:
        raise ValueError("populations above 2**31 examples are not supported")
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return ClientPopulation(
        features={k: jnp.asarray(v) for k, v in features.items()},
        offsets=jnp.asarray(offsets, jnp.int32),
        counts=jnp.asarray(counts, jnp.int32),
        max_count=int(counts.max()),
    )


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class GatheredCohort:
    """One round's cohort with its examples, gathered from a host population.

    What the compiled round receives instead of the whole population when the
    population lives in host memory (`jaxfl.data.host`): the M sampled
    clients' global ids and their examples packed as an M-client population.
    The round then trains client `client_ids[j]` on slot j of `clients`, with
    the key and identity of the global client, so that it computes exactly
    what it computes on the device-resident population (tested).

    Attributes:
      client_ids: `[M]` int32 global ids of the cohort, in sampling order.
      clients: the cohort's examples: client j of this M-client population
        is global client `client_ids[j]`; its feature arrays have a static
        number of rows (the sum of the M largest client sizes, so every
        cohort fits) and its `max_count` is the whole population's, which
        fixes the shapes of local training exactly as on the device.
      num_clients: N, the size of the population sampled from (static).
      held_out: optional, the cohort's own held-out examples, client j's in
        slot j like `clients` (`ClientPopulation.held_out`).
    """

    client_ids: jax.Array
    clients: ClientPopulation
    num_clients: int = dataclasses.field(metadata=dict(static=True))
    held_out: ClientPopulation | None = None


@dataclasses.dataclass(frozen=True)
class FederatedDataset:
    """Training clients, test clients and optional validation clients.

    The populations are separate: a test client's data is never used for
    training. `num_classes` and `input_shape` describe the task. Populations
    are device-resident `ClientPopulation`s, or host-resident
    `jaxfl.data.host.HostPopulation`s for data read from the on-disk cache
    (`jaxfl.experiment.runner.setup` places them on the device when they fit).

    Attributes:
      input_vocab_size: None for real-valued inputs; V when each input
        position holds a token id in [0, V) (characters, words), which models
        one-hot encode or embed.
      excluded_target_ids: target ids that accuracy does not count (a
        sequence layout's pad, oov, bos and eos, as Reddi et al. 2021 and
        FedJAX report next-token accuracy).
      personal_splits: test (and validation) client k is training client k's
        own held-out examples, so a personal model v_k can be evaluated on
        client k's test data (Ditto); False: the test clients are others.
    """

    name: str
    train: ClientPopulation
    test: ClientPopulation
    num_classes: int
    input_shape: tuple[int, ...]
    validation: ClientPopulation | None = None
    description: str = ""
    input_vocab_size: int | None = None
    excluded_target_ids: tuple[int, ...] = ()
    personal_splits: bool = False

    @property
    def populations(self) -> dict[str, ClientPopulation]:
        """Population name -> population: train, test, and validation when there is one."""
        named = {"train": self.train, "test": self.test}
        if self.validation is not None:
            named["validation"] = self.validation
        return named
