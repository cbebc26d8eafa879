"""`parse_example`: tf.train.Example protos decoded without TensorFlow, against a hand-written encoder."""

import numpy as np
import pytest
from data.writers import (
    cifar100_like,
    encode_example,
    encode_example_parts,
    encode_feature,
    examples_of,
    stackoverflow_like,
)

from jaxfl.data.errors import DataFileError
from jaxfl.data.formats import parse_example

INT64_EDGES = np.array([0, 1, 127, 128, 300, -1, -2, -128, 2**31, -(2**31), 2**63 - 1, -(2**63)], np.int64)


def assert_same(parsed, expected):
    assert parsed.keys() == expected.keys()
    for name, value in expected.items():
        if isinstance(value, list):
            assert parsed[name] == value
        else:
            want = np.asarray(value).reshape(-1)
            want = want.astype(np.float32 if want.dtype.kind == "f" else np.int64)
            assert parsed[name].dtype == want.dtype
            np.testing.assert_array_equal(parsed[name], want)


@pytest.mark.parametrize("packed", [True, False])
def test_round_trip_every_kind(packed):
    rng = np.random.default_rng(0)
    features = {
        "pixels": rng.random(784, dtype=np.float32),
        "label": np.array([61]),
        "big": INT64_EDGES,
        "snippets": ["Ô Roméo, ’tis thee".encode(), b"", b"\x00\xff raw"],
        "naïve name": np.array([np.inf, -0.0, 1e-45], np.float32),
        "empty_ints": np.zeros(0, np.int64),
        "empty_floats": np.zeros(0, np.float32),
        "empty_bytes": [],
    }
    assert_same(parse_example(encode_example(features, packed=packed)), features)


def test_negative_int64_uses_ten_byte_varints():
    blob = encode_example({"score": np.array([-1])})
    assert b"\xff" * 9 + b"\x01" in blob
    assert parse_example(blob)["score"].tolist() == [-1]


def test_cifar_pixels_above_127_are_multi_byte_varints():
    client = cifar100_like(np.random.default_rng(1), [2])["0"]
    for example in examples_of(client):
        parsed = parse_example(encode_example(example))
        assert parsed["image"].shape == (3072,)
        assert_same(parsed, example)


def test_stackoverflow_example_with_negative_score():
    client = next(iter(stackoverflow_like(np.random.default_rng(2), [4]).values()))
    for example in examples_of(client):
        assert_same(parse_example(encode_example(example)), example)


def test_mixed_packed_and_unpacked_chunks_concatenate():
    # A repeated field may arrive partly packed and partly not; both parts count, in order.
    packed = encode_feature(np.array([1, 2]), packed=True)
    unpacked = encode_feature(np.array([3, -4]), packed=False)
    # Two Feature messages for one map key: the later entry replaces the earlier (map semantics).
    blob = encode_example_parts([("a", packed), ("a", unpacked)])
    assert parse_example(blob)["a"].tolist() == [3, -4]
    # Two serialized Features concatenated are one Feature with two int64_lists, which merge.
    blob = encode_example_parts([("b", packed + unpacked)])
    assert parse_example(blob)["b"].tolist() == [1, 2, 3, -4]


def test_empty_blob_is_an_empty_example():
    assert parse_example(b"") == {}


def test_unknown_fields_are_skipped():
    blob = encode_example({"x": np.array([1.5], np.float32)})
    # Field 7 as a varint and field 9 as a 32-bit word, before the real content.
    assert parse_example(b"\x38\x05\x4d\x00\x00\x00\x00" + blob)["x"].tolist() == [1.5]


def test_every_truncation_is_an_error():
    blob = encode_example({"label": np.array([3]), "text": [b"hello"], "f": np.array([0.5, 2.0])})
    for cut in range(1, len(blob)):
        with pytest.raises(DataFileError) as excinfo:
            parse_example(blob[:cut], where="file.sqlite: example 0")
        message = str(excinfo.value)
        assert message.startswith("file.sqlite: example 0: not a valid tf.train.Example")
        assert "\n" not in message


@pytest.mark.parametrize(
    "blob",
    [b"not a proto", b"\xff" * 11, b"\x0a\x05\x0a\x03", b"\x0a\x02\x0a\x00\x0f"],
    ids=["text", "long-varint", "overlong-length", "bad-wire-type"],
)
def test_garbage_is_an_error(blob):
    with pytest.raises(DataFileError, match="emnist_all.sqlite"):
        parse_example(blob, where="emnist_all.sqlite")


def test_not_bytes_is_an_error():
    with pytest.raises(DataFileError, match="expected bytes"):
        parse_example("text")  # type: ignore[arg-type]
