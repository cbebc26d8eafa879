"""Splitting populations by whole clients (`jaxfl/data/splits.py`)."""

import dataclasses

import numpy as np
import pytest

from jaxfl.data import FederatedDataset, pack_clients
from jaxfl.data.splits import hold_out_clients, select_clients


def _clients(sizes, seed=0):
    rng = np.random.default_rng(seed)
    return [
        {
            "x": rng.standard_normal((n, 3)).astype(np.float32),
            "y": rng.integers(0, 4, n).astype(np.int32),
        }
        for n in sizes
    ]


def _dataset(sizes=(3, 1, 5, 2, 4, 6, 1)):
    clients = _clients(sizes)
    return clients, FederatedDataset(
        name="toy",
        train=pack_clients(clients),
        test=pack_clients(_clients((2, 2), seed=1)),
        num_classes=4,
        input_shape=(3,),
        description="toy clients",
    )


def test_select_clients_keeps_whole_clients_in_the_given_order():
    clients, dataset = _dataset()
    ids = [4, 0, 2]
    subset = select_clients(dataset.train, ids)
    np.testing.assert_array_equal(subset.counts, [len(clients[i]["y"]) for i in ids])
    for j, i in enumerate(ids):
        for name in ("x", "y"):
            np.testing.assert_array_equal(subset.client(j)[name], clients[i][name])


@pytest.mark.parametrize("ids", [[], [0, 0], [7], [-1]])
def test_select_clients_rejects_bad_ids(ids):
    _, dataset = _dataset()
    with pytest.raises(ValueError):
        select_clients(dataset.train, ids)


@pytest.mark.parametrize("fraction", [0.5, 0.3, 0.01, 0.99])
def test_hold_out_partitions_the_training_clients(fraction):
    clients, dataset = _dataset()
    split = hold_out_clients(dataset, fraction, seed=3)
    n = len(clients)
    expected = min(max(round(fraction * n), 1), n - 1)
    assert split.validation.num_clients == expected
    assert split.train.num_clients == n - expected
    assert split.test is dataset.test

    # Every original client is on exactly one side, whole and unchanged.
    def as_set(population):
        return {
            tuple(population.client(i)["y"].tolist()) + tuple(population.client(i)["x"].ravel().tolist())
            for i in range(population.num_clients)
        }

    originals = {
        tuple(c["y"].tolist()) + tuple(c["x"].ravel().tolist()) for c in clients
    }
    kept, held = as_set(split.train), as_set(split.validation)
    assert kept.isdisjoint(held)
    assert kept | held == originals


def test_hold_out_is_seeded():
    _, dataset = _dataset()
    a = hold_out_clients(dataset, 0.5, seed=1)
    b = hold_out_clients(dataset, 0.5, seed=1)
    np.testing.assert_array_equal(a.validation.counts, b.validation.counts)
    np.testing.assert_array_equal(a.validation.features["x"], b.validation.features["x"])
    draws = {
        tuple(np.asarray(hold_out_clients(dataset, 0.5, seed=s).validation.features["y"]).tolist())
        for s in range(10)
    }
    assert len(draws) > 1


def test_hold_out_rejects_bad_input():
    _, dataset = _dataset()
    for fraction in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match="fraction"):
            hold_out_clients(dataset, fraction)
    with pytest.raises(ValueError, match="validation"):
        hold_out_clients(dataclasses.replace(dataset, validation=dataset.test))
    single = dataclasses.replace(dataset, train=select_clients(dataset.train, [0]))
    with pytest.raises(ValueError, match="two"):
        hold_out_clients(single)
