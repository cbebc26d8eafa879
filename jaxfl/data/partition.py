"""Partitioning a centralized labelled dataset over N clients, seeded, in NumPy.

Each partitioner takes the labels of a centralized dataset (or just its size)
and returns a list of N index arrays: client i's examples, as `int64` indices
into the dataset, in a seeded random order within the client. Use them on any
labelled array data, e.g.

    parts = partition("dirichlet", y_train, 100, alpha=0.3, seed=0)
    clients = [{"x": x_train[rows], "y": y_train[rows]} for rows in parts]
    population = jaxfl.data.pack_clients(clients)

Partitioners (`PARTITIONERS`, by name for `partition`):

* `iid`: a random permutation cut into near-equal parts.
* `dirichlet`: per-class split across clients, "hetero-dir" (Yurochkin et
  al. 2019; NIID-Bench `noniid-labeldir`, FedLab `hetero_dir_partition`,
  Flower `DirichletPartitioner`). Unequal client sizes; covers every example.
* `dirichlet-mixture`: per-client class mixture q_i ~ Dir (Hsu et al. 2019;
  FedLab `client_inner_dirichlet_partition`; the label-shift data of Delta-FL,
  `jaxfl.data.synthetic.label_shift`). Client sizes are given.
* `shards`: sort by label, cut into shards, deal shards (McMahan et al. 2017).
* `lognormal`: IID labels with log-normal client sizes (FedLab
  `lognormal_unbalance_split`).

Helpers: `split_each_client` (a held-out fraction of every client, for a test
population of the same clients), `lognormal_client_sizes` (client sizes for
`dirichlet_mixture`), and `partition_statistics` (sizes, classes per client,
label skew).

Randomness comes only from `np.random.default_rng(seed)`, never from the
global `np.random`: the same arguments give identical partitions on the same
NumPy version. The upstream codes (NIID-Bench, FedLab) draw from the global
`np.random` in their own order of calls; their partitions have the same law
as these but cannot be reproduced bit for bit, and no attempt is made to.

Each partitioner's docstring names the procedure it follows and its source.

References:
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
  [Yurochkin et al. 2019] Bayesian Nonparametric Federated Learning of Neural Networks. ICML 2019.
  [Hsu et al. 2019] T.-M. H. Hsu, H. Qi, M. Brown. Measuring the Effects of
    Non-Identical Data Distribution for Federated Visual Classification.
    arXiv preprint, 2019.
  [McMahan et al. 2017] H. B. McMahan, E. Moore, D. Ramage, S. Hampson,
    B. Agüera y Arcas. Communication-Efficient Learning of Deep Networks
    from Decentralized Data. AISTATS 2017.
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxfl.validation import check_fraction, check_int, check_number

__all__ = [
    "PARTITIONERS",
    "dirichlet",
    "dirichlet_mixture",
    "iid",
    "lognormal_client_sizes",
    "lognormal_sizes",
    "partition",
    "partition_statistics",
    "shards",
    "split_each_client",
]

# Lookahead of `_serve_with_redraws`: clients checked at once for an exhausted
# class before falling back to a per-client step.
_SERVE_BLOCK = 1024


# ---------------------------------------------------------------------------
# Argument checks: one-line ValueErrors naming the argument and its range.
# ---------------------------------------------------------------------------


def _as_array(name, value, expected):
    """`np.asarray(value)`, with NumPy's complaint about ragged or odd input replaced by one naming `name`."""
    try:
        return np.asarray(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be {expected}, got {type(value).__name__} {value!r:.60}") from None


def _check_labels(labels, name="labels"):
    """Returns the labels as a 1-D int64 array of non-negative class ids."""
    array = _as_array(name, labels, "a 1-D array of integer class ids >= 0")
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of integer class ids >= 0, got shape {array.shape}")
    if array.size == 0:
        raise ValueError(f"{name} must hold at least one example, got an empty array")
    if array.dtype.kind not in "iu":
        raise ValueError(f"{name} must be a 1-D array of integer class ids >= 0, got dtype {array.dtype}")
    if array.min() < 0:
        raise ValueError(f"{name} must be integer class ids >= 0, got {array.min()}")
    return array.astype(np.int64, copy=False)


def _check_num_clients(num_clients, num_examples):
    return check_int(
        "num_clients", num_clients, minimum=1, maximum=num_examples, note=" (the number of examples)"
    )


def _check_sizes(num_examples, num_clients):
    """(E, N) as ints with E >= 1 and N in [1, E]."""
    num_examples = check_int("num_examples", num_examples, minimum=1)
    return num_examples, _check_num_clients(num_clients, num_examples)


def _seeded_rng(seed) -> np.random.Generator:
    return np.random.default_rng(check_int("seed", seed, minimum=0))


def _check_per_client(name, value, minimum, num_examples, num_clients, why=""):
    """`value` as an int in [minimum, E // N]: a per-client count that every client can have at once."""
    return check_int(
        name,
        value,
        minimum=minimum,
        maximum=num_examples // num_clients,
        note=f" (examples // num_clients = {num_examples} // {num_clients}{why})",
    )


def _check_rng(rng):
    """A Generator as is, or a non-negative int seed made into one (never None)."""
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, numbers.Integral) and not isinstance(rng, bool | np.bool_) and rng >= 0:
        return np.random.default_rng(int(rng))
    raise ValueError(f"rng must be a numpy.random.Generator or an integer seed >= 0, got {rng!r}")


