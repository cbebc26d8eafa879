"""EMNIST by writer (TFF, FedJAX) and FEMNIST (LEAF): 28x28 characters, one client per writer.

Inputs are float32 `[28, 28, 1]` pixels in [0, 1] and labels int32: 0-9
digits, 10-35 upper-case, 36-61 lower-case letters (62 classes; 10 with
`only_digits`). Pixel convention: TFF and LEAF store 1.0 for the background
(white) and 0.0 for ink, the inverse of MNIST; `pixels='tff'` keeps that,
`pixels='inverted'` gives `1 - pixels` as FedJAX's preprocessing does
(google/fedjax `fedjax/datasets/emnist.py`).

Files recognized in `--data-dir` (readers in `jaxfl.data.formats`):

* TFF HDF5: `fed_emnist_{train,test}.h5`, `fed_emnist_digitsonly_{train,test}.h5`;
* TFF SQLite: `emnist_all.sqlite[.lzma]` (splits `all_*`, `digits_only_*`);
* FedJAX SQLite: `federated_emnist_{train,test}.sqlite`,
  `federated_emnist_digitsonly_{train,test}.sqlite`;
* LEAF (`femnist`): a `data/femnist/data` directory with `train/` and
  `test/` JSON (or `all_data/`, split here).

The published train/test split is kept: each writer's examples are split
between the two (TFF: 3,400 writers, 671,585 / 77,483 examples; digits:
3,383 writers, 341,873 / 40,832).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from jaxfl.data.datasets.common import (
    ClientSource,
    check_data_dir,
    find_tff_sources,
    held_out_split_point,
    load_cached,
    missing,
    split_clients_by_name,
    take_first,
    write_sources,
)
from jaxfl.data.errors import DataFileError
from jaxfl.data.formats.leaf_json import find_leaf_splits, iter_leaf_users
from jaxfl.data.population import FederatedDataset
from jaxfl.validation import check_choice, check_fraction, check_int

_CONVERTER_VERSION = 1
PIXELS = ("tff", "inverted")


def _emnist_sources(data_dir: Path, only_digits: bool) -> tuple[str, dict[str, ClientSource]]:
    """The format found in `data_dir` and its train/test client sources."""
    kind = "digitsonly_" if only_digits else ""
    prefix = "digits_only" if only_digits else "all"
    found = find_tff_sources(
        data_dir,
        {population: f"fed_emnist_{kind}{population}.h5" for population in ("train", "test")},
        ["emnist_all.sqlite", "emnist_all.sqlite.lzma"],
        {population: f"{prefix}_{population}" for population in ("train", "test")},
        {population: f"federated_emnist_{kind}{population}.sqlite" for population in ("train", "test")},
    )
    if found is None:
        wanted = (
            f"fed_emnist_{kind}{{train,test}}.h5, emnist_all.sqlite[.lzma] or "
            f"federated_emnist_{kind}{{train,test}}.sqlite"
        )
        raise missing("emnist", wanted, [data_dir])
    return found


def _pixels(raw: np.ndarray, convention: str, where: str) -> np.ndarray:
    pixels = np.asarray(raw, np.float32)
    if pixels.ndim == 2 and pixels.shape[1] == 784:
        pixels = pixels.reshape(-1, 28, 28)
    if pixels.shape[1:] != (28, 28):
        raise DataFileError(f"{where}: pixels of shape {pixels.shape[1:]}, expected 28x28 (or 784)")
    if convention == "inverted":
        pixels = 1.0 - pixels
    return pixels[..., None].astype(np.float32)


def _featurize(features: dict, convention: str, num_classes: int, where: str) -> dict[str, np.ndarray]:
    try:
        pixels, labels = features["pixels"], features["label"]
    except KeyError as error:
        raise DataFileError(
            f"{where}: no feature {error.args[0]!r} (features: {', '.join(features)})"
        ) from None
    labels = np.asarray(labels).reshape(-1).astype(np.int32)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise DataFileError(f"{where}: labels outside [0, {num_classes})")
    return {"x": _pixels(pixels, convention, where), "y": labels}


def emnist(
    *,
    data_dir: str | None = None,
    only_digits: bool = False,
    pixels: str = "tff",
    max_examples_per_client: int | None = None,
) -> FederatedDataset:
    """Federated EMNIST from TFF or FedJAX files (one client per writer).

    Args:
      data_dir: where the files are (required: no EMNIST file ships with a
        package).
      only_digits: the digits-only version (10 classes, 3,383 writers).
      pixels: 'tff' (1.0 = background, as stored) or 'inverted' (1 - pixels,
        as FedJAX preprocesses).
      max_examples_per_client: keep each writer's first examples only.

    Returns:
      The `FederatedDataset` (memory-mapped from the cache); the test
      clients are the training writers' published held-out examples.
    """
    check_choice("pixels", pixels, PIXELS)
    if not isinstance(only_digits, bool):
        raise ValueError(f"only_digits must be true or false, got {only_digits!r}")
    cap = check_int("max_examples_per_client", max_examples_per_client, optional=True)
    directory = check_data_dir(data_dir, "emnist")
    if directory is None:
        raise missing("emnist", "EMNIST files", "(no --data-dir given; EMNIST ships with no package)")
    source_format, sources = _emnist_sources(directory, only_digits)
    num_classes = 10 if only_digits else 62
    options = {"only_digits": only_digits, "pixels": pixels, "max_examples_per_client": cap}

    def build(builder):
        def featurize(raw, where):
            return take_first(_featurize(raw, pixels, num_classes, where), cap)

        statistics = write_sources(builder, sources, featurize, "emnist")
        return {
            "num_classes": num_classes,
            "input_shape": [28, 28, 1],
            "description": (
                f"EMNIST{' digits' if only_digits else ''} by writer ({source_format}, "
                f"{sources['train'].path.parent}), pixels {pixels}"
            ),
            "statistics": statistics,
            "format": source_format,
        }

    return load_cached(
        "emnist", options, [s.path for s in sources.values()], build, converter_version=_CONVERTER_VERSION
    )


def _leaf_writers(path: Path, pixels: str):
    """(writer, examples) of a LEAF femnist JSON file."""
    for user, record, _ in iter_leaf_users(path):
        features = {"pixels": np.asarray(record["x"], np.float32), "label": np.asarray(record["y"])}
        yield user, _featurize(features, pixels, 62, f"{path}: {user}")


def _write_published(builder, splits: dict[str, Path], pixels: str, min_examples: int) -> None:
    """LEAF's own train/test writers, filtered by `min_examples`."""
    train_writer = builder.population("train")
    kept, seen = set(), set()
    for user, features in _leaf_writers(splits["train"], pixels):
        seen.add(user)
        if len(features["y"]) >= min_examples:
            train_writer.add(user, features)
            kept.add(user)
    test_writer = builder.population("test")
    for user, features in _leaf_writers(splits["test"], pixels):
        # A writer of both splits (LEAF's `-t sample`) follows its training part; one
        # only in test (LEAF's `-t user`, unseen in training) needs min_examples itself.
        enough = user in kept if user in seen else len(features["y"]) >= min_examples
        if enough and len(features["y"]):
            test_writer.add(user, features)


