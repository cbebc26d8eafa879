"""Prepared TensorFlow Datasets (TFDS) directories, read offline without TensorFlow.

`read_tfds("sentiment140", "~/tensorflow_datasets", "train")` returns every
example of a split as NumPy arrays, one per feature; `tfds_info` lists the
splits and features without reading any data. Only datasets already prepared
in the data directory are read: jaxfl never downloads or generates one.

How (checked against the tensorflow-datasets 4.9.10 wheel):

* The dataset is opened from its files alone: the versioned directory
  `<data_dir>/<name>/[<config>/]<version>/` is found here (latest prepared
  version; default config from `.config/metadata.json`, or the only one) and
  opened with `tfds.builder_from_directory`, TFDS's read-only builder, which
  reads `dataset_info.json` and `features.json` and has no download step.
  `tfds.data_source(name, data_dir=..., download=False)` is not used: when
  TFDS ships generation code for the name (e.g. `mnist`) it constructs that
  code builder, whose constructor asks the GCS bucket for metadata when the
  data is missing (`DatasetInfo.initialize_from_bucket`; disabled by default
  in TFDS 4.9.10, a network call where enabled), and TFDS's own file search
  (`builder_from_files`) imports that code to find the default config.
* Records are read through `builder.as_data_source(...)` (random access:
  `array_record`, or `parquet`) as raw bytes, a few thousand at a time with
  `__getitems__`, within one shard at a time so that a read error names its
  shard, and decoded with `features.deserialize_example_np`, TFDS's NumPy
  decoder: protobuf for the `tf.train.Example`, Pillow (or OpenCV when
  installed) for PNG/JPEG `Image` features, zlib for compressed tensors.
* Shards in `tfrecord` (the `tfds build` default) or `riegeli` format have no
  random-access reader, and TFDS reads them only through TensorFlow: they are
  refused with the command that converts them.

Output arrays, per feature (nested `FeaturesDict` features are flattened to
`"outer/inner"` names):

* `Image`: `[N, H, W, C]` of the image dtype (uint8 for PNG/JPEG);
* `ClassLabel`: `[N]` int64;
* `Text`: `[N]` object array of `str` (TFDS stores UTF-8);
* `Tensor`/`Scalar`: `[N, *shape]` of their dtype; string tensors give
  object arrays of `bytes`;
* features whose shape varies between examples (e.g. images of several
  sizes, `Sequence`): an object array of per-example values, unless they all
  happen to have one shape, in which case they are stacked.

Every failure is a one-line `DataFileError` (or `MissingDataError`) naming
the directory or shard and what to do.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxfl.data.errors import DataFileError, MissingDataError

__all__ = [
    "CLIENT_KEY_CANDIDATES",
    "TfdsFeature",
    "TfdsInfo",
    "TfdsSplit",
    "natural_client_key",
    "read_tfds",
    "tfds_info",
]

# Feature names that identify the natural client of an example, most specific
# first: `user` is sentiment140's, `writer`/`writer_id` EMNIST-style, `author`
# reddit-style, `speaker` Shakespeare-style.
CLIENT_KEY_CANDIDATES: tuple[str, ...] = (
    "client_id",
    "user_id",
    "user",
    "writer_id",
    "writer",
    "author_id",
    "author",
    "speaker",
)

# Records per `__getitems__` call: large enough that the per-call overhead
# vanishes, small enough that a chunk of decoded images stays small.
DEFAULT_CHUNK_SIZE = 4096

_INSTALL_HINT = "pip install 'jaxfl[data]' (tensorflow-datasets, array_record, importlib_resources, pillow)"


# ---------------------------------------------------------------------------
# Metadata
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TfdsFeature:
    """One (flattened) feature of a TFDS dataset, from its `features.json`.

    Attributes:
      name: the feature's name; nested features are `"outer/inner"`.
      kind: `"image"`, `"class_label"`, `"text"`, `"tensor"` (also `Scalar`
        and the other `Tensor` subclasses) or `"other"` (`Sequence`, `Video`,
        `Dataset`, ...).
      tfds_class: the TFDS feature class name, e.g. `"Image"`.
      shape: the per-example shape (`None` for a dimension that varies), or
        `None` where TFDS gives no single shape (`Sequence` of a dict).
      dtype: the NumPy dtype name of the arrays `read_tfds` returns (`"str"`
        for `Text`, `"bytes"` for string tensors), or `None` if unknown.
      num_classes: for a `ClassLabel`, the number of classes.
      class_names: for a `ClassLabel`, the class names (`"0"`, `"1"`, ...
        when the dataset gives none).
      encoding: for an `Image`, the declared encoding (`"png"`, `"jpeg"`) or
        `None` when TFDS picks (PNG).
    """

    name: str
    kind: str
    tfds_class: str
    shape: tuple[int | None, ...] | None
    dtype: str | None
    num_classes: int | None = None
    class_names: tuple[str, ...] | None = None
    encoding: str | None = None


@dataclasses.dataclass(frozen=True)
class TfdsInfo:
    """What a prepared TFDS dataset holds, from its metadata alone.

    Attributes:
      name: the dataset name, e.g. `"sentiment140"`.
      config: the builder config found (`None` for a dataset without configs).
      version: the version found, e.g. `"1.0.0"`.
      dataset_dir: the versioned directory holding the files.
      file_format: the format the reader uses, or the prepared one when none
        is readable (`"array_record"`, `"tfrecord"`, ...).
      file_formats: every format the shards are available in.
      splits: split name -> number of examples.
      features: flattened feature name -> `TfdsFeature`, in name order.
      supervised_keys: `(input, target)` feature names when the dataset
        declares them, else `None`.
    """

    name: str
    config: str | None
    version: str
    dataset_dir: Path
    file_format: str
    file_formats: tuple[str, ...]
    splits: Mapping[str, int]
    features: Mapping[str, TfdsFeature]
    supervised_keys: tuple[str, str] | None = None

    @property
    def full_name(self) -> str:
        """`name[/config]:version`, the form TFDS names accept."""
        config = f"/{self.config}" if self.config else ""
        return f"{self.name}{config}:{self.version}"

    @property
    def random_access(self) -> bool:
        """Whether some available format can be read without TensorFlow."""
        return any(f in _RANDOM_ACCESS_FORMATS for f in self.file_formats)

    @property
    def class_label_keys(self) -> tuple[str, ...]:
        return tuple(n for n, f in self.features.items() if f.kind == "class_label")

    @property
    def image_keys(self) -> tuple[str, ...]:
        return tuple(n for n, f in self.features.items() if f.kind == "image")

    @property
    def label_key(self) -> str | None:
        """The class-label feature: the supervised target if it is a `ClassLabel`,
        else one named `label`, else the first `ClassLabel`; `None` if there is none.
        """
        keys = self.class_label_keys
        if self.supervised_keys and self.supervised_keys[1] in keys:
            return self.supervised_keys[1]
        if "label" in keys:
            return "label"
        return keys[0] if keys else None

    @property
    def num_classes(self) -> int | None:
        """`num_classes` of `label_key`, or `None`."""
        key = self.label_key
        return None if key is None else self.features[key].num_classes

    @property
    def image_key(self) -> str | None:
        """The image feature: the supervised input if it is an `Image`, else the
        first `Image`; `None` if there is none.
        """
        keys = self.image_keys
        if self.supervised_keys and self.supervised_keys[0] in keys:
            return self.supervised_keys[0]
        return keys[0] if keys else None

    @property
    def image_shape(self) -> tuple[int | None, ...] | None:
        """`[H, W, C]` of `image_key` (`None` for a varying dimension), or `None`."""
        key = self.image_key
        return None if key is None else self.features[key].shape

    @property
    def client_key(self) -> str | None:
        """`natural_client_key(self)`."""
        return natural_client_key(self)


@dataclasses.dataclass(frozen=True)
class TfdsSplit:
    """All examples of one split, as NumPy arrays per feature.

    Attributes:
      info: the dataset's metadata.
      split: the split as requested (e.g. `"train"` or `"train[:10%]"`).
      arrays: feature name -> array with the `num_examples` examples on axis 0.
      num_examples: the number of examples read.
    """

    info: TfdsInfo
    split: str
    arrays: Mapping[str, np.ndarray]
    num_examples: int

    def __post_init__(self):
        for name, array in self.arrays.items():
            if len(array) != self.num_examples:
                raise ValueError(f"feature {name!r} has {len(array)} examples, not {self.num_examples}")

    @property
    def feature_names(self) -> tuple[str, ...]:
        return tuple(self.arrays)

    def __len__(self) -> int:
        return self.num_examples

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]


def natural_client_key(info: TfdsInfo | TfdsSplit) -> str | None:
    """The feature naming each example's natural client, if the dataset has one.

    A feature qualifies when its name (or, for a nested feature, its last
    component) is one of `CLIENT_KEY_CANDIDATES`, case-insensitively, and it
    holds one text, string or integer value per example: `user` in
    `sentiment140`, `client_id`, `user_id`, `writer`, ...

    Args:
      info: the metadata, or a split read with `read_tfds`.

    Returns:
      The feature name, or `None` when no feature names a client.
    """
    if isinstance(info, TfdsSplit):
        info = info.info
    eligible = [f for f in info.features.values() if _is_id_like(f)]
    for candidate in CLIENT_KEY_CANDIDATES:
        for feature in eligible:
            if feature.name.lower() == candidate:
                return feature.name
    for candidate in CLIENT_KEY_CANDIDATES:
        for feature in eligible:
            if feature.name.rsplit("/", 1)[-1].lower() == candidate:
                return feature.name
    return None


def _is_id_like(feature: TfdsFeature) -> bool:
    if feature.shape != () or feature.kind not in ("text", "tensor", "class_label"):
        return False
    return feature.dtype in ("str", "bytes") or (
        feature.dtype is not None and np.issubdtype(np.dtype(feature.dtype), np.integer)
    )


# ---------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------


def tfds_info(name: str, data_dir: str | os.PathLike) -> TfdsInfo:
    """Lists the splits and features of a prepared TFDS dataset without reading data.

    Args:
      name: the TFDS name, optionally with config and version
        (`"name[/config][:version]"`); the latest prepared version is used when
        none is given.
      data_dir: the TFDS data root (holding `<name>/...`), or a versioned
        dataset directory (holding `dataset_info.json`).

    Returns:
      The dataset's metadata. `random_access` says whether `read_tfds` can
      read its shards.

    Raises:
      MissingDataError: the dataset is not prepared in `data_dir`.
      DataFileError: its metadata is unreadable, or TFDS is not installed.
    """
    return _describe(*_open_builder(name, data_dir))


def read_tfds(
    name: str,
    data_dir: str | os.PathLike,
    split: str,
    *,
    features: Sequence[str] | None = None,
    progress: Any = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> TfdsSplit:
    """Reads every example of a split of a prepared TFDS dataset into NumPy arrays.

    Nothing is downloaded or generated, and TensorFlow is not used: the
    dataset must be prepared in a random-access format (`array_record`, or
    `parquet`).

    Args:
      name: the TFDS name, optionally `"name[/config][:version]"`.
      data_dir: the TFDS data root, or a versioned dataset directory.
      split: a split name, or a TFDS split slice such as `"train[:10%]"`.
      features: the (flattened) feature names to return; default all. Others
        are not decoded, which also skips features that cannot be decoded
        without TensorFlow.
      progress: `None`, a tqdm-like object (its `update(n)` is called with
        the records read so far in each chunk), or a callable
        `progress(done, total)`.
      chunk_size: records per read call.

    Returns:
      The split's arrays (see the module docstring for the dtypes) and the
      dataset's metadata.

    Raises:
      MissingDataError: the dataset or one of the split's shards is absent.
      DataFileError: unknown split or feature, a format without random
        access, a truncated or corrupt shard, or a feature that cannot be
        decoded without TensorFlow.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    tfds = _import_tfds()
    builder, formats = _open_builder(name, data_dir)
    info = _describe(builder, formats)
    where = f"TFDS dataset '{info.full_name}' in {info.dataset_dir}"
    if not info.random_access:
        raise DataFileError(_no_random_access_message(info, Path(data_dir).expanduser()))
    selected = _select_features(info, features, where)
    num_examples, bounds = _split_shards(builder, info, split, where)
    for path, _, _ in bounds:
        if not Path(path).is_file():
            raise MissingDataError(
                f"TFDS shard {path} is missing ({len(bounds)} shard(s) listed for split '{split}' of "
                f"{where}); copy the whole dataset directory again or prepare it again"
            )

    decoders = _decoders(tfds, builder, selected)
    columns = {n: _Column(info.features[n], num_examples) for n in selected}
    deserialize = builder.info.features.deserialize_example_np
    done = 0
    with _quiet_opencv_notice(), _data_source(tfds, builder, split, where) as source:
        for path, start, stop in _chunks(bounds, chunk_size):
            records = _read_records(source, start, stop, path)
            for offset, record in enumerate(records):
                index = start + offset
                try:
                    example = deserialize(record, decoders=decoders)
                except Exception as err:  # diagnosed and re-raised below.
                    raise _decode_error(tfds, builder, record, selected, index, path, err) from err
                for feature_name, column in columns.items():
                    column.put(index, _lookup(example, feature_name), path)
            done += stop - start
            _report(progress, stop - start, done, num_examples)
    arrays = {n: c.finish() for n, c in columns.items()}
    return TfdsSplit(info=info, split=split, arrays=arrays, num_examples=num_examples)


