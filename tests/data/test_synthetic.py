"""Tests of the synthetic generators and the registry (`jaxfl/data`).

No golden numbers tied to random bits: the generators are checked against
re-implementations (the peers' loop, the paper's make_classification call)
and against the statistics their docstrings promise.
"""

import math

import numpy as np
import pytest
import scipy.optimize
import scipy.stats
from sklearn.datasets import make_classification

from jaxfl.data import (
    FederatedDataset,
    dataset_names,
    dataset_options,
    fedprox_synthetic,
    label_shift,
    load_dataset,
    many_clients,
    peer_benchmark,
)

# A label-shift configuration small enough for unit tests: 150 clients of
# 100 examples from a pool of 40000 (4000 per class; the largest class demand
# is well below that).
SMALL_LABEL_SHIFT = dict(
    num_train_clients=100,
    num_validation_clients=20,
    num_test_clients=30,
    pool_size=40_000,
)


def _populations(dataset: FederatedDataset):
    populations = {"train": dataset.train, "test": dataset.test}
    if dataset.validation is not None:
        populations["validation"] = dataset.validation
    return populations


def _all_arrays(dataset: FederatedDataset) -> dict[str, np.ndarray]:
    """Every array of every population, keyed by population and field."""
    arrays = {}
    for role, population in _populations(dataset).items():
        arrays[f"{role}.offsets"] = np.asarray(population.offsets)
        arrays[f"{role}.counts"] = np.asarray(population.counts)
        for name, values in population.features.items():
            arrays[f"{role}.{name}"] = np.asarray(values)
    return arrays


def _assert_same_arrays(a: FederatedDataset, b: FederatedDataset):
    arrays_a, arrays_b = _all_arrays(a), _all_arrays(b)
    assert arrays_a.keys() == arrays_b.keys()
    for key in arrays_a:
        assert arrays_a[key].dtype == arrays_b[key].dtype, key
        np.testing.assert_array_equal(arrays_a[key], arrays_b[key], err_msg=key)


def _numpy_clients(population) -> list[dict[str, np.ndarray]]:
    """Every client's examples as NumPy arrays.

    Slices host copies: `ClientPopulation.client` slices device arrays, which
    compiles one slice per distinct client size.
    """
    features = {k: np.asarray(v) for k, v in population.features.items()}
    bounds = zip(
        np.asarray(population.offsets), np.asarray(population.counts), strict=True
    )
    return [
        {k: v[start : start + count] for k, v in features.items()}
        for start, count in bounds
    ]


def _client_labels(population):
    return [client["y"] for client in _numpy_clients(population)]


def _linearly_separable(x: np.ndarray, y: np.ndarray, num_classes: int) -> bool:
    """Whether one affine map W, b gives y == argmax(x @ W + b) for all rows.

    Feasibility LP: (w_c - w_y) . x + (b_c - b_y) <= -1 for every row and
    every other class c (the margin 1 is free, by scaling W and b).
    """
    num_rows, num_features = x.shape
    x = x.astype(np.float64)
    other = np.array([[c for c in range(num_classes) if c != label] for label in y])
    num_other = num_classes - 1
    num_variables = num_features * num_classes + num_classes
    rows = np.arange(num_rows * num_other)
    constraints = np.zeros((rows.size, num_variables))
    example = np.repeat(np.arange(num_rows), num_other)
    own = y[example]
    other = other.ravel()
    feature_index = np.arange(num_features)
    # W is stored row-major [D, C]: W[d, c] is variable d * C + c.
    constraints[rows[:, None], feature_index * num_classes + other[:, None]] += x[
        example
    ]
    constraints[rows[:, None], feature_index * num_classes + own[:, None]] -= x[example]
    constraints[rows, num_features * num_classes + other] += 1.0
    constraints[rows, num_features * num_classes + own] -= 1.0
    result = scipy.optimize.linprog(
        c=np.zeros(num_variables),
        A_ub=constraints,
        b_ub=-np.ones(rows.size),
        bounds=(None, None),
        method="highs",
    )
    assert result.status in (0, 2), result.message  # feasible or infeasible
    return result.status == 0


