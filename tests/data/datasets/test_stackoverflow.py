"""`stackoverflow`: TFF HDF5/SQLite[.lzma] and FedJAX SQLite with TFF's word counts, end to end.

The files are written by `tests/data/writers.py` in `tmp_path`; the expected
ids and examples are computed here, post by post, from the tokens written
(FedJAX's id layout: pad 0, bos 1, eos 2, word i of the vocabulary 3 + i,
out of vocabulary V + 3).
"""

from __future__ import annotations

import json
import os

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
    stackoverflow_like,
    write_fedjax_sqlite,
    write_tff_hdf5,
    write_tff_sqlite,
)

from jaxfl.data import load_dataset
from jaxfl.data.datasets import stackoverflow as stackoverflow_module
from jaxfl.data.errors import DataFileError, MissingDataError

FORMATS = ("tff-hdf5", "tff-sqlite", "tff-sqlite-lzma", "fedjax-sqlite")
PAD, BOS, EOS = 0, 1, 2


def make_users(seed: int = 0):
    rng = np.random.default_rng(seed)
    return {
        "train": stackoverflow_like(rng, [3, 1, 4]),
        "held_out": stackoverflow_like(rng, [2, 2]),
        "test": stackoverflow_like(rng, [1, 2]),
    }


def blobs(clients):
    return {cid: [encode_example(e) for e in examples_of(arrays)] for cid, arrays in clients.items()}


def write_stackoverflow(directory, fmt, splits, *, held_out=True):
    directory.mkdir(parents=True, exist_ok=True)
    names = ["train", "test"] + (["held_out"] if held_out else [])
    if fmt == "tff-hdf5":
        for name in names:
            write_tff_hdf5(directory / f"stackoverflow_{name}.h5", splits[name])
        return directory / "stackoverflow_train.h5"
    if fmt.startswith("tff-sqlite"):
        tff_names = {"train": "train", "test": "test", "held_out": "heldout"}
        path = write_tff_sqlite(
            directory / "stackoverflow.sqlite", {tff_names[n]: blobs(splits[n]) for n in names}
        )
        if fmt.endswith("lzma"):
            compressed = compress_lzma(path)
            path.unlink()
            return compressed
        return path
    assert fmt == "fedjax-sqlite"
    for name in names:
        clients = splits[name]
        rows = [(c.encode(), clients[c], None) for c in sorted(clients)]
        write_fedjax_sqlite(directory / f"stackoverflow_{name}.sqlite", rows)
    return directory / "stackoverflow_train.sqlite"


def write_word_count(directory, words):
    """TFF's `stackoverflow.word_count`: `word count` lines, most frequent first."""
    path = directory / "stackoverflow.word_count"
    path.write_text("".join(f"{w} {1000 - i}\n" for i, w in enumerate(words)))
    return path


# The vocabulary file: some words of the data (tok0..tok49) and some that never occur.
WORDS = [f"tok{i}" for i in (7, 3, 12, 40, 0, 25, 33, 18, 9, 41)] + ["numpy", "python"] + [
    f"tok{i}" for i in range(50) if i not in (7, 3, 12, 40, 0, 25, 33, 18, 9, 41)
]


def posts(clients, name):
    return [t.decode() for t in clients[name]["tokens"]]


def ids_of(post, words):
    index = {w: 3 + i for i, w in enumerate(words)}
    return [index.get(w, len(words) + 3) for w in post.split(" ")]


def next_word(client_posts, words, length):
    """Every target of `[bos] + ids + [eos]` with the `length` ids before it, left-padded."""
    xs, ys = [], []
    for post in client_posts:
        stream = [BOS, *ids_of(post, words), EOS]
        for t in range(1, len(stream)):
            context = stream[:t][-length:]
            xs.append([PAD] * (length - len(context)) + context)
            ys.append(stream[t])
    return {"x": np.array(xs, np.int32).reshape(-1, length), "y": np.array(ys, np.int32)}