# ---------------------------------------------------------------------------
# Shared vectorized steps.
# ---------------------------------------------------------------------------


def _small_uint(bound):
    """The narrowest dtype for integers in [0, bound): NumPy's stable sort is a radix sort up to 16 bits."""
    if bound <= 2**8:
        return np.uint8
    if bound <= 2**16:
        return np.uint16
    return np.int64


def _class_pools(rng, labels, num_classes):
    """Example indices grouped by class (class 0 first), in random order within each class.

    One permutation, then a stable sort by label: the ties (examples of one
    class) keep the permutation's random order.

    Returns:
      (pool, class_sizes): `[E]` indices, and `[num_classes]` counts, so class
      k's examples are `pool[start_k:start_k + class_sizes[k]]`.
    """
    shuffled = rng.permutation(labels.size)
    order = np.argsort(labels[shuffled].astype(_small_uint(num_classes)), kind="stable")
    return shuffled[order], np.bincount(labels, minlength=num_classes)


def _split(rows, sizes):
    """`rows` cut into consecutive parts of the given sizes, as a list of int64 arrays."""
    return np.split(rows.astype(np.int64, copy=False), np.cumsum(sizes)[:-1])


def _group_shuffled(rng, rows, owner, num_clients):
    """Client i's rows (those with `owner == i`), for every client, each in random order.

    One permutation of all rows, then a stable sort by owner: within a
    client, the rows keep the permutation's random order.
    """
    shuffled = rng.permutation(rows.size)
    order = np.argsort(owner[shuffled].astype(_small_uint(num_clients)), kind="stable")
    return _split(rows[shuffled[order]], np.bincount(owner, minlength=num_clients))


def _segment_owners(counts, owners):
    """Owner of every row when segment s of `counts.ravel()` belongs to `owners[s]`."""
    return np.repeat(owners, counts.ravel())


# ---------------------------------------------------------------------------
# IID.
# ---------------------------------------------------------------------------


def iid(num_examples: int, num_clients: int, *, seed: int) -> list[np.ndarray]:
    """IID partition: a random permutation cut into near-equal parts.

    Procedure::

        perm = rng.permutation(E)
        client i gets the i-th of N consecutive pieces of perm; the first
        E mod N clients hold floor(E / N) + 1 examples, the others floor(E / N)

    Args:
      num_examples: E, the number of examples (>= 1).
      num_clients: N, in [1, E].
      seed: seed of `np.random.default_rng` (>= 0).

    Returns:
      N int64 index arrays, disjoint and covering `range(E)`, each in random
      order.

    Raises:
      ValueError: an argument outside its range.
    """
    num_examples, num_clients = _check_sizes(num_examples, num_clients)
    rng = _seeded_rng(seed)
    return [
        part.astype(np.int64, copy=False)
        for part in np.array_split(rng.permutation(num_examples), num_clients)
    ]


# ---------------------------------------------------------------------------
# Per-class Dirichlet split ("hetero-dir").
# ---------------------------------------------------------------------------


def _hetero_dir_counts(proportions, class_sizes, num_examples, balance):
    """Examples of each class per client, `[K', N]`, from the per-class proportions `[K', N]`.

    The class's examples are cut at floor(cumsum(p) * n_k), as upstream does
    with `np.split`: client j gets the j-th piece.
    """
    num_present, num_clients = proportions.shape
    if not balance:
        cuts = np.floor(np.cumsum(proportions, axis=1) * class_sizes[:, None]).astype(np.int64)
        # The last cut is the class size itself (upstream drops cumsum's last entry for this reason);
        # clipping guards against a cumulative sum that rounds above 1.
        cuts = np.minimum(cuts, class_sizes[:, None])
        cuts[:, -1] = class_sizes
        return np.diff(cuts, axis=1, prepend=0)
    counts = np.zeros((num_present, num_clients), np.int64)
    client_sizes = np.zeros(num_clients, np.int64)
    # Classes are dealt in order and each sees the client sizes left by the previous ones.
    for r in range(num_present):
        open_clients = client_sizes < num_examples / num_clients
        p = proportions[r] * open_clients
        total = p.sum()
        if total <= 0.0:
            # All the mass sat on full clients (possible only when tiny alpha makes p one-hot in
            # floating point): share the class equally among the open clients instead of dividing by 0.
            p = open_clients.astype(np.float64)
            total = p.sum()
        cuts = np.minimum(np.floor(np.cumsum(p / total) * class_sizes[r]).astype(np.int64), class_sizes[r])
        cuts[-1] = class_sizes[r]
        counts[r] = np.diff(cuts, prepend=0)
        client_sizes += counts[r]
    return counts


