"""Test-only writer of a tiny *prepared* TFDS dataset, built without TensorFlow.

`write_tiny_tfds(data_dir)` runs a `tfds.core.GeneratorBasedBuilder` defined
here (`jaxfl_tiny`, version 1.0.0) with `file_format="array_record"` and
returns the examples it wrote, so a test can compare a reader's output with
them exactly. The builder is local: nothing is downloaded and no TFDS code for
a real dataset is involved.

Features (the ones `jaxfl.data.formats.tfds_source` must handle):

* `image`: `tfds.features.Image(shape=(8, 8, 1))`, uint8. TFDS encodes an image
  given as a NumPy array with `tf.image.encode_png`, which needs TensorFlow;
  given *bytes* it stores them as they are. So the images are PNG-encoded here
  by `png_gray8`, a few lines of `zlib`, which is also independent of the
  Pillow decoder the reader uses: the round trip checks a real PNG decode.
  Only 8-bit grayscale PNG is written; RGB, 16-bit, float32 (which TFDS
  bit-casts to 4-channel PNG) and JPEG images are not covered.
* `label`: `tfds.features.ClassLabel(num_classes=3)`.
* `text`: `tfds.features.Text()`, UTF-8 (some examples are not ASCII).
* `user`: `tfds.features.Text()`, the natural client (as in sentiment140).
* `score`: `tfds.features.Scalar(np.float32)`.
* `embedding`: `tfds.features.Tensor(shape=(3,), dtype=np.float32)`.

`DatasetInfo(disable_shuffling=True)` keeps the records in generation order, so
the reader's output can be compared element by element.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import tensorflow_datasets as tfds

NAME = "jaxfl_tiny"
VERSION = "1.0.0"
NUM_CLASSES = 3
IMAGE_SHAPE = (8, 8, 1)
USERS = ("alice", "bob", "chloé", "dmitri")


def png_gray8(image: np.ndarray) -> bytes:
    """Encodes an [H, W] or [H, W, 1] uint8 array as an 8-bit grayscale PNG."""
    pixels = np.ascontiguousarray(image.reshape(image.shape[0], image.shape[1]), dtype=np.uint8)
    height, width = pixels.shape

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return (
            struct.pack(">I", len(payload))
            + kind
            + payload
            + struct.pack(">I", zlib.crc32(kind + payload) & 0xFFFFFFFF)
        )

    # Bit depth 8, colour type 0 (grayscale), deflate, adaptive filtering,
    # no interlace; every scanline uses filter type 0 (None).
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    raw = b"".join(b"\x00" + row.tobytes() for row in pixels)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def make_examples(num: int, seed: int) -> dict[str, np.ndarray]:
    """The examples of one split, feature by feature, from a seeded RNG."""
    rng = np.random.default_rng(seed)
    return {
        "image": rng.integers(0, 256, size=(num, *IMAGE_SHAPE), dtype=np.uint8),
        "label": rng.integers(0, NUM_CLASSES, size=num).astype(np.int64),
        "text": np.array(
            [f"example {i} of seed {seed}: {'é' * int(rng.integers(0, 3))}" for i in range(num)],
            dtype=object,
        ),
        "user": np.array([USERS[int(u)] for u in rng.integers(0, len(USERS), size=num)], dtype=object),
        "score": rng.normal(size=num).astype(np.float32),
        "embedding": rng.normal(size=(num, 3)).astype(np.float32),
    }


class JaxflTiny(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """A tiny federated dataset; `skip_registration` keeps it out of TFDS's registry.

    Left unregistered, a reader can only find it through its files, which is
    the situation of a user's prepared dataset.
    """

    VERSION = tfds.core.Version(VERSION)

    def __init__(self, *, splits: dict[str, dict[str, np.ndarray]], **kwargs):
        self._splits = splits
        super().__init__(**kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
        # `DatasetInfo` directly rather than `dataset_info_from_configs`: the
        # latter reads metadata files next to the builder's module.
        return tfds.core.DatasetInfo(
            builder=self,
            description="jaxfl test fixture",
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Image(shape=IMAGE_SHAPE),
                    "label": tfds.features.ClassLabel(num_classes=NUM_CLASSES),
                    "text": tfds.features.Text(),
                    "user": tfds.features.Text(),
                    "score": tfds.features.Scalar(dtype=np.float32),
                    "embedding": tfds.features.Tensor(shape=(3,), dtype=np.float32),
                }
            ),
            supervised_keys=("image", "label"),
            disable_shuffling=True,
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # Nothing to download.
        return {name: self._generate_examples(arrays) for name, arrays in self._splits.items()}

    def _generate_examples(self, arrays):
        for i in range(len(arrays["label"])):
            yield (
                i,
                {
                    "image": png_gray8(arrays["image"][i]),
                    "label": int(arrays["label"][i]),
                    "text": arrays["text"][i],
                    "user": arrays["user"][i],
                    "score": arrays["score"][i],
                    "embedding": arrays["embedding"][i],
                },
            )


@dataclasses.dataclass(frozen=True)
class TinyTfds:
    """What `write_tiny_tfds` wrote.

    Attributes:
      data_dir: the TFDS data root (`<data_dir>/jaxfl_tiny/1.0.0/` holds the files).
      dataset_dir: the versioned dataset directory.
      splits: split name -> feature name -> the arrays written.
    """

    data_dir: Path
    dataset_dir: Path
    splits: dict[str, dict[str, np.ndarray]]


def write_tiny_tfds(
    data_dir: str | Path,
    *,
    sizes: dict[str, int] | None = None,
    num_shards: int | None = None,
    seed: int = 0,
) -> TinyTfds:
    """Prepares `jaxfl_tiny` in `data_dir` (array_record, no TensorFlow, no network).

    Args:
      data_dir: the TFDS data root to write into.
      sizes: split name -> number of examples (default train 23, test 9).
      num_shards: shards per split (TFDS's default puts a tiny split in one).
      seed: seeds the examples; split k uses `seed + k`.

    Returns:
      The paths and the examples written.
    """
    sizes = {"train": 23, "test": 9} if sizes is None else sizes
    splits = {name: make_examples(num, seed + k) for k, (name, num) in enumerate(sizes.items())}
    builder = JaxflTiny(splits=splits, data_dir=str(data_dir), file_format="array_record")
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(try_download_gcs=False, num_shards=num_shards)
    )
    return TinyTfds(data_dir=Path(data_dir), dataset_dir=Path(builder.data_dir), splits=splits)


def fake_tfrecord_only(dataset_dir: Path) -> None:
    """Turns a written dataset into one that says it is prepared as tfrecord only.

    Writing real TFRecord shards through TFDS needs TensorFlow. The reader
    decides from `dataset_info.json` (its `fileFormat`) and the shard names
    alone, before it opens any shard, so relabelling the metadata and renaming
    the shards reproduces what it sees for a `tfds build` default (tfrecord)
    dataset; the shard contents stay array_record and are never read.
    """
    info_path = dataset_dir / "dataset_info.json"
    info = json.loads(info_path.read_text())
    info["fileFormat"] = "tfrecord"
    info.pop("alternativeFileFormats", None)
    info_path.write_text(json.dumps(info, indent=2))
    for shard in dataset_dir.glob(f"{NAME}-*.array_record-*"):
        shard.rename(shard.with_name(shard.name.replace(".array_record-", ".tfrecord-")))


def fake_converted_from_tfrecord(dataset_dir: Path) -> None:
    """Makes a written dataset look prepared as tfrecord, then converted in place.

    `tfds convert_format` without `--out_dir` adds the new format to
    `alternativeFileFormats` and leaves `fileFormat` (and the old shards) as
    they were. The "tfrecord shards" written here are junk: a reader that
    opened them instead of the array_record ones would fail.
    """
    info_path = dataset_dir / "dataset_info.json"
    info = json.loads(info_path.read_text())
    info["fileFormat"] = "tfrecord"
    info["alternativeFileFormats"] = ["array_record"]
    info_path.write_text(json.dumps(info, indent=2))
    for shard in dataset_dir.glob(f"{NAME}-*.array_record-*"):
        shard.with_name(shard.name.replace(".array_record-", ".tfrecord-")).write_bytes(b"not a tfrecord")