def sequence(client_posts, words, length):
    xs, ys = [], []
    for post in client_posts:
        ids = ids_of(post, words)
        x = ([BOS] + ids)[:length]
        y = (ids + [EOS])[:length]
        xs.append(x + [PAD] * (length - len(x)))
        ys.append(y + [PAD] * (length - len(y)))
    return {"x": np.array(xs, np.int32), "y": np.array(ys, np.int32)}


def assert_population(population, clients, make, words, length, cap=None):
    assert population.client_names() == sorted(clients)
    got = clients_of(population)
    for name in sorted(clients):
        want = make(posts(clients, name)[:cap], words, length)
        for key in ("x", "y"):
            assert got[name][key].dtype == np.int32
            np.testing.assert_array_equal(got[name][key], want[key], err_msg=f"{name} {key}")


# ---------------------------------------------------------------------------
# Round trips.


@pytest.mark.parametrize("fmt", FORMATS)
def test_next_word_round_trip(tmp_path, fmt):
    splits = make_users()
    write_stackoverflow(tmp_path, fmt, splits)
    write_word_count(tmp_path, WORDS)
    data = load_dataset("stackoverflow", data_dir=tmp_path, vocab_size=20, sequence_length=4)
    words = WORDS[:20]
    assert data.input_vocab_size == data.num_classes == 20 + 4
    assert data.input_shape == (4,)
    assert_population(data.train, splits["train"], next_word, words, 4)
    assert_population(data.test, splits["test"], next_word, words, 4)
    # The held-out clients are the validation population.
    assert data.validation is not None
    assert_population(data.validation, splits["held_out"], next_word, words, 4)
    # One example per token and one for eos, per post.
    for population, clients in ((data.train, splits["train"]), (data.validation, splits["held_out"])):
        want = [sum(len(p.split(" ")) + 1 for p in posts(clients, c)) for c in sorted(clients)]
        np.testing.assert_array_equal(population.counts, want)
    assert "top 20 of stackoverflow.word_count" in data.description


@pytest.mark.parametrize("fmt", FORMATS[1:])
def test_every_format_gives_the_same_dataset(tmp_path, fmt):
    splits = make_users(seed=1)
    write_stackoverflow(tmp_path / "h5", "tff-hdf5", splits)
    write_word_count(tmp_path / "h5", WORDS)
    write_stackoverflow(tmp_path / "other", fmt, splits)
    write_word_count(tmp_path / "other", WORDS)
    for options in ({"vocab_size": 30, "sequence_length": 3}, {"layout": "sequence", "vocab_size": 8}):
        assert_same_dataset(
            load_dataset("stackoverflow", data_dir=tmp_path / "other", **options),
            load_dataset("stackoverflow", data_dir=tmp_path / "h5", **options),
        )


@pytest.mark.parametrize("length", [3, 8])
def test_sequence_layout(tmp_path, length):
    splits = make_users(seed=2)
    write_stackoverflow(tmp_path, "tff-hdf5", splits)
    write_word_count(tmp_path, WORDS)
    data = load_dataset("stackoverflow", data_dir=tmp_path, layout="sequence", vocab_size=15,
                        sequence_length=length)
    assert data.input_shape == (length,)
    assert data.train.features["y"].shape[1:] == (length,)
    assert_population(data.train, splits["train"], sequence, WORDS[:15], length)
    assert_population(data.validation, splits["held_out"], sequence, WORDS[:15], length)
    # One example per post.
    np.testing.assert_array_equal(data.train.counts, [3, 1, 4])


def test_max_examples_per_client_caps_posts(tmp_path):
    splits = make_users(seed=3)
    write_stackoverflow(tmp_path, "tff-sqlite", splits)
    write_word_count(tmp_path, WORDS)
    data = load_dataset("stackoverflow", data_dir=tmp_path, vocab_size=20, sequence_length=4,
                        max_examples_per_client=2)
    assert_population(data.train, splits["train"], next_word, WORDS[:20], 4, cap=2)
    unlimited = load_dataset("stackoverflow", data_dir=tmp_path, vocab_size=20, sequence_length=4,
                             max_examples_per_client=None)
    assert_population(unlimited.train, splits["train"], next_word, WORDS[:20], 4)