def dirichlet(
    labels: np.ndarray | Sequence[int],
    num_clients: int,
    *,
    alpha: float,
    min_size: int = 10,
    balance: bool = False,
    seed: int,
    max_attempts: int = 100,
) -> list[np.ndarray]:
    """Per-class Dirichlet split across clients ("hetero-dir", label-distribution skew).

    Every class is divided among the N clients by its own Dirichlet draw, so
    clients differ both in their label mix and in their size; smaller alpha
    gives fewer classes per client. This is the NIID-Bench `noniid-labeldir`
    partition (Yurochkin et al. 2019; Li et al. 2022).

    Procedure (E examples, classes k = 0, 1, ... in increasing order, only the
    classes present in `labels`)::

        repeat up to max_attempts times:
            sizes = zeros(N)
            for each class k with n_k examples:
                p ~ Dir_N(alpha, ..., alpha)
                if balance:                      # NIID-Bench always does this
                    p_j <- p_j * [sizes_j < E / N];  p <- p / sum(p)
                cut = floor(cumsum(p) * n_k);  cut_N = n_k
                client j gets cut_j - cut_{j-1} examples of class k
                sizes += those counts
            if min(sizes) >= min_size: stop
        else: raise ValueError
        client j's examples of class k: its slice of class k's examples,
        shuffled; each client's indices are then shuffled

    The Dirichlet vectors of an attempt (one per class) are drawn at once,
    before the balancing (which only rescales them), and the examples are
    drawn once the counts are accepted: the same law as upstream, in a
    different order of random calls. If balancing leaves no mass on the open
    clients (tiny alpha), the class is shared equally among the open clients.

    References: M. Yurochkin et al., "Bayesian Nonparametric Federated
    Learning of Neural Networks", ICML 2019; Q. Li, Y. Diao, Q. Chen, B. He,
    "Federated Learning on Non-IID Data Silos: An Experimental Study", ICDE
    2022, code `Xtra-Computing/NIID-Bench` (`utils.py`, `partition_data`,
    `noniid-labeldir`, min size 10, always balanced); also
    `SMILELab-FL/FedLab` (`fedlab/utils/dataset/functional.py`,
    `hetero_dir_partition`) and `adap/flower` (`flwr_datasets` partitioner
    `DirichletPartitioner`, balancing optional, an error after 10 retries).
    NIID-Bench and FedLab use the global `np.random` and cannot be
    bit-matched.

    Args:
      labels: `[E]` integer class ids >= 0.
      num_clients: N, in [1, E].
      alpha: the Dirichlet concentration of every client, finite and > 0.
        For 60000 examples of 10 balanced classes over 100 clients, 0.1
        gives about 5 distinct classes per client on average, with ~87% of
        a client's examples in its top two; 1 gives ~9.9 classes and 10 all
        10, close to IID.
      min_size: the fewest examples any client may hold, in [0, E // N].
      balance: whether a class skips the clients already holding >= E / N
        examples (NIID-Bench's behaviour; fewer huge clients, more sparse
        late classes).
      seed: seed of `np.random.default_rng` (>= 0).
      max_attempts: draws of the whole partition before giving up (>= 1).

    Returns:
      N int64 index arrays, disjoint and covering `range(E)`, each in random
      order.

    Raises:
      ValueError: an argument outside its range, or no partition meeting
        `min_size` in `max_attempts` draws.
    """
    labels = _check_labels(labels)
    num_examples = labels.size
    num_clients = _check_num_clients(num_clients, num_examples)
    alpha = check_number("alpha", alpha, low=0.0, low_open=True)
    min_size = _check_per_client("min_size", min_size, 0, num_examples, num_clients)
    if not isinstance(balance, bool | np.bool_):
        raise ValueError(f"balance must be True or False, got {balance!r}")
    max_attempts = check_int("max_attempts", max_attempts, minimum=1)
    rng = _seeded_rng(seed)

    num_classes = int(labels.max()) + 1
    class_sizes = np.bincount(labels, minlength=num_classes)
    present = np.flatnonzero(class_sizes)
    concentration = np.full(num_clients, alpha)
    for _ in range(max_attempts):
        proportions = rng.dirichlet(concentration, size=present.size)
        counts = _hetero_dir_counts(proportions, class_sizes[present], num_examples, bool(balance))
        if counts.sum(axis=0).min() >= min_size:
            break
    else:
        raise ValueError(
            f"dirichlet: no partition gave every one of {num_clients} clients >= {min_size} examples "
            f"in {max_attempts} attempts (alpha={alpha:g}, {num_examples} examples); "
            "lower min_size, raise alpha, use fewer clients, or raise max_attempts"
        )
    pool, _ = _class_pools(rng, labels, num_classes)
    # The pool lists the classes in order, each class's examples cut into the clients' segments in
    # client order: exactly the layout of `counts` read row by row.
    owner = _segment_owners(counts, np.tile(np.arange(num_clients), present.size))
    return _group_shuffled(rng, pool, owner, num_clients)