# ---------------------------------------------------------------------------
# Determinism.
# ---------------------------------------------------------------------------

GENERATOR_CASES = {
    "synthetic": (lambda seed: fedprox_synthetic(1.0, 1.0, num_clients=10, seed=seed)),
    "synthetic-iid": (
        lambda seed: fedprox_synthetic(0.0, 0.0, num_clients=10, iid=True, seed=seed)
    ),
    "label-shift-partition": (
        lambda seed: label_shift(**SMALL_LABEL_SHIFT, partition_seed=seed)
    ),
    "label-shift-data": (
        lambda seed: label_shift(**SMALL_LABEL_SHIFT, data_seed=2345 + seed)
    ),
    "peer-benchmark": (
        lambda seed: peer_benchmark(num_features=60, num_classes=10, seed=seed)
    ),
    "many-clients": (lambda seed: many_clients(num_clients=1000, seed=seed)),
}


@pytest.mark.parametrize("case", sorted(GENERATOR_CASES))
def test_same_seed_gives_identical_arrays(case):
    """Every generator is deterministic given its seeds."""
    generate = GENERATOR_CASES[case]
    _assert_same_arrays(generate(0), generate(0))


@pytest.mark.parametrize("case", sorted(GENERATOR_CASES))
def test_different_seed_gives_different_data(case):
    """Changing a seed changes the data."""
    generate = GENERATOR_CASES[case]
    first, second = generate(0), generate(1)
    x_first = np.asarray(first.train.features["x"])
    x_second = np.asarray(second.train.features["x"])
    assert x_first.shape != x_second.shape or not np.array_equal(x_first, x_second)


# ---------------------------------------------------------------------------
# FedProx Synthetic(alpha, beta) and Synthetic-IID.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("iid", [False, True])
def test_synthetic_shapes_dtypes_and_labels(iid):
    """Synthetic populations have the documented shapes, dtypes and labels."""
    dataset = fedprox_synthetic(
        0.5, 0.5, num_clients=12, num_features=7, num_classes=4, iid=iid
    )

    assert dataset.input_shape == (7,)
    assert dataset.num_classes == 4
    assert dataset.validation is None
    for population in (dataset.train, dataset.test):
        assert population.num_clients == 12
        assert population.features["x"].shape == (population.num_examples, 7)
        assert population.features["x"].dtype == np.float32
        assert population.features["y"].dtype == np.int32
        labels = np.asarray(population.features["y"])
        assert labels.min() >= 0 and labels.max() < 4


def test_synthetic_split_is_per_client_train_fraction_with_one_test_example():
    """Each client is split train_fraction / rest, keeping one example each side."""
    dataset = fedprox_synthetic(1.0, 1.0, num_clients=50)
    train_counts = np.asarray(dataset.train.counts)
    test_counts = np.asarray(dataset.test.counts)
    sizes = train_counts + test_counts

    assert sizes.min() >= 50
    np.testing.assert_array_equal(train_counts, (0.9 * sizes).astype(int))
    assert test_counts.min() >= 1

    # A tiny train fraction still leaves every client one training example,
    # and a fraction near 1 still leaves one test example.
    tiny = fedprox_synthetic(1.0, 1.0, num_clients=20, train_fraction=1e-4)
    np.testing.assert_array_equal(tiny.train.counts, 1)
    huge = fedprox_synthetic(1.0, 1.0, num_clients=20, train_fraction=0.9999)
    np.testing.assert_array_equal(huge.test.counts, 1)


