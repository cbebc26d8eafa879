"""Decode serialized `tf.train.Example` protos without TensorFlow or protobuf.

TFF's SQLite files (`jaxfl.data.formats.tff_sqlite`) and TFDS shards store one
`tf.train.Example` per record. Its schema (tensorflow/core/example/example.proto
and feature.proto) is small enough to decode with a hand-written reader of the
protobuf wire format:

    Example   { Features features = 1; }
    Features  { map<string, Feature> feature = 1; }   // map entry: key = 1, value = 2
    Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                             Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }
    FloatList { repeated float value = 1 [packed = true]; }
    Int64List { repeated int64 value = 1 [packed = true]; }

Wire format: every field is a varint tag `field_number << 3 | wire_type`;
wire type 0 is a varint, 1 a little-endian 64-bit word, 2 a length-prefixed
byte string (submessages, bytes, packed repeated scalars), 5 a little-endian
32-bit word. A repeated scalar may arrive packed (one wire-type-2 field) or
unpacked (one field per value), and a parser must accept both, in any mix.
An int64 is the varint of its two's-complement uint64, so a negative value
takes 10 bytes. Fields this reader does not know are skipped, as protobuf
parsers do.

Packed floats are read with `np.frombuffer`, and packed varints (CIFAR-100's
3,072 pixels per example) are decoded with vectorized NumPy, not per value.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import numpy as np

from jaxfl.data.errors import DataFileError

__all__ = ["parse_example"]

Feature = np.ndarray | list[bytes]

_WIRE_VARINT, _WIRE_I64, _WIRE_LEN, _WIRE_I32 = 0, 1, 2, 5


class _Malformed(Exception):
    """Internal: the blob is not a valid Example; the message says why."""


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """Reads one varint at `pos`; returns (value, position after it)."""
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise _Malformed(f"truncated varint at byte {pos}")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise _Malformed(f"varint longer than 10 bytes ending at byte {pos}")


def _fields(buf: bytes, pos: int, end: int) -> list[tuple[int, int, int, int]]:
    """Splits a message into (field, wire_type, a, b).

    For a varint, `a` is the value; for fixed-width and length-delimited fields
    `buf[a:b]` is the payload.
    """
    out = []
    while pos < end:
        tag, pos = _varint(buf, pos, end)
        field, wire = tag >> 3, tag & 7
        if field == 0:
            raise _Malformed(f"field number 0 at byte {pos}")
        if wire == _WIRE_VARINT:
            value, pos = _varint(buf, pos, end)
            out.append((field, wire, value, pos))
        elif wire == _WIRE_LEN:
            length, pos = _varint(buf, pos, end)
            if pos + length > end:
                raise _Malformed(f"field {field} claims {length} bytes at byte {pos}, only {end - pos} left")
            out.append((field, wire, pos, pos + length))
            pos += length
        elif wire in (_WIRE_I64, _WIRE_I32):
            width = 8 if wire == _WIRE_I64 else 4
            if pos + width > end:
                raise _Malformed(f"truncated {8 * width}-bit field {field} at byte {pos}")
            out.append((field, wire, pos, pos + width))
            pos += width
        else:
            # 3/4 are the deprecated groups, 6/7 do not exist: neither appears in an Example.
            raise _Malformed(f"unsupported wire type {wire} for field {field} at byte {pos}")
    return out


def _packed_varints(buf: bytes, start: int, end: int) -> np.ndarray:
    """Decodes `buf[start:end]`, a run of varints, into int64 (two's complement)."""
    raw = np.frombuffer(buf, np.uint8, end - start, start)
    if raw.size == 0:
        return np.zeros(0, np.int64)
    more = raw >= 0x80
    if not more.any():
        # Every value below 128 (pixels, labels, ...): one byte each.
        return raw.astype(np.int64)
    if more[-1]:
        raise _Malformed(f"truncated packed varint ending at byte {end}")
    last = np.flatnonzero(~more)
    starts = np.concatenate(([0], last[:-1] + 1))
    lengths = last - starts + 1
    if lengths.max() > 10:
        raise _Malformed(f"varint longer than 10 bytes in the packed field at byte {start}")
    position = np.arange(raw.size) - np.repeat(starts, lengths)
    parts = (raw & 0x7F).astype(np.uint64) << (7 * position).astype(np.uint64)
    # Bits shifted past 64 fall off, which is exactly the uint64 -> int64 wrap
    # that protobuf's 10-byte negative varints rely on.
    return np.bitwise_or.reduceat(parts, starts).view(np.int64)


def _signed64(value: int) -> int:
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def _bytes_list(buf: bytes, start: int, end: int) -> list[bytes]:
    values = []
    for field, wire, a, b in _fields(buf, start, end):
        if field == 1:
            if wire != _WIRE_LEN:
                raise _Malformed(f"bytes_list value with wire type {wire}")
            values.append(buf[a:b])
    return values


def _scalar_chunks(
    buf: bytes,
    start: int,
    end: int,
    kind: str,
    packed: Callable[[int, int], np.ndarray],
    unpacked_wire: int,
    unpacked: Callable[[int], np.ndarray],
) -> list[np.ndarray]:
    """The values of a repeated scalar field 1 (`FloatList`, `Int64List`), one array per wire field, in order.

    A wire-type-2 field is a packed run, decoded by `packed(a, b)`; a field of
    `unpacked_wire` is one value, decoded by `unpacked(a)`; other fields
    numbered 1 are malformed, other numbers are skipped.
    """
    chunks = []
    for field, wire, a, b in _fields(buf, start, end):
        if field != 1:
            continue
        if wire == _WIRE_LEN:
            chunks.append(packed(a, b))
        elif wire == unpacked_wire:
            chunks.append(unpacked(a))
        else:
            raise _Malformed(f"{kind} value with wire type {wire}")
    return chunks


def _float_list(buf: bytes, start: int, end: int) -> np.ndarray:
    def packed(a, b):
        if (b - a) % 4:
            raise _Malformed(f"packed float_list of {b - a} bytes, not a multiple of 4")
        return np.frombuffer(buf, "<f4", (b - a) // 4, a)

    def unpacked(a):
        return np.array(struct.unpack_from("<f", buf, a), "<f4")

    chunks = _scalar_chunks(buf, start, end, "float_list", packed, _WIRE_I32, unpacked)
    if not chunks:
        return np.zeros(0, np.float32)
    # astype copies, so the result owns its memory and is writeable.
    return np.concatenate(chunks).astype(np.float32)


def _int64_list(buf: bytes, start: int, end: int) -> np.ndarray:
    chunks = _scalar_chunks(
        buf,
        start,
        end,
        "int64_list",
        lambda a, b: _packed_varints(buf, a, b),
        _WIRE_VARINT,
        lambda a: np.array([_signed64(a)], np.int64),
    )
    if not chunks:
        return np.zeros(0, np.int64)
    return np.concatenate(chunks) if len(chunks) > 1 else chunks[0].copy()


_KINDS = {1: _bytes_list, 2: _float_list, 3: _int64_list}


def _feature(buf: bytes, start: int, end: int) -> Feature:
    kind = None
    value: Feature = []
    for field, wire, a, b in _fields(buf, start, end):
        if field not in _KINDS:
            continue
        if wire != _WIRE_LEN:
            raise _Malformed(f"Feature field {field} with wire type {wire}")
        part = _KINDS[field](buf, a, b)
        if field == kind:
            # A repeated submessage merges into the earlier one (protobuf rule).
            value = value + part if isinstance(part, list) else np.concatenate([value, part])
        else:
            # Setting another member of a oneof replaces the earlier member.
            kind, value = field, part
    return value


def _parse(buf: bytes) -> dict[str, Feature]:
    result: dict[str, Feature] = {}
    for field, wire, a, b in _fields(buf, 0, len(buf)):
        if field != 1:
            continue
        if wire != _WIRE_LEN:
            raise _Malformed(f"Example.features with wire type {wire}")
        for entry_field, entry_wire, c, d in _fields(buf, a, b):
            if entry_field != 1:
                continue
            if entry_wire != _WIRE_LEN:
                raise _Malformed(f"Features.feature with wire type {entry_wire}")
            key = None
            value: Feature = []
            for kv_field, kv_wire, e, f in _fields(buf, c, d):
                if kv_field in (1, 2) and kv_wire != _WIRE_LEN:
                    raise _Malformed(f"map entry field {kv_field} with wire type {kv_wire}")
                if kv_field == 1:
                    try:
                        key = buf[e:f].decode("utf-8")
                    except UnicodeDecodeError as err:
                        raise _Malformed(f"feature name is not UTF-8 ({err.reason})") from None
                elif kv_field == 2:
                    value = _feature(buf, e, f)
            # A map entry without a key has the empty key (proto3 default).
            result[key if key is not None else ""] = value
    return result


def parse_example(blob: bytes, *, where: str = "tf.train.Example") -> dict[str, Feature]:
    """Decodes one serialized `tf.train.Example`.

    The format is described in this module's docstring; it was checked
    against tensorflow/core/example/{example,feature}.proto and against the
    blobs TFF's `sql_client_data.py` (google-parfait/tensorflow-federated)
    reads.

    Args:
      blob: the serialized proto.
      where: prefix of error messages, e.g. "emnist_all.sqlite: client 'f0000_14'
        example 3", so that they name the file the blob came from.

    Returns:
      Feature name -> value: a float32 array for a float_list, an int64 array
      for an int64_list, a list of bytes for a bytes_list. A Feature with no
      kind set comes back as an empty list.

    Raises:
      DataFileError: the blob is truncated or not an Example.
    """
    if isinstance(blob, (bytearray, memoryview)):
        blob = bytes(blob)
    if not isinstance(blob, bytes):
        raise DataFileError(f"{where}: expected bytes, got {type(blob).__name__}")
    try:
        return _parse(blob)
    except _Malformed as err:
        raise DataFileError(f"{where}: not a valid tf.train.Example ({err})") from None