# ---------------------------------------------------------------------------
# Per-client Dirichlet class mixture (Hsu et al. 2019).
# ---------------------------------------------------------------------------


def _check_client_sizes(client_sizes, num_clients, num_examples):
    if isinstance(client_sizes, numbers.Integral) and not isinstance(client_sizes, bool | np.bool_):
        sizes = np.full(num_clients, int(client_sizes), np.int64)
    else:
        sizes = _as_array("client_sizes", client_sizes, f"an integer or {num_clients} integers")
        if sizes.ndim != 1 or sizes.size != num_clients or sizes.dtype.kind not in "iu":
            raise ValueError(
                f"client_sizes must be an integer or {num_clients} integers (one per client), "
                f"got {np.shape(client_sizes)} of dtype {sizes.dtype}"
            )
        sizes = sizes.astype(np.int64)
    if sizes.min() < 0:
        raise ValueError(f"client_sizes must be >= 0, got {sizes.min()}")
    if sizes.sum() > num_examples:
        raise ValueError(
            f"client_sizes sum to {sizes.sum()} but labels hold only {num_examples} examples; "
            "lower client_sizes or use fewer clients"
        )
    return sizes


def _check_prior(prior, labels, class_sizes):
    """The class prior as a probability vector over K >= labels.max() + 1 classes."""
    if prior is None or (isinstance(prior, str) and prior == "empirical"):
        return class_sizes / labels.size
    if isinstance(prior, str) and prior == "uniform":
        return np.full(class_sizes.size, 1.0 / class_sizes.size)
    if isinstance(prior, str):
        raise ValueError(f"prior must be None, 'empirical', 'uniform' or an array of weights, got {prior!r}")
    weights = _as_array("prior", prior, "a 1-D array of class weights")
    if (
        weights.ndim != 1
        or weights.size < class_sizes.size
        or weights.dtype.kind not in "iuf"
        or not np.all(np.isfinite(weights))
        or weights.min() < 0
        or weights.sum() <= 0
    ):
        raise ValueError(
            f"prior must be a 1-D array of >= {class_sizes.size} (labels.max() + 1) finite weights >= 0 "
            f"with a positive sum, got shape {weights.shape}: {prior!r:.60}"
        )
    return weights.astype(np.float64) / weights.sum()


def _serve_with_redraws(rng, counts, mixtures, sizes, available):
    """Class counts `[N, K]` taken by the clients in the given (serving) order.

    Client j asks for `counts[j]`; where a class holds fewer examples than
    asked, the client takes what is left and redraws the shortfall from
    Multinomial(shortfall, mixtures[j] restricted to the classes still
    holding examples, renormalized) (or, if its mixture puts no mass there,
    in proportion to what those classes still hold), until it is full.

    Vectorized over blocks of clients that exhaust no class; only a client that
    meets an exhausted class takes a Python step.
    """
    num_clients = counts.shape[0]
    taken = counts.copy()
    remaining = available.astype(np.int64).copy()
    start = 0
    while start < num_clients:
        block = counts[start : start + _SERVE_BLOCK]
        cumulative = np.cumsum(block, axis=0)
        short = (cumulative > remaining).any(axis=1)
        if not short.any():
            remaining -= cumulative[-1]
            start += block.shape[0]
            continue
        first = int(np.argmax(short))
        if first:
            remaining -= cumulative[first - 1]
        j = start + first
        take = np.minimum(counts[j], remaining)
        remaining -= take
        deficit = int(sizes[j] - take.sum())
        # Each pass either fills the client or exhausts at least one more class, so at most K passes;
        # it always ends because the sizes were checked to fit the data.
        while deficit > 0:
            weights = mixtures[j] * (remaining > 0)
            total = weights.sum()
            if total <= 0.0:
                weights = remaining.astype(np.float64)
                total = weights.sum()
            extra = np.minimum(rng.multinomial(deficit, weights / total), remaining)
            take += extra
            remaining -= extra
            deficit -= int(extra.sum())
        taken[j] = take
        start = j + 1
    return taken