def test_synthetic_client_sizes_follow_lognormal_4_2_plus_50():
    """Client sizes are int(lognormal(4, 2)) + 50 in distribution."""
    # One feature keeps 2000 heavy-tailed clients cheap; the sizes are drawn
    # before anything that depends on the number of features.
    dataset = fedprox_synthetic(
        1.0, 1.0, num_clients=2000, num_features=1, num_classes=2
    )
    sizes = np.asarray(dataset.train.counts) + np.asarray(dataset.test.counts)
    assert sizes.min() >= 50

    # n - 50 = floor(L) with L ~ lognormal(4, 2): P(n - 50 <= m) = P(L < m + 1).
    for m in (5, 20, 54, 150, 1000, 5000):
        expected = scipy.stats.norm.cdf((math.log(m + 1) - 4.0) / 2.0)
        observed = np.mean(sizes - 50 <= m)
        # Binomial standard error is at most 0.011 with 2000 clients.
        assert abs(observed - expected) < 0.05, (m, observed, expected)


def test_synthetic_feature_covariance_diagonal_decays_as_power_1_2():
    """Inputs have covariance diag((j + 1)^-1.2), pooled (IID) and per client."""
    # Fixed client sizes (size_sigma=0): int(e^4) + 50 = 104 examples each.
    num_features = 60
    expected = np.arange(1, num_features + 1) ** -1.2
    iid = fedprox_synthetic(0.0, 0.0, num_clients=200, iid=True, size_sigma=0.0)
    x = np.concatenate(
        [np.asarray(iid.train.features["x"]), np.asarray(iid.test.features["x"])]
    )
    assert x.shape[0] == 200 * 104
    # IID: v_k = 0, so the pooled second moment is Sigma's diagonal. With
    # ~20k rows the relative standard error of each variance is ~1%.
    np.testing.assert_allclose(np.mean(x**2, axis=0), expected, rtol=0.06)
    # Off-diagonal covariance is zero.
    correlation = np.corrcoef(x, rowvar=False)
    assert np.abs(correlation - np.eye(num_features)).max() < 0.05

    # Non-IID: each client has its own mean v_k, but the same covariance.
    non_iid = fedprox_synthetic(1.0, 1.0, num_clients=200, size_sigma=0.0)
    within_client_variances = [
        np.var(np.concatenate([train["x"], test["x"]]), axis=0, ddof=1)
        for train, test in zip(
            _numpy_clients(non_iid.train), _numpy_clients(non_iid.test), strict=True
        )
    ]
    np.testing.assert_allclose(
        np.mean(within_client_variances, axis=0), expected, rtol=0.06
    )


def test_synthetic_beta_is_a_standard_deviation():
    """The beta of Synthetic(alpha, beta) is a standard deviation, as in FedProx."""
    # The mean over features of client k's inputs is ~ B_k + N(0, 1/60) +
    # sampling noise, with B_k ~ N(0, beta^2): across clients its variance is
    # about beta^2 + 1/60 (4.02 for beta = 2; a variance reading gives 2.02).
    dataset = fedprox_synthetic(
        0.0, 2.0, num_clients=400, size_sigma=0.0, num_classes=2
    )
    client_means = [client["x"].mean() for client in _numpy_clients(dataset.train)]
    assert 3.0 < np.var(client_means, ddof=1) < 5.0


def _train_and_test_of_clients(dataset, clients):
    """Inputs and labels of the given clients' training and test examples together."""
    train, test = _numpy_clients(dataset.train), _numpy_clients(dataset.test)
    chosen = [train[i] for i in clients] + [test[i] for i in clients]
    return (
        np.concatenate([client["x"] for client in chosen]),
        np.concatenate([client["y"] for client in chosen]),
    )


def test_synthetic_iid_labels_come_from_one_shared_linear_map():
    """IID labels fit one affine map; Synthetic(1, 1) needs one per client."""
    # Few features and classes with thousands of examples: a single affine
    # map can only fit the labels if it really generated them.
    options = dict(num_clients=20, num_features=3, num_classes=3, size_sigma=1.0)
    iid = fedprox_synthetic(0.0, 0.0, iid=True, **options)
    x, y = _train_and_test_of_clients(iid, range(20))
    assert x.shape[0] > 1000
    assert _linearly_separable(x, y, 3)

    # Synthetic(1, 1): each client (train and test together: they are the
    # same client's data) has its own map, so the pool has none.
    non_iid = fedprox_synthetic(1.0, 1.0, **options)
    for client in range(3):
        assert _linearly_separable(*_train_and_test_of_clients(non_iid, [client]), 3)
    x, y = _train_and_test_of_clients(non_iid, range(20))
    assert not _linearly_separable(x, y, 3)