# ---------------------------------------------------------------------------
# Opening the builder
# ---------------------------------------------------------------------------

_RANDOM_ACCESS_FORMATS = ("array_record", "parquet")


def _import_tfds():
    try:
        import tensorflow_datasets as tfds  # optional dependency, imported on use.
    except ImportError as err:
        raise DataFileError(f"reading TFDS datasets needs tensorflow-datasets: {_INSTALL_HINT}") from err
    return tfds


def _open_builder(name: str, data_dir: str | os.PathLike) -> tuple[Any, tuple[str, ...]]:
    """The read-only builder of `name` in `data_dir`, and the formats of its shards.

    Never a dataset's code builder. The formats are every one the shards are
    available in, the main one first.
    """
    tfds = _import_tfds()
    root = Path(data_dir).expanduser()
    base, config, version = _parse_name(name) if name else ("", None, None)
    if not root.is_dir():
        raise MissingDataError(f"TFDS data directory {root} does not exist; {_prepare_hint(base, root)}")
    if (root / "dataset_info.json").is_file():
        # A versioned dataset directory, e.g. `~/tensorflow_datasets/mnist/3.0.1`.
        dataset_dir = root
    elif not base:
        raise DataFileError(f"no TFDS dataset name given, and {root} is not a versioned dataset directory")
    else:
        dataset_dir = _find_dataset_dir(root, name, base, config, version)
    try:
        builder = tfds.builder_from_directory(os.fspath(dataset_dir))
        # A dataset converted in place (`tfds convert_format`) keeps its first
        # format as the main one and lists the new one as an alternative:
        # switch to the readable one now, as `as_data_source` would later, so
        # that the split's file names are those of the shards read. (Passing
        # `file_format=` to `builder_from_directory` fails in TFDS 4.9.10: the
        # info's format is already set.)
        main = builder.info.file_format
        formats = [main.value] if main is not None else []
        formats += sorted(f.value for f in builder.info.available_file_formats())
        formats = tuple(dict.fromkeys(formats))
        readable = [f for f in _RANDOM_ACCESS_FORMATS if f in formats]
        if readable and (main is None or main.value not in _RANDOM_ACCESS_FORMATS):
            builder.info.set_file_format(readable[0], override=True, override_if_initialized=True)
    except Exception as err:  # any failure here is unreadable metadata.
        raise DataFileError(f"cannot read the TFDS metadata in {dataset_dir}: {_one_line(err)}") from err
    if base and base != builder.info.name:
        raise DataFileError(
            f"{dataset_dir} holds TFDS dataset '{builder.info.name}', not '{base}'; "
            "pass its data root or the right dataset name"
        )
    return builder, formats


