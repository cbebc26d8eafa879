"""Centralized image datasets split over clients: Fashion-MNIST, MNIST, CIFAR-10, CIFAR-100.

Images become float32 in [0, 1], `[H, W, C]` (28x28x1 or 32x32x3); labels
int32. Clients come from a partitioner (`jaxfl.data.datasets.centralized`),
except CIFAR-100 from TFF's files, which has TFF's own federated split
(`jaxfl.data.datasets.tff_cifar100`).

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
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from jaxfl.data.datasets.centralized import (
    PARTITION_DEFAULTS,
    partition_options,
    partition_summary,
    write_partitioned,
)
from jaxfl.data.datasets.common import check_data_dir, find_file, load_cached, missing, search_directories
from jaxfl.data.errors import DataFileError
from jaxfl.data.formats.checksums import verify_published
from jaxfl.data.formats.cifar import read_cifar
from jaxfl.data.formats.idx import read_idx
from jaxfl.data.population import FederatedDataset

# Bump when a converter's output changes for the same files and options.
_CONVERTER_VERSION = 2  # 2: dirichlet-mixture clients cover every example

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
            raise missing(dataset, f"IDX file {stem}[.gz]", places)
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


def _idx_dataset(
    dataset: str, title: str, data_dir, defaults: Sequence[str], options: dict, verify: bool
) -> FederatedDataset:
    data_dir = check_data_dir(data_dir, dataset)
    files = _find_idx(dataset, data_dir, defaults)

    def build(builder):
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


def fashion_mnist(
    *,
    data_dir: str | None = None,
    num_clients: int = _D["num_clients"],
    partition: str = _D["partition"],
    alpha: float = _D["alpha"],
    min_size: int = _D["min_size"],
    shards_per_client: int = _D["shards_per_client"],
    sigma: float = _D["sigma"],
    test: str = _D["test"],
    num_test_clients: int = _D["num_test_clients"],
    test_fraction: float = _D["test_fraction"],
    seed: int = _D["seed"],
    verify_checksums: bool = True,
) -> FederatedDataset:
    """Fashion-MNIST (Xiao et al. 2017) dealt over clients by a partitioner.

    60,000 training and 10,000 test 28x28 grey images of 10 kinds of
    clothing, 6,000 / 1,000 per class; the dataset of Ditto's experiments
    (thesis chapter 5). Read from the IDX files in `data_dir`, or in Debian's
    location (`/usr/share/datasets/fashion-mnist`) without one.

    Args:
      data_dir: where the IDX files are (default: Debian's location).
      num_clients: training clients N.
      partition: 'dirichlet' (per-class Dirichlet(alpha) split, Yurochkin et
        al. 2019, every client >= min_size examples), 'dirichlet-mixture'
        (each client's class mix ~ Dirichlet(alpha), Hsu et al. 2019),
        'shards' (McMahan et al. 2017: shards_per_client label shards each),
        'iid', or 'lognormal' (IID with lognormal(sigma) sizes).
      alpha: Dirichlet concentration (smaller: fewer classes per client).
      min_size: smallest client of the 'dirichlet' partition.
      shards_per_client: label shards per client ('shards').
      sigma: spread of the 'lognormal' client sizes.
      test: 'unseen' (the test split dealt over num_test_clients new
        clients) or 'held-out' (test_fraction of each training client).
      num_test_clients: test clients ('unseen').
      test_fraction: share of each client held out ('held-out').
      seed: seed of the partition.
      verify_checksums: check files that have a published SHA-256 against
        it (false: use a file of that name anyway, e.g. a re-encoded copy).

    Returns:
      The `FederatedDataset` (memory-mapped from the cache).
    """
    options = partition_options(locals())
    return _idx_dataset(
        "fashion-mnist", "Fashion-MNIST", data_dir, [DEBIAN_FASHION_MNIST], options, verify_checksums
    )


def mnist(
    *,
    data_dir: str | None = None,
    num_clients: int = _D["num_clients"],
    partition: str = _D["partition"],
    alpha: float = _D["alpha"],
    min_size: int = _D["min_size"],
    shards_per_client: int = _D["shards_per_client"],
    sigma: float = _D["sigma"],
    test: str = _D["test"],
    num_test_clients: int = _D["num_test_clients"],
    test_fraction: float = _D["test_fraction"],
    seed: int = _D["seed"],
    verify_checksums: bool = True,
) -> FederatedDataset:
    """MNIST (LeCun et al. 1998) dealt over clients by a partitioner.

    60,000 / 10,000 28x28 handwritten digits from the four IDX files in
    `data_dir`. The options are those of `fashion_mnist`.
    """
    options = partition_options(locals())
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
    num_clients: int = _D["num_clients"],
    partition: str = _D["partition"],
    alpha: float = _D["alpha"],
    min_size: int = _D["min_size"],
    shards_per_client: int = _D["shards_per_client"],
    sigma: float = _D["sigma"],
    test: str = _D["test"],
    num_test_clients: int = _D["num_test_clients"],
    test_fraction: float = _D["test_fraction"],
    seed: int = _D["seed"],
    verify_checksums: bool = True,
) -> FederatedDataset:
    """CIFAR-10 (Krizhevsky 2009) dealt over clients by a partitioner.

    50,000 / 10,000 32x32 colour images of 10 classes, from the python or
    binary version in `data_dir`. The options are those of `fashion_mnist`.
    """
    options = partition_options(locals())
    return _cifar_dataset("cifar10", 10, data_dir, options, "fine", verify_checksums)


def cifar100(
    *,
    data_dir: str | None = None,
    label: str = "fine",
    num_clients: int = _D["num_clients"],
    partition: str = _D["partition"],
    alpha: float = _D["alpha"],
    min_size: int = _D["min_size"],
    shards_per_client: int = _D["shards_per_client"],
    sigma: float = _D["sigma"],
    test: str = _D["test"],
    num_test_clients: int = _D["num_test_clients"],
    test_fraction: float = _D["test_fraction"],
    seed: int = _D["seed"],
    verify_checksums: bool = True,
) -> FederatedDataset:
    """CIFAR-100: TFF's federated split, or the centralized set dealt by a partitioner.

    With TFF's files in `data_dir` (`fed_cifar100_{train,test}.h5` or
    `cifar100.sqlite[.lzma]`), the clients are TFF's: 500 training and 100
    test clients of 100 images each, made by a two-level Pachinko allocation
    (coarse labels ~ Dir(0.1), fine ~ Dir(10); data-sources.md 2(a)); the
    partition options are then ignored. With `cifar-100-python[.tar.gz]`,
    the 50,000 / 10,000 images are dealt by the partitioner (options of
    `fashion_mnist`).

    Args:
      data_dir: where TFF's or the centralized files are.
      label: 'fine' (100 classes) or 'coarse' (20 superclasses).
      num_clients: training clients N (partitioned).
      partition: the partitioner (see `fashion_mnist`).
      alpha: its Dirichlet concentration.
      min_size: the smallest client of 'dirichlet'.
      shards_per_client: label shards per client ('shards').
      sigma: spread of the 'lognormal' sizes.
      test: 'unseen' or 'held-out' test clients.
      num_test_clients: test clients ('unseen').
      test_fraction: share held out per client ('held-out').
      seed: seed of the partition.
      verify_checksums: check files that have a published SHA-256.
    """
    from jaxfl.data.datasets.tff_cifar100 import find_tff_cifar100, tff_cifar100

    if label not in ("fine", "coarse"):
        raise ValueError(f"label must be 'fine' or 'coarse', got {label!r}")
    checked = check_data_dir(data_dir, "cifar100")
    if checked is not None and find_tff_cifar100(checked) is not None:
        return tff_cifar100(checked, label=label)
    options = partition_options(locals())
    return _cifar_dataset("cifar100", 100, data_dir, options, label, verify_checksums)
