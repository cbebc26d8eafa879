"""IMDB movie reviews as their authors distribute them (the `aclImdb` folder).

Maas et al. 2011's Large Movie Review Dataset: `aclImdb_v1.tar.gz` from
https://ai.stanford.edu/~amaas/data/sentiment/, extracted to `aclImdb/`:

    aclImdb/train/pos/<id>_<rating>.txt   12,500 reviews rated 7-10 (label 1)
    aclImdb/train/neg/<id>_<rating>.txt   12,500 reviews rated 1-4 (label 0)
    aclImdb/test/pos/, aclImdb/test/neg/  the same for the 25,000 test reviews
    aclImdb/train/unsup/<id>_0.txt        50,000 unlabelled reviews (optional here)

plus `imdb.vocab`, `imdbEr.txt`, `train/labeledBow.feat` and `urls_*.txt`,
which this reader does not need. Each review is one UTF-8 line of text with
HTML line breaks (`<br />`). Reviews are returned in the order of their
numeric id, negative then positive, so that a run is the same on every file
system.

Words (`review_words`): the text lower-cased, `<br />` turned into a space,
and the runs of letters and digits (with inner apostrophes: "don't") taken
in order. `top_words` is the vocabulary of Li 2023's IMDB experiments (the
10,000 most frequent words of the training reviews; ties by the word) and
`word_ids` the bag of words of each review over it.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from jaxfl.data.errors import DataFileError, MissingDataError

__all__ = ["ImdbReviews", "read_aclimdb", "review_words", "top_words", "word_ids"]

_LABELLED = ("train/neg", "train/pos", "test/neg", "test/pos")
_LAYOUT = "aclImdb layout: train/pos, train/neg, test/pos, test/neg of <id>_<rating>.txt reviews"
_FILE_NAME = re.compile(r"(\d+)_(\d+)\.txt")
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z0-9]+)*")


@dataclasses.dataclass(frozen=True)
class ImdbReviews:
    """The reviews of `aclImdb`.

    Attributes:
      train_texts, test_texts: the labelled reviews (25,000 each in the real set).
      train_labels, test_labels: int32, 1 for a positive review (pos/), 0 for a negative one.
      train_ratings, test_ratings: int32, the rating in the file name (1-4 or 7-10).
      unsup_texts: the unlabelled training reviews (`train/unsup`), empty when not read or absent.
    """

    train_texts: list[str]
    train_labels: np.ndarray
    train_ratings: np.ndarray
    test_texts: list[str]
    test_labels: np.ndarray
    test_ratings: np.ndarray
    unsup_texts: list[str]


def _root(path: Path) -> Path:
    if not path.exists():
        raise MissingDataError(f"{path}: no such directory (expected the IMDB aclImdb folder)")
    if not path.is_dir():
        raise DataFileError(f"{path}: is a file; extract aclImdb_v1.tar.gz and give the aclImdb folder")
    if not (path / "train").is_dir() and (path / "aclImdb").is_dir():
        return path / "aclImdb"
    return path


def _reviews(folder: Path) -> tuple[list[str], np.ndarray]:
    """The texts of a folder's reviews in id order, and their ratings."""
    if not folder.is_dir():
        raise MissingDataError(f"{folder}: missing ({_LAYOUT})")
    named = []
    with os.scandir(folder) as entries:
        names = [entry.name for entry in entries]
    for name in names:
        match = _FILE_NAME.fullmatch(name)
        if match is None:
            if name.endswith(".txt"):
                raise DataFileError(f"{folder / name}: not named <id>_<rating>.txt ({_LAYOUT})")
            continue
        named.append((int(match.group(1)), int(match.group(2)), str(folder / name)))
    if not named:
        raise MissingDataError(f"{folder}: no <id>_<rating>.txt reviews ({_LAYOUT})")
    named.sort()
    texts = []
    for _, _, path in named:
        try:
            with open(path, encoding="utf-8") as f:
                texts.append(f.read())
        except UnicodeDecodeError as error:
            raise DataFileError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
        except OSError as error:
            raise DataFileError(f"{path}: unreadable ({error.strerror})") from None
    return texts, np.asarray([rating for _, rating, _ in named], np.int32)


def read_aclimdb(path: str | os.PathLike[str], *, unsup: bool = False) -> ImdbReviews:
    """Reads the labelled (and, with `unsup`, the unlabelled) reviews of an `aclImdb` folder.

    Args:
      path: the `aclImdb` folder, or the folder holding it.
      unsup: also read `train/unsup` (absent: `unsup_texts` is empty).

    Returns:
      `ImdbReviews`.

    Raises:
      MissingDataError: the folder, or one of train/pos, train/neg, test/pos,
        test/neg, is missing or holds no review (the message names it).
      DataFileError: a review file is misnamed, unreadable or not UTF-8.
    """
    root = _root(Path(path))
    parts = {}
    for name in _LABELLED:
        parts[name] = _reviews(root / name)
    splits = {}
    for split in ("train", "test"):
        neg_texts, neg_ratings = parts[f"{split}/neg"]
        pos_texts, pos_ratings = parts[f"{split}/pos"]
        labels = np.concatenate([np.zeros(len(neg_texts), np.int32), np.ones(len(pos_texts), np.int32)])
        splits[split] = (neg_texts + pos_texts, labels, np.concatenate([neg_ratings, pos_ratings]))
    unsup_texts: list[str] = []
    if unsup and (root / "train" / "unsup").is_dir():
        unsup_texts = _reviews(root / "train" / "unsup")[0]
    return ImdbReviews(*splits["train"], *splits["test"], unsup_texts)


def review_words(text: str) -> list[str]:
    """The words of a review (see the module docstring)."""
    return _WORD.findall(text.lower().replace("<br />", " "))


def top_words(texts: Iterable[str], size: int = 10_000) -> list[str]:
    """The `size` most frequent words of `texts` (counting every occurrence), ties by the word."""
    counts = collections.Counter(word for text in texts for word in review_words(text))
    return sorted(counts, key=lambda word: (-counts[word], word))[:size]


def word_ids(texts: Sequence[str], vocabulary: Mapping[str, int]) -> np.ndarray:
    """Each text's distinct vocabulary words as ids, ascending, padded with `len(vocabulary)`.

    Returns:
      int32 `[len(texts), L]`, L the most distinct vocabulary words of a text (at least 1):
      the word-presence bag of words as ids (column `len(vocabulary)` is no word).
    """
    pad = len(vocabulary)
    rows = [sorted({vocabulary[w] for w in review_words(text) if w in vocabulary}) for text in texts]
    ids = np.full((len(rows), max([1, *map(len, rows)])), pad, np.int32)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    return ids