def _parse_name(name: str) -> tuple[str, str | None, str | None]:
    """`"name[/config][:version]"` -> `(name, config, version)`."""
    from tensorflow_datasets.core import naming

    try:
        parsed, kwargs = naming.parse_builder_name_kwargs(name)
    except Exception as err:  # TFDS raises several types for a malformed name.
        raise DataFileError(f"invalid TFDS dataset name '{name}': {_one_line(err)}") from err
    if parsed.namespace:
        # Namespaced names (community, huggingface:, kaggle:) resolve through
        # registries on the network.
        raise DataFileError(
            f"TFDS dataset '{name}' names a namespace ('{parsed.namespace}'); jaxfl reads only datasets "
            "prepared in a local data directory: give the dataset's own name"
        )
    extra = set(kwargs) - {"config", "version"}
    if extra:
        raise DataFileError(
            f"TFDS dataset name '{name}' passes builder arguments ({', '.join(sorted(extra))}), which need "
            "the dataset's generation code; jaxfl reads prepared files only: name the config instead"
        )
    config = kwargs.get("config")
    version = kwargs.get("version")
    return parsed.name, (str(config) if config else None), (str(version) if version else None)


def _find_dataset_dir(root: Path, name: str, base: str, config: str | None, version: str | None) -> Path:
    """`<root>/<base>/[<config>/]<version>`, the latest prepared version matching `version`.

    This is TFDS's own search (`read_only_builder.builder_from_files`) without
    its one code lookup: to find the default config, TFDS imports the
    dataset's builder module when TFDS ships one. Here the default config
    comes from the files (`.config/metadata.json`, which `tfds build` writes)
    or from there being a single config.
    """
    dataset_root = root / base
    if not dataset_root.is_dir():
        raise MissingDataError(_not_prepared_message(name, base, root))
    if config is None:
        config = _default_config(dataset_root)
    if config is not None:
        config_dir = dataset_root / config
    elif _versions(dataset_root):
        config_dir = dataset_root
    else:
        configs = sorted(d.name for d in _subdirs(dataset_root) if _versions(d))
        if len(configs) > 1:
            raise MissingDataError(
                f"TFDS dataset '{base}' in {root} is prepared in several configs ({', '.join(configs)}) "
                f"and none is marked default: name one, e.g. '{base}/{configs[0]}'"
            )
        if not configs:
            raise MissingDataError(_not_prepared_message(name, base, root))
        config_dir = dataset_root / configs[0]
    versions = _versions(config_dir)
    if version is not None:
        try:
            versions = [v for v in versions if v.match(version)]
        except Exception as err:  # e.g. `experimental_latest`, which needs code.
            raise DataFileError(f"invalid TFDS version '{version}' in '{name}': {_one_line(err)}") from err
    if not versions:
        raise MissingDataError(_not_prepared_message(name, base, root))
    return config_dir / str(versions[-1])


