"""Centralized labelled datasets split over clients by a partitioner.

MNIST, Fashion-MNIST, CIFAR-10/100 and most TFDS datasets have no natural
clients: a partitioner (`jaxfl.data.partition`) deals the official training
split over `num_clients` clients. The test population is either

* 'unseen': the official test split dealt over `num_test_clients` new
  clients by the same partitioner (clients never seen in training, with the
  same kind of heterogeneity), or
* 'held-out': a `test_fraction` of each training client's examples (the
  same clients; the official test split is not used).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

import numpy as np

from jaxfl.data import partition as partitioners
from jaxfl.data.datasets.common import progress_bar
from jaxfl.validation import check_choice, check_fraction, check_int, check_keywords

TEST_SPLITS = ("unseen", "held-out")



class PartitionOptions(TypedDict, total=False):
    """How a centralized dataset is dealt over clients: keywords of every such loader (`**partition`).

    Their defaults are `PARTITION_DEFAULTS`; `jaxfl.data.dataset_options`
    lists them with each dataset's other options.

    Attributes:
      num_clients: training clients N.
      partition: 'dirichlet' (per-class Dirichlet(alpha) split, Yurochkin et
        al. 2019, every client >= min_size examples), 'dirichlet-mixture'
        (each client's class mix ~ Dirichlet(alpha), Hsu et al. 2019),
        'shards' (McMahan et al. 2017: shards_per_client label shards each),
        'iid', 'lognormal' (IID with lognormal(sigma) sizes); Fashion-MNIST
        also takes 'ditto' (`jaxfl.data.fashion_mnist`).
      alpha: Dirichlet concentration (smaller: fewer classes per client).
      min_size: smallest client of the 'dirichlet' partition.
      shards_per_client: label shards per client ('shards').
      sigma: spread of the 'lognormal' client sizes.
      test: 'unseen' (the test split dealt over num_test_clients new
        clients) or 'held-out' (test_fraction of each training client).
      num_test_clients: test clients ('unseen').
      test_fraction: share of each client held out ('held-out').
      seed: seed of the partition.
    """

    num_clients: int
    partition: str
    alpha: float
    min_size: int
    shards_per_client: int
    sigma: float
    test: str
    num_test_clients: int
    test_fraction: float
    seed: int


PARTITION_DEFAULTS: Mapping[str, Any] = {
    "num_clients": 100,
    "partition": "dirichlet",
    "alpha": 0.5,
    "min_size": 10,
    "shards_per_client": 2,
    "sigma": 1.0,
    "test": "unseen",
    "num_test_clients": 100,
    "test_fraction": 0.2,
    "seed": 0,
}


def check_partition_keywords(given: Mapping[str, Any], loader: str) -> None:
    """Refuses a keyword of `loader`'s `**partition` that `PartitionOptions` lacks (a TypeError)."""
    check_keywords(loader, given, PARTITION_DEFAULTS)


def partition_options(given: Mapping[str, Any], loader: str) -> dict[str, Any]:
    """A loader's `**partition` keywords with `PARTITION_DEFAULTS` for the others, validated.

    Loaders call this before they look for files, so that a bad option is
    reported as such even where the files are missing.
    """
    check_partition_keywords(given, loader)
    return check_partition_options({**PARTITION_DEFAULTS, **given})


def unused_partition_options(given: Mapping[str, Any]) -> list[str]:
    """The options in `given` (those a caller set) that its partition or test split does not read.

    E.g. shards_per_client with the default Dirichlet partition, or
    test_fraction with the 'unseen' test split: accepted, and changing
    nothing (the CLI warns).
    """
    partition = given.get("partition", PARTITION_DEFAULTS["partition"])
    test = given.get("test", PARTITION_DEFAULTS["test"])
    readers = {
        "alpha": ("partition", ("dirichlet", "dirichlet-mixture")),
        "min_size": ("partition", ("dirichlet",)),
        "shards_per_client": ("partition", ("shards",)),
        "sigma": ("partition", ("lognormal",)),
        "num_test_clients": ("test", ("unseen",)),
        "test_fraction": ("test", ("held-out",)),
    }
    chosen = {"partition": partition, "test": test}
    return [
        f"dataset option {name} is used only with {key}={' or '.join(values)} (here {key}={chosen[key]}); "
        "ignored"
        for name, (key, values) in readers.items()
        if name in given and chosen[key] not in values
    ]


def partitioner_options(options: Mapping[str, Any], num_examples: int, num_clients: int) -> dict[str, Any]:
    """The keyword arguments of the chosen partitioner, from the dataset's options."""
    name = options["partition"]
    if name == "dirichlet":
        return {"alpha": options["alpha"], "min_size": options["min_size"]}
    if name == "dirichlet-mixture":
        # Hsu et al. 2019 with equal client sizes (the first `num_examples % num_clients` one
        # larger): every example fits.
        sizes = np.full(num_clients, num_examples // num_clients)
        sizes[: num_examples % num_clients] += 1
        return {"alpha": options["alpha"], "client_sizes": sizes}
    if name == "shards":
        return {"shards_per_client": options["shards_per_client"]}
    if name == "lognormal":
        return {"sigma": options["sigma"]}
    return {}


def check_partition_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Validates the shared options (the partitioner checks its own on use)."""
    options = dict(options)
    check_choice("partition", options["partition"], tuple(partitioners.PARTITIONERS))
    check_choice("test", options["test"], TEST_SPLITS)
    options["num_clients"] = check_int("num_clients", options["num_clients"])
    options["num_test_clients"] = check_int("num_test_clients", options["num_test_clients"])
    options["test_fraction"] = check_fraction("test_fraction", options["test_fraction"])
    options["seed"] = check_int("seed", options["seed"], minimum=0)
    return options


def _deal(labels: np.ndarray, option: str, options: Mapping[str, Any], seed: int) -> list[np.ndarray]:
    num_clients = options[option]
    if num_clients > labels.size:
        split = "training" if option == "num_clients" else "test"
        raise ValueError(f"{option}={num_clients} exceeds the {labels.size} examples of the {split} split")
    return partitioners.partition(
        options["partition"],
        labels,
        num_clients,
        seed=seed,
        **partitioner_options(options, labels.size, num_clients),
    )


def write_partitioned(
    builder,
    train: Mapping[str, np.ndarray],
    test: Mapping[str, np.ndarray] | None,
    options: Mapping[str, Any],
    *,
    label: str = "y",
    description: str,
) -> dict[str, Any]:
    """Deals `train` (and `test`) over clients and writes the populations.

    Args:
      builder: the cache entry's `CacheBuilder`.
      train: feature name -> `[E, ...]` arrays of the training split.
      test: the same for the test split (needed when `options['test']` is
        'unseen').
      options: the shared partition options (`PARTITION_DEFAULTS`' keys).
      label: the feature the partitioner reads (integer class ids).
      description: the dataset's one-line description.

    Returns:
      Statistics of both populations (`jaxfl.data.partition.partition_statistics`).
    """
    options = check_partition_options(options)
    seed = options["seed"]
    train_labels = np.asarray(train[label])
    num_classes = int(train_labels.max()) + 1
    parts = _deal(train_labels, "num_clients", options, seed)
    if options["test"] == "held-out":
        parts, test_parts = partitioners.split_each_client(parts, options["test_fraction"], seed=seed + 1)
        test_source = train
    else:
        if test is None:
            raise ValueError("this dataset has no test split: use test=held-out")
        test_source = test
        # An independent stream for the test clients: the training clients do
        # not change with the test options.
        test_parts = _deal(np.asarray(test[label]), "num_test_clients", options, seed + 1)
    statistics = {}
    for name, source, client_parts in (("train", train, parts), ("test", test_source, test_parts)):
        labels = np.asarray(source[label])
        statistics[name] = partitioners.partition_statistics(
            labels, [p for p in client_parts if p.size], max(num_classes, int(labels.max()) + 1)
        )
        writer = builder.population(name)
        with progress_bar(len(client_parts), f"{description}: {name} clients") as bar:
            for i, rows in enumerate(client_parts):
                bar.update(1)
                if rows.size == 0:
                    continue  # A client with nothing (held-out side of a 1-example client).
                writer.add(f"{name}_{i}", {k: np.asarray(v)[rows] for k, v in source.items()})
    return statistics


def partition_summary(options: Mapping[str, Any]) -> str:
    """One line saying how the clients were made, for descriptions."""
    name = options["partition"]
    detail = {
        "dirichlet": f"Dirichlet({options['alpha']:g}) per class, >= {options['min_size']} examples",
        "dirichlet-mixture": f"Dirichlet({options['alpha']:g}) class mixture per client",
        "shards": f"{options['shards_per_client']} label shards each",
        "lognormal": f"IID, lognormal({options['sigma']:g}) sizes",
        "iid": "IID",
    }[name]
    test = (
        f"test: {options['num_test_clients']} unseen clients"
        if options["test"] == "unseen"
        else f"test: {options['test_fraction']:g} of each client held out"
    )
    return f"{options['num_clients']} clients ({detail}; seed {options['seed']}); {test}"
