"""Synthetic federated datasets, generated offline with NumPy, seeded.

Every generator returns a `FederatedDataset` whose populations are packed
`ClientPopulation`s with two features:

* `"x"`: `[E, D]` float32 inputs;
* `"y"`: `[E]` int32 class labels in `[0, num_classes)`.

All randomness comes from `numpy.random.Generator`s seeded by the arguments,
so the same arguments give bit-identical arrays on the same NumPy version.

Generators:

* `fedprox_synthetic`: FedProx Synthetic(alpha, beta) and Synthetic-IID
  (Li 2023, Section 3.4.1 and Appendix 3.7.1; the generator of the
  reference code, litian96/FedProx).
* `label_shift`: the make_classification label-shift dataset of Delta-FL
  (Pillutla et al. 2023, Appendix D.2).
* `peer_benchmark`: the FedAvg workload of the side-by-side speed comparison
  with fedjax, pfl and Flower (`benchmarks/compare_peers.py`), bit-identical
  to the clients the comparison's fedjax script draws.
* `many_clients`: up to millions of small clients for the population-scaling
  benchmark, generated without a per-client Python loop.

References:
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator

import numpy as np

from jaxfl.data.memory import check_memory
from jaxfl.data.population import ClientPopulation, FederatedDataset, pack_arrays, pack_clients
from jaxfl.validation import check_int, check_number

__all__ = [
    "fedprox_synthetic",
    "fedprox_synthetic_nbytes",
    "label_shift",
    "label_shift_nbytes",
    "many_clients",
    "many_clients_nbytes",
    "peer_benchmark",
    "peer_benchmark_nbytes",
]

# The largest number of examples a packed population can index with int32
# offsets (see `pack_arrays`); checked before generating, not after.
_MAX_EXAMPLES = np.iinfo(np.int32).max - 1


# Arguments are checked by `jaxfl.validation` (each message names the argument
# and its range, so that the registry and the CLI above it pass it through);
# memory before anything large is drawn.


def _check_fits(nbytes, what, hint):
    """Refuses, before generating, a dataset that would not fit in memory."""
    check_memory(nbytes, what, hint=hint)


# Memory estimates (bytes) of the generators, from their validated arguments:
# lower bounds of the arrays each builds (float64 draws, float32 features and
# int32 labels, the per-client lists and the packed copy), so that a refusal
# is never a false alarm. `_check_fits` compares them with the memory available
# before anything large is drawn.


def fedprox_synthetic_nbytes(num_clients, num_features, num_classes, total_examples=0, max_examples=0):
    """Memory of `fedprox_synthetic`: its per-client draws before the sizes are
    known, then (given `total_examples` and the largest client) its examples.
    """
    draws = num_clients * 8 * 4 + num_features * 8 + num_features * num_classes * 8 * 2
    # x float64 while drawn (and its permuted copy), then float32 in the
    # client lists and in the packed populations.
    examples = total_examples * (num_features * 4 + 4) * 2 + max_examples * num_features * 8 * 2
    return draws + examples


def label_shift_nbytes(
    num_train_clients, num_validation_clients, num_test_clients, examples_per_client, pool_size
):
    """Memory of `label_shift`: make_classification's float64 pool (with its
    temporaries, three copies) and the float32 one, then the populations.
    """
    pool = pool_size * _LABEL_SHIFT_NUM_FEATURES * (8 * 3 + 4) + pool_size * 8 * 3
    clients = num_train_clients + num_validation_clients + num_test_clients
    return pool + clients * examples_per_client * (_LABEL_SHIFT_NUM_FEATURES * 4 + 4) * 2


def peer_benchmark_nbytes(
    num_features, num_classes, num_clients, min_examples, max_examples, num_test_clients
):
    """Memory of `peer_benchmark`: W_true, then the clients (mean size
    (min + max) / 2) in lists and packed, and the largest client's logits.
    """
    weights = num_features * num_classes * (8 + 4)
    mean_size = (min_examples + max_examples) / 2
    clients = (num_clients + num_test_clients) * mean_size * (num_features * 4 + 4) * 2
    return int(weights + clients + max_examples * num_classes * 4)


def many_clients_nbytes(
    num_clients, min_examples, max_examples, num_features, num_classes, num_test_clients, storage
):
    """Memory of `many_clients`: sizes and per-client logit shifts of every
    client, then all examples ('memory') or one block of clients ('disk').
    """
    clients = num_clients + num_test_clients
    per_client = clients * 8 + num_clients * num_classes * 4 * 2
    mean_size = (min_examples + max_examples) / 2
    block = min(_CLIENT_BLOCK, num_clients) * mean_size * (num_features * 4 + num_classes * 4 * 2 + 4)
    if storage == "memory":
        examples = clients * mean_size * (num_features * 4 + 4) * 2
    else:
        examples = 0
    return int(num_features * num_classes * 4 + per_client + block + examples)


def _check_total_examples(total, what):
    if total > _MAX_EXAMPLES:
        raise ValueError(
            f"{what} would hold {total} examples; a population supports at "
            f"most {_MAX_EXAMPLES} (int32 offsets)"
        )


# ---------------------------------------------------------------------------
# FedProx Synthetic(alpha, beta) and Synthetic-IID.
# ---------------------------------------------------------------------------


def _fedprox_client_sizes(rng: np.random.Generator, num_clients: int, size_sigma: float) -> np.ndarray:
    """n_k = int(lognormal(4, size_sigma)) + 50: heavy-tailed sizes ("power law" in the thesis)."""
    client_sizes = rng.lognormal(4.0, size_sigma, num_clients)
    if not np.all(client_sizes < _MAX_EXAMPLES):  # Also NaN or inf: lognormal overflowed.
        raise ValueError(
            f"size_sigma={size_sigma:g} draws a client of more than {_MAX_EXAMPLES} examples "
            "(the most a population holds); lower size_sigma"
        )
    client_sizes = client_sizes.astype(np.int64)
    client_sizes += 50
    _check_total_examples(int(client_sizes.sum()), "Synthetic")
    return client_sizes


def _fedprox_description(iid, alpha, beta, num_clients, size_sigma, train_fraction, seed) -> tuple[str, str]:
    """The dataset's name and description."""
    held_out = "test clients are the training clients' held-out examples"
    if iid:
        return "synthetic-iid", (
            f"FedProx Synthetic-IID: {num_clients} clients, shared W and b, "
            f"v_k = 0, sizes int(lognormal(4, {size_sigma:g})) + 50, "
            f"train fraction {train_fraction:g}, seed {seed}; {held_out}"
        )
    return f"synthetic({alpha:g},{beta:g})", (
        f"FedProx Synthetic({alpha:g}, {beta:g}): {num_clients} clients, "
        f"sizes int(lognormal(4, {size_sigma:g})) + 50, train fraction "
        f"{train_fraction:g}, seed {seed}; {held_out}"
    )