# ---------------------------------------------------------------------------
# Delta-FL label shift (004 Appendix D.2).
# ---------------------------------------------------------------------------


def _mean_distinct_classes(population):
    return float(np.mean([np.unique(y).size for y in _client_labels(population)]))


def test_label_shift_clients_are_disjoint_draws_from_the_papers_pool():
    """Every example is a distinct row of the paper's make_classification pool."""
    dataset = label_shift(**SMALL_LABEL_SHIFT)
    # The paper's call, re-issued here, with the test's pool size.
    pool_x, pool_y = make_classification(
        n_samples=SMALL_LABEL_SHIFT["pool_size"],
        n_features=20,
        n_informative=15,
        n_redundant=2,
        n_repeated=0,
        n_classes=10,
        n_clusters_per_class=1,
        class_sep=5.0,
        hypercube=False,
        random_state=2345,
    )
    pool_x = pool_x.astype(np.float32)
    row_of_bytes = {row.tobytes(): i for i, row in enumerate(pool_x)}
    assert len(row_of_bytes) == len(pool_x)  # continuous features: no ties

    used_rows = []
    for role, population in _populations(dataset).items():
        x = np.asarray(population.features["x"])
        y = np.asarray(population.features["y"])
        rows = np.array([row_of_bytes[row.tobytes()] for row in x])
        np.testing.assert_array_equal(y, pool_y[rows], err_msg=role)
        used_rows.append(rows)
    used_rows = np.concatenate(used_rows)
    assert np.unique(used_rows).size == used_rows.size  # without replacement


def test_label_shift_sizes_shapes_and_label_statistics():
    """100 examples per client and the documented label diversity."""
    dataset = label_shift(**SMALL_LABEL_SHIFT)

    assert dataset.input_shape == (20,)
    assert dataset.num_classes == 10
    expected_clients = {"train": 100, "validation": 20, "test": 30}
    for role, population in _populations(dataset).items():
        assert population.num_clients == expected_clients[role]
        np.testing.assert_array_equal(population.counts, 100)
        assert population.features["x"].dtype == np.float32
        assert population.features["x"].shape == (population.num_examples, 20)
        assert population.features["y"].dtype == np.int32
        labels = np.asarray(population.features["y"])
        assert labels.min() >= 0 and labels.max() <= 9

    # Dir(0.5) mixes: ~8.0 distinct classes per training client; Dir(0.01):
    # ~1.4 per validation or test client (data-sources.md section 3.3).
    assert 7.2 < _mean_distinct_classes(dataset.train) < 8.8
    assert 1.1 < _mean_distinct_classes(dataset.test) < 1.8
    assert 1.1 < _mean_distinct_classes(dataset.validation) < 1.8


def test_label_shift_paper_size():
    """The paper's 2500 / 500 / 500 clients, with ~8.0 and ~1.4 classes."""
    dataset = label_shift()

    assert dataset.train.num_clients == 2500
    assert dataset.validation.num_clients == 500
    assert dataset.test.num_clients == 500
    for population in _populations(dataset).values():
        np.testing.assert_array_equal(population.counts, 100)
    assert 7.8 < _mean_distinct_classes(dataset.train) < 8.2
    assert 1.3 < _mean_distinct_classes(dataset.test) < 1.6
    assert 1.3 < _mean_distinct_classes(dataset.validation) < 1.6


def test_label_shift_training_clients_do_not_depend_on_test_clients():
    """Training clients are drawn first, from their own stream."""
    small = label_shift(**{**SMALL_LABEL_SHIFT, "num_test_clients": 5})
    large = label_shift(**SMALL_LABEL_SHIFT)
    for name in ("x", "y"):
        np.testing.assert_array_equal(
            small.train.features[name], large.train.features[name]
        )


