"""Splitting a population by clients: whole clients go to one side or the other.

Pillutla et al. 2023 (Appendix C.2) tune the regularization "with cross
validation": half of the training clients are held out as validation
clients, models are trained on the other half, and the setting with the
smallest 90th percentile of the misclassification error on the validation
clients wins. A dataset without validation clients (FedProx
Synthetic(1,1), whose test population is the training clients' own held-out
examples) gets them from `hold_out_clients`.

`split_client_examples` instead splits every client's *examples* in two and
keeps all clients on both sides: the family's selection/evaluation parts, and
the personal test data of `--client-split` (client k on both sides).

References:
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from jaxfl.data.population import ClientPopulation, FederatedDataset, pack_arrays


def select_clients(
    population: ClientPopulation, client_ids: Sequence[int] | np.ndarray
) -> ClientPopulation:
    """The population made of the given clients, with all their examples.

    Args:
      population: the clients, packed.
      client_ids: indices of the clients to keep, in the order wanted
        (distinct, at least one).

    Returns:
      A new population whose client j is `population`'s client
      `client_ids[j]`, examples in their original order.

    Raises:
      ValueError: no ids, an id out of range, or a repeated id.
    """
    ids = np.asarray(client_ids, dtype=np.int64).reshape(-1)
    num_clients = population.num_clients
    if ids.size == 0:
        raise ValueError("select at least one client")
    if ids.min() < 0 or ids.max() >= num_clients:
        raise ValueError(f"client ids must be in [0, {num_clients}), got {ids.min()}..{ids.max()}")
    if np.unique(ids).size != ids.size:
        raise ValueError("client ids must be distinct")
    # Gather on the host: one index array of all kept rows, clients in order.
    offsets = np.asarray(population.offsets)[ids]
    counts = np.asarray(population.counts)[ids]
    rows = np.concatenate([np.arange(o, o + c) for o, c in zip(offsets, counts, strict=True)])
    features = {name: np.asarray(value)[rows] for name, value in population.features.items()}
    return pack_arrays(features, counts)


def hold_out_clients(
    dataset: FederatedDataset, fraction: float = 0.5, *, seed: int = 0
) -> FederatedDataset:
    """Moves a random fraction of the training clients to a validation population.

    The held-out clients keep all their training examples, which become the
    validation population; the others remain the training population. The
    test population is carried over unchanged: it is not used for tuning
    (for Synthetic(1,1) it holds the held-out examples of *all* original
    training clients, so read only the validation population of the result).

    Args:
      dataset: a dataset without validation clients.
      fraction: the share of training clients held out, in (0, 1); the
        number held out is round(fraction * N), clamped to [1, N - 1].
      seed: seed of the NumPy permutation that picks them.

    Returns:
      A `FederatedDataset` named `<name>/holdout` with the remaining training
      clients (in their original order) and the held-out ones as validation
      clients (in their original order).

    Raises:
      ValueError: a fraction outside (0, 1), fewer than two training
        clients, or a dataset that already has validation clients.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    if dataset.validation is not None:
        raise ValueError(
            f"dataset {dataset.name!r} already has validation clients; tune on those"
        )
    num_clients = dataset.train.num_clients
    if num_clients < 2:
        raise ValueError("holding out clients needs at least two training clients")
    num_held = min(max(round(fraction * num_clients), 1), num_clients - 1)
    held = np.zeros(num_clients, bool)
    held[np.random.default_rng(seed).permutation(num_clients)[:num_held]] = True
    return dataclasses.replace(
        dataset,
        name=f"{dataset.name}/holdout",
        train=select_clients(dataset.train, np.flatnonzero(~held)),
        validation=select_clients(dataset.train, np.flatnonzero(held)),
        description=(
            f"{dataset.description} | {num_held} of {num_clients} training clients "
            f"held out as validation clients (seed {seed})"
        ),
    )


def split_client_examples(
    population: ClientPopulation, selection_fraction: float, seed: int
) -> tuple[ClientPopulation, ClientPopulation]:
    """Splits every client's examples into a selection and an evaluation part.

    Client i's examples are shuffled (NumPy, seeded) and the first
    max(1, floor(fraction * n_i)) go to selection, the rest to evaluation. A
    client with a single example uses it for both (it has nothing else).

    Returns:
      (selection, evaluation): populations with the same clients in the same
      order.
    """
    if not 0.0 < selection_fraction < 1.0:
        raise ValueError(f"selection_fraction must be in (0, 1), got {selection_fraction}")
    rng = np.random.default_rng(seed)
    counts = np.asarray(population.counts)
    offsets = np.asarray(population.offsets)
    features = {k: np.asarray(v) for k, v in population.features.items()}
    select_rows, eval_rows, select_counts, eval_counts = [], [], [], []
    for offset, count in zip(offsets, counts, strict=True):
        rows = offset + rng.permutation(count)
        cut = max(1, int(selection_fraction * count))
        chosen, rest = rows[:cut], rows[cut:]
        if rest.size == 0:
            rest = chosen
        select_rows.append(chosen)
        eval_rows.append(rest)
        select_counts.append(chosen.size)
        eval_counts.append(rest.size)
    select_rows = np.concatenate(select_rows)
    eval_rows = np.concatenate(eval_rows)
    selection = pack_arrays({k: v[select_rows] for k, v in features.items()}, np.asarray(select_counts))
    evaluation = pack_arrays({k: v[eval_rows] for k, v in features.items()}, np.asarray(eval_counts))
    return selection, evaluation