def _merged_writers(splits: dict[str, Path], pixels: str, min_examples: int, directory: Path) -> dict:
    """Every writer with `min_examples` examples, its examples of all files in one array each."""
    merged: dict[str, list[dict]] = {}
    for path in splits.values():
        for user, features in _leaf_writers(path, pixels):
            merged.setdefault(user, []).append(features)
    users = {u: {k: np.concatenate([f[k] for f in parts]) for k in parts[0]} for u, parts in merged.items()}
    users = {u: f for u, f in users.items() if len(f["y"]) >= min_examples}
    if not users:
        raise DataFileError(f"{directory}: no writer has {min_examples} examples")
    return users


def _write_resplit(builder, users: dict, split: str, test_fraction: float, seed: int) -> None:
    """Split 'users' (held-out writers) or 'examples' (each writer's last examples held out)."""
    train_writer, test_writer = builder.population("train"), builder.population("test")
    if split == "users":
        held = split_clients_by_name(list(users), test_fraction, seed)
        for user in sorted(users):
            (test_writer if user in held else train_writer).add(user, users[user])
        return
    for user in sorted(users):
        features = users[user]
        cut = held_out_split_point(len(features["y"]), test_fraction)
        train_writer.add(user, {k: v[:cut] for k, v in features.items()})
        if cut < len(features["y"]):
            test_writer.add(user, {k: v[cut:] for k, v in features.items()})


def femnist(
    *,
    data_dir: str | None = None,
    pixels: str = "tff",
    min_examples: int = 1,
    split: str = "published",
    test_fraction: float = 0.1,
    seed: int = 0,
) -> FederatedDataset:
    """FEMNIST as LEAF writes it: JSON by writer, 784 floats in [0, 1] (1.0 = background), 62 classes.

    Args:
      data_dir: a LEAF femnist directory (`leaf/data/femnist/data`, or one
        holding `train/` and `test/` or `all_data/`).
      pixels: 'tff' (as stored) or 'inverted'.
      min_examples: drop writers with fewer training examples (LEAF's `-k`;
        the Delta-FL reference uses 100); writers found only in `test/`
        (LEAF's `-t user`) need as many test examples.
      split: 'published' (LEAF's own `train/` and `test/`), 'users' (whole
        writers held out as test clients, LEAF's `-t user`; Delta-FL with
        test_fraction 0.5), or 'examples' (each writer's last test_fraction
        of examples held out, LEAF's `-t sample`).
      test_fraction: share held out by 'users' or 'examples'.
      seed: seed of the 'users' split.
    """
    check_choice("pixels", pixels, PIXELS)
    check_choice("split", split, ("published", "users", "examples"))
    min_examples = check_int("min_examples", min_examples)
    test_fraction = check_fraction("test_fraction", test_fraction)
    seed = check_int("seed", seed, minimum=0)
    directory = check_data_dir(data_dir, "femnist")
    if directory is None:
        raise missing("femnist", "LEAF femnist JSON", "(no --data-dir given; FEMNIST ships with no package)")
    splits = find_leaf_splits(directory)
    if split == "published" and not {"train", "test"} <= set(splits):
        raise ValueError(
            f"{directory} holds unsplit LEAF data (all_data): choose split=users or split=examples"
        )
    options = {
        "pixels": pixels,
        "min_examples": min_examples,
        "split": split,
        "test_fraction": test_fraction,
        "seed": seed,
    }

    def build(builder):
        if split == "published":
            _write_published(builder, splits, pixels, min_examples)
        else:
            users = _merged_writers(splits, pixels, min_examples, directory)
            _write_resplit(builder, users, split, test_fraction, seed)
        return {
            "num_classes": 62,
            "input_shape": [28, 28, 1],
            "description": (
                f"FEMNIST (LEAF JSON, {directory}), split {split}, >= {min_examples} examples per writer"
            ),
        }

    return load_cached("femnist", options, list(splits.values()), build, converter_version=_CONVERTER_VERSION)
