"""`jaxfl.data.formats.tfds_source`: prepared TFDS datasets read offline, without TensorFlow.

The dataset is written by `tests/data/tfds_writer.py` (a local TFDS builder,
array_record, no TensorFlow). What is not covered, and why:

* real TFRecord shards: writing them through TFDS needs TensorFlow. The
  tfrecord-only case is reproduced by relabelling the metadata and renaming
  the shards (`fake_tfrecord_only`), which is all the reader looks at before
  refusing.
* RGB, 16-bit, float32 and JPEG images, `Sequence`/`Video`/`Audio` features
  and the parquet format: not written here.

Every test runs with sockets disabled, so any download or GCS lookup fails
the test immediately instead of hanging for minutes.
"""

from __future__ import annotations

import json
import shutil
import socket
import sys
from pathlib import Path

import numpy as np
import pytest

tfds = pytest.importorskip(
    "tensorflow_datasets", reason="tensorflow-datasets is not installed (the optional `data` extra)"
)
pytest.importorskip("array_record", reason="array_record is not installed (needed for TFDS random access)")
pytest.importorskip("PIL", reason="Pillow is not installed (decodes TFDS Image features without TensorFlow)")
pytest.importorskip(
    "importlib_resources", reason="importlib_resources is not installed (TFDS writes need it)"
)

from data.tfds_writer import (  # noqa: E402
    IMAGE_SHAPE,
    NAME,
    NUM_CLASSES,
    fake_converted_from_tfrecord,
    fake_tfrecord_only,
    png_gray8,
    write_tiny_tfds,
)

from jaxfl.data.errors import DataFileError, MissingDataError  # noqa: E402
from jaxfl.data.formats.tfds_source import (  # noqa: E402
    TfdsFeature,
    TfdsInfo,
    natural_client_key,
    read_tfds,
    tfds_info,
)


class NetworkAttempted(AssertionError):
    pass


def _no_network(*args, **kwargs):
    raise NetworkAttempted(f"network access attempted: {args!r}")


