"""CIFAR-100 with TFF's federated split (Reddi et al. 2021): 500 training and 100 test clients.

TFF made the clients by a two-level Pachinko allocation of the 50,000
training and 10,000 test images (coarse labels ~ Dir(0.1), fine labels
within ~ Dir(10), 100 images per client; Reddi et al. 2021); jaxfl reads
them as published, from `fed_cifar100_{train,test}.h5` or
`cifar100.sqlite[.lzma]` (splits `train`, `test`; `image` an int64 list of
3,072, `label`, `coarse_label`). Images become float32 `[32, 32, 3]` in
[0, 1].
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from jaxfl.data.datasets.common import (
    ClientSource,
    find_tff_sources,
    load_cached,
    write_sources,
)
from jaxfl.data.errors import DataFileError
from jaxfl.data.population import FederatedDataset

_CONVERTER_VERSION = 1


def find_tff_cifar100(data_dir: Path) -> tuple[str, dict[str, ClientSource]] | None:
    populations = ("train", "test")
    return find_tff_sources(
        data_dir,
        {population: f"fed_cifar100_{population}.h5" for population in populations},
        ["cifar100.sqlite", "cifar100.sqlite.lzma"],
        {population: population for population in populations},
    )


def _featurize(features: dict, label: str, where: str) -> dict[str, np.ndarray]:
    key = "label" if label == "fine" else "coarse_label"
    if "image" not in features or key not in features:
        raise DataFileError(f"{where}: needs features 'image' and {key!r} (has {', '.join(features)})")
    images = np.asarray(features["image"])
    images = images.reshape(images.shape[0], 32, 32, 3)
    if images.size and (images.min() < 0 or images.max() > 255):
        raise DataFileError(f"{where}: pixel values outside [0, 255]")
    return {
        "x": (images.astype(np.float32) / np.float32(255.0)).astype(np.float32),
        "y": np.asarray(features[key]).reshape(-1).astype(np.int32),
    }


def tff_cifar100(data_dir: Path, *, label: str = "fine") -> FederatedDataset:
    """TFF's federated CIFAR-100 (called by `jaxfl.data.datasets.images.cifar100`)."""
    found = find_tff_cifar100(data_dir)
    if found is None:
        raise DataFileError(f"{data_dir}: no TFF CIFAR-100 files")
    source_format, sources = found

    def build(builder):
        statistics = write_sources(
            builder, sources, lambda raw, where: _featurize(raw, label, where), "cifar100"
        )
        return {
            "statistics": statistics,
            "num_classes": 100 if label == "fine" else 20,
            "input_shape": [32, 32, 3],
            "description": f"CIFAR-100 ({label} labels), TFF's federated split ({source_format}, {data_dir})",
            "format": source_format,
        }

    return load_cached(
        "cifar100-tff",
        {"label": label},
        [s.path for s in sources.values()],
        build,
        converter_version=_CONVERTER_VERSION,
    )