def _default_config(dataset_root: Path) -> str | None:
    metadata = dataset_root / ".config" / "metadata.json"
    if not metadata.is_file():
        return None
    try:
        return json.loads(metadata.read_text()).get("default_config_name") or None
    except (OSError, ValueError, AttributeError) as err:
        raise DataFileError(f"cannot read {metadata}: {_one_line(err)}") from err


def _subdirs(path: Path) -> list[Path]:
    try:
        return [p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        return []


def _versions(config_dir: Path) -> list:
    """The sorted versions prepared in `config_dir` (with both metadata files)."""
    from tensorflow_datasets.core.utils.version import Version

    versions = [
        Version(d.name)
        for d in _subdirs(config_dir)
        if Version.is_valid(d.name)
        and (d / "dataset_info.json").is_file()
        and (d / "features.json").is_file()
    ]
    return sorted(versions)


def _prepare_hint(base: str, root: Path) -> str:
    dataset = base or "NAME"
    return (
        f"jaxfl never downloads: prepare it with `tfds build {dataset} --data_dir {root} "
        "--file_format=array_record` (or download_and_prepare) on a machine with network, "
        "then copy the data directory here"
    )


def _not_prepared_message(name: str, base: str, root: Path) -> str:
    dataset_root = root / base
    found = ""
    entries = sorted(p.name for p in _subdirs(dataset_root))
    if entries:
        found = f"; {dataset_root} holds: {', '.join(entries)}"
    return (
        f"TFDS dataset '{name}' is not prepared in {root} (searched {dataset_root}/[<config>/]<version>/ "
        f"for dataset_info.json and features.json{found}); {_prepare_hint(base, root)}"
    )


def _no_random_access_message(info: TfdsInfo, data_dir: Path) -> str:
    formats = ", ".join(info.file_formats) or "an unknown format"
    root = data_dir
    if (data_dir / "dataset_info.json").is_file():  # Given the versioned directory itself.
        root = info.dataset_dir.parents[1 if info.config is None else 2]
    return (
        f"TFDS dataset '{info.full_name}' in {info.dataset_dir} is prepared as {formats} only; reading it "
        "without TensorFlow needs random access, i.e. array_record shards: rebuild it with "
        f"`tfds build {info.name} --data_dir {root} --file_format=array_record` or convert it with "
        f"`tfds convert_format --dataset_version_dir={info.dataset_dir} --out_file_format=array_record` "
        "(both on a machine with TensorFlow)"
    )


# ---------------------------------------------------------------------------
# Metadata from the builder
# ---------------------------------------------------------------------------


def _describe(builder, formats: tuple[str, ...]) -> TfdsInfo:
    info = builder.info
    features = dict(sorted(_flat_features(builder.info.features, "")))
    readable = [f for f in _RANDOM_ACCESS_FORMATS if f in formats]
    supervised = info.supervised_keys
    if not (
        isinstance(supervised, tuple) and len(supervised) == 2 and all(isinstance(k, str) for k in supervised)
    ):
        supervised = None  # Nested supervised keys are not used here.
    return TfdsInfo(
        name=info.name,
        config=info.config_name or None,
        version=str(info.version),
        dataset_dir=Path(os.fspath(builder.data_dir)),
        file_format=readable[0] if readable else (formats[0] if formats else "unknown"),
        file_formats=formats,
        splits={name: int(split.num_examples) for name, split in info.splits.items()},
        features=features,
        supervised_keys=supervised,
    )


def _flat_features(feature, prefix: str) -> Iterator[tuple[str, TfdsFeature]]:
    from tensorflow_datasets.core import features as tfds_features

    if isinstance(feature, tfds_features.FeaturesDict):
        for key, child in feature.items():
            yield from _flat_features(child, f"{prefix}{key}/")
        return
    name = prefix.rstrip("/")
    yield name, _feature_spec(name, feature, tfds_features)


def _feature_spec(name: str, feature, tfds_features) -> TfdsFeature:
    # Never touch `feature.dtype`: it converts to a TensorFlow dtype and so
    # imports TensorFlow. `np_dtype` is the NumPy one.
    shape = getattr(feature, "shape", None)
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else None
    np_dtype = getattr(feature, "np_dtype", None)
    try:
        dtype = np.dtype(np_dtype) if np_dtype is not None else None
    except TypeError:  # A nested structure of dtypes (e.g. `Sequence` of a dict).
        dtype = None
    dtype_name = None if dtype is None else ("bytes" if dtype == np.object_ else dtype.name)
    tfds_class = type(feature).__name__
    if isinstance(feature, tfds_features.Image):
        return TfdsFeature(
            name, "image", tfds_class, shape, dtype_name, encoding=getattr(feature, "encoding_format", None)
        )
    if isinstance(feature, tfds_features.ClassLabel):
        names = feature.names if feature.num_classes is not None else None
        return TfdsFeature(
            name,
            "class_label",
            tfds_class,
            (),
            "int64",
            num_classes=feature.num_classes,
            class_names=None if names is None else tuple(names),
        )
    if isinstance(feature, tfds_features.Text):
        # A Text feature with a (legacy) encoder stores token ids, not text.
        if getattr(feature, "encoder", None) is None:
            return TfdsFeature(name, "text", tfds_class, (), "str")
        return TfdsFeature(name, "tensor", tfds_class, shape, dtype_name)
    if isinstance(feature, tfds_features.Tensor):
        return TfdsFeature(name, "tensor", tfds_class, shape, dtype_name)
    return TfdsFeature(name, "other", tfds_class, shape, dtype_name)


def _select_features(info: TfdsInfo, features: Sequence[str] | None, where: str) -> list[str]:
    if features is None:
        return list(info.features)
    if isinstance(features, str):
        features = [features]
    unknown = [f for f in features if f not in info.features]
    if unknown:
        raise DataFileError(
            f"{where} has no feature {', '.join(repr(f) for f in unknown)}; "
            f"features: {', '.join(info.features)}"
        )
    return list(dict.fromkeys(features))


def _split_shards(builder, info: TfdsInfo, split: str, where: str):
    """The number of examples of `split` and its `(shard path, start, stop)` ranges."""
    available = ", ".join(f"{name} ({count} examples)" for name, count in info.splits.items())
    # A split may be a slice (`train[:10%]`) or a union (`train+test`).
    unknown = [
        p for p in (part.split("[", 1)[0].strip() for part in split.split("+")) if p not in info.splits
    ]
    if unknown:
        raise DataFileError(f"{where} has no split '{split}'; available splits: {available or 'none'}")
    try:
        split_info = builder.info.splits[split]
        instructions = split_info.file_instructions
    except Exception as err:  # TFDS raises several types for a malformed slice.
        raise DataFileError(
            f"invalid split '{split}' for {where}: {_one_line(err)}; available splits: {available}"
        ) from err
    bounds = []
    start = 0
    for instruction in instructions:
        take = instruction.take if instruction.take >= 0 else instruction.examples_in_shard - instruction.skip
        bounds.append((os.fspath(instruction.filename), start, start + take))
        start += take
    return start, bounds


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def _data_source(tfds, builder, split: str, where: str):
    try:
        source = builder.as_data_source(
            split=split, deserialize_method=tfds.decode.DeserializeMethod.RAW_BYTES
        )
    except Exception as err:  # e.g. a parquet shard that does not open.
        raise DataFileError(f"cannot open split '{split}' of {where}: {_one_line(err)}") from err
    try:
        yield source
    finally:
        # ArrayRecord keeps one open reader per shard read; close them now
        # rather than whenever the source is garbage-collected.
        # A reader that hit a corrupt chunk raises again on close; the read
        # error is the one to report, and the garbage collector closes the rest.
        inner = getattr(source, "data_source", None)
        if hasattr(inner, "__exit__"):
            with contextlib.suppress(Exception):
                inner.__exit__(None, None, None)


def _chunks(bounds, chunk_size: int):
    # Chunks never cross a shard boundary, so that a read error names its shard.
    for path, start, stop in bounds:
        for chunk_start in range(start, stop, chunk_size):
            yield path, chunk_start, min(chunk_start + chunk_size, stop)


def _read_records(source, start: int, stop: int, path: str) -> list:
    try:
        records = source.__getitems__(list(range(start, stop)))
    except Exception as err:  # array_record raises RuntimeError, others OSError/ValueError.
        raise DataFileError(
            f"TFDS shard {path} is truncated or corrupt ({_one_line(err)}); prepare or copy the dataset again"
        ) from err
    if len(records) != stop - start:
        raise DataFileError(
            f"TFDS shard {path} is truncated: {len(records)} of {stop - start} records read; "
            "prepare or copy the dataset again"
        )
    return records


def _decoders(tfds, builder, selected: list[str]) -> dict | None:
    """Skips decoding of the top-level features that were not asked for."""
    wanted = {name.split("/", 1)[0] for name in selected}
    skipped = {key: tfds.decode.SkipDecoding() for key in builder.info.features.keys() if key not in wanted}
    return skipped or None


def _lookup(example: Mapping[str, Any], name: str) -> Any:
    value: Any = example
    for part in name.split("/"):
        value = value[part]
    return value


def _decode_error(tfds, builder, record, selected, index: int, path: str, err: Exception) -> DataFileError:
    """Names the feature that failed to decode (one decode per feature of one record)."""
    deserialize = builder.info.features.deserialize_example_np
    top_level = list(builder.info.features.keys())
    try:
        deserialize(record, decoders={key: tfds.decode.SkipDecoding() for key in top_level})
    except Exception as parse_err:
        return DataFileError(
            f"record {index} of TFDS shard {path} is not a valid example ({_one_line(parse_err)}); "
            "the shard is corrupt: prepare or copy the dataset again"
        )
    culprit, cause = None, err
    for key in dict.fromkeys(name.split("/", 1)[0] for name in selected):
        try:
            deserialize(record, decoders={k: tfds.decode.SkipDecoding() for k in top_level if k != key})
        except Exception as feature_err:
            culprit, cause = key, feature_err
            break
    feature = (
        f"feature '{culprit}' ({type(builder.info.features[culprit]).__name__})" if culprit else "a feature"
    )
    if isinstance(cause, ImportError):
        missing = getattr(cause, "name", None) or ""
        if missing.startswith("tensorflow"):
            fix = "it needs TensorFlow, which jaxfl does not use: leave it out with features=[...]"
        else:
            fix = f"{_one_line(cause)}; {_INSTALL_HINT}"
    else:
        fix = f"{_one_line(cause)}; leave it out with features=[...] if it is not needed"
    return DataFileError(f"cannot decode {feature} of record {index} in TFDS shard {path}: {fix}")


class _Column:
    """Collects one feature's values, into a preallocated array where the shape is fixed."""

    def __init__(self, spec: TfdsFeature, num_examples: int):
        self.spec = spec
        self.fixed = (
            spec.shape is not None
            and all(d is not None for d in spec.shape)
            and spec.dtype is not None
            and spec.kind != "other"
        )
        if spec.dtype in ("str", "bytes"):
            self.array = np.empty((num_examples, *(spec.shape or ())), dtype=object) if self.fixed else None
        elif self.fixed:
            self.array = np.empty((num_examples, *spec.shape), dtype=np.dtype(spec.dtype))
        else:
            self.array = None
        self.values: list = [] if self.array is None else None

    def put(self, index: int, value: Any, path: str) -> None:
        if self.spec.dtype == "str" and isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataFileError(
                    f"text feature '{self.spec.name}' of record {index} in TFDS shard {path} is not UTF-8 "
                    f"({err.reason} at byte {err.start})"
                ) from err
        if self.array is None:
            self.values.append(value)
            return
        # Checked, not left to NumPy: assignment would broadcast a (1,) value
        # into a (3,) slot without complaint.
        got = np.shape(value)
        if got != self.spec.shape:
            raise DataFileError(
                f"feature '{self.spec.name}' of record {index} in TFDS shard {path} has shape {got}, "
                f"but the dataset's features.json says {self.spec.shape}"
            )
        self.array[index] = value

    def finish(self) -> np.ndarray:
        if self.array is not None:
            return self.array
        values = [np.asarray(v) if not isinstance(v, (str, bytes, dict)) else v for v in self.values]
        arrays = [v for v in values if isinstance(v, np.ndarray)]
        if len(arrays) == len(values) and values and len({(a.shape, a.dtype) for a in arrays}) == 1:
            return np.stack(arrays)
        out = np.empty(len(values), dtype=object)
        for i, value in enumerate(values):
            out[i] = value
        return out


def _report(progress, chunk: int, done: int, total: int) -> None:
    if progress is None:
        return
    if hasattr(progress, "update"):
        progress.update(chunk)
    else:
        progress(done, total)


class _DropOpenCvNotice(logging.Filter):
    # TFDS logs "OpenCV is not installed ... Defaulting to PIL" once when it
    # decodes an image with Pillow; Pillow is the decoder jaxfl expects, so the
    # notice is noise for a CLI user.
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("OpenCV is not installed")


@contextlib.contextmanager
def _quiet_opencv_notice():
    logger = logging.getLogger("absl")
    notice_filter = _DropOpenCvNotice()
    logger.addFilter(notice_filter)
    try:
        yield
    finally:
        logger.removeFilter(notice_filter)


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    text = text or type(err).__name__
    return text if len(text) <= 300 else text[:297] + "..."