def test_label_shift_without_validation_clients():
    """Zero validation clients give no validation population."""
    dataset = label_shift(**{**SMALL_LABEL_SHIFT, "num_validation_clients": 0})
    assert dataset.validation is None


def test_label_shift_reports_an_exhausted_class_pool():
    """A class pool or a pool too small for the clients is a clear error."""
    # One client of 300 examples with a Dir(0.01) mix takes (almost) all of
    # them from one class, whose pool holds only ~200.
    with pytest.raises(ValueError, match="ran out of class"):
        label_shift(
            num_train_clients=1,
            num_validation_clients=0,
            num_test_clients=1,
            examples_per_client=300,
            train_concentration=0.01,
            pool_size=2000,
        )
    with pytest.raises(ValueError, match="pool_size=1000 is too small"):
        label_shift(**{**SMALL_LABEL_SHIFT, "pool_size": 1000})


# ---------------------------------------------------------------------------
# The peers' benchmark workload.
# ---------------------------------------------------------------------------


def _peers_reference(num_features, num_classes, num_clients=100):
    """The data loop of shared/peers/fedjax_fedavg.py, restated."""
    rng = np.random.default_rng(0)
    W_true = rng.normal(size=(num_features, num_classes)).astype(np.float32)
    data = []
    for _ in range(num_clients):
        n = int(rng.integers(20, 401))
        x = rng.random((n, num_features), dtype=np.float32)
        data.append({"x": x, "y": (x @ W_true).argmax(1).astype(np.int32)})
    return data


@pytest.mark.parametrize("num_features, num_classes", [(784, 62), (60, 10)])
def test_peer_benchmark_is_bit_identical_to_the_peers_loop(num_features, num_classes):
    """Training and test clients equal the peers' loop, bit for bit."""
    dataset = peer_benchmark(
        num_features=num_features, num_classes=num_classes, num_test_clients=7
    )
    # The test clients continue the same generator after the training ones.
    reference = _peers_reference(num_features, num_classes, num_clients=107)

    assert dataset.train.num_clients == 100
    assert dataset.test.num_clients == 7
    assert dataset.input_shape == (num_features,)
    assert dataset.num_classes == num_classes
    populations = [(dataset.train, reference[:100]), (dataset.test, reference[100:])]
    for population, clients in populations:
        for got, expected in zip(_numpy_clients(population), clients, strict=True):
            for name in ("x", "y"):
                assert got[name].dtype == expected[name].dtype
                np.testing.assert_array_equal(got[name], expected[name])
    # About 21k training examples, as the peers' README says.
    assert 18_000 < dataset.train.num_examples < 24_000


# ---------------------------------------------------------------------------
# Many small clients.
# ---------------------------------------------------------------------------


def test_many_clients_sizes_labels_and_memory():
    """Client sizes in range, labels in range, memory proportional to examples."""
    dataset = many_clients(
        num_clients=20_000, min_examples=2, max_examples=6, num_features=5
    )
    counts = np.asarray(dataset.train.counts)

    assert dataset.train.num_clients == 20_000
    assert dataset.test.num_clients == 1000
    assert counts.min() == 2 and counts.max() == 6
    assert abs(counts.mean() - 4.0) < 0.05
    labels = np.asarray(dataset.train.features["y"])
    assert labels.min() >= 0 and labels.max() < 10
    # Memory is the examples (5 float32 + 1 int32 each) plus two index arrays.
    examples = dataset.train.num_examples
    assert dataset.train.nbytes == examples * (5 * 4 + 4) + 2 * 20_000 * 4


def test_many_clients_label_skew_concentrates_client_labels():
    """A larger label skew gives clients fewer distinct labels."""

    def mean_distinct(label_skew):
        dataset = many_clients(
            num_clients=2000, min_examples=10, max_examples=10, label_skew=label_skew
        )
        labels = np.asarray(dataset.train.features["y"]).reshape(2000, 10)
        return np.mean([np.unique(row).size for row in labels])

    # Ten examples over ten classes: ~6 distinct when IID, ~1 when skewed.
    assert mean_distinct(0.0) > 4.0
    assert mean_distinct(10.0) < 2.0