def test_vocabulary_counted_over_the_training_clients_without_word_count(tmp_path):
    splits = make_users(seed=4)
    write_stackoverflow(tmp_path, "tff-hdf5", splits)
    counts, first_seen = {}, {}
    for client in sorted(splits["train"]):
        for post in posts(splits["train"], client):
            for word in post.split(" "):
                counts[word] = counts.get(word, 0) + 1
                first_seen.setdefault(word, len(first_seen))
    words = sorted(counts, key=lambda w: (-counts[w], first_seen[w]))[:12]
    data = load_dataset("stackoverflow", data_dir=tmp_path, vocab_size=12, sequence_length=5)
    assert data.input_vocab_size == 12 + 4
    assert "counted over the training clients" in data.description
    assert_population(data.train, splits["train"], next_word, words, 5)
    assert_population(data.test, splits["test"], next_word, words, 5)


def test_held_out_file_is_optional(tmp_path):
    splits = make_users(seed=5)
    write_stackoverflow(tmp_path, "tff-hdf5", splits, held_out=False)
    write_word_count(tmp_path, WORDS)
    data = load_dataset("stackoverflow", data_dir=tmp_path, vocab_size=20)
    assert data.validation is None
    assert_population(data.train, splits["train"], next_word, WORDS[:20], 20)


# ---------------------------------------------------------------------------
# Errors.


def test_empty_data_dir(tmp_path):
    with pytest.raises(MissingDataError) as excinfo:
        load_dataset("stackoverflow", data_dir=tmp_path)
    check_message(excinfo, "stackoverflow", tmp_path, "stackoverflow_{train,held_out,test}.h5",
                  kind=MissingDataError)


def test_no_or_missing_data_dir(tmp_path):
    with pytest.raises(MissingDataError) as excinfo:
        load_dataset("stackoverflow")
    check_message(excinfo, "stackoverflow", "--data-dir", kind=MissingDataError)
    with pytest.raises(MissingDataError) as excinfo:
        load_dataset("stackoverflow", data_dir=tmp_path / "nowhere")
    check_message(excinfo, "stackoverflow", tmp_path / "nowhere", "does not exist", kind=MissingDataError)


@pytest.mark.parametrize("fmt", FORMATS)
def test_truncated_file(tmp_path, fmt):
    path = write_stackoverflow(tmp_path / "data", fmt, make_users())
    assert_truncated_file_refused("stackoverflow", path, 0.5)


@pytest.mark.parametrize("fmt", FORMATS)
def test_file_of_another_format_under_the_expected_name(tmp_path, fmt):
    path = write_stackoverflow(tmp_path, fmt, make_users())
    path.write_text("id,tokens\n1,hello world\n")
    with pytest.raises(DataFileError) as excinfo:
        load_dataset("stackoverflow", data_dir=tmp_path)
    check_message(excinfo, "stackoverflow", path)


@pytest.mark.parametrize(
    "content, word",
    [("tok1 10\ntok2 many\n", "line 2"), ("tok1 10\ntok2 9\n", "fewer than vocab_size=5")],
)
def test_bad_word_count_fails_and_leaves_no_cache_entry(tmp_path, content, word):
    write_stackoverflow(tmp_path, "tff-hdf5", make_users())
    (tmp_path / "stackoverflow.word_count").write_text(content)
    with pytest.raises(DataFileError) as excinfo:
        load_dataset("stackoverflow", data_dir=tmp_path, vocab_size=5)
    check_message(excinfo, "stackoverflow", "stackoverflow.word_count", word)
    assert entries("stackoverflow") == []
    assert_no_staging()
    write_word_count(tmp_path, WORDS)
    assert load_dataset("stackoverflow", data_dir=tmp_path, vocab_size=5).input_vocab_size == 9
    assert len(entries("stackoverflow")) == 1


