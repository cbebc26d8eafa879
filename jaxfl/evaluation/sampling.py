"""A fixed sample of clients to evaluate on (`--eval-clients`).

Evaluating every client of a large population is what dominates a short run
(a recurrent model over every training and test client of Shakespeare, for
each algorithm); TFF and FedJAX evaluate on a sample of clients during
training for that reason. The sample here is drawn once per run, from the
seed, so every algorithm of the run and every evaluation round sees the same
clients, and their curves differ only by the models.

The draw is a systematic sample over the clients ordered by their number of
examples (ties in a random order): with step N/n and one uniform start, the
k-th client taken has rank floor(u + k N/n), so one comes from each stretch
of N/n ranks, and every client is in the sample with probability exactly
n/N. The sample therefore spans small and large clients as the population
does, which a simple random sample of a few dozen clients often does not,
and an equally weighted mean over it is unbiased for the population's.
"""

from __future__ import annotations

import zlib

import numpy as np

from jaxfl.data.host import HostPopulation
from jaxfl.data.population import FederatedDataset
from jaxfl.data.splits import select_clients


def stratified_client_sample(counts: np.ndarray, size: int, seed: int) -> np.ndarray:
    """Sorted ids of `size` of the N clients, spread over them by client size.

    Clients are ranked by `counts` (ties broken in a random order); with
    step N/size and a start u ~ U[0, step), the sample holds the clients of
    ranks floor(u + i * step), i = 0..size-1: the i-th between ranks
    floor(i * step) and floor((i + 1) * step), distinct since step > 1, and
    each client is in it with probability exactly size/N (the points
    u + i * step fall in any unit interval of [0, N) with probability 1/step).

    Args:
      counts: `[N]` numbers of examples.
      size: clients wanted (>= 1); all N when size >= N.
      seed: the draw's seed.

    Returns:
      `[min(size, N)]` int64 client ids, ascending.
    """
    counts = np.asarray(counts).reshape(-1)
    num_clients = counts.size
    if size < 1:
        raise ValueError(f"the sample needs at least one client, got {size}")
    if size >= num_clients:
        return np.arange(num_clients, dtype=np.int64)
    rng = np.random.default_rng(seed)
    shuffled = rng.permutation(num_clients)
    order = shuffled[np.argsort(counts[shuffled], kind="stable")]
    step = num_clients / size
    positions = np.floor(rng.uniform(0.0, step) + step * np.arange(size)).astype(np.int64)
    return np.sort(order[np.minimum(positions, num_clients - 1)])


def evaluation_sample(dataset: FederatedDataset, size: int, seed: int) -> dict[str, np.ndarray]:
    """Population name -> the ids of its clients evaluated, for the populations larger than `size`.

    Each population gets its own draw (`stratified_client_sample`, seeded by
    `seed` and the population's name), except that where test (validation)
    client k is training client k's own held-out data (`personal_splits`)
    they are the training sample's clients, so that a client's personal
    model is evaluated on its own test data.
    """
    sample = {}
    for name, population in dataset.populations.items():
        if dataset.personal_splits and name != "train" and "train" in sample:
            sample[name] = sample["train"]
            continue
        if population.num_clients <= size:
            continue
        stream = [seed, zlib.crc32(name.encode())]
        sample[name] = stratified_client_sample(np.asarray(population.counts), size, stream)
    return sample


def sampled_population(population, client_ids: np.ndarray):
    """The population made of `client_ids`' clients, where `population` lives (host or device)."""
    if isinstance(population, HostPopulation):
        host = population.gather_host(client_ids, int(population.counts[client_ids].sum(dtype=np.int64)))
        return HostPopulation.from_arrays(host["features"], host["counts"])
    return select_clients(population, client_ids)
