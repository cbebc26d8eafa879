"""`tfds:NAME`: any prepared TFDS dataset as a federated dataset.

The dataset is read offline from a data directory (`--data-dir`, else
`$TFDS_DATA_DIR`, else `~/tensorflow_datasets`) by
`jaxfl.data.formats.tfds_source` (no TensorFlow; array_record shards).
Inputs are its image feature (float32 in [0, 1], `[H, W, C]`) or its numeric
tensor features; labels its class label. Clients are the values of a client
feature when the dataset has one (`user` in `sentiment140`, detected by
`natural_client_key`, or named with `client_key=`), else made by a
partitioner (`jaxfl.data.datasets.centralized`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Unpack

import numpy as np

from jaxfl.data.datasets.centralized import (
    PartitionOptions,
    check_partition_keywords,
    partition_options,
    partition_summary,
    write_partitioned,
)
from jaxfl.data.datasets.common import load_cached, progress_bar, write_population
from jaxfl.data.errors import DataFileError
from jaxfl.data.formats.tfds_source import TfdsInfo, read_tfds, tfds_info
from jaxfl.data.population import FederatedDataset
from jaxfl.validation import check_int

_CONVERTER_VERSION = 2  # 2: dirichlet-mixture clients cover every example


def default_tfds_data_dir() -> Path:
    return Path(os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets").expanduser()


def group_by_client(keys: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """`(client name, row indices)` per distinct key, sorted by name; rows keep their order."""
    names = np.array(
        [k.decode("utf-8", "replace") if isinstance(k, bytes) else str(k) for k in keys], dtype=object
    )
    unique, inverse = np.unique(names.astype(str), return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.cumsum(np.bincount(inverse, minlength=unique.size))[:-1]
    return list(zip((str(u) for u in unique), np.split(order, bounds), strict=True))


def _inputs(info: TfdsInfo, split_arrays: dict, label: str, where: str) -> np.ndarray:
    image = info.image_key
    if image is not None:
        images = np.stack(split_arrays[image]) if split_arrays[image].dtype == object else split_arrays[image]
        if images.ndim == 3:
            images = images[..., None]
        scale = 255.0 if images.dtype == np.uint8 else 1.0
        return (images.astype(np.float32) / np.float32(scale)).astype(np.float32)
    numeric = [
        name
        for name, feature in info.features.items()
        if name != label and feature.kind == "tensor" and np.dtype(feature.dtype).kind in "fiub"
    ]
    if not numeric:
        kinds = ", ".join(f"{n} ({f.kind})" for n, f in info.features.items())
        raise DataFileError(
            f"{where}: no image or numeric feature to use as inputs (features: {kinds}); text datasets "
            "have their own loaders (e.g. --dataset sent140 for sentiment140)"
        )
    columns = [split_arrays[name].astype(np.float32).reshape(len(split_arrays[name]), -1) for name in numeric]
    return np.concatenate(columns, axis=1)


def _client_key(info: TfdsInfo, client_key: str) -> str | None:
    """The feature naming each example's client: 'auto' (the natural one, if any), 'none', or a feature."""
    if client_key == "auto":
        return info.client_key
    if client_key == "none":
        return None
    if client_key not in info.features:
        raise ValueError(
            f"client_key {client_key!r} is not a feature of {info.full_name} "
            f"(features: {', '.join(info.features)})"
        )
    return client_key


def _natural_clients(data: dict, min_examples: int):
    """(client, its examples, None below `min_examples`) of the clients named by `data["client"]`."""
    features = {k: v for k, v in data.items() if k != "client"}
    for client, rows in group_by_client(data["client"]):
        yield client, {k: v[rows] for k, v in features.items()} if rows.size >= min_examples else None


def tfds_dataset(
    *,
    name: str,
    data_dir: str | None = None,
    client_key: str = "auto",
    train_split: str = "train",
    test_split: str = "test",
    min_examples: int = 1,
    **partition: Unpack[PartitionOptions],
) -> FederatedDataset:
    """A prepared TFDS dataset, by its natural clients or partitioned.

    Args:
      name: the TFDS name, `name[/config][:version]`.
      data_dir: the TFDS data directory (default `$TFDS_DATA_DIR` or
        `~/tensorflow_datasets`).
      client_key: the feature naming each example's client; 'auto' uses the
        dataset's natural one if it has one (`user`, `client_id`, ...), else
        a partitioner; 'none' always partitions.
      train_split: the split of the training clients (TFDS split syntax).
      test_split: the split of the test clients (natural clients: the test
        split's own clients; partitioned: see `test`).
      min_examples: natural clients with fewer examples are dropped.
      **partition: the `jaxfl.data.PartitionOptions`,
        used without a client key.

    Returns:
      The `FederatedDataset` (memory-mapped from the cache).
    """
    root = Path(data_dir).expanduser() if data_dir is not None else default_tfds_data_dir()
    min_examples = check_int("min_examples", min_examples)
    check_partition_keywords(partition, "tfds_dataset")
    info = tfds_info(name, root)
    where = f"tfds:{info.full_name} in {info.dataset_dir}"
    label = info.label_key
    if label is None:
        raise DataFileError(
            f"{where}: no class-label feature to predict (features: {', '.join(info.features)})"
        )
    key = _client_key(info, client_key)
    options = dict(client_key=key, train_split=train_split, test_split=test_split, min_examples=min_examples)
    if key is None:
        options.update(partition_options(partition, "tfds_dataset"))

    def read(split: str) -> dict[str, np.ndarray]:
        wanted = [f for f in (info.image_key, label, key) if f] if info.image_key else None
        with progress_bar(info.splits.get(split), f"tfds:{info.full_name} {split}") as bar:
            arrays = read_tfds(info.full_name, info.dataset_dir, split, features=wanted, progress=bar).arrays
        data = {"x": _inputs(info, arrays, label, where), "y": arrays[label].astype(np.int32)}
        if key is not None:
            data["client"] = arrays[key]
        return data

    def build(builder):
        train = read(train_split)
        test_data = read(test_split) if (key is not None or options["test"] == "unseen") else None
        metadata = {
            "num_classes": int(info.num_classes or int(train["y"].max()) + 1),
            "input_shape": list(train["x"].shape[1:]),
        }
        if key is None:
            statistics = write_partitioned(builder, train, test_data, options, description=f"tfds:{name}")
            metadata["description"] = f"tfds:{info.full_name}: {partition_summary(options)}"
        else:
            statistics = {
                population: write_population(
                    builder, population, _natural_clients(data, min_examples), total=None,
                    description=f"tfds:{info.full_name} {population} clients",
                    empty_error=f"{where}: no {population} client has {min_examples} examples",
                )  # fmt: skip
                for population, data in (("train", train), ("test", test_data))
            }
            metadata["description"] = f"tfds:{info.full_name}, clients by {key!r}"
        metadata["statistics"] = statistics
        return metadata

    return load_cached(
        f"tfds-{info.name}",
        {"name": info.full_name, **options},
        [info.dataset_dir],
        build,
        converter_version=_CONVERTER_VERSION,
    )