@pytest.fixture(scope="module", autouse=True)
def no_network():
    """Fails any connection or name lookup made by the code under test (module-wide)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", _no_network)
        patch.setattr(socket.socket, "connect_ex", _no_network)
        patch.setattr(socket, "create_connection", _no_network)
        patch.setattr(socket, "getaddrinfo", _no_network)
        yield


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, no_network):
    # Three shards per split so that chunked reads cross shard boundaries.
    tfds.disable_progress_bar()
    return write_tiny_tfds(tmp_path_factory.mktemp("tfds"), num_shards=3, seed=7)


@pytest.fixture
def tiny_copy(tiny, tmp_path):
    """A private copy of the dataset, for tests that damage it."""
    shutil.copytree(tiny.data_dir / NAME, tmp_path / NAME)
    return tmp_path, tmp_path / NAME / "1.0.0"


def test_guard_blocks_sockets():
    with pytest.raises(NetworkAttempted):
        socket.create_connection(("storage.googleapis.com", 443), timeout=1)


@pytest.mark.parametrize("split", ["train", "test"])
@pytest.mark.parametrize("chunk_size", [4, 4096])
def test_round_trip_is_exact(tiny, split, chunk_size):
    data = read_tfds(NAME, tiny.data_dir, split, chunk_size=chunk_size)
    expected = tiny.splits[split]
    assert data.split == split
    assert len(data) == len(expected["label"])
    assert sorted(data.arrays) == sorted(expected)
    for name, want in expected.items():
        got = data[name]
        assert got.shape == want.shape, name
        assert got.dtype == want.dtype, name
        if want.dtype == object:
            assert list(got) == list(want), name
            assert all(type(v) is str for v in got), name
        else:
            np.testing.assert_array_equal(got, want, err_msg=name)


def test_shapes_and_dtypes(tiny):
    data = read_tfds(NAME, tiny.data_dir, "train")
    n = len(tiny.splits["train"]["label"])
    assert data["image"].shape == (n, *IMAGE_SHAPE) and data["image"].dtype == np.uint8
    assert data["label"].dtype == np.int64
    assert data["label"].min() >= 0 and data["label"].max() < NUM_CLASSES
    assert data["score"].shape == (n,) and data["score"].dtype == np.float32
    assert data["embedding"].shape == (n, 3)


def test_versioned_directory(tiny):
    data = read_tfds("", tiny.dataset_dir, "test")
    np.testing.assert_array_equal(data["label"], tiny.splits["test"]["label"])
    assert read_tfds(NAME, tiny.dataset_dir, "test", features=["user"])["user"].tolist() == list(
        tiny.splits["test"]["user"]
    )


def test_version_in_name(tiny):
    data = read_tfds(f"{NAME}:1.0.0", tiny.data_dir, "test", features=["label"])
    np.testing.assert_array_equal(data["label"], tiny.splits["test"]["label"])
    assert len(read_tfds(f"{NAME}:1.*.*", tiny.data_dir, "test", features=["label"])) == 9


def test_split_slices_and_unions(tiny):
    train, test = tiny.splits["train"], tiny.splits["test"]
    head = read_tfds(NAME, tiny.data_dir, "train[:5]", features=["label", "text"])
    np.testing.assert_array_equal(head["label"], train["label"][:5])
    assert head["text"].tolist() == list(train["text"][:5])
    both = read_tfds(NAME, tiny.data_dir, "train+test", features=["label"], chunk_size=5)
    np.testing.assert_array_equal(both["label"], np.concatenate([train["label"], test["label"]]))


def test_feature_subset(tiny):
    data = read_tfds(NAME, tiny.data_dir, "test", features=["user", "label"])
    assert data.feature_names == ("user", "label")
    assert data["user"].tolist() == list(tiny.splits["test"]["user"])


def test_metadata(tiny):
    info = tfds_info(NAME, tiny.data_dir)
    assert info.name == NAME and info.version == "1.0.0" and info.config is None
    assert info.full_name == f"{NAME}:1.0.0"
    assert info.dataset_dir == tiny.dataset_dir
    assert info.file_format == "array_record" and info.random_access
    assert dict(info.splits) == {"train": 23, "test": 9}
    assert list(info.features) == sorted(["image", "label", "text", "user", "score", "embedding"])
    assert info.label_key == "label" and info.num_classes == NUM_CLASSES
    assert info.features["label"].class_names == ("0", "1", "2")
    assert info.image_key == "image" and info.image_shape == IMAGE_SHAPE
    assert info.features["image"].dtype == "uint8"
    assert {n: f.kind for n, f in info.features.items()} == {
        "embedding": "tensor",
        "image": "image",
        "label": "class_label",
        "score": "tensor",
        "text": "text",
        "user": "text",
    }
    assert info.features["embedding"].shape == (3,)
    assert info.supervised_keys == ("image", "label")
    assert read_tfds(NAME, tiny.data_dir, "test", features=["label"]).info == info


def test_natural_client_key(tiny):
    info = tfds_info(NAME, tiny.data_dir)
    assert natural_client_key(info) == "user" == info.client_key
    assert natural_client_key(read_tfds(NAME, tiny.data_dir, "test", features=["label"])) == "user"


def _info_with(*features: TfdsFeature) -> TfdsInfo:
    return TfdsInfo(
        name="x",
        config=None,
        version="1.0.0",
        dataset_dir=Path("/nowhere"),
        file_format="array_record",
        file_formats=("array_record",),
        splits={"train": 1},
        features={f.name: f for f in features},
    )


def test_natural_client_key_candidates():
    text = lambda name: TfdsFeature(name, "text", "Text", (), "str")  # noqa: E731
    assert natural_client_key(_info_with(text("tweet"), text("user"), text("client_id"))) == "client_id"
    assert (
        natural_client_key(_info_with(TfdsFeature("user_id", "tensor", "Tensor", (), "int64"))) == "user_id"
    )
    assert natural_client_key(_info_with(text("meta/Writer"))) == "meta/Writer"
    assert natural_client_key(_info_with(text("text"), text("label"))) is None
    # Not an identifier: an image, a float, a vector.
    assert natural_client_key(_info_with(TfdsFeature("user", "image", "Image", (8, 8, 1), "uint8"))) is None
    assert natural_client_key(_info_with(TfdsFeature("user", "tensor", "Scalar", (), "float32"))) is None
    assert natural_client_key(_info_with(TfdsFeature("user", "tensor", "Tensor", (2,), "int64"))) is None


def test_progress_callback_and_tqdm_like(tiny):
    calls = []
    read_tfds(
        NAME,
        tiny.data_dir,
        "train",
        features=["label"],
        chunk_size=5,
        progress=lambda d, t: calls.append((d, t)),
    )
    assert calls[-1] == (23, 23)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)

    class Bar:
        n = 0

        def update(self, k):
            self.n += k

    bar = Bar()
    read_tfds(NAME, tiny.data_dir, "test", features=["label"], chunk_size=2, progress=bar)
    assert bar.n == 9


def test_png_writer_matches_pillow():
    import io

    from PIL import Image

    image = np.arange(64, dtype=np.uint8).reshape(8, 8, 1) * 3
    decoded = np.asarray(Image.open(io.BytesIO(png_gray8(image))))
    np.testing.assert_array_equal(decoded, image[:, :, 0])


# ---------------------------------------------------------------------------
# Errors: one line each, saying what is wrong and what to do.
# ---------------------------------------------------------------------------


def _one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text, text
    return text


def test_not_prepared(tmp_path):
    with pytest.raises(MissingDataError) as err:
        read_tfds("sentiment140", tmp_path, "train")
    text = _one_line(err)
    assert str(tmp_path / "sentiment140") in text
    assert "never downloads" in text
    assert f"tfds build sentiment140 --data_dir {tmp_path}" in text
    with pytest.raises(MissingDataError, match="not prepared"):
        tfds_info("sentiment140", tmp_path)


def _dataset_code_modules() -> set[str]:
    prefixes = ("tensorflow_datasets.datasets.", "tensorflow_datasets.image_classification.")
    return {m for m in sys.modules if m.startswith(prefixes)}


@pytest.mark.parametrize("name", ["mnist", "sentiment140"])
def test_not_prepared_name_with_tfds_code_stays_offline(tmp_path, name):
    # TFDS ships generation code for these names: `tfds.data_source` would
    # construct that code builder. The reader looks at files only.
    before = _dataset_code_modules()
    with pytest.raises(MissingDataError) as err:
        read_tfds(name, tmp_path, "train")
    assert f"tfds build {name}" in _one_line(err)
    assert _dataset_code_modules() == before


def test_prepared_name_with_tfds_code_is_read_from_files(tiny, tmp_path):
    # The tiny dataset under the name `mnist`: read from its files, without
    # importing TFDS's mnist code (whose features would differ).
    source, target = tiny.dataset_dir, tmp_path / "mnist" / "1.0.0"
    target.mkdir(parents=True)
    for path in source.iterdir():
        (target / path.name.replace(NAME, "mnist")).write_bytes(path.read_bytes())
    info_path = target / "dataset_info.json"
    info_path.write_text(info_path.read_text().replace(f'"name": "{NAME}"', '"name": "mnist"'))
    before = _dataset_code_modules()
    data = read_tfds("mnist", tmp_path, "test")
    assert data.info.full_name == "mnist:1.0.0"
    np.testing.assert_array_equal(data["image"], tiny.splits["test"]["image"])
    assert _dataset_code_modules() == before


def test_missing_data_dir(tmp_path):
    with pytest.raises(MissingDataError) as err:
        read_tfds(NAME, tmp_path / "absent", "train")
    assert "does not exist" in _one_line(err)


def test_wrong_version_or_config(tiny):
    with pytest.raises(MissingDataError) as err:
        read_tfds(f"{NAME}:2.0.0", tiny.data_dir, "train")
    assert "holds: 1.0.0" in _one_line(err)
    with pytest.raises(MissingDataError):
        read_tfds(f"{NAME}/other_config", tiny.data_dir, "train")


def test_name_of_another_dataset_in_versioned_dir(tiny):
    with pytest.raises(DataFileError, match="holds TFDS dataset 'jaxfl_tiny', not 'mnist'") as err:
        read_tfds("mnist", tiny.dataset_dir, "train")
    _one_line(err)


def test_namespaced_name_refused(tmp_path):
    with pytest.raises(DataFileError, match="namespace") as err:
        read_tfds("huggingface:mnist", tmp_path, "train")
    _one_line(err)


def test_unknown_split(tiny):
    with pytest.raises(DataFileError) as err:
        read_tfds(NAME, tiny.data_dir, "validation")
    text = _one_line(err)
    assert "no split 'validation'" in text
    assert "train (23 examples), test (9 examples)" in text


def test_unknown_feature(tiny):
    with pytest.raises(DataFileError, match="no feature 'pixels'") as err:
        read_tfds(NAME, tiny.data_dir, "train", features=["pixels"])
    _one_line(err)


def test_tfrecord_only(tiny_copy):
    data_dir, dataset_dir = tiny_copy
    fake_tfrecord_only(dataset_dir)
    info = tfds_info(NAME, data_dir)  # The metadata stays readable.
    assert info.file_format == "tfrecord" and not info.random_access
    with pytest.raises(DataFileError) as err:
        read_tfds(NAME, data_dir, "train")
    text = _one_line(err)
    assert "tfrecord only" in text and "array_record" in text
    assert f"tfds build {NAME} --data_dir {data_dir} --file_format=array_record" in text
    assert "tfds convert_format" in text


def test_converted_in_place_reads_the_array_record_shards(tiny, tiny_copy):
    data_dir, dataset_dir = tiny_copy
    fake_converted_from_tfrecord(dataset_dir)
    info = tfds_info(NAME, data_dir)
    assert info.file_format == "array_record" and set(info.file_formats) == {"array_record", "tfrecord"}
    data = read_tfds(NAME, data_dir, "train")
    np.testing.assert_array_equal(data["image"], tiny.splits["train"]["image"])
    assert data["text"].tolist() == list(tiny.splits["train"]["text"])


def _shards(dataset_dir: Path, split: str) -> list[Path]:
    return sorted(dataset_dir.glob(f"{NAME}-{split}.array_record-*"))


@pytest.mark.parametrize("keep_bytes", [100, 70_000])
def test_truncated_shard(tiny_copy, keep_bytes):
    data_dir, dataset_dir = tiny_copy
    shard = _shards(dataset_dir, "train")[1]
    shard.write_bytes(shard.read_bytes()[:keep_bytes])
    with pytest.raises(DataFileError) as err:
        read_tfds(NAME, data_dir, "train", chunk_size=5)
    text = _one_line(err)
    assert str(shard) in text and "truncated or corrupt" in text
    # The other split is untouched and still reads.
    assert len(read_tfds(NAME, data_dir, "test")) == 9


def test_corrupt_shard(tiny_copy):
    data_dir, dataset_dir = tiny_copy
    shard = _shards(dataset_dir, "train")[0]
    raw = bytearray(shard.read_bytes())
    for i in range(64, 1024, 7):  # Inside the first chunk of records.
        raw[i] ^= 0xFF
    shard.write_bytes(bytes(raw))
    with pytest.raises(DataFileError) as err:
        read_tfds(NAME, data_dir, "train")
    assert str(shard) in _one_line(err)


def test_missing_shard(tiny_copy):
    data_dir, dataset_dir = tiny_copy
    shard = _shards(dataset_dir, "test")[2]
    shard.unlink()
    with pytest.raises(MissingDataError) as err:
        read_tfds(NAME, data_dir, "test")
    assert str(shard) in _one_line(err)


def test_corrupt_metadata(tiny_copy):
    data_dir, dataset_dir = tiny_copy
    (dataset_dir / "dataset_info.json").write_text("{not json")
    with pytest.raises(DataFileError, match="cannot read the TFDS metadata") as err:
        read_tfds(NAME, data_dir, "train")
    _one_line(err)


def test_undecodable_feature_is_named_and_can_be_left_out(tiny, monkeypatch):
    # Without an image decoder (no Pillow, no OpenCV) the Image feature cannot
    # be decoded without TensorFlow: the error names it, and leaving it out works.
    from tensorflow_datasets.core.features import image_feature

    monkeypatch.setattr(image_feature, "PIL_Image", None)
    monkeypatch.setattr(image_feature, "cv2", None)
    with pytest.raises(DataFileError) as err:
        read_tfds(NAME, tiny.data_dir, "test")
    text = _one_line(err)
    assert "cannot decode feature 'image' (Image)" in text and "pillow" in text
    data = read_tfds(NAME, tiny.data_dir, "test", features=["label", "text"])
    np.testing.assert_array_equal(data["label"], tiny.splits["test"]["label"])


def test_shape_mismatch_is_reported(tiny_copy):
    data_dir, dataset_dir = tiny_copy
    # Declare 4x4 images while the shards hold 8x8 ones.
    features_path = dataset_dir / "features.json"
    features = json.loads(features_path.read_text())
    features["featuresDict"]["features"]["image"]["image"]["shape"]["dimensions"] = ["4", "4", "1"]
    features_path.write_text(json.dumps(features))
    with pytest.raises(
        DataFileError, match=r"has shape \(8, 8, 1\), but the dataset's features.json says"
    ) as err:
        read_tfds(NAME, data_dir, "train", features=["image"])
    _one_line(err)