# ---------------------------------------------------------------------------
# Registry.
# ---------------------------------------------------------------------------


def test_dataset_names():
    """The registry lists the documented names."""
    assert dataset_names() == [
        "cifar10",
        "cifar100",
        "emnist",
        "fashion-mnist",
        "femnist",
        "label-shift",
        "many-clients",
        "mnist",
        "peer-benchmark",
        "sent140",
        "shakespeare",
        "stackoverflow",
        "synthetic",
        "synthetic-iid",
    ]


def test_synthetic_defaults_to_synthetic_1_1_and_iid_to_the_iid_variant():
    """'synthetic' is Synthetic(1, 1); 'synthetic-iid' the IID variant."""
    assert dataset_options("synthetic")["alpha"] == 1.0
    assert dataset_options("synthetic")["beta"] == 1.0
    _assert_same_arrays(
        load_dataset("synthetic", num_clients=5),
        fedprox_synthetic(1.0, 1.0, num_clients=5),
    )
    _assert_same_arrays(
        load_dataset("synthetic-iid", num_clients=5),
        fedprox_synthetic(0.0, 0.0, num_clients=5, iid=True),
    )
    assert load_dataset("synthetic", num_clients=5).name == "synthetic(1,1)"
    assert load_dataset("synthetic-iid", num_clients=5).name == "synthetic-iid"


def test_registry_passes_options_through():
    """Options reach the generator."""
    peers = load_dataset("peer-benchmark", num_features=60, num_classes=10)
    assert peers.input_shape == (60,) and peers.num_classes == 10
    shift = load_dataset("label-shift", **SMALL_LABEL_SHIFT)
    assert shift.validation.num_clients == 20
    assert load_dataset("many-clients", num_clients=30).train.num_clients == 30


def test_unknown_dataset_names_the_valid_ones():
    """An unknown name is an error listing the valid names."""
    with pytest.raises(ValueError) as error:
        load_dataset("fmnist")
    message = str(error.value)
    assert "unknown dataset 'fmnist'" in message and "tfds:NAME" in message
    for name in dataset_names():
        assert name in message


@pytest.mark.parametrize(
    "name, options, message",
    [
        ("synthetic", {"gamma": 1.0}, "dataset 'synthetic' has no option 'gamma'"),
        ("synthetic-iid", {"alpha": 1.0}, "has no option 'alpha'.*set by the name"),
        (
            "synthetic",
            {"alpha": -1.0},
            r"dataset 'synthetic': alpha must be a finite number >= 0, got -1.0",
        ),
        ("synthetic", {"beta": float("nan")}, "beta must be a finite number >= 0, got nan"),
        ("synthetic", {"alpha": "1"}, "alpha must be a finite number >= 0, got '1'"),
        (
            "synthetic",
            {"num_clients": 0},
            "num_clients must be an integer >= 1, got 0",
        ),
        (
            "synthetic",
            {"train_fraction": 1.0},
            r"train_fraction must be a finite number in \(0, 1\), got 1.0",
        ),
        (
            "label-shift",
            {"num_train_clients": 2.5},
            "num_train_clients must be an integer >= 1, got 2.5",
        ),
        (
            "label-shift",
            {"test_concentration": 0.0},
            "test_concentration must be a finite number > 0, got 0.0",
        ),
        (
            "peer-benchmark",
            {"num_features": True},
            "num_features must be an integer >= 1, got True",
        ),
        (
            "peer-benchmark",
            {"min_examples": 30, "max_examples": 10},
            "max_examples must be an integer >= 30, got 10",
        ),
        ("many-clients", {"seed": -1}, "seed must be an integer >= 0, got -1"),
    ],
)
def test_invalid_options_name_the_option_and_the_allowed_range(name, options, message):
    """Bad options are errors naming the option and its allowed range."""
    with pytest.raises(ValueError, match=message):
        load_dataset(name, **options)