def _fedprox_clients(rng, client_sizes, num_features, num_classes, iid, alpha, beta, train_fraction):
    """Every client's (training examples, test examples), in the generator's order of draws."""
    num_clients = client_sizes.size
    # sqrt of Sigma's diagonal: x = v_k + feature_scales * standard normal.
    feature_scales = np.arange(1, num_features + 1, dtype=np.float64) ** -0.6

    if iid:
        shared_weights = rng.normal(0.0, 1.0, (num_features, num_classes))
        shared_bias = rng.normal(0.0, 1.0, num_classes)
    else:
        model_means = rng.normal(0.0, alpha, num_clients)  # u_k
        feature_mean_centres = rng.normal(0.0, beta, num_clients)  # B_k

    train_clients, test_clients = [], []
    for k, size in enumerate(client_sizes):
        if iid:
            feature_mean = np.zeros(num_features)
            weights, bias = shared_weights, shared_bias
        else:
            feature_mean = rng.normal(feature_mean_centres[k], 1.0, num_features)
            weights = rng.normal(model_means[k], 1.0, (num_features, num_classes))
            bias = rng.normal(model_means[k], 1.0, num_classes)
        x = feature_mean + feature_scales * rng.standard_normal((size, num_features))
        y = np.argmax(x @ weights + bias, axis=1)
        order = rng.permutation(size)
        x, y = x[order].astype(np.float32), y[order].astype(np.int32)
        num_train = min(max(int(train_fraction * size), 1), size - 1)
        train_clients.append({"x": x[:num_train], "y": y[:num_train]})
        test_clients.append({"x": x[num_train:], "y": y[num_train:]})
    return train_clients, test_clients


