"""Centralized image datasets split over clients: Fashion-MNIST, MNIST, CIFAR-10, CIFAR-100.

Images become float32 in [0, 1], `[H, W, C]` (28x28x1 or 32x32x3); labels
int32. Clients come from a partitioner (`jaxfl.data.datasets.centralized`),
except CIFAR-100 from TFF's files, which has TFF's own federated split
(`jaxfl.data.datasets.tff_cifar100`), and Fashion-MNIST's
`partition='ditto'`, the 500 devices of Ditto's experiments (Li 2023,
Table 5.4; `ditto_partition`), whose inputs are z-scored instead.

Files (the format is recognized by name):

* Fashion-MNIST / MNIST: the four IDX files (`train-images-idx3-ubyte.gz`,
  `train-labels-idx1-ubyte.gz`, `t10k-images-idx3-ubyte.gz`,
  `t10k-labels-idx1-ubyte.gz`, gzipped or not) in `--data-dir`; for
  Fashion-MNIST also where Debian's `dataset-fashion-mnist` package puts
  them, `/usr/share/datasets/fashion-mnist` (`apt-get install
  dataset-fashion-mnist`). Checksums: the official files' (as registered by
  tensorflow-datasets) and Debian's re-compressed ones are both accepted.
* CIFAR-10: `cifar-10-python.tar.gz` or its `cifar-10-batches-py/`, or the
  binary version (`cifar-10-binary.tar.gz`, `cifar-10-batches-bin/`).
* CIFAR-100: `cifar-100-python.tar.gz` or `cifar-100-python/` (partitioned),
  or TFF's `fed_cifar100_{train,test}.h5` / `cifar100.sqlite[.lzma]`.

References:
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks.
  [Xiao et al. 2017] Fashion-MNIST: a Novel Image Dataset for Benchmarking Machine Learning Algorithms.
  [Krizhevsky 2009] Learning Multiple Layers of Features from Tiny Images.
  [Reddi et al. 2021] Adaptive Federated Optimization. ICLR 2021.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Unpack

import numpy as np

from jaxfl.data.datasets.centralized import (
    PARTITION_DEFAULTS,
    PartitionOptions,
    check_partition_keywords,
    partition_options,
    partition_summary,
    write_partitioned,
)
from jaxfl.data.datasets.common import (
    check_data_dir,
    find_file,
    load_cached,
    missing,
    progress_bar,
    search_directories,
)
from jaxfl.data.errors import DataFileError
from jaxfl.data.formats.checksums import verify_published
from jaxfl.data.formats.cifar import read_cifar
from jaxfl.data.formats.idx import read_idx
from jaxfl.data.partition import partition_statistics
from jaxfl.data.population import FederatedDataset
from jaxfl.validation import check_int

# Bump when a converter's output changes for the same files and options.
_CONVERTER_VERSION = 2  # 2: dirichlet-mixture clients cover every example

# Fashion-MNIST's partition='ditto' (`ditto_partition`): the constants of the
# authors' litian96/ditto data/fmnist/create_dataset.py.
DITTO_PARTITION = "ditto"
DITTO_NUM_CLIENTS = 500
DITTO_SEED = 233  # np.random.seed(233)
DITTO_CLASSES_PER_CLIENT = 5
DITTO_TOTAL_TRAIN = 60_000  # the lognormal sizes are normalized to this total
DITTO_SPLIT = (0.72, 0.08, 0.20)  # train / validation / test of each device (Li 2023, Appendix 5.7.4)

DEBIAN_FASHION_MNIST = "/usr/share/datasets/fashion-mnist"

_IDX_NAMES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

_D = PARTITION_DEFAULTS


def _find_idx(dataset: str, data_dir: Path | None, defaults: Sequence[str]) -> dict[str, Path]:
    directories = search_directories(data_dir, *defaults)
    found = {}
    for key, stem in _IDX_NAMES.items():
        path = find_file(directories, [stem + ".gz", stem])
        if path is None:
            places = [data_dir] if data_dir is not None else [Path(d) for d in defaults]
            how = None
            if data_dir is None and DEBIAN_FASHION_MNIST in defaults:
                how = (
                    "apt-get install dataset-fashion-mnist, or --data-dir with the IDX files "
                    "(docs/datasets.md)"
                )
            raise missing(dataset, f"IDX file {stem}[.gz]", places, how)
        found[key] = path
    return found


def _images(array: np.ndarray) -> np.ndarray:
    """uint8 `[N, H, W]` or `[N, H, W, C]` pixels as float32 `[N, H, W, C]` in [0, 1]."""
    if array.ndim == 3:
        array = array[..., None]
    return array.astype(np.float32) / np.float32(255.0)


def _verify(path: Path, what: str, enabled: bool) -> None:
    if not isinstance(enabled, bool):
        raise ValueError(f"verify_checksums must be true or false, got {enabled!r}")
    if not enabled:
        return
    try:
        verify_published(path, what=what)
    except DataFileError as error:
        raise DataFileError(f"{error}; --dataset-option verify_checksums=false uses it anyway") from None


def _read_idx_splits(files: dict[str, Path], title: str, verify: bool) -> dict[str, np.ndarray]:
    """The four IDX arrays (checksums verified when asked), images and labels checked to match."""
    for path in files.values():
        _verify(path, f"{title} {path.name}", verify)
    arrays = {key: read_idx(path) for key, path in files.items()}
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
            raise DataFileError(
                f"{files[split + '_images']}: {images.shape[0]} images of shape {images.shape[1:]} "
                f"do not match the {labels.shape[0]} labels of {files[split + '_labels'].name}"
            )
    return arrays


def _idx_dataset(
    dataset: str, title: str, data_dir, defaults: Sequence[str], options: dict, verify: bool
) -> FederatedDataset:
    data_dir = check_data_dir(data_dir, dataset)
    files = _find_idx(dataset, data_dir, defaults)

    def build(builder):
        arrays = _read_idx_splits(files, title, verify)
        train = {"x": _images(arrays["train_images"]), "y": arrays["train_labels"].astype(np.int32)}
        test = {"x": _images(arrays["test_images"]), "y": arrays["test_labels"].astype(np.int32)}
        statistics = write_partitioned(builder, train, test, options, description=dataset)
        return {
            "num_classes": 10,
            "input_shape": list(train["x"].shape[1:]),
            "description": f"{title} from {files['train_images'].parent}: {partition_summary(options)}",
            "statistics": statistics,
        }

    return load_cached(dataset, options, list(files.values()), build, converter_version=_CONVERTER_VERSION)


# ---------------------------------------------------------------------------
# Fashion-MNIST as Ditto's experiments partition it (Li 2023, Chapter 5).


def ditto_allocation(num_clients: int = DITTO_NUM_CLIENTS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The classes and per-class example counts of Ditto's Fashion-MNIST devices.

    The draws of the authors' `data/fmnist/create_dataset.py` (litian96/ditto;
    Li 2023, Table 5.4), in their order, from NumPy's legacy generator seeded
    233 (their `np.random.seed(233)`):

    1. sizes `n = lognormal(3, 1, N) + 10`, scaled to sum to 60,000;
    2. for each device k in turn, proportions `p = lognormal(1, 1, 5)`,
       normalized; device k holds classes `(k + j) mod 10`, j = 0..4, with
       `int(p_j n_k) + 1` training and `int(p_j n_k / 6) + 1` test examples
       of class `(k + j) mod 10`.

    Sums are Python's `sum` over the arrays, as the script's (sequential, not
    NumPy's pairwise: the truncations `int(...)` see the same floats).

    Args:
      num_clients: N devices (Li 2023: 500).

    Returns:
      `classes [N, 5]` int64, `train_counts [N, 5]` and `test_counts [N, 5]`
      int64 (each count >= 1).
    """
    num_clients = check_int("num_clients", num_clients)
    random = np.random.RandomState(DITTO_SEED)
    sizes = random.lognormal(3, 1, num_clients) + 10
    sizes = DITTO_TOTAL_TRAIN * sizes / sum(sizes)
    per = DITTO_CLASSES_PER_CLIENT
    classes = np.zeros((num_clients, per), np.int64)
    train_counts = np.zeros((num_clients, per), np.int64)
    test_counts = np.zeros((num_clients, per), np.int64)
    for k in range(num_clients):
        proportions = random.lognormal(1, 1, per)
        proportions = proportions / sum(proportions)
        for j in range(per):
            classes[k, j] = (k + j) % 10
            train_counts[k, j] = int(proportions[j] * sizes[k]) + 1
            test_counts[k, j] = int(proportions[j] * sizes[k] / 6) + 1
    return classes, train_counts, test_counts


