"""Tests of the packed client population (`jaxfl/data/population.py`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfl.data import ClientPopulation, pack_arrays, pack_clients

CLIENT_SIZES = (3, 1, 5)


def _clients(sizes=CLIENT_SIZES, seed=0):
    """Clients with a vector feature, an image-like feature and labels."""
    rng = np.random.default_rng(seed)
    return [
        {
            "x": rng.standard_normal((n, 4)).astype(np.float32),
            "image": rng.standard_normal((n, 2, 3)).astype(np.float32),
            "y": rng.integers(0, 7, n).astype(np.int32),
        }
        for n in sizes
    ]


def test_offsets_and_counts_describe_contiguous_clients():
    """Clients are contiguous row ranges given by offsets and counts."""
    population = pack_clients(_clients())

    np.testing.assert_array_equal(population.counts, [3, 1, 5])
    np.testing.assert_array_equal(population.offsets, [0, 3, 4])
    assert population.offsets.dtype == jnp.int32
    assert population.counts.dtype == jnp.int32
    assert population.max_count == 5
    assert population.num_clients == 3
    assert population.num_examples == 9
    np.testing.assert_array_equal(
        population.example_client_ids, [0, 0, 0, 1, 2, 2, 2, 2, 2]
    )


def test_client_round_trip_preserves_values_shapes_and_dtypes():
    """client(i) returns exactly what was packed for client i."""
    clients = _clients()
    population = pack_clients(clients)

    for i, original in enumerate(clients):
        unpacked = population.client(i)
        assert sorted(unpacked) == sorted(original)
        for name, values in original.items():
            assert unpacked[name].dtype == values.dtype
            np.testing.assert_array_equal(unpacked[name], values)


def test_pack_arrays_equals_pack_clients():
    """Packing concatenated arrays equals packing the clients one by one."""
    clients = _clients()
    from_clients = pack_clients(clients)
    from_arrays = pack_arrays(
        {k: np.concatenate([c[k] for c in clients]) for k in clients[0]},
        np.array(CLIENT_SIZES),
    )

    assert jax.tree.structure(from_clients) == jax.tree.structure(from_arrays)
    for a, b in zip(
        jax.tree.leaves(from_clients), jax.tree.leaves(from_arrays), strict=True
    ):
        np.testing.assert_array_equal(a, b)


def test_client_weights():
    """Weights are the example counts, or uniform; anything else is an error."""
    population = pack_clients(_clients())

    np.testing.assert_array_equal(population.client_weights(), [3.0, 1.0, 5.0])
    np.testing.assert_array_equal(population.client_weights("uniform"), [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="'num_examples' or 'uniform'"):
        population.client_weights("by_size")
    cohort = jnp.array([2, 0, 2])
    for kind in ("num_examples", "uniform"):
        np.testing.assert_array_equal(
            jax.jit(population.cohort_weights, static_argnums=0)(kind, cohort),
            np.asarray(population.client_weights(kind))[[2, 0, 2]],
        )
    with pytest.raises(ValueError, match="'num_examples' or 'uniform'"):
        population.cohort_weights("by_size", cohort)


def test_memory_is_the_raw_examples_plus_two_index_arrays():
    """Storage is packed: no padding to the largest client."""
    # Client sizes from 1 to 500: padding to the largest would cost ~50x.
    sizes = [1] * 99 + [500]
    clients = _clients(sizes)
    population = pack_clients(clients)

    raw_bytes = sum(v.nbytes for client in clients for v in client.values())
    index_bytes = 2 * len(sizes) * np.dtype(np.int32).itemsize
    assert population.nbytes == raw_bytes + index_bytes
    assert sum(f.nbytes for f in population.features.values()) == raw_bytes


@pytest.mark.parametrize(
    "clients, message",
    [
        ([], "at least one client"),
        ([{}], "at least one feature"),
        (
            [{"x": np.zeros((2, 3))}, {"y": np.zeros(2)}],
            r"client 1 has features \['y'\]",
        ),
        (
            [{"x": np.zeros((2, 3)), "y": np.zeros(3)}],
            "different numbers of examples",
        ),
        ([{"x": np.zeros((2, 3))}, {"x": np.zeros((0, 3))}], "client 1 has no"),
        (
            [{"x": np.zeros((2, 3))}, {"x": np.zeros((2, 4))}],
            "different shapes or dtypes",
        ),
        (
            [
                {"x": np.zeros((2, 3), np.float32)},
                {"x": np.zeros((2, 3), np.int32)},
            ],
            "different shapes or dtypes",
        ),
    ],
)
def test_pack_clients_rejects_malformed_clients(clients, message):
    """Each malformed input gets an error that says what is wrong."""
    with pytest.raises(ValueError, match=message):
        pack_clients(clients)


@pytest.mark.parametrize(
    "counts, message",
    [
        (np.array([], np.int64), "non-empty vector of positive integers"),
        (np.array([2, 0, 2]), "non-empty vector of positive integers"),
        (np.array([3, -1, 2]), "non-empty vector of positive integers"),
        (np.array([[2, 2]]), "non-empty vector of positive integers"),
        (np.array([2, 1]), "has 4 rows, counts sum to 3"),
    ],
)
def test_pack_arrays_rejects_bad_counts(counts, message):
    """Counts must be positive and sum to the number of rows."""
    with pytest.raises(ValueError, match=message):
        pack_arrays({"x": np.zeros((4, 2), np.float32)}, counts)


def test_population_is_a_pytree_with_static_max_count():
    """Arrays are pytree leaves; max_count is part of the structure."""
    population = pack_clients(_clients())

    leaves, treedef = jax.tree.flatten(population)
    # Two features, offsets and counts; max_count lives in the tree structure.
    assert len(leaves) == 5
    rebuilt = jax.tree.unflatten(treedef, leaves)
    assert isinstance(rebuilt, ClientPopulation)
    assert rebuilt.max_count == population.max_count

    other = pack_clients(_clients(sizes=(3, 1, 6)))
    assert jax.tree.structure(other) != treedef


def test_population_round_trips_through_jit():
    """A population passes through jit unchanged, max_count static."""
    population = pack_clients(_clients())

    @jax.jit
    def identity_and_padded_first_client(p):
        # max_count is a Python int inside jit: it may fix an array shape.
        padded = jnp.zeros((p.max_count,), jnp.int32)
        first_labels = jax.lax.dynamic_slice(p.features["y"], (p.offsets[0],), (3,))
        return p, padded.at[:3].set(first_labels)

    returned, padded = identity_and_padded_first_client(population)

    assert isinstance(returned, ClientPopulation)
    assert returned.max_count == population.max_count
    for a, b in zip(
        jax.tree.leaves(returned), jax.tree.leaves(population), strict=True
    ):
        np.testing.assert_array_equal(a, b)
    assert padded.shape == (5,)
    np.testing.assert_array_equal(padded[:3], population.client(0)["y"])
    np.testing.assert_array_equal(padded[3:], 0)