def fedprox_synthetic(
    alpha: float,
    beta: float,
    *,
    num_clients: int = 100,
    num_features: int = 60,
    num_classes: int = 10,
    iid: bool = False,
    size_sigma: float = 2.0,
    train_fraction: float = 0.9,
    seed: int = 0,
) -> FederatedDataset:
    """FedProx Synthetic(alpha, beta), or Synthetic-IID with `iid=True`.

    The generator of FedProx (`litian96/FedProx:
    data/synthetic_*/generate_synthetic.py` and
    `data/synthetic_iid/generate_iid.py`; described in Li 2023, Section
    3.4.1 and Appendix 3.7.1). For client k:

        n_k = int(lognormal(4, size_sigma)) + 50
        u_k ~ N(0, alpha**2)      B_k ~ N(0, beta**2)
        W_k ~ N(u_k, 1)^(D x C)   b_k ~ N(u_k, 1)^C
        v_k ~ N(B_k, 1)^D
        x ~ N(v_k, Sigma),  Sigma = diag((j + 1)**-1.2), j = 0..D-1
        y = argmax(x @ W_k + b_k)    (= argmax of the softmax)

    alpha and beta are *standard deviations*, as in the reference code, which
    passes them as the scale of `numpy.random.normal` (the thesis writes
    N(0, alpha), which reads as a variance; the two agree for alpha, beta in
    {0, 1}). alpha controls how much the clients' models differ, beta how
    much their inputs differ.

    Synthetic-IID (`iid=True`): one global `W, b ~ N(0, 1)` shared by all
    clients and `v_k = 0`; alpha and beta are then ignored (pass 0, 0).

    Each client's examples are shuffled and split: the first
    `int(train_fraction * n_k)` go to the training population, the rest to
    the test population (the reference code uses 0.9; the thesis text says
    0.8: Li 2023, Appendix 3.7.2). The split is clamped so that every
    client keeps at least one training and one test example.

    The test population holds the *same clients* as the training population,
    in the same order: test client k is training client k's held-out
    examples, drawn from its own distribution. This is how FedProx, q-FFL and
    Ditto evaluate on this dataset; it is not a population of unseen clients.

    Reproducibility: the reference scripts set no seed, so their published
    JSON files cannot be regenerated; this generator is seeded by
    `numpy.random.default_rng(seed)` and matches them in distribution only.
    It samples x as `v_k + sqrt(diag(Sigma)) * N(0, 1)` (the same law as
    `multivariate_normal(v_k, Sigma)` for a diagonal Sigma, and faster).

    Args:
      alpha: standard deviation of the clients' model means u_k (>= 0).
      beta: standard deviation of the clients' feature-mean centres B_k
        (>= 0).
      num_clients: number of clients K (FedProx: 30; q-FFL and Ditto: 100).
      num_features: input dimension D.
      num_classes: number of classes C (>= 2).
      iid: Synthetic-IID instead of Synthetic(alpha, beta).
      size_sigma: sigma of the lognormal client sizes (FedProx: 2; the
        fair_flearn "hybrid" set uses 1; the thesis says only "power law").
      train_fraction: fraction of each client's examples used for training,
        in (0, 1).
      seed: seed of `numpy.random.default_rng`.

    Returns:
      A `FederatedDataset` named `synthetic(alpha,beta)` or `synthetic-iid`,
      with `input_shape == (num_features,)`.

    Raises:
      ValueError: an argument outside its range (the message names it).
    """
    num_clients = check_int("num_clients", num_clients, minimum=1)
    num_features = check_int("num_features", num_features, minimum=1)
    num_classes = check_int("num_classes", num_classes, minimum=2)
    size_sigma = check_number("size_sigma", size_sigma, low=0.0)
    train_fraction = check_number(
        "train_fraction",
        train_fraction,
        low=0.0,
        high=1.0,
        low_open=True,
        high_open=True,
    )
    seed = check_int("seed", seed, minimum=0)
    if not iid:
        alpha = check_number("alpha", alpha, low=0.0)
        beta = check_number("beta", beta, low=0.0)

    _check_fits(
        fedprox_synthetic_nbytes(num_clients, num_features, num_classes),
        f"num_clients={num_clients}, num_features={num_features}, num_classes={num_classes}",
        "lower them",
    )
    rng = np.random.default_rng(seed)
    client_sizes = _fedprox_client_sizes(rng, num_clients, size_sigma)
    _check_fits(
        fedprox_synthetic_nbytes(
            num_clients, num_features, num_classes, int(client_sizes.sum()), int(client_sizes.max())
        ),
        f"Synthetic of {int(client_sizes.sum())} examples of {num_features} features "
        f"(num_clients={num_clients}, size_sigma={size_sigma:g})",
        "lower num_clients, num_features or size_sigma",
    )

    train_clients, test_clients = _fedprox_clients(
        rng, client_sizes, num_features, num_classes, iid, alpha, beta, train_fraction
    )
    name, description = _fedprox_description(iid, alpha, beta, num_clients, size_sigma, train_fraction, seed)
    return FederatedDataset(
        personal_splits=True,
        name=name,
        train=pack_clients(train_clients),
        test=pack_clients(test_clients),
        num_classes=num_classes,
        input_shape=(num_features,),
        description=description,
    )


