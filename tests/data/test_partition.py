"""Tests of the label partitioners (`jaxfl/data/partition.py`).

No golden numbers tied to random bits: `shards` and `dirichlet` are checked
against slow plain-Python re-implementations making the same random calls in
the same order, and everything else against the properties and statistics the
docstrings promise (disjointness, coverage, sizes, the law of the class mix).
"""

import math

import numpy as np
import pytest
import scipy.stats

from jaxfl.data.partition import (
    PARTITIONERS,
    dirichlet,
    dirichlet_mixture,
    iid,
    lognormal_client_sizes,
    lognormal_sizes,
    partition,
    partition_statistics,
    shards,
    split_each_client,
)

NUM_CLASSES = 10


def _labels(num_examples=20_000, num_classes=NUM_CLASSES, seed=0):
    return np.random.default_rng(seed).integers(0, num_classes, num_examples)


def _assert_index_arrays(parts, num_clients):
    assert isinstance(parts, list) and len(parts) == num_clients
    for part in parts:
        assert isinstance(part, np.ndarray) and part.dtype == np.int64 and part.ndim == 1


def _assert_disjoint(parts):
    rows = np.concatenate(parts)
    assert np.unique(rows).size == rows.size


def _assert_disjoint_covering(parts, num_examples):
    rows = np.concatenate(parts)
    assert rows.size == num_examples
    np.testing.assert_array_equal(np.sort(rows), np.arange(num_examples))


def _assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


def _differs(a, b):
    return len(a) != len(b) or any(x.shape != y.shape or np.any(x != y) for x, y in zip(a, b, strict=True))


# Every partitioner, as (name, callable of seed) on the same data, for the shared properties.
LABELS = _labels()
COVERING = {
    "iid": lambda seed: iid(LABELS.size, 50, seed=seed),
    "dirichlet": lambda seed: dirichlet(LABELS, 50, alpha=0.5, seed=seed),
    "dirichlet-balanced": lambda seed: dirichlet(LABELS, 50, alpha=0.5, balance=True, seed=seed),
    "shards": lambda seed: shards(LABELS, 50, shards_per_client=3, seed=seed),
    "lognormal": lambda seed: lognormal_sizes(LABELS.size, 50, sigma=1.0, seed=seed),
}
ALL = {
    **COVERING,
    "dirichlet-mixture": lambda seed: dirichlet_mixture(LABELS, 50, alpha=0.5, client_sizes=200, seed=seed),
}


@pytest.mark.parametrize("name", sorted(COVERING))
def test_covering_partitioners_are_disjoint_and_cover_every_example(name):
    parts = COVERING[name](0)
    _assert_index_arrays(parts, 50)
    _assert_disjoint_covering(parts, LABELS.size)


@pytest.mark.parametrize("name", sorted(ALL))
def test_same_seed_gives_the_same_partition_and_another_seed_another(name):
    _assert_same(ALL[name](3), ALL[name](3))
    assert _differs(ALL[name](3), ALL[name](4))


@pytest.mark.parametrize("name", sorted(ALL))
def test_clients_hold_their_examples_in_random_order(name):
    # Not sorted by index and not grouped by class: the within-client shuffle happened.
    parts = ALL[name](0)
    big = max(parts, key=len)
    assert np.any(np.diff(big) < 0)
    # Grouped by class, the labels would change only (distinct classes - 1) times.
    changes = np.count_nonzero(np.diff(LABELS[big]))
    assert changes > 3 * (np.unique(LABELS[big]).size - 1)


def test_the_global_numpy_random_state_is_neither_used_nor_changed():
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    for make in ALL.values():
        make(0)
    lognormal_client_sizes(1000, 10, 1.0, 0)
    split_each_client(iid(100, 5, seed=0), 0.3, seed=0)
    np.testing.assert_array_equal(np.random.get_state()[1], before)


# ---------------------------------------------------------------------------
# iid
# ---------------------------------------------------------------------------


def test_iid_sizes_are_near_equal_and_larger_first():
    parts = iid(1003, 10, seed=0)
    assert [len(p) for p in parts] == [101, 101, 101] + [100] * 7


def test_iid_client_label_mixes_are_close_to_the_global_one():
    stats = partition_statistics(LABELS, iid(LABELS.size, 50, seed=0), NUM_CLASSES)
    # 400 examples of 10 classes: sampling noise alone gives a TV distance of about 0.06.
    assert stats["tv_mean"] < 0.1
    assert stats["classes_mean"] == NUM_CLASSES