def _take_sequentially(
    labels: np.ndarray, classes: np.ndarray, counts: np.ndarray, num_classes: int = 10
) -> list[np.ndarray]:
    """Each device's rows of a split: per class, the next `count` rows of that class's pool.

    A class's pool is its rows in file order; a draw that would run past the
    pool's end starts again at its beginning (the script's wrap-around).
    """
    pools = [np.flatnonzero(labels == c) for c in range(num_classes)]
    position = np.zeros(num_classes, np.int64)
    rows = []
    for device_classes, device_counts in zip(classes, counts, strict=True):
        parts = []
        for c, count in zip(device_classes, device_counts, strict=True):
            pool = pools[c]
            if count > pool.size:
                raise DataFileError(f"class {c} has {pool.size} examples, a device needs {count}")
            if position[c] + count > pool.size:
                position[c] = 0
            parts.append(pool[position[c] : position[c] + count])
            position[c] += count
        rows.append(np.concatenate(parts))
    return rows


def ditto_partition(
    train_labels: np.ndarray, test_labels: np.ndarray, num_clients: int = DITTO_NUM_CLIENTS
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Rows of the official train and test splits each Ditto device draws (`ditto_allocation`).

    Returns:
      (train rows, test rows): per device, indices into `train_labels` and
      into `test_labels`, class by class in the device's class order. Pools
      wrap around, so a row can belong to several devices (never twice to one).
    """
    classes, train_counts, test_counts = ditto_allocation(num_clients)
    return (
        _take_sequentially(np.asarray(train_labels), classes, train_counts),
        _take_sequentially(np.asarray(test_labels), classes, test_counts),
    )


def ditto_split_sizes(size: int) -> tuple[int, int, int]:
    """(train, validation, test) examples of a device of `size` examples: 72/8/20, rounded.

    Validation and test are `floor(f * size + 0.5)`, at least 1 each; train
    is the rest (>= 1 for size >= 3).
    """
    _, val_fraction, test_fraction = DITTO_SPLIT
    num_val = max(math.floor(val_fraction * size + 0.5), 1)
    num_test = max(math.floor(test_fraction * size + 0.5), 1)
    num_train = size - num_val - num_test
    if num_train < 1:
        raise ValueError(f"a device of {size} examples cannot be split 72/8/20")
    return num_train, num_val, num_test


def _ditto_dataset(
    dataset: str, title: str, data_dir, defaults: Sequence[str], options: dict, verify: bool
) -> FederatedDataset:
    """`partition='ditto'` (see `fashion_mnist`): the authors' devices, each split 72/8/20."""
    data_dir = check_data_dir(data_dir, dataset)
    files = _find_idx(dataset, data_dir, defaults)
    num_clients, seed = options["num_clients"], options["seed"]

    def build(builder):
        arrays = _read_idx_splits(files, title, verify)
        train_labels = arrays["train_labels"].astype(np.int32)
        test_labels = arrays["test_labels"].astype(np.int32)
        # The script's normalization: per pixel, with the training split's float32
        # mean and standard deviation (+ 0.001), applied to both splits.
        flat = arrays["train_images"].reshape(len(train_labels), -1).astype(np.float32)
        mean, std = np.mean(flat, 0), np.std(flat, 0)
        shape = (*arrays["train_images"].shape[1:], 1)

        def z_score(images):
            z = (images.reshape(len(images), -1).astype(np.float32) - mean) / (std + np.float32(0.001))
            return z.reshape(len(images), *shape)

        x_train, x_test = z_score(arrays["train_images"]), z_score(arrays["test_images"])
        train_rows, test_rows = ditto_partition(train_labels, test_labels, num_clients)
        order = np.random.default_rng(seed)
        names = ("train", "validation", "test")
        writers = {name: builder.population(name) for name in names}
        labels = {name: [] for name in names}
        with progress_bar(num_clients, f"{dataset}: ditto devices") as bar:
            for k in range(num_clients):
                bar.update(1)
                x = np.concatenate([x_train[train_rows[k]], x_test[test_rows[k]]])
                y = np.concatenate([train_labels[train_rows[k]], test_labels[test_rows[k]]])
                permutation = order.permutation(len(y))
                x, y = x[permutation], y[permutation]
                ends = np.cumsum(ditto_split_sizes(len(y)))
                for name, start, end in zip(names, (0, *ends[:2]), ends, strict=True):
                    writers[name].add(f"f_{k:05d}", {"x": x[start:end], "y": y[start:end]})
                    labels[name].append(y[start:end])
        statistics = {}
        for name in names:
            sizes = np.array([part.size for part in labels[name]])
            bounds = np.concatenate([[0], np.cumsum(sizes)])
            parts = [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
            statistics[name] = partition_statistics(np.concatenate(labels[name]), parts, 10)
        return {
            "num_classes": 10,
            "input_shape": list(shape),
            "description": (
                f"{title} from {files['train_images'].parent}: {ditto_summary(num_clients, seed)}"
            ),
            "statistics": statistics,
            "personal_splits": True,
        }

    return load_cached(dataset, options, list(files.values()), build, converter_version=_CONVERTER_VERSION)


def ditto_summary(num_clients: int, seed: int) -> str:
    """One line saying how the 'ditto' partition's devices were made."""
    return (
        f"Ditto's partition (Li 2023, Table 5.4; litian96/ditto create_dataset.py): {num_clients} devices of "
        f"5 classes (k+j) mod 10, lognormal sizes and class proportions (seed {DITTO_SEED}), inputs "
        f"z-scored per pixel; each device's examples split 72/8/20 train/validation/test (seed {seed}); "
        "test and validation client k are training client k"
    )


def fashion_mnist(
    *,
    data_dir: str | None = None,
    verify_checksums: bool = True,
    **partition: Unpack[PartitionOptions],
) -> FederatedDataset:
    """Fashion-MNIST (Xiao et al. 2017) dealt over clients by a partitioner.

    60,000 training and 10,000 test 28x28 grey images of 10 kinds of
    clothing, 6,000 / 1,000 per class; the dataset of Ditto's experiments
    (Li 2023, Chapter 5). Read from the IDX files in `data_dir`, or in Debian's
    location (`/usr/share/datasets/fashion-mnist`) without one.

    `partition='ditto'` is the partition of Ditto's experiments (Li 2023,
    Table 5.4; the authors' litian96/ditto `data/fmnist/create_dataset.py`,
    `ditto_allocation`): inputs z-scored per pixel with the training split's
    mean and standard deviation (+ 0.001; not scaled to [0, 1]); N = 500
    devices, device k holding classes (k + j) mod 10, j = 0..4, with
    lognormal sizes and class proportions drawn as the script draws them
    (NumPy's legacy generator seeded 233, whatever `seed`), its examples of
    each class taken in turn from that class's examples in file order,
    starting again at the first when a class runs out (so some examples
    belong to two devices). The script gives device k about n_k training
    and n_k / 6 test examples; the thesis splits each device's data 72/8/20
    train / validation / test (Appendix 5.7.4), which those counts do not give
    (they make 86/14). Here each device's training and test examples are
    pooled, shuffled (`seed`) and split 72/8/20 (`ditto_split_sizes`):
    training client k, validation client k and test client k are device k
    (`personal_splits`), as `--client-split` would make them. The options
    test, num_test_clients and test_fraction do not apply; alpha, min_size,
    shards_per_client and sigma are not read.

    Args:
      data_dir: where the IDX files are (default: Debian's location).
      verify_checksums: check files that have a published SHA-256 against
        it (false: use a file of that name anyway, e.g. a re-encoded copy).
      **partition: the `jaxfl.data.PartitionOptions`,
        and partition 'ditto' (above); num_clients unset or None: 500 for
        'ditto', else 100; seed with 'ditto': of the shuffle before each
        device's 72/8/20 split.

    Returns:
      The `FederatedDataset` (memory-mapped from the cache).
    """
    check_partition_keywords(partition, "fashion_mnist")
    if partition.get("num_clients", 0) is None:  # Unset (the registry's default).
        del partition["num_clients"]
    if partition.get("partition") == DITTO_PARTITION:
        for name in ("test", "num_test_clients", "test_fraction"):
            if partition.get(name, _D[name]) != _D[name]:
                raise ValueError(
                    f"{name} does not apply to partition='ditto' (its test and validation clients are "
                    "each device's own 20% and 8%)"
                )
        options = {
            "partition": DITTO_PARTITION,
            "num_clients": check_int("num_clients", partition.get("num_clients", DITTO_NUM_CLIENTS)),
            "seed": check_int("seed", partition.get("seed", _D["seed"]), minimum=0),
        }
        return _ditto_dataset(
            "fashion-mnist", "Fashion-MNIST", data_dir, [DEBIAN_FASHION_MNIST], options, verify_checksums
        )
    options = partition_options(partition, "fashion_mnist")
    return _idx_dataset(
        "fashion-mnist", "Fashion-MNIST", data_dir, [DEBIAN_FASHION_MNIST], options, verify_checksums
    )


def mnist(
    *,
    data_dir: str | None = None,
    verify_checksums: bool = True,
    **partition: Unpack[PartitionOptions],
) -> FederatedDataset:
    """MNIST (LeCun et al. 1998) dealt over clients by a partitioner.

    60,000 / 10,000 28x28 handwritten digits from the four IDX files in
    `data_dir`, dealt by `**partition` (`PartitionOptions`).
    """
    options = partition_options(partition, "mnist")
    return _idx_dataset("mnist", "MNIST", data_dir, [], options, verify_checksums)


def _cifar_dataset(
    dataset: str, variant: int, data_dir, options: dict, label: str, verify: bool
) -> FederatedDataset:
    data_dir = check_data_dir(data_dir, dataset)
    names = (
        ["cifar-10-python.tar.gz", "cifar-10-batches-py", "cifar-10-binary.tar.gz", "cifar-10-batches-bin"]
        if variant == 10
        else ["cifar-100-python.tar.gz", "cifar-100-python"]
    )
    source = find_file(search_directories(data_dir), names)
    if source is None:
        # CIFAR-100 is read first as TFF's federated split (the caller); name those files too.
        tff = ["fed_cifar100_train.h5", "cifar100.sqlite(.lzma)"] if variant == 100 else []
        raise missing(dataset, " or ".join([*tff, *names]), [data_dir] if data_dir else [])

    def build(builder):
        if source.is_file():
            _verify(source, f"CIFAR-{variant} {source.name}", verify)
        splits = read_cifar(source, label=label)
        train = {"x": _images(splits.train_images), "y": splits.train_labels.astype(np.int32)}
        test = {"x": _images(splits.test_images), "y": splits.test_labels.astype(np.int32)}
        statistics = write_partitioned(builder, train, test, options, description=dataset)
        return {
            "num_classes": splits.num_classes,
            "input_shape": [32, 32, 3],
            "description": f"CIFAR-{variant} ({label} labels) from {source}: {partition_summary(options)}",
            "statistics": statistics,
        }

    return load_cached(
        dataset, {**options, "label": label}, [source], build, converter_version=_CONVERTER_VERSION
    )


def cifar10(
    *,
    data_dir: str | None = None,
    verify_checksums: bool = True,
    **partition: Unpack[PartitionOptions],
) -> FederatedDataset:
    """CIFAR-10 (Krizhevsky 2009) dealt over clients by a partitioner.

    50,000 / 10,000 32x32 colour images of 10 classes, from the python or
    binary version in `data_dir`, dealt by `**partition` (`PartitionOptions`).
    """
    options = partition_options(partition, "cifar10")
    return _cifar_dataset("cifar10", 10, data_dir, options, "fine", verify_checksums)


def cifar100(
    *,
    data_dir: str | None = None,
    label: str = "fine",
    verify_checksums: bool = True,
    **partition: Unpack[PartitionOptions],
) -> FederatedDataset:
    """CIFAR-100: TFF's federated split, or the centralized set dealt by a partitioner.

    With TFF's files in `data_dir` (`fed_cifar100_{train,test}.h5` or
    `cifar100.sqlite[.lzma]`), the clients are TFF's: 500 training and 100
    test clients of 100 images each, made by a two-level Pachinko allocation
    (coarse labels ~ Dir(0.1), fine ~ Dir(10); Reddi et al. 2021); the
    partition options are then ignored. With `cifar-100-python[.tar.gz]`,
    the 50,000 / 10,000 images are dealt by the partitioner.

    Args:
      data_dir: where TFF's or the centralized files are.
      label: 'fine' (100 classes) or 'coarse' (20 superclasses).
      verify_checksums: check files that have a published SHA-256.
      **partition: the `jaxfl.data.PartitionOptions`
        (with the centralized files).
    """
    from jaxfl.data.datasets.tff_cifar100 import find_tff_cifar100, tff_cifar100

    check_partition_keywords(partition, "cifar100")
    if label not in ("fine", "coarse"):
        raise ValueError(f"label must be 'fine' or 'coarse', got {label!r}")
    checked = check_data_dir(data_dir, "cifar100")
    if checked is not None and find_tff_cifar100(checked) is not None:
        return tff_cifar100(checked, label=label)
    options = partition_options(partition, "cifar100")
    return _cifar_dataset("cifar100", 100, data_dir, options, label, verify_checksums)