def dirichlet_mixture(
    labels: np.ndarray | Sequence[int],
    num_clients: int,
    *,
    alpha: float,
    client_sizes: int | Sequence[int] | np.ndarray,
    prior: str | Sequence[float] | np.ndarray | None = None,
    seed: int,
) -> list[np.ndarray]:
    """Per-client Dirichlet class mixture (Hsu et al. 2019): label skew at given client sizes.

    Each client has its own label distribution q_i drawn around a class
    prior, and draws its examples from it without replacement. Unlike
    `dirichlet`, the client sizes are set by the caller and alpha alone sets
    the label skew; the partition need not cover the data.

    Procedure (K = number of prior entries, n_i = client_sizes[i])::

        c = alpha * K * prior                   # alpha per class under a uniform prior
        q_i ~ Dir(c)  for every client i        # classes with c_k = 0 get q_ik = 0
        m_i ~ Multinomial(n_i, q_i)             # class counts asked for
        shuffle every class's examples into a pool
        serve the clients in a random order; client i takes m_ik examples
        of class k from the front of pool k; where pool k holds fewer, it
        takes what is left and redraws the shortfall from
        Multinomial(shortfall, q_i restricted to the classes still holding
        examples, renormalized), repeating until it holds n_i examples; if q_i
        has no mass left on those classes, the shortfall is drawn in
        proportion to what they still hold
        shuffle each client's examples

    The redraw is upstream's rule (FedLab: draw a class from q_i again while
    the drawn class is exhausted) applied to a client's whole shortfall at
    once rather than example by example, and with clients served one after
    another rather than interleaved; the random serving order spreads the
    distortion near exhaustion over random clients instead of the last ones.
    With a uniform prior and while no class runs out, this has the law of
    `jaxfl.data.synthetic.label_shift`'s clients (Delta-FL, Pillutla et al.
    2023, Appendix D.2), though not its random bits.

    On alpha: Hsu et al. write q ~ Dir(alpha' p) with p a probability vector,
    so their alpha' is the total concentration; here alpha is the mean
    per-class concentration (alpha' = alpha * K), which is the convention of
    `dirichlet`, FedLab's `client_inner_dirichlet_partition` and Delta-FL's
    Dir(0.5) / Dir(0.01) under a uniform prior.

    References: T.-M. H. Hsu, H. Qi, M. Brown, "Measuring the Effects of
    Non-Identical Data Distribution for Federated Visual Classification",
    arXiv:1909.06335, 2019; `SMILELab-FL/FedLab`
    (`fedlab/utils/dataset/functional.py`, `client_inner_dirichlet_partition`,
    which uses the global `np.random` and cannot be bit-matched).

    Args:
      labels: `[E]` integer class ids >= 0.
      num_clients: N >= 1.
      alpha: mean per-class concentration, finite and > 0 (small: one or two
        classes per client; large: every client near the prior).
      client_sizes: examples of each client: one integer for all, or N
        integers, each >= 0, summing to at most E (e.g. from
        `lognormal_client_sizes`).
      prior: the class prior p: None or 'empirical' (default: the class
        frequencies of `labels`, so that the clients on average follow the
        data and the pools run out evenly), 'uniform' (over classes 0 ..
        labels.max()), or >= labels.max() + 1 non-negative weights
        (normalized; classes beyond labels.max() have no examples and are
        redrawn as exhausted).
      seed: seed of `np.random.default_rng` (>= 0).

    Returns:
      N int64 index arrays, pairwise disjoint, client i's of size
      client_sizes[i], each in random order.

    Raises:
      ValueError: an argument outside its range, or client sizes that sum to
        more than the data holds.
    """
    labels = _check_labels(labels)
    num_examples = labels.size
    num_clients = check_int("num_clients", num_clients, minimum=1)
    alpha = check_number("alpha", alpha, low=0.0, low_open=True)
    sizes = _check_client_sizes(client_sizes, num_clients, num_examples)
    class_sizes = np.bincount(labels)
    prior = _check_prior(prior, labels, class_sizes)
    num_classes = prior.size
    class_sizes = np.bincount(labels, minlength=num_classes)
    rng = _seeded_rng(seed)

    concentration = alpha * num_classes * prior
    support = np.flatnonzero(concentration > 0)
    mixtures = np.zeros((num_clients, num_classes))
    mixtures[:, support] = rng.dirichlet(concentration[support], size=num_clients)
    asked = rng.multinomial(sizes, mixtures)
    serving = rng.permutation(num_clients)
    taken = _serve_with_redraws(rng, asked[serving], mixtures[serving], sizes[serving], class_sizes)

    pool, _ = _class_pools(rng, labels, num_classes)
    # Class k's pool is consumed from its front, client by client in serving order.
    used = taken.sum(axis=0)
    class_starts = np.cumsum(class_sizes) - class_sizes
    used_starts = np.cumsum(used) - used
    positions = np.repeat(class_starts - used_starts, used) + np.arange(used.sum())
    owner = _segment_owners(taken.T, np.tile(serving, num_classes))
    return _group_shuffled(rng, pool[positions], owner, num_clients)


# ---------------------------------------------------------------------------
# Shards (McMahan et al. 2017).
# ---------------------------------------------------------------------------