# ---------------------------------------------------------------------------
# Delta-FL label-shift dataset (make_classification + Dirichlet label mixes).
# ---------------------------------------------------------------------------

_LABEL_SHIFT_NUM_CLASSES = 10
_LABEL_SHIFT_NUM_FEATURES = 20


@functools.lru_cache(maxsize=2)
def _make_classification_pool(
    pool_size: int, data_seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """The example pool of Pillutla et al. 2023, Appendix D.2, as float32 x and int32 y.

    Cached in-process (read-only arrays) because the paper-size call is
    costly (5e5 examples) and sweeps load the dataset many times.
    """
    # Imported here: scikit-learn's import is slow and only this needs it.
    from sklearn.datasets import make_classification

    # Exactly the paper's call (Appendix D.2), n_samples and random_state
    # aside. make_classification draws from the legacy RandomState: the pool
    # is bit-stable only for a fixed scikit-learn version.
    x, y = make_classification(
        n_samples=pool_size,
        n_features=_LABEL_SHIFT_NUM_FEATURES,
        n_informative=15,
        n_redundant=2,
        n_repeated=0,
        n_classes=_LABEL_SHIFT_NUM_CLASSES,
        n_clusters_per_class=1,
        class_sep=5.0,
        hypercube=False,
        random_state=data_seed,
    )
    x = x.astype(np.float32)
    y = y.astype(np.int32)
    x.flags.writeable = False
    y.flags.writeable = False
    return x, y


def _draw_label_mixture_clients(
    rng: np.random.Generator,
    *,
    num_clients: int,
    examples_per_client: int,
    concentration: float,
    pool_labels: np.ndarray,
    class_rows: np.ndarray,
    class_starts: np.ndarray,
    class_cursor: np.ndarray,
    population: str,
) -> np.ndarray:
    """Pool rows of `num_clients` label-shifted clients, stored client-major.

    Client i draws q_i ~ Dirichlet(concentration * ones(C)) and class counts
    ~ Multinomial(examples_per_client, q_i); it takes that many examples of
    each class from the per-class pools, without replacement: class k's pool
    is `class_rows[class_starts[k]:class_starts[k + 1]]` (already shuffled)
    and `class_cursor[k]` (updated in place) is its first unused position, so
    no example goes to two clients. Each client's examples are then shuffled.

    Returns:
      `[num_clients * examples_per_client]` row indices into the pool.
    """
    num_classes = class_cursor.shape[0]
    label_mixes = rng.dirichlet(np.full(num_classes, concentration), num_clients)
    class_counts = rng.multinomial(examples_per_client, label_mixes)  # [M, C]

    demand = class_counts.sum(axis=0)
    available = np.diff(class_starts) - class_cursor
    short = np.flatnonzero(demand > available)
    if short.size:
        k = int(short[0])
        raise ValueError(
            f"the example pool ran out of class {k}: the {population} clients "
            f"need {int(demand[k])} examples of it but only {int(available[k])} "
            f"are left of a pool of {pool_labels.size}; "
            "raise pool_size or lower the number of clients or "
            "examples_per_client"
        )

    # Segment s = (client s // C, class s % C) takes class_counts.flat[s]
    # consecutive rows of its class pool, starting where the previous clients
    # stopped; all of it vectorized, with no loop over clients.
    start_in_class = np.cumsum(class_counts, axis=0) - class_counts
    segment_first = (class_starts[:-1] + class_cursor + start_in_class).ravel()
    segment_lengths = class_counts.ravel()
    segment_of_row = np.repeat(np.arange(segment_lengths.size), segment_lengths)
    row_in_segment = np.arange(segment_of_row.size) - np.repeat(
        np.cumsum(segment_lengths) - segment_lengths, segment_lengths
    )
    rows = class_rows[segment_first[segment_of_row] + row_in_segment]
    class_cursor += demand

    # Rows arrive grouped by class within each client; shuffle within clients.
    client_of_row = segment_of_row // num_classes
    order = np.lexsort((rng.random(rows.size), client_of_row))
    return rows[order]


def _label_shift_populations(
    pool_x: np.ndarray,
    pool_y: np.ndarray,
    partition_seed: int,
    examples_per_client: int,
    num_clients: dict[str, int],
    concentrations: dict[str, float],
) -> tuple[ClientPopulation, ClientPopulation | None, ClientPopulation]:
    """The training, validation (None without clients) and test clients, disjoint draws from the pool.

    Independent streams for the pool shuffle and each population
    (`SeedSequence(partition_seed).spawn(4)`), the training clients first.
    """
    pool_rng, *population_rngs = (
        np.random.default_rng(s) for s in np.random.SeedSequence(partition_seed).spawn(4)
    )
    # Shuffled per-class pools, concatenated in class order.
    shuffled = pool_rng.permutation(pool_y.size)
    class_rows = shuffled[np.argsort(pool_y[shuffled], kind="stable")]
    class_sizes = np.bincount(pool_y, minlength=_LABEL_SHIFT_NUM_CLASSES)
    class_starts = np.concatenate([[0], np.cumsum(class_sizes)])
    class_cursor = np.zeros(_LABEL_SHIFT_NUM_CLASSES, np.int64)
    populations = []
    for rng, role in zip(population_rngs, ("training", "validation", "test"), strict=True):
        if not num_clients[role]:
            populations.append(None)
            continue
        rows = _draw_label_mixture_clients(
            rng,
            num_clients=num_clients[role],
            examples_per_client=examples_per_client,
            concentration=concentrations[role],
            pool_labels=pool_y,
            class_rows=class_rows,
            class_starts=class_starts,
            class_cursor=class_cursor,
            population=role,
        )
        sizes = np.full(num_clients[role], examples_per_client)
        populations.append(pack_arrays({"x": pool_x[rows], "y": pool_y[rows]}, sizes))
    return tuple(populations)


def label_shift(
    *,
    num_train_clients: int = 2500,
    num_validation_clients: int = 500,
    num_test_clients: int = 500,
    examples_per_client: int = 100,
    train_concentration: float = 0.5,
    test_concentration: float = 0.01,
    pool_size: int = 500_000,
    data_seed: int = 2345,
    partition_seed: int = 0,
) -> FederatedDataset:
    """The label-shift dataset of Delta-FL (Pillutla et al. 2023, Appendix D.2).

    A pool of `pool_size` examples comes from scikit-learn's
    `make_classification` called exactly as in the paper (20 features of
    which 15 informative, 2 redundant, 3 noise; 10 classes, one Gaussian
    cluster each at the corners of a random polytope; class_sep 5;
    `random_state=data_seed`, 2345 in the paper; paper size 5e5). The
    class-conditional law x | y is therefore shared by all clients; only the
    label mix differs (label shift).

    Clients: `num_train_clients` training clients with label mix
    q_i ~ Dirichlet(train_concentration), validation and test clients with
    q_i ~ Dirichlet(test_concentration) (paper: 2500 / 500 / 500 clients,
    Dir(0.5) and Dir(0.01)). The paper does not say how examples are drawn
    from the pool; here, as the natural reading, each client draws class
    counts ~ Multinomial(examples_per_client, q_i) and takes its examples of
    each class without replacement from per-class pools, disjoint across
    all clients of all three populations. With the paper's settings
    training clients hold about 8.0 distinct classes on average and
    validation/test clients about 1.4.

    Randomness: the pool depends only on (pool_size, data_seed) and the
    partition only on partition_seed, through independent streams for the
    pool shuffle and for each population (`SeedSequence(partition_seed)
    .spawn(4)`); the training clients are drawn first, so they do not change
    when the numbers of validation or test clients do. The pool is cached
    in-process.

    Args:
      num_train_clients: training clients (>= 1).
      num_validation_clients: validation clients (>= 0; 0 gives no
        validation population).
      num_test_clients: test clients (>= 1).
      examples_per_client: examples of every client (>= 1).
      train_concentration: Dirichlet concentration of the training clients'
        label mixes (> 0).
      test_concentration: Dirichlet concentration of the validation and test
        clients' label mixes (> 0).
      pool_size: examples generated by make_classification (paper: 5e5;
        smaller pools make tests fast).
      data_seed: `random_state` of make_classification (paper: 2345).
      partition_seed: seed of the client partition.

    Returns:
      A `FederatedDataset` named `label-shift` with `input_shape == (20,)`,
      10 classes and a validation population (or None).

    Raises:
      ValueError: an argument outside its range, or a class pool that runs
        out of examples (the message says which and by how much).
    """
    num_train_clients = check_int("num_train_clients", num_train_clients, minimum=1)
    num_validation_clients = check_int(
        "num_validation_clients", num_validation_clients, minimum=0
    )
    num_test_clients = check_int("num_test_clients", num_test_clients, minimum=1)
    examples_per_client = check_int(
        "examples_per_client", examples_per_client, minimum=1
    )
    train_concentration = check_number(
        "train_concentration", train_concentration, low=0.0, low_open=True
    )
    test_concentration = check_number(
        "test_concentration", test_concentration, low=0.0, low_open=True
    )
    # make_classification needs at least one example per class.
    pool_size = check_int(
        "pool_size", pool_size, minimum=_LABEL_SHIFT_NUM_CLASSES, maximum=_MAX_EXAMPLES
    )
    data_seed = check_int("data_seed", data_seed, minimum=0)
    partition_seed = check_int("partition_seed", partition_seed, minimum=0)
    total_clients = num_train_clients + num_validation_clients + num_test_clients
    if total_clients * examples_per_client > pool_size:
        raise ValueError(
            f"pool_size={pool_size} is too small for {total_clients} clients x "
            f"{examples_per_client} examples; raise "
            "pool_size or lower the number of clients or examples_per_client"
        )

    _check_fits(
        label_shift_nbytes(
            num_train_clients, num_validation_clients, num_test_clients, examples_per_client, pool_size
        ),
        f"pool_size={pool_size}",
        "lower pool_size (it must hold the clients' examples) and the number of clients",
    )
    pool_x, pool_y = _make_classification_pool(pool_size, data_seed)
    train, validation, test = _label_shift_populations(
        pool_x,
        pool_y,
        partition_seed,
        examples_per_client,
        {"training": num_train_clients, "validation": num_validation_clients, "test": num_test_clients},
        {"training": train_concentration, "validation": test_concentration, "test": test_concentration},
    )
    return FederatedDataset(
        name="label-shift",
        train=train,
        test=test,
        validation=validation,
        num_classes=_LABEL_SHIFT_NUM_CLASSES,
        input_shape=(_LABEL_SHIFT_NUM_FEATURES,),
        description=(
            f"Delta-FL label shift (Pillutla et al. 2023, App. D.2): make_classification pool of "
            f"{pool_size} (random_state {data_seed}); {num_train_clients} "
            f"training clients Dir({train_concentration:g}), "
            f"{num_validation_clients} validation and {num_test_clients} test "
            f"clients Dir({test_concentration:g}); {examples_per_client} "
            f"examples each; partition seed {partition_seed}"
        ),
    )


# ---------------------------------------------------------------------------
# The FedAvg workload of the speed comparison with fedjax, pfl and Flower.
# ---------------------------------------------------------------------------


def _peer_clients(rng, true_weights, num_clients, min_examples, max_examples):
    """Clients drawn exactly as the comparison's fedjax script draws them."""
    num_features = true_weights.shape[0]
    clients = []
    for _ in range(num_clients):
        # Same calls, same order, same dtypes as that script's loop: for each
        # client its size, then its inputs, then labels from the float32
        # matmul. Changing any of these changes the bits.
        n = int(rng.integers(min_examples, max_examples + 1))
        x = rng.random((n, num_features), dtype=np.float32)
        clients.append({"x": x, "y": (x @ true_weights).argmax(1).astype(np.int32)})
    return clients


def peer_benchmark(
    *,
    num_features: int = 784,
    num_classes: int = 62,
    num_clients: int = 100,
    min_examples: int = 20,
    max_examples: int = 400,
    num_test_clients: int = 20,
    seed: int = 0,
) -> FederatedDataset:
    """The FedAvg workload of the side-by-side comparison with fedjax, pfl and Flower.

    The workload `benchmarks/compare_peers.py` runs in jaxfl and in the other
    simulators: `x ~ U[0, 1)^D` (float32), `y = argmax(x @ W_true)` with
    `W_true ~ N(0, 1)^(D x C)` (cast to float32), client sizes
    `n_i ~ integers(min_examples, max_examples + 1)` (there: 20..400, about
    21k examples over 100 clients). The draws follow the comparison's fedjax
    script call for call (`rng = default_rng(seed)`; `W_true` first; then for
    each client its size, then its inputs), so with the defaults (and its
    DIM/NCLS changed through num_features/num_classes) the training clients
    are bit-identical to the other simulators' clients, in the same order.
    The comparison's variants: 784 -> 62 (default) and 60 -> 10.

    The other simulators evaluate on training clients; for a test
    population this function continues the same generator after the
    training clients and draws `num_test_clients` fresh clients the same way
    (same W_true, same size law). These are new clients, not the training clients' held-out
    data, and drawing them leaves the training clients unchanged.

    Args:
      num_features: input dimension D (the comparison: 784, or 60).
      num_classes: number of classes C (the comparison: 62, or 10).
      num_clients: training clients (the comparison: 100).
      min_examples: smallest client size (the comparison: 20).
      max_examples: largest client size, inclusive (the comparison: 400).
      num_test_clients: test clients drawn after the training clients.
      seed: seed of `numpy.random.default_rng` (the comparison: 0).

    Returns:
      A `FederatedDataset` named `peer-benchmark` with
      `input_shape == (num_features,)`.

    Raises:
      ValueError: an argument outside its range (the message names it).
    """
    num_features = check_int("num_features", num_features, minimum=1)
    num_classes = check_int("num_classes", num_classes, minimum=2)
    num_clients = check_int("num_clients", num_clients, minimum=1)
    min_examples = check_int("min_examples", min_examples, minimum=1)
    max_examples = check_int("max_examples", max_examples, minimum=min_examples)
    num_test_clients = check_int("num_test_clients", num_test_clients, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    _check_total_examples(
        (num_clients + num_test_clients) * max_examples, "peer-benchmark"
    )
    _check_fits(
        peer_benchmark_nbytes(
            num_features, num_classes, num_clients, min_examples, max_examples, num_test_clients
        ),
        f"num_features={num_features}, num_classes={num_classes} and {num_clients + num_test_clients} "
        f"clients of {min_examples}-{max_examples} examples",
        "lower them",
    )

    rng = np.random.default_rng(seed)
    true_weights = rng.normal(size=(num_features, num_classes)).astype(np.float32)
    train = _peer_clients(rng, true_weights, num_clients, min_examples, max_examples)
    test = _peer_clients(
        rng, true_weights, num_test_clients, min_examples, max_examples
    )
    return FederatedDataset(
        name="peer-benchmark",
        train=pack_clients(train),
        test=pack_clients(test),
        num_classes=num_classes,
        input_shape=(num_features,),
        description=(
            "FedAvg workload of the comparison with fedjax, pfl and Flower: "
            f"{num_features} -> {num_classes}, "
            f"{num_clients} clients of {min_examples}-{max_examples} examples "
            f"(bit-identical to the comparison's), seed {seed}; "
            f"{num_test_clients} fresh test clients"
        ),
    )


# ---------------------------------------------------------------------------
# Many small clients, for population scaling.
# ---------------------------------------------------------------------------

# Clients generated together: bounds the temporaries (features and logits of
# about 5 * 2**18 examples) whatever the population size.
_CLIENT_BLOCK = 1 << 18


def _many_clients_blocks(
    rng, *, num_clients, min_examples, max_examples, true_weights, label_skew
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(counts, x, y) of consecutive blocks of clients, drawn in one fixed order.

    All sizes first, then all per-client logit shifts, then the features
    block by block: the draws are the same whatever the block size, so the
    in-memory and the on-disk populations are the same arrays.
    """
    num_classes = true_weights.shape[1]
    counts = rng.integers(min_examples, max_examples + 1, size=num_clients)
    _check_total_examples(int(counts.sum()), "many-clients")
    # A per-client shift of the logits gives each client its own label mix.
    client_logit_shift = (
        label_skew * rng.standard_normal((num_clients, num_classes), dtype=np.float32)
    ).astype(np.float32)
    for first in range(0, num_clients, _CLIENT_BLOCK):
        block = slice(first, min(first + _CLIENT_BLOCK, num_clients))
        block_counts = counts[block]
        rows = int(block_counts.sum())
        x = rng.standard_normal((rows, true_weights.shape[0]), dtype=np.float32)
        logits = x @ true_weights
        logits += np.repeat(client_logit_shift[block], block_counts, axis=0)
        yield block_counts, x, logits.argmax(axis=1).astype(np.int32)


def _many_clients_populations(
    seed, num_clients, num_test_clients, min_examples, max_examples, num_features, num_classes, label_skew
):
    """("train", its blocks), then ("test", its blocks), from one stream: consume each in turn."""
    rng = np.random.default_rng(seed)
    true_weights = rng.standard_normal((num_features, num_classes), dtype=np.float32) / np.float32(
        math.sqrt(num_features)
    )
    for name, n in (("train", num_clients), ("test", num_test_clients)):
        yield name, _many_clients_blocks(
            rng,
            num_clients=n,
            min_examples=min_examples,
            max_examples=max_examples,
            true_weights=true_weights,
            label_skew=label_skew,
        )


def _pack_blocks(blocks) -> ClientPopulation:
    """One population of every (counts, x, y) block."""
    blocks = list(blocks)
    return pack_arrays(
        {"x": np.concatenate([b[1] for b in blocks]), "y": np.concatenate([b[2] for b in blocks])},
        np.concatenate([b[0] for b in blocks]),
    )


def _write_blocks(writer, blocks) -> None:
    """Appends every (counts, x, y) block to a cache population, clients named by their index."""
    first = 0
    for counts, x, y in blocks:
        names = [str(i) for i in range(first, first + counts.size)]
        writer.add_block(names, counts, {"x": x, "y": y})
        first += counts.size


def many_clients(
    *,
    num_clients: int,
    min_examples: int = 1,
    max_examples: int = 10,
    num_features: int = 20,
    num_classes: int = 10,
    label_skew: float = 1.0,
    num_test_clients: int | None = None,
    seed: int = 0,
    storage: str = "memory",
) -> FederatedDataset:
    """A large population of small clients, for population-scaling runs.

    Client i holds `n_i ~ integers(min_examples, max_examples + 1)` examples
    with `x ~ N(0, I_D)` (float32) and labels from a shared linear teacher
    plus a client-specific shift of the logits:

        y = argmax(x @ W_true + s_i),  W_true ~ N(0, 1/D)^(D x C),
        s_i ~ N(0, label_skew**2)^C

    so clients differ in their label mix (label_skew = 0 makes them IID).
    Generation is vectorized NumPy (no per-client Python loop) and its memory
    is proportional to the number of examples: one million clients of 1-10
    examples take about a second and 0.5 GB of host memory (plus the device
    copy). Not from a paper: a workload for the population-scaling benchmark.

    The test population is `num_test_clients` new clients drawn the same way
    (default: min(num_clients, 1000)), after the training clients.

    With `storage='disk'` the clients are generated block by block into the
    on-disk cache (`jaxfl.data.cache`; host memory stays one block of 2**18
    clients) and come back memory-mapped (`HostPopulation`s), the same arrays
    as in memory: the population for runs larger than device memory (10^7
    clients of 1-9 examples: 4.2 GB on disk, benchmarks/out_of_core.py).

    Args:
      num_clients: training clients N (>= 1; up to millions).
      min_examples: smallest client size (>= 1).
      max_examples: largest client size, inclusive (>= min_examples).
      num_features: input dimension D.
      num_classes: number of classes C (>= 2).
      label_skew: standard deviation of the per-client logit shifts (>= 0).
      num_test_clients: test clients (>= 1), or None for
        min(num_clients, 1000).
      seed: seed of `numpy.random.default_rng`.
      storage: 'memory' (device-resident populations) or 'disk'
        (memory-mapped from the cache).

    Returns:
      A `FederatedDataset` named `many-clients` with
      `input_shape == (num_features,)`.

    Raises:
      ValueError: an argument outside its range (the message names it).
    """
    num_clients = check_int("num_clients", num_clients, minimum=1)
    min_examples = check_int("min_examples", min_examples, minimum=1)
    max_examples = check_int("max_examples", max_examples, minimum=min_examples)
    num_features = check_int("num_features", num_features, minimum=1)
    num_classes = check_int("num_classes", num_classes, minimum=2)
    label_skew = check_number("label_skew", label_skew, low=0.0)
    if num_test_clients is None:
        num_test_clients = min(num_clients, 1000)
    num_test_clients = check_int("num_test_clients", num_test_clients, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    if storage not in ("memory", "disk"):
        raise ValueError(f"storage must be 'memory' or 'disk', got {storage!r}")
    _check_total_examples(num_clients * min_examples, "many-clients")
    _check_fits(
        many_clients_nbytes(
            num_clients, min_examples, max_examples, num_features, num_classes, num_test_clients, storage
        ),
        f"{num_clients} clients of {min_examples}-{max_examples} examples, num_features={num_features}, "
        f"num_classes={num_classes} (storage={storage})",
        "lower them" + ("" if storage == "disk" else ", or storage=disk"),
    )
    description = (
        f"many clients: {num_clients} clients of {min_examples}-"
        f"{max_examples} examples, {num_features} -> {num_classes} linear "
        f"teacher, label skew {label_skew:g}, seed {seed}; "
        f"{num_test_clients} fresh test clients"
    )

    def generate():
        return _many_clients_populations(
            seed, num_clients, num_test_clients, min_examples, max_examples, num_features, num_classes,
            label_skew,
        )  # fmt: skip

    if storage == "memory":
        populations = {name: _pack_blocks(blocks) for name, blocks in generate()}
    else:
        from jaxfl.data.cache import cached_dataset

        def build(builder):
            for name, blocks in generate():
                _write_blocks(builder.population(name), blocks)
            return {"num_classes": num_classes, "input_shape": [num_features], "description": description}

        options = dict(num_clients=num_clients, min_examples=min_examples, max_examples=max_examples,
                       num_features=num_features, num_classes=num_classes, label_skew=label_skew,
                       num_test_clients=num_test_clients, seed=seed, generator=1)
        _, populations = cached_dataset("many-clients", options, build)
    return FederatedDataset(
        name="many-clients",
        train=populations["train"],
        test=populations["test"],
        num_classes=num_classes,
        input_shape=(num_features,),
        description=description,
    )