def test_iid_matches_a_plain_permutation_cut():
    rng = np.random.default_rng(5)
    perm = list(rng.permutation(23))
    expected, start = [], 0
    for i in range(4):
        size = 23 // 4 + (1 if i < 23 % 4 else 0)
        expected.append(np.array(perm[start : start + size]))
        start += size
    _assert_same(iid(23, 4, seed=5), expected)


# ---------------------------------------------------------------------------
# shards
# ---------------------------------------------------------------------------


def _group_shuffled_reference(rng, rows, owner, num_clients):
    """Plain loop: a permutation of all rows, then each row appended to its owner's list."""
    clients = [[] for _ in range(num_clients)]
    for j in rng.permutation(len(rows)):
        clients[owner[j]].append(rows[j])
    return [np.array(c, dtype=np.int64) for c in clients]


def _class_pools_reference(rng, labels):
    perm = rng.permutation(len(labels))
    # Python's sort is stable: examples of a class keep the permutation's order.
    return sorted(perm.tolist(), key=lambda j: labels[j])


def _shards_reference(labels, num_clients, shards_per_client, seed):
    rng = np.random.default_rng(seed)
    pool = _class_pools_reference(rng, labels)
    num_shards = num_clients * shards_per_client
    shard_of_row = []
    for s in range(num_shards):
        size = len(labels) // num_shards + (1 if s < len(labels) % num_shards else 0)
        shard_of_row += [s] * size
    dealt = rng.permutation(num_shards)
    owner_of_shard = {}
    for i in range(num_clients):
        for s in dealt[i * shards_per_client : (i + 1) * shards_per_client]:
            owner_of_shard[int(s)] = i
    owner = [owner_of_shard[s] for s in shard_of_row]
    return _group_shuffled_reference(rng, pool, owner, num_clients)


@pytest.mark.parametrize("num_examples, num_clients, per_client", [(600, 10, 2), (997, 7, 3), (50, 50, 1)])
def test_shards_matches_a_plain_python_reference(num_examples, num_clients, per_client):
    labels = _labels(num_examples, 5, seed=num_examples)
    expected = _shards_reference(labels.tolist(), num_clients, per_client, seed=11)
    _assert_same(shards(labels, num_clients, shards_per_client=per_client, seed=11), expected)


def test_shards_give_each_client_few_classes():
    labels = _labels(60_000, NUM_CLASSES)
    parts = shards(labels, 100, shards_per_client=2, seed=0)
    classes = [np.unique(labels[p]).size for p in parts]
    # Classes hold ~6000 examples and shards 300: a shard straddles at most one boundary.
    assert max(classes) <= 2 * 2
    assert np.mean(classes) < 2.5


