"""Cohort sampling without replacement: Floyd's ids exactly, distinct, in range, uniform."""

import jax
import numpy as np
import pytest
from reference import floyd_sample_reference, slow_after
from scipy import stats

from jaxfl.training import sampling
from jaxfl.training.sampling import sample_without_replacement


@pytest.mark.parametrize("population_size, sample_size", [(1, 1), (10, 10), (50, 7), (10**6, 100)])
def test_distinct_and_in_range(population_size, sample_size):
    ids = np.asarray(
        jax.jit(sample_without_replacement, static_argnums=(1, 2))(
            jax.random.key(3), population_size, sample_size
        )
    )
    assert ids.shape == (sample_size,)
    assert len(set(ids.tolist())) == sample_size
    assert ids.min() >= 0 and ids.max() < population_size


@pytest.mark.parametrize(
    "population_size, sample_size",
    # Sizes where collisions chain (M close to N), M = N, a single draw, and
    # both ways of finding repeated draws (pairs up to _PAIRWISE_MAX, a sort above).
    slow_after([(1, 1), (2, 2), (9, 8), (64, 33), (40, 40), (2500, 100), (1500, 1100), (1100, 1100)], keep=4),
)
def test_same_ids_as_floyds_loop(population_size, sample_size):
    sample = jax.jit(sample_without_replacement, static_argnums=(1, 2))
    for seed in range(20 if sample_size < 1000 else 3):
        key = jax.random.key(seed)
        np.testing.assert_array_equal(
            np.asarray(sample(key, population_size, sample_size)),
            floyd_sample_reference(key, population_size, sample_size),
        )


def test_sort_path_matches_pairwise_path(monkeypatch):
    keys = jax.random.split(jax.random.key(7), 50)
    pairwise = jax.vmap(lambda k: sample_without_replacement(k, 30, 25))(keys)
    monkeypatch.setattr(sampling, "_PAIRWISE_MAX", 0)
    by_sort = jax.vmap(lambda k: sample_without_replacement(k, 30, 25))(keys)
    np.testing.assert_array_equal(np.asarray(pairwise), np.asarray(by_sort))


def test_inclusion_is_uniform():
    # Each of N=12 clients must be included with probability M/N = 1/3.
    draws = jax.jit(
        jax.vmap(lambda k: sample_without_replacement(k, 12, 4))
    )(jax.random.split(jax.random.key(0), 6000))
    counts = np.bincount(np.asarray(draws).ravel(), minlength=12)
    assert stats.chisquare(counts).pvalue > 1e-3
    # Pairs are uniform too (Floyd's algorithm gives uniform subsets): the
    # pair (0, 1) appears with probability C(10,2)/C(12,4) = 1/11.
    both = np.mean(np.any(draws == 0, axis=1) & np.any(draws == 1, axis=1))
    assert abs(both - 1 / 11) < 0.015


@pytest.mark.parametrize("sample_size", [0, 11])
def test_rejects_bad_sizes(sample_size):
    with pytest.raises(ValueError, match="sample_size"):
        sample_without_replacement(jax.random.key(0), 10, sample_size)