def shards(
    labels: np.ndarray | Sequence[int], num_clients: int, *, shards_per_client: int = 2, seed: int
) -> list[np.ndarray]:
    """Pathological non-IID shards of FedAvg (McMahan et al. 2017).

    Procedure (E examples, S = num_clients * shards_per_client shards)::

        order = indices sorted by label (stable; random order within a class)
        cut order into S consecutive shards of floor(E / S) or floor(E / S) + 1
            examples: the first E mod S shards are one longer, so nothing is
            dropped when S does not divide E
        perm = rng.permutation(S)
        client i gets shards perm[i * spc : (i + 1) * spc]
        shuffle each client's examples

    A shard holds one class unless it straddles a class boundary; a client
    therefore holds at most 2 * shards_per_client classes when every class has
    at least a shard's worth of examples, and at most shards_per_client when
    S divides E and every class size is a multiple of the shard size E / S. MNIST in the paper: 60000
    examples, 100 clients, 2 shards of 300.

    References: H. B. McMahan et al., "Communication-Efficient Learning of
    Deep Networks from Decentralized Data", AISTATS 2017; FedLab
    `shards_partition` (`SMILELab-FL/FedLab`, which drops the remainder
    instead, and uses the global `np.random`: not bit-matched).

    Args:
      labels: `[E]` integer class ids >= 0.
      num_clients: N, in [1, E]; N * shards_per_client must be <= E.
      shards_per_client: shards dealt to each client, in [1, E // N].
      seed: seed of `np.random.default_rng` (>= 0).

    Returns:
      N int64 index arrays, disjoint and covering `range(E)`, each in random
      order.

    Raises:
      ValueError: an argument outside its range, N * shards_per_client > E
        included.
    """
    labels = _check_labels(labels)
    num_examples = labels.size
    num_clients = _check_num_clients(num_clients, num_examples)
    shards_per_client = _check_per_client(
        "shards_per_client", shards_per_client, 1, num_examples, num_clients, ", so no shard is empty"
    )
    rng = _seeded_rng(seed)
    num_shards = num_clients * shards_per_client
    pool, _ = _class_pools(rng, labels, int(labels.max()) + 1)
    shard_sizes = np.full(num_shards, num_examples // num_shards, np.int64)
    shard_sizes[: num_examples % num_shards] += 1
    dealt = rng.permutation(num_shards)
    shard_owner = np.empty(num_shards, np.int64)
    shard_owner[dealt] = np.repeat(np.arange(num_clients), shards_per_client)
    return _group_shuffled(rng, pool, np.repeat(shard_owner, shard_sizes), num_clients)


# ---------------------------------------------------------------------------
# Log-normal client sizes.
# ---------------------------------------------------------------------------


def lognormal_client_sizes(
    total: int,
    num_clients: int,
    sigma: float,
    rng: np.random.Generator | int,
    min_size: int = 1,
) -> np.ndarray:
    """Client sizes proportional to log-normal draws, summing exactly to `total`.

    Procedure::

        w_i ~ LogNormal(0, sigma)               # sigma = 0: all w_i = 1
        s_i = max(min_size, c * w_i), with c > 0 such that sum_i s_i = total
              (water-filling: clients below the floor are set to it and the
              rest rescaled, until none is below)
        sizes = floor(s); the total - sum(floor(s)) clients with the largest
              fractional parts (ties: lowest index) get one more

    So sizes are proportional to the draws except for clients raised to
    `min_size`, sigma = 0 gives sizes differing by at most one, and a larger
    sigma gives a larger spread (coefficient of variation about
    sqrt(exp(sigma^2) - 1) for many clients). FedLab's
    `lognormal_unbalance_split` scales the same draws (its mean,
    log(total / N), cancels in the normalization), truncates, and moves the
    rounding error to one client, with no floor.

    Args:
      total: examples to distribute, >= num_clients * min_size.
      num_clients: N >= 1.
      sigma: standard deviation of log-sizes, finite and >= 0.
      rng: a `np.random.Generator` (advanced in place) or an integer seed.
      min_size: the fewest examples of any client (>= 0).

    Returns:
      `[N]` int64 sizes, each >= min_size, summing to `total`.

    Raises:
      ValueError: an argument outside its range.
    """
    num_clients = check_int("num_clients", num_clients, minimum=1)
    min_size = check_int("min_size", min_size, minimum=0)
    total = check_int(
        "total",
        total,
        minimum=num_clients * min_size,
        maximum=np.iinfo(np.int64).max,
        note=" (num_clients * min_size and up)",
    )
    sigma = check_number("sigma", sigma, low=0.0)
    rng = _check_rng(rng)
    weights = rng.lognormal(0.0, sigma, num_clients)
    if total == num_clients * min_size:
        return np.full(num_clients, min_size, np.int64)
    free = np.ones(num_clients, bool)
    # Water-filling: the scale only falls as clients are clamped, so this ends after at most N passes
    # (usually one or two), with at least one client free (the last free client always gets
    # total - (N - 1) * min_size > min_size).
    while True:
        scale = (total - min_size * np.count_nonzero(~free)) / weights[free].sum()
        clamp = free & (scale * weights < min_size)
        if not clamp.any():
            break
        free &= ~clamp
    real = np.where(free, scale * weights, float(min_size))
    sizes = np.maximum(np.floor(real).astype(np.int64), min_size)
    rest = int(total - sizes.sum())
    if rest > 0:
        sizes[np.argsort(-(real - np.floor(real)), kind="stable")[:rest]] += 1
    elif rest < 0:
        # Only floating-point error at the floor can overshoot; take it back from the largest clients.
        sizes[np.argsort(-sizes, kind="stable")[:-rest]] -= 1
    return sizes


def lognormal_sizes(
    num_examples: int, num_clients: int, *, sigma: float, seed: int, min_size: int = 1
) -> list[np.ndarray]:
    """IID labels with unbalanced, log-normal client sizes.

    Procedure::

        sizes = lognormal_client_sizes(E, N, sigma, rng, min_size)
        perm = rng.permutation(E)
        client i gets the next sizes[i] entries of perm

    References: FedLab `lognormal_unbalance_split` (`SMILELab-FL/FedLab`,
    `fedlab/utils/dataset/functional.py`; global `np.random`, not
    bit-matched), which FedLab's `CIFAR10Partitioner` uses for
    `balance=False, partition="iid"`.

    Args:
      num_examples: E >= 1.
      num_clients: N, in [1, E].
      sigma: standard deviation of log-sizes, finite and >= 0 (0: near-equal
        sizes, as `iid`).
      seed: seed of `np.random.default_rng` (>= 0).
      min_size: the fewest examples of any client, in [0, E // N].

    Returns:
      As `iid`: N disjoint int64 index arrays covering `range(E)`, each in
      random order, of the drawn sizes.

    Raises:
      ValueError: an argument outside its range (as `iid`, and `sigma` or
        `min_size`).
    """
    num_examples, num_clients = _check_sizes(num_examples, num_clients)
    min_size = _check_per_client("min_size", min_size, 0, num_examples, num_clients)
    rng = _seeded_rng(seed)
    sizes = lognormal_client_sizes(num_examples, num_clients, sigma, rng, min_size)
    return _split(rng.permutation(num_examples), sizes)


# ---------------------------------------------------------------------------
# Held-out fraction of every client.
# ---------------------------------------------------------------------------


def split_each_client(
    parts: Sequence[np.ndarray | Sequence[int]], fraction: float, *, seed: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Splits every client's examples into a kept part and a held-out part.

    Client i with n_i examples holds out h_i = floor(fraction * n_i + 0.5)
    (rounded half up), clamped to [1, n_i - 1] when n_i >= 2 so that both
    sides hold an example; a client with one example keeps it (h_i = 0) and
    one with none has two empty sides. Which examples are held out is a
    uniformly random subset per client; both sides keep the client's order.
    The held-out parts, client by client, make a test population of the same
    clients.

    Args:
      parts: N 1-D integer index arrays (e.g. a partitioner's output).
      fraction: the share held out, in (0, 1).
      seed: seed of `np.random.default_rng` (>= 0).

    Returns:
      (kept, held_out): two lists of N int64 arrays; kept[i] and held_out[i]
      partition parts[i].

    Raises:
      ValueError: an argument outside its range.
    """
    arrays = []
    for i, part in enumerate(parts):
        array = _as_array("parts", part, "1-D integer index arrays")
        if array.size == 0:
            array = array.astype(np.int64).reshape(0)
        if array.ndim != 1 or array.dtype.kind not in "iu":
            raise ValueError(
                f"parts must be 1-D integer index arrays, got shape {array.shape} of dtype {array.dtype} "
                f"for client {i}"
            )
        arrays.append(array.astype(np.int64, copy=False))
    if not arrays:
        raise ValueError("parts must hold at least one client, got none")
    fraction = check_fraction("fraction", fraction)
    rng = _seeded_rng(seed)

    sizes = np.array([a.size for a in arrays], np.int64)
    held = np.floor(fraction * sizes + 0.5).astype(np.int64)
    held = np.where(sizes >= 2, np.clip(held, 1, np.maximum(sizes - 1, 1)), 0)
    num_clients = sizes.size
    owner = np.repeat(np.arange(num_clients), sizes)
    # A random order within each client (clients in order); its first h_i positions are held out.
    shuffled = rng.permutation(owner.size)
    grouped = shuffled[np.argsort(owner[shuffled].astype(_small_uint(num_clients)), kind="stable")]
    rank = np.arange(owner.size) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    is_held = np.zeros(owner.size, bool)
    is_held[grouped[rank < np.repeat(held, sizes)]] = True
    flat = np.concatenate(arrays)
    kept = _split(flat[~is_held], sizes - held)
    held_out = _split(flat[is_held], held)
    return kept, held_out


# ---------------------------------------------------------------------------
# Statistics.
# ---------------------------------------------------------------------------


def partition_statistics(
    labels: np.ndarray | Sequence[int], parts: Sequence[np.ndarray | Sequence[int]], num_classes: int
) -> dict[str, float]:
    """Summary statistics of a partition: sizes, classes per client, label skew.

    The label skew of client i is the total-variation distance between its
    label distribution and that of all of `labels`,
    TV_i = 1/2 * sum_k |n_ik / n_i - n_k / E|; an empty client has no label
    distribution and is left out of its mean.

    Args:
      labels: `[E]` integer class ids in [0, num_classes).
      parts: N 1-D integer index arrays into `labels`.
      num_classes: K >= labels.max() + 1.

    Returns:
      A dict of Python numbers: `num_clients`, `num_assigned` (examples in
      all parts), `size_min`, `size_median`, `size_mean`, `size_max`,
      `classes_mean`, `classes_min`, `classes_max` (distinct classes per
      client), `tv_mean` (mean TV_i over non-empty clients; NaN if none).

    Raises:
      ValueError: an argument outside its range.
    """
    labels = _check_labels(labels)
    num_classes = check_int("num_classes", num_classes, minimum=int(labels.max()) + 1)
    arrays = []
    for part in parts:
        array = _as_array("parts", part, "1-D integer index arrays")
        arrays.append(array if array.size else np.zeros(0, np.int64))
    if not arrays:
        raise ValueError("parts must hold at least one client, got none")
    if any(a.ndim != 1 for a in arrays):
        raise ValueError("parts must be 1-D integer index arrays")
    rows = np.concatenate(arrays)
    if rows.dtype.kind not in "iu" or (rows.size and (rows.min() < 0 or rows.max() >= labels.size)):
        raise ValueError(f"parts must hold integer indices in [0, {labels.size}) (the number of labels)")
    sizes = np.array([a.size for a in arrays], np.int64)
    owner = np.repeat(np.arange(sizes.size), sizes)
    counts = np.bincount(owner * num_classes + labels[rows], minlength=sizes.size * num_classes)
    counts = counts.reshape(sizes.size, num_classes)
    distinct = np.count_nonzero(counts, axis=1)
    global_mix = np.bincount(labels, minlength=num_classes) / labels.size
    nonempty = sizes > 0
    tv = 0.5 * np.abs(counts[nonempty] / sizes[nonempty, None] - global_mix).sum(axis=1)
    return {
        "num_clients": int(sizes.size),
        "num_assigned": int(sizes.sum()),
        "size_min": int(sizes.min()),
        "size_median": float(np.median(sizes)),
        "size_mean": float(sizes.mean()),
        "size_max": int(sizes.max()),
        "classes_mean": float(distinct.mean()),
        "classes_min": int(distinct.min()),
        "classes_max": int(distinct.max()),
        "tv_mean": float(tv.mean()) if tv.size else float("nan"),
    }


# ---------------------------------------------------------------------------
# By name.
# ---------------------------------------------------------------------------


PARTITIONERS: Mapping[str, Callable[..., list[np.ndarray]]] = {
    "iid": iid,
    "dirichlet": dirichlet,
    "dirichlet-mixture": dirichlet_mixture,
    "shards": shards,
    "lognormal": lognormal_sizes,
}


def _options(function):
    """(all option names, required option names) of a partitioner: its keyword-only arguments but seed."""
    parameters = [
        p
        for p in inspect.signature(function).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name != "seed"
    ]
    return [p.name for p in parameters], [p.name for p in parameters if p.default is inspect.Parameter.empty]


def partition(
    name: str, labels: np.ndarray | Sequence[int], num_clients: int, *, seed: int, **options: Any
) -> list[np.ndarray]:
    """Partitions labelled data over clients with the partitioner called `name`.

    `partition("dirichlet", y, 100, alpha=0.3, seed=0)` is
    `dirichlet(y, 100, alpha=0.3, seed=0)`; the size-only partitioners ('iid',
    'lognormal') get `len(labels)` examples. The options are the partitioner's
    keyword arguments: 'iid': none; 'dirichlet': alpha, min_size, balance,
    max_attempts; 'dirichlet-mixture': alpha, client_sizes, prior; 'shards':
    shards_per_client; 'lognormal': sigma, min_size.

    Args:
      name: one of `PARTITIONERS`.
      labels: `[E]` integer class ids >= 0.
      num_clients: N >= 1.
      seed: seed of `np.random.default_rng` (>= 0).
      **options: the partitioner's options (see its docstring).

    Returns:
      N int64 index arrays, one per client.

    Raises:
      ValueError: an unknown name or option, a missing required option, or
        an argument outside its range.
    """
    if not isinstance(name, str) or name not in PARTITIONERS:
        raise ValueError(f"unknown partitioner {name!r}; valid names: {', '.join(PARTITIONERS)}")
    function = PARTITIONERS[name]
    allowed, required = _options(function)
    unknown = [option for option in options if option not in allowed]
    if unknown:
        raise ValueError(
            f"unknown option {', '.join(map(repr, unknown))} for partitioner {name!r}; "
            f"valid options: {', '.join(allowed) if allowed else 'none'}"
        )
    missing = [option for option in required if option not in options]
    if missing:
        raise ValueError(f"partitioner {name!r} needs option {', '.join(missing)}")
    labels = _check_labels(labels)
    if next(iter(inspect.signature(function).parameters)) == "num_examples":
        return function(labels.size, num_clients, seed=seed, **options)
    return function(labels, num_clients, seed=seed, **options)