def test_tokens_feature_missing(tmp_path):
    splits = make_users()
    for split in splits.values():
        for client in split.values():
            client["words"] = client.pop("tokens")
    write_stackoverflow(tmp_path, "tff-hdf5", splits)
    with pytest.raises(DataFileError) as excinfo:
        load_dataset("stackoverflow", data_dir=tmp_path, vocab_size=5)
    check_message(excinfo, "stackoverflow", "stackoverflow_train.h5", "'tokens'")
    assert_no_staging()


@pytest.mark.parametrize(
    "option, value",
    [
        ("vocab_size", 0),
        ("sequence_length", -1),
        ("layout", "bag-of-words"),
        ("max_examples_per_client", 0),
        ("num_tags", 0),
        ("max_words", 0),
    ],
)
def test_bad_option_value(tmp_path, option, value):
    write_stackoverflow(tmp_path, "tff-hdf5", make_users())
    with pytest.raises(ValueError) as excinfo:
        load_dataset("stackoverflow", data_dir=tmp_path, **{option: value})
    check_message(excinfo, "stackoverflow", option, repr(value), kind=ValueError)


# ---------------------------------------------------------------------------
# The cache.


def test_cache_converts_once_per_files_and_options(tmp_path, monkeypatch):
    write_stackoverflow(tmp_path, "fedjax-sqlite", make_users())
    word_count = write_word_count(tmp_path, WORDS)
    calls = conversions(monkeypatch, stackoverflow_module, "next_word_examples")
    first = load_dataset("stackoverflow", data_dir=tmp_path, vocab_size=10)
    converted = len(calls)
    assert converted == 3 + 2 + 2  # One call per client of the three populations.
    (entry,) = entries("stackoverflow")
    again = load_dataset("stackoverflow", data_dir=tmp_path, vocab_size=10)
    assert len(calls) == converted and entries("stackoverflow") == [entry]
    assert_same_dataset(again, first)
    load_dataset("stackoverflow", data_dir=tmp_path, vocab_size=11)
    assert len(calls) == 2 * converted and len(entries("stackoverflow")) == 2
    # The vocabulary file is a source too.
    newer = word_count.stat().st_mtime_ns + 10**9
    os.utime(word_count, ns=(newer, newer))
    load_dataset("stackoverflow", data_dir=tmp_path, vocab_size=10)
    assert len(calls) == 3 * converted and len(entries("stackoverflow")) == 3
    assert_no_staging()


# ---------------------------------------------------------------------------
# Layout 'tags' (Reddi et al.'s StackOverflow tag prediction).

TAG_COUNTS = {"python": 50, "java": 40, "c++": 40, "numpy": 30, "never-used": 20, "rare-tag": 1}
TAG_POOL = ["python", "java", "c++", "numpy", "rare-tag", "unlisted"]


def tagged_users(seed: int):
    """`make_users` with titles of data words (irregular spaces, tabs) and tags drawn from TAG_POOL."""
    rng = np.random.default_rng(seed)
    splits = make_users(seed)
    for clients in splits.values():
        for client in clients.values():
            n = len(client["tokens"])
            titles, tags = [], []
            for j in range(n):
                words = [f"tok{int(t)}" for t in rng.integers(0, 60, int(rng.integers(0, 5)))]
                titles.append(("  " if j % 2 else "\t").join(words + ["?"]))
                chosen = rng.choice(TAG_POOL, int(rng.integers(0, 4)), replace=False)
                tags.append("|".join(chosen))
            client["title"] = np.array([t.encode() for t in titles], dtype=object)
            client["tags"] = np.array([t.encode() for t in tags], dtype=object)
    return splits


def write_tag_count(directory, counts=TAG_COUNTS):
    """TFF's `stackoverflow.tag_count`: a JSON object {tag: count}."""
    path = directory / "stackoverflow.tag_count"
    path.write_text(json.dumps(counts))
    return path


