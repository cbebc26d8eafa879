"""FedProx/LEAF Synthetic data from their published JSON files, as `--dataset synthetic --data-dir DIR`.

FedProx (`litian96/FedProx : data/synthetic_*`) writes each setting's users to
`data/train/mytrain.json` and `data/test/mytest.json` (90/10 per user; users
`f_00000`, ...), LEAF's Synthetic (`TalwalkarLab/leaf : data/synthetic`) to
`data/{train,test}/*.json` (users "0", "1", ...): `x` lists of floats, `y`
integer classes. The published files were
drawn without a seed, so they differ from `jaxfl.data.synthetic`'s seeded
generator in their bits though not in their law; reading them reproduces a
paper's exact data. Test clients are the users' own held-out examples.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from jaxfl.data.datasets.common import load_cached, size_statistics
from jaxfl.data.errors import DataFileError
from jaxfl.data.formats.leaf_json import find_leaf_splits, iter_leaf_users
from jaxfl.data.population import FederatedDataset

_CONVERTER_VERSION = 1


def leaf_synthetic(data_dir: Path, *, name: str = "synthetic") -> FederatedDataset:
    """The Synthetic dataset in `data_dir` (FedProx's or LEAF's JSON), train and test users as published."""
    splits = find_leaf_splits(data_dir)
    if not {"train", "test"} <= set(splits):
        raise DataFileError(
            f"{data_dir}: needs LEAF's train/ and test/ JSON directories (found {sorted(splits)})"
        )

    def users(path):
        for user, record, _ in iter_leaf_users(path):
            try:
                x = np.asarray(record["x"], np.float32)
                y = np.asarray(record["y"], np.int64)
            except (TypeError, ValueError) as error:
                raise DataFileError(f"{path}: user {user!r}: x must be lists of numbers ({error})") from None
            if x.ndim != 2 or y.ndim != 1:
                raise DataFileError(
                    f"{path}: user {user!r}: x must be a list of equal-length lists of numbers"
                )
            yield user, {"x": x, "y": y}

    def build(builder):
        dims, labels, statistics = set(), [], {}
        for population in ("train", "test"):
            writer = builder.population(population)
            counts = []
            for user, features in users(splits[population]):
                if not len(features["y"]):
                    continue
                if features["y"].min() < 0:
                    raise DataFileError(f"{splits[population]}: user {user!r} has negative labels")
                dims.add(features["x"].shape[1])
                labels.append(int(features["y"].max()))
                writer.add(user, {"x": features["x"], "y": features["y"].astype(np.int32)})
                counts.append(len(features["y"]))
            if not counts:
                raise DataFileError(f"{splits[population]}: no user with examples")
            statistics[population] = size_statistics(np.asarray(counts))
        if len(dims) != 1:
            raise DataFileError(f"{data_dir}: users have inputs of different sizes {sorted(dims)}")
        return {
            "num_classes": max(max(labels) + 1, 2),
            "input_shape": [dims.pop()],
            "description": f"Synthetic (LEAF/FedProx JSON, {data_dir})",
            "statistics": statistics,
            "format": "LEAF JSON",
        }

    return load_cached(f"{name}-json", {}, list(splits.values()), build, converter_version=_CONVERTER_VERSION)