def test_shards_that_do_not_straddle_classes_give_at_most_shards_per_client_classes():
    # 10 classes of 600 and 100 clients x 2 shards of 300: every shard is one class.
    labels = np.random.default_rng(0).permutation(np.repeat(np.arange(10), 600))
    for per_client in (1, 2):
        parts = shards(labels, 600 // 300 * 10 // per_client, shards_per_client=per_client, seed=1)
        assert all(np.unique(labels[p]).size <= per_client for p in parts)
        _assert_disjoint_covering(parts, labels.size)


def test_shards_keep_the_remainder_in_one_longer_shards():
    parts = shards(_labels(1001, 3), 10, shards_per_client=3, seed=0)
    _assert_disjoint_covering(parts, 1001)
    # 30 shards of 33 or 34 examples (11 of them longer): a client holds 3 of them.
    assert all(99 <= len(p) <= 102 for p in parts)


# ---------------------------------------------------------------------------
# dirichlet (hetero-dir)
# ---------------------------------------------------------------------------


def _dirichlet_reference(labels, num_clients, alpha, min_size, balance, seed):
    rng = np.random.default_rng(seed)
    num_examples = len(labels)
    present = sorted(set(labels))
    class_size = {k: labels.count(k) for k in present}
    while True:
        proportions = rng.dirichlet([alpha] * num_clients, size=len(present))
        sizes = [0] * num_clients
        counts = []
        for r, k in enumerate(present):
            p = [float(x) for x in proportions[r]]
            if balance:
                p = [pj if sizes[j] < num_examples / num_clients else 0.0 for j, pj in enumerate(p)]
                # numpy's (pairwise) sum, so that the rounding matches the library's.
                total = float(np.sum(np.array(p)))
                p = [pj / total for pj in p]
            cuts, cumulative = [], 0.0
            for pj in p:
                cumulative += pj
                cuts.append(min(math.floor(cumulative * class_size[k]), class_size[k]))
            cuts[-1] = class_size[k]
            row = [cuts[0]] + [cuts[j] - cuts[j - 1] for j in range(1, num_clients)]
            counts.append(row)
            sizes = [s + c for s, c in zip(sizes, row, strict=True)]
        if min(sizes) >= min_size:
            break
    pool = _class_pools_reference(rng, labels)
    owner = []
    for row in counts:
        for j, c in enumerate(row):
            owner += [j] * c
    return _group_shuffled_reference(rng, pool, owner, num_clients)


@pytest.mark.parametrize("balance", [False, True])
@pytest.mark.parametrize("alpha, min_size", [(0.3, 5), (2.0, 10)])
def test_dirichlet_matches_a_plain_python_reference(alpha, min_size, balance):
    # Class 2 is absent: only the classes present take part.
    labels = _labels(1500, 5, seed=2)
    labels[labels == 2] = 4
    expected = _dirichlet_reference(labels.tolist(), 12, alpha, min_size, balance, seed=7)
    _assert_same(dirichlet(labels, 12, alpha=alpha, min_size=min_size, balance=balance, seed=7), expected)


def test_dirichlet_min_size_holds_and_small_alpha_needs_retries():
    labels = _labels(5000)
    for seed in range(5):
        # min_size=0 accepts the first draw: it leaves some client below 30, so the retries matter.
        first = dirichlet(labels, 40, alpha=0.2, min_size=0, seed=seed)
        assert min(len(p) for p in first) < 30
        parts = dirichlet(labels, 40, alpha=0.2, min_size=30, seed=seed, max_attempts=1000)
        assert min(len(p) for p in parts) >= 30
        _assert_disjoint_covering(parts, labels.size)


def test_dirichlet_gives_up_with_a_message_saying_what_to_change():
    with pytest.raises(ValueError, match="lower min_size, raise alpha, use fewer clients") as info:
        dirichlet(_labels(2000), 100, alpha=0.01, min_size=20, seed=0, max_attempts=3)
    assert "\n" not in str(info.value)


def test_dirichlet_distinct_classes_fall_with_alpha_and_reach_all_classes_for_large_alpha():
    stats = {
        alpha: partition_statistics(
            LABELS, dirichlet(LABELS, 50, alpha=alpha, min_size=0, seed=0), NUM_CLASSES
        )
        for alpha in (0.03, 0.1, 0.3, 1.0, 1000.0)
    }
    classes = [stats[a]["classes_mean"] for a in (0.03, 0.1, 0.3, 1.0)]
    assert all(a < b for a, b in zip(classes, classes[1:], strict=False)), classes
    assert stats[0.03]["classes_mean"] < 3
    assert stats[1000.0]["classes_mean"] == NUM_CLASSES
    # Near IID for large alpha (400 examples a client: sampling noise ~0.06), far for small.
    assert stats[1000.0]["tv_mean"] < 0.1
    assert stats[0.1]["tv_mean"] > 0.5
    # Larger skew, unequal sizes.
    assert stats[0.1]["size_max"] > 2 * stats[0.1]["size_median"]


def test_dirichlet_balance_closes_a_client_that_reaches_the_mean_size():
    # Tiny alpha gives a whole class to one client: that client then holds exactly E / N = 50
    # examples and is closed (NIID-Bench's `len < E / N`), so the other class goes to the other client.
    labels = np.repeat([0, 1], 50)
    for seed in range(5):
        parts = dirichlet(labels, 2, alpha=1e-3, min_size=0, balance=True, seed=seed)
        assert sorted(np.unique(labels[p]).size for p in parts) == [1, 1]
    together = [dirichlet(labels, 2, alpha=1e-3, min_size=0, seed=s) for s in range(10)]
    assert any(min(len(p) for p in parts) == 0 for parts in together)


def test_dirichlet_balance_stops_feeding_full_clients():
    labels = _labels(10_000, 5)
    largest_class = np.bincount(labels).max()
    for seed in range(3):
        parts = dirichlet(labels, 20, alpha=0.2, min_size=0, balance=True, seed=seed)
        # A client below E / N = 500 before a class can receive at most that whole class.
        assert max(len(p) for p in parts) < 500 + largest_class
        _assert_disjoint_covering(parts, labels.size)
    unbalanced = [max(len(p) for p in dirichlet(labels, 20, alpha=0.2, min_size=0, seed=s)) for s in range(3)]
    balanced = [
        max(len(p) for p in dirichlet(labels, 20, alpha=0.2, min_size=0, balance=True, seed=s))
        for s in range(3)
    ]
    assert np.mean(balanced) < np.mean(unbalanced)


# ---------------------------------------------------------------------------
# dirichlet_mixture (Hsu et al.)
# ---------------------------------------------------------------------------


def test_dirichlet_mixture_honours_client_sizes_exactly_and_is_disjoint():
    sizes = lognormal_client_sizes(8000, 60, 1.0, np.random.default_rng(0))
    parts = dirichlet_mixture(LABELS, 60, alpha=0.3, client_sizes=sizes, seed=0)
    _assert_index_arrays(parts, 60)
    assert [len(p) for p in parts] == sizes.tolist()
    _assert_disjoint(parts)
    parts = dirichlet_mixture(LABELS, 7, alpha=0.3, client_sizes=np.int32(11), seed=0)
    assert [len(p) for p in parts] == [11] * 7


def test_dirichlet_mixture_that_asks_for_everything_covers_everything():
    # Classes run out near the end; the redraws still fill every client exactly.
    labels = _labels(3000, 4)
    sizes = lognormal_client_sizes(3000, 40, 0.5, 1)
    for alpha in (0.05, 1.0):
        parts = dirichlet_mixture(labels, 40, alpha=alpha, client_sizes=sizes, seed=2)
        assert [len(p) for p in parts] == sizes.tolist()
        _assert_disjoint_covering(parts, labels.size)


def test_dirichlet_mixture_redraws_an_exhausted_class_from_the_clients_other_classes():
    # Class 0 holds 5 examples but the prior puts 90% on it; class 3 has zero prior mass.
    labels = np.concatenate([np.zeros(5, np.int64), np.ones(500, np.int64), np.full(500, 2), np.full(500, 3)])
    parts = dirichlet_mixture(labels, 20, alpha=5.0, client_sizes=30, prior=[0.9, 0.05, 0.05, 0.0], seed=0)
    assert [len(p) for p in parts] == [30] * 20
    _assert_disjoint(parts)
    counts = np.array([np.bincount(labels[p], minlength=4) for p in parts])
    assert counts[:, 0].sum() == 5
    # The shortfall goes to the classes the clients' mixtures favour, never to one they give no mass.
    assert counts[:, 3].sum() == 0
    # Clients are served in a random order: the scarce class does not always go to client 0.
    holders = set()
    for seed in range(5):
        parts = dirichlet_mixture(
            labels, 20, alpha=5.0, client_sizes=30, prior=[0.9, 0.05, 0.05, 0.0], seed=seed
        )
        holders |= {i for i, p in enumerate(parts) if np.any(labels[p] == 0)}
    assert len(holders) > 2


def test_dirichlet_mixture_falls_back_to_what_is_left_when_the_mixture_has_no_mass_there():
    labels = np.concatenate([np.zeros(10, np.int64), np.ones(100, np.int64)])
    parts = dirichlet_mixture(labels, 5, alpha=1.0, client_sizes=20, prior=[1.0, 0.0], seed=0)
    counts = np.array([np.bincount(labels[p], minlength=2) for p in parts])
    assert counts[:, 0].sum() == 10 and counts.sum() == 100


def _mixture_chi_square(labels, parts, prior, alpha, size):
    """Pearson statistic of the clients' total class counts against the prior, ~ chi2(K - 1).

    Client counts are Dirichlet-multinomial(size, alpha * K * prior): the variance of a class total
    is that of a multinomial times (size + A) / (1 + A), A = alpha * K.
    """
    num_classes = prior.size
    concentration = alpha * num_classes
    totals = np.bincount(np.concatenate([labels[p] for p in parts]), minlength=num_classes)
    expected = len(parts) * size * prior
    inflation = (size + concentration) / (1 + concentration)
    statistic = np.sum((totals - expected) ** 2 / (expected * inflation))
    return scipy.stats.chi2.sf(statistic, num_classes - 1)


def test_dirichlet_mixture_class_proportions_average_to_the_given_prior():
    labels = np.random.default_rng(0).permutation(np.repeat(np.arange(4), 25_000))
    prior = np.array([0.5, 0.3, 0.15, 0.05])
    p_values = [
        _mixture_chi_square(
            labels,
            dirichlet_mixture(labels, 400, alpha=1.0, client_sizes=50, prior=prior, seed=s),
            prior,
            1.0,
            50,
        )
        for s in range(4)
    ]
    assert min(p_values) > 1e-3, p_values
    # The test has power: the data's own (uniform) frequencies are rejected.
    parts = dirichlet_mixture(labels, 400, alpha=1.0, client_sizes=50, seed=0)
    assert _mixture_chi_square(labels, parts, prior, 1.0, 50) < 1e-6


def test_dirichlet_mixture_default_prior_is_the_empirical_class_frequencies():
    labels = np.random.default_rng(1).permutation(np.repeat(np.arange(3), [60_000, 30_000, 10_000]))
    empirical = np.array([0.6, 0.3, 0.1])
    for prior in (None, "empirical"):
        parts = dirichlet_mixture(labels, 300, alpha=0.5, client_sizes=40, prior=prior, seed=3)
        assert _mixture_chi_square(labels, parts, empirical, 0.5, 40) > 1e-3
    parts = dirichlet_mixture(labels, 300, alpha=0.5, client_sizes=40, prior="uniform", seed=3)
    assert _mixture_chi_square(labels, parts, np.full(3, 1 / 3), 0.5, 40) > 1e-3


def test_dirichlet_mixture_alpha_is_the_per_class_concentration():
    # Under a uniform prior a client's class fraction has variance p (1 - p) (n + A) / (n (1 + A)),
    # A = alpha * K (not alpha, as with Hsu et al.'s total concentration).
    labels = np.random.default_rng(0).permutation(np.repeat(np.arange(10), 20_000))
    parts = dirichlet_mixture(labels, 1000, alpha=0.5, client_sizes=100, prior="uniform", seed=0)
    fractions = np.array([np.bincount(labels[p], minlength=10) for p in parts]) / 100
    predicted = 0.1 * 0.9 * (100 + 5) / (100 * (1 + 5))
    assert abs(fractions.var(axis=0).mean() / predicted - 1) < 0.1


def test_dirichlet_mixture_distinct_classes_fall_with_alpha():
    classes = [
        partition_statistics(
            LABELS, dirichlet_mixture(LABELS, 100, alpha=alpha, client_sizes=100, seed=0), NUM_CLASSES
        )["classes_mean"]
        for alpha in (0.01, 0.1, 1.0, 100.0)
    ]
    assert all(a < b for a, b in zip(classes, classes[1:], strict=False)), classes
    assert classes[0] < 2 and classes[-1] > 9.5


# ---------------------------------------------------------------------------
# lognormal sizes
# ---------------------------------------------------------------------------


def test_lognormal_sizes_sum_exactly_and_respect_min_size():
    for sigma in (0.0, 0.5, 1.0, 3.0):
        for min_size in (0, 1, 20):
            sizes = lognormal_client_sizes(10_007, 97, sigma, np.random.default_rng(0), min_size)
            assert sizes.dtype == np.int64 and sizes.sum() == 10_007 and sizes.min() >= min_size


def test_lognormal_sizes_are_proportional_to_the_draws_above_the_floor():
    draws = np.random.default_rng(4).lognormal(0.0, 2.0, 200)
    sizes = lognormal_client_sizes(50_000, 200, 2.0, np.random.default_rng(4), min_size=0)
    assert np.all(np.abs(sizes - 50_000 * draws / draws.sum()) < 1)
    # With a floor: the clamped clients sit on it, the others keep their proportions to one another.
    sizes = lognormal_client_sizes(50_000, 200, 2.0, np.random.default_rng(4), min_size=50)
    free = sizes > 50
    assert np.all(draws[~free] <= draws[free].min())
    scale = (50_000 - 50 * np.count_nonzero(~free)) / draws[free].sum()
    assert np.all(np.abs(sizes[free] - scale * draws[free]) < 1)


def test_lognormal_sigma_zero_gives_equal_sizes_and_larger_sigma_a_larger_spread():
    assert np.ptp(lognormal_client_sizes(1003, 10, 0.0, 0)) <= 1
    cvs = []
    for sigma in (0.0, 0.3, 1.0, 2.0):
        sizes = np.concatenate([lognormal_client_sizes(100_000, 200, sigma, seed) for seed in range(3)])
        cvs.append(sizes.std() / sizes.mean())
    assert all(a < b for a, b in zip(cvs, cvs[1:], strict=False)), cvs
    assert cvs[0] < 0.01 and abs(cvs[2] - math.sqrt(math.e - 1)) < 0.5


def test_lognormal_client_sizes_takes_a_generator_or_a_seed():
    np.testing.assert_array_equal(
        lognormal_client_sizes(1000, 10, 1.0, 3),
        lognormal_client_sizes(1000, 10, 1.0, np.random.default_rng(3)),
    )


def test_lognormal_partition_is_iid_with_the_drawn_sizes():
    parts = lognormal_sizes(LABELS.size, 50, sigma=1.0, seed=2)
    np.testing.assert_array_equal(
        [len(p) for p in parts], lognormal_client_sizes(LABELS.size, 50, 1.0, np.random.default_rng(2))
    )
    # Large clients have near-global label mixes.
    large = [p for p in parts if len(p) > 400]
    assert partition_statistics(LABELS, large, NUM_CLASSES)["tv_mean"] < 0.1


# ---------------------------------------------------------------------------
# split_each_client
# ---------------------------------------------------------------------------


def test_split_each_client_holds_out_the_rounded_fraction():
    sizes = [0, 1, 2, 3, 5, 10, 11, 100]
    parts = [np.arange(100 * i, 100 * i + n) for i, n in enumerate(sizes)]
    kept, held = split_each_client(parts, 0.25, seed=0)
    # Rounded half up (10 * 0.25 = 2.5 -> 3), and clamped to [1, n - 1] for n >= 2; n = 1 keeps its example.
    assert [len(h) for h in held] == [0, 0, 1, 1, 1, 3, 3, 25]
    assert [len(k) for k in kept] == [0, 1, 1, 2, 4, 7, 8, 75]
    _, held = split_each_client(parts, 0.9, seed=0)
    assert [len(h) for h in held] == [0, 0, 1, 2, 4, 9, 10, 90]


def test_split_each_client_partitions_each_client_and_keeps_its_order():
    parts = iid(1000, 20, seed=0)
    kept, held = split_each_client(parts, 0.3, seed=1)
    _assert_index_arrays(kept, 20)
    _assert_index_arrays(held, 20)
    for part, k, h in zip(parts, kept, held, strict=True):
        np.testing.assert_array_equal(np.sort(np.concatenate([k, h])), np.sort(part))
        position = {int(x): i for i, x in enumerate(part)}
        assert all(np.diff([position[int(x)] for x in k]) > 0)
        assert all(np.diff([position[int(x)] for x in h]) > 0)
    _assert_same(split_each_client(parts, 0.3, seed=1)[1], held)
    assert _differs(split_each_client(parts, 0.3, seed=2)[1], held)


def test_split_each_client_holds_out_a_uniform_subset():
    # Each position of a 10-example client is held out (3 of 10) with probability 0.3.
    parts = [np.arange(10 * i, 10 * i + 10) for i in range(2000)]
    _, held = split_each_client(parts, 0.3, seed=0)
    hits = np.bincount(np.concatenate(held) % 10, minlength=10)
    assert scipy.stats.chisquare(hits).pvalue > 1e-3


# ---------------------------------------------------------------------------
# partition (by name) and partition_statistics
# ---------------------------------------------------------------------------


def test_partition_dispatches_by_name():
    assert list(PARTITIONERS) == ["iid", "dirichlet", "dirichlet-mixture", "shards", "lognormal"]
    _assert_same(partition("iid", LABELS, 30, seed=1), iid(LABELS.size, 30, seed=1))
    _assert_same(
        partition("dirichlet", LABELS, 30, seed=1, alpha=0.5, balance=True),
        dirichlet(LABELS, 30, alpha=0.5, balance=True, seed=1),
    )
    _assert_same(
        partition("dirichlet-mixture", LABELS, 30, seed=1, alpha=0.5, client_sizes=50),
        dirichlet_mixture(LABELS, 30, alpha=0.5, client_sizes=50, seed=1),
    )
    _assert_same(partition("shards", LABELS, 30, seed=1), shards(LABELS, 30, seed=1))
    _assert_same(
        partition("lognormal", LABELS, 30, seed=1, sigma=0.7),
        lognormal_sizes(LABELS.size, 30, sigma=0.7, seed=1),
    )


@pytest.mark.parametrize(
    "name, options, message",
    [
        ("dirchlet", {}, "unknown partitioner 'dirchlet'; valid names: iid, dirichlet, dirichlet-mixture"),
        ("iid", {"alpha": 1.0}, "unknown option 'alpha' for partitioner 'iid'; valid options: none"),
        ("dirichlet", {"alpha": 1.0, "beta": 2}, "valid options: alpha, min_size, balance, max_attempts"),
        ("dirichlet", {}, "partitioner 'dirichlet' needs option alpha"),
        ("dirichlet-mixture", {"alpha": 1.0}, "needs option client_sizes"),
        ("lognormal", {}, "needs option sigma"),
    ],
)
def test_partition_rejects_unknown_names_and_options_in_one_line(name, options, message):
    with pytest.raises(ValueError) as info:
        partition(name, LABELS, 10, seed=0, **options)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_partition_statistics_on_a_hand_made_partition():
    labels = np.array([0, 0, 1, 1, 2, 2, 0, 1])
    parts = [np.array([0, 1]), np.array([2, 4, 6]), np.array([], dtype=np.int64), np.array([3, 5, 7])]
    stats = partition_statistics(labels, parts, num_classes=4)
    assert stats["num_clients"] == 4 and stats["num_assigned"] == 8
    assert (stats["size_min"], stats["size_median"], stats["size_mean"], stats["size_max"]) == (
        0,
        2.5,
        2.0,
        3,
    )
    assert (stats["classes_mean"], stats["classes_min"], stats["classes_max"]) == (1.5, 0, 3)
    # Global mix (3/8, 3/8, 2/8, 0); the empty client is left out of the mean TV distance.
    tvs = [0.5 * (5 / 8 + 3 / 8 + 2 / 8), 0.5 * (1 / 24 + 1 / 24 + 2 / 24), 0.5 * (9 / 24 + 7 / 24 + 2 / 24)]
    assert stats["tv_mean"] == pytest.approx(np.mean(tvs))


# ---------------------------------------------------------------------------
# Edge cases
# ---------------------------------------------------------------------------


def test_one_client_gets_everything():
    labels = _labels(500)
    for name, options in [
        ("iid", {}),
        ("dirichlet", {"alpha": 0.1}),
        ("dirichlet", {"alpha": 0.1, "balance": True}),
        ("shards", {"shards_per_client": 4}),
        ("lognormal", {"sigma": 2.0}),
    ]:
        parts = partition(name, labels, 1, seed=0, **options)
        _assert_disjoint_covering(parts, 500)
    parts = dirichlet_mixture(labels, 1, alpha=0.1, client_sizes=500, seed=0)
    _assert_disjoint_covering(parts, 500)


def test_a_single_class():
    labels = np.full(300, 3)
    for name, options in [
        ("iid", {}),
        ("dirichlet", {"alpha": 0.5, "min_size": 0}),
        ("shards", {}),
        ("lognormal", {"sigma": 1.0}),
    ]:
        _assert_disjoint_covering(partition(name, labels, 12, seed=0, **options), 300)
    parts = dirichlet_mixture(labels, 12, alpha=0.5, client_sizes=25, seed=0)
    _assert_disjoint_covering(parts, 300)
    # A uniform prior over classes 0..3 puts mass on empty classes: all of it is redrawn onto class 3.
    parts = dirichlet_mixture(labels, 12, alpha=0.5, client_sizes=20, prior="uniform", seed=0)
    assert [len(p) for p in parts] == [20] * 12


def test_as_many_clients_as_examples():
    labels = _labels(64, 3)
    for parts in (
        iid(64, 64, seed=0),
        shards(labels, 64, shards_per_client=1, seed=0),
        lognormal_sizes(64, 64, sigma=1.0, seed=0),
        dirichlet_mixture(labels, 64, alpha=1.0, client_sizes=1, seed=0),
    ):
        assert [len(p) for p in parts] == [1] * 64
        _assert_disjoint_covering(parts, 64)
    _assert_disjoint_covering(dirichlet(labels, 64, alpha=1.0, min_size=0, seed=0), 64)


def test_labels_may_be_any_integer_dtype_or_a_list():
    labels = _labels(1000, 4)
    expected = dirichlet(labels, 10, alpha=0.5, seed=0)
    _assert_same(dirichlet(labels.astype(np.uint8), 10, alpha=0.5, seed=0), expected)
    _assert_same(dirichlet(labels.tolist(), 10, alpha=0.5, seed=0), expected)


# ---------------------------------------------------------------------------
# Argument checks: every bad argument raises a one-line ValueError naming it.
# ---------------------------------------------------------------------------

SMALL = _labels(100, 4)

BAD_ARGUMENTS = [
    ("num_examples", lambda: iid(0, 1, seed=0)),
    ("num_examples", lambda: iid(10.0, 1, seed=0)),
    ("num_clients", lambda: iid(10, 0, seed=0)),
    ("num_clients", lambda: iid(10, 11, seed=0)),
    ("num_clients", lambda: iid(10, True, seed=0)),
    ("seed", lambda: iid(10, 2, seed=-1)),
    ("seed", lambda: iid(10, 2, seed=None)),
    ("labels", lambda: dirichlet(SMALL.reshape(10, 10), 2, alpha=1.0, seed=0)),
    ("labels", lambda: dirichlet(SMALL.astype(float), 2, alpha=1.0, seed=0)),
    ("labels", lambda: dirichlet(SMALL - 1, 2, alpha=1.0, seed=0)),
    ("labels", lambda: dirichlet([], 2, alpha=1.0, seed=0)),
    ("num_clients", lambda: dirichlet(SMALL, 101, alpha=1.0, min_size=0, seed=0)),
    ("alpha", lambda: dirichlet(SMALL, 2, alpha=0.0, seed=0)),
    ("alpha", lambda: dirichlet(SMALL, 2, alpha=-1.0, seed=0)),
    ("alpha", lambda: dirichlet(SMALL, 2, alpha=math.inf, seed=0)),
    ("alpha", lambda: dirichlet(SMALL, 2, alpha=math.nan, seed=0)),
    ("alpha", lambda: dirichlet(SMALL, 2, alpha="1", seed=0)),
    ("min_size", lambda: dirichlet(SMALL, 2, alpha=1.0, min_size=-1, seed=0)),
    ("min_size", lambda: dirichlet(SMALL, 20, alpha=1.0, min_size=6, seed=0)),
    ("balance", lambda: dirichlet(SMALL, 2, alpha=1.0, balance="yes", seed=0)),
    ("max_attempts", lambda: dirichlet(SMALL, 2, alpha=1.0, max_attempts=0, seed=0)),
    ("num_clients", lambda: dirichlet_mixture(SMALL, 0, alpha=1.0, client_sizes=1, seed=0)),
    ("alpha", lambda: dirichlet_mixture(SMALL, 2, alpha=0, client_sizes=1, seed=0)),
    ("client_sizes", lambda: dirichlet_mixture(SMALL, 2, alpha=1.0, client_sizes=[1, 2, 3], seed=0)),
    ("client_sizes", lambda: dirichlet_mixture(SMALL, 2, alpha=1.0, client_sizes=[1.0, 2.0], seed=0)),
    ("client_sizes", lambda: dirichlet_mixture(SMALL, 2, alpha=1.0, client_sizes=[-1, 2], seed=0)),
    ("client_sizes", lambda: dirichlet_mixture(SMALL, 2, alpha=1.0, client_sizes=51, seed=0)),
    ("prior", lambda: dirichlet_mixture(SMALL, 2, alpha=1.0, client_sizes=1, prior=[1, 1, 1], seed=0)),
    ("prior", lambda: dirichlet_mixture(SMALL, 2, alpha=1.0, client_sizes=1, prior=[1, -1, 1, 1], seed=0)),
    ("prior", lambda: dirichlet_mixture(SMALL, 2, alpha=1.0, client_sizes=1, prior=[0, 0, 0, 0], seed=0)),
    (
        "prior",
        lambda: dirichlet_mixture(SMALL, 2, alpha=1.0, client_sizes=1, prior=[1, 1, np.nan, 1], seed=0),
    ),
    ("prior", lambda: dirichlet_mixture(SMALL, 2, alpha=1.0, client_sizes=1, prior="flat", seed=0)),
    ("shards_per_client", lambda: shards(SMALL, 2, shards_per_client=0, seed=0)),
    ("shards_per_client", lambda: shards(SMALL, 30, shards_per_client=4, seed=0)),
    ("num_clients", lambda: shards(SMALL, 101, seed=0)),
    ("sigma", lambda: lognormal_sizes(100, 2, sigma=-0.1, seed=0)),
    ("sigma", lambda: lognormal_sizes(100, 2, sigma=math.nan, seed=0)),
    ("min_size", lambda: lognormal_sizes(100, 20, sigma=1.0, min_size=6, seed=0)),
    ("total", lambda: lognormal_client_sizes(10, 5, 1.0, 0, min_size=3)),
    ("num_clients", lambda: lognormal_client_sizes(10, 0, 1.0, 0)),
    ("rng", lambda: lognormal_client_sizes(10, 2, 1.0, None)),
    ("fraction", lambda: split_each_client([np.arange(3)], 0.0, seed=0)),
    ("fraction", lambda: split_each_client([np.arange(3)], 1.0, seed=0)),
    ("parts", lambda: split_each_client([np.arange(4).reshape(2, 2)], 0.5, seed=0)),
    ("parts", lambda: split_each_client([np.array([0.5])], 0.5, seed=0)),
    ("parts", lambda: split_each_client([], 0.5, seed=0)),
    ("num_classes", lambda: partition_statistics(SMALL, [np.arange(3)], 3)),
    ("parts", lambda: partition_statistics(SMALL, [np.array([100])], 4)),
    ("labels", lambda: partition("iid", SMALL.astype(float), 2, seed=0)),
    ("labels", lambda: partition("iid", [[0, 1], [2]], 2, seed=0)),
    ("client_sizes", lambda: dirichlet_mixture(SMALL, 2, alpha=1.0, client_sizes=[[1, 2], [3]], seed=0)),
    ("prior", lambda: dirichlet_mixture(SMALL, 2, alpha=1.0, client_sizes=1, prior=[[1, 2], [3]], seed=0)),
    ("parts", lambda: split_each_client([[[0, 1], [2]]], 0.5, seed=0)),
    ("parts", lambda: partition_statistics(SMALL, [np.arange(4).reshape(2, 2)], 4)),
]


@pytest.mark.parametrize(
    "name, call", BAD_ARGUMENTS, ids=[f"{i}-{n}" for i, (n, _) in enumerate(BAD_ARGUMENTS)]
)
def test_bad_arguments_raise_a_one_line_value_error_naming_the_argument(name, call):
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert name in message and "\n" not in message, message