def tag_examples(clients, name, words, num_tags, max_words):
    """x: ids of title words then token words, truncated, padded with 0; y: multi-hot of the top tags."""
    top = sorted(TAG_COUNTS, key=lambda t: -TAG_COUNTS[t])[:num_tags]
    xs, ys = [], []
    client = clients[name]
    for tokens, title, tags in zip(client["tokens"], client["title"], client["tags"], strict=True):
        ids = ids_of(" ".join(title.decode().split() + tokens.decode().split()), words)[:max_words]
        xs.append(ids + [PAD] * (max_words - len(ids)))
        ys.append([int(t in tags.decode().split("|")) for t in top])
    return {"x": np.array(xs, np.int32), "y": np.array(ys, np.uint8)}


@pytest.mark.parametrize("fmt", FORMATS)
def test_tags_round_trip(tmp_path, fmt):
    splits = tagged_users(seed=6)
    write_stackoverflow(tmp_path, fmt, splits)
    write_word_count(tmp_path, WORDS)
    write_tag_count(tmp_path)
    data = load_dataset("stackoverflow", data_dir=tmp_path, layout="tags", vocab_size=20, num_tags=4)
    assert data.num_classes == 4 and data.input_shape == (128,) and data.input_vocab_size == 24
    assert data.excluded_target_ids == ()
    for population, name in ((data.train, "train"), (data.test, "test"), (data.validation, "held_out")):
        clients = splits[name]
        assert population.client_names() == sorted(clients)
        got = clients_of(population)
        for client in sorted(clients):
            want = tag_examples(clients, client, WORDS[:20], 4, 128)
            for key in ("x", "y"):
                assert got[client][key].dtype == want[key].dtype
                np.testing.assert_array_equal(got[client][key], want[key], err_msg=f"{client} {key}")
    assert "0 of 8 training posts longer" in data.description
    assert "4 most used tags of stackoverflow.tag_count" in data.description


def test_tags_truncate_long_posts_and_cap_posts(tmp_path):
    splits = tagged_users(seed=7)
    write_stackoverflow(tmp_path, "tff-hdf5", splits)
    write_word_count(tmp_path, WORDS)
    write_tag_count(tmp_path)
    data = load_dataset(
        "stackoverflow", data_dir=tmp_path, layout="tags", vocab_size=30, num_tags=6, max_words=6,
        max_examples_per_client=2,
    )
    assert data.input_shape == (6,) and data.num_classes == 6
    got = clients_of(data.train)
    longer = 0
    for client in sorted(splits["train"]):
        want = tag_examples(splits["train"], client, WORDS[:30], 6, 6)
        for key in ("x", "y"):
            np.testing.assert_array_equal(got[client][key], want[key][:2], err_msg=f"{client} {key}")
        arrays = splits["train"][client]
        for tokens, title in zip(arrays["tokens"][:2], arrays["title"][:2], strict=True):
            longer += len(title.split() + tokens.split()) > 6
    assert longer > 0
    assert f"{longer} of {int(data.train.counts.sum())} training posts longer" in data.description


def test_tags_need_the_tag_count_file(tmp_path):
    write_stackoverflow(tmp_path, "tff-hdf5", tagged_users(seed=8))
    write_word_count(tmp_path, WORDS)
    with pytest.raises(MissingDataError) as excinfo:
        load_dataset("stackoverflow", data_dir=tmp_path, layout="tags", vocab_size=20)
    check_message(excinfo, "stackoverflow", "stackoverflow.tag_count", tmp_path, kind=MissingDataError)
    assert entries("stackoverflow") == []
    (tmp_path / "stackoverflow.tag_count").write_text("python 12\n")
    with pytest.raises(DataFileError) as excinfo:
        load_dataset("stackoverflow", data_dir=tmp_path, layout="tags", vocab_size=20)
    check_message(excinfo, "stackoverflow", "stackoverflow.tag_count", "not JSON")
    assert_no_staging()
