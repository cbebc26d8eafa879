"""`read_aclimdb` and its bag of words on a tiny aclImdb folder written here, against a slow reference
that walks the folder with `glob` and counts words by hand."""

from __future__ import annotations

import re

import numpy as np
import pytest

from jaxfl.data.errors import DataFileError, MissingDataError
from jaxfl.data.formats import read_aclimdb
from jaxfl.data.formats.aclimdb import review_words, top_words, word_ids

REVIEWS = {
    "train/pos": {"3_9": "A great film.<br /><br />I loved it, don't miss it!", "10_7": "great acting"},
    "train/neg": {"2_1": "Awful. The worst film", "11_4": "boring, boring... and DULL"},
    "test/pos": {"0_10": "loved the great cast"},
    "test/neg": {"5_2": "the plot was awful<br />really"},
    "train/unsup": {"7_0": "no label here"},
}


def write_aclimdb(root, reviews=REVIEWS):
    for folder, files in reviews.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (root / folder / f"{name}.txt").write_text(text, encoding="utf-8")
    (root / "imdb.vocab").write_text("the\n")  # Present in the real folder, unused.
    return root


def reference(root, split):
    """(texts, labels, ratings) by a walk of the folder: neg then pos, by numeric id."""
    texts, labels, ratings = [], [], []
    for label, kind in ((0, "neg"), (1, "pos")):
        paths = sorted((root / split / kind).glob("*.txt"), key=lambda p: int(p.stem.split("_")[0]))
        for path in paths:
            texts.append(path.read_bytes().decode("utf-8"))
            labels.append(label)
            ratings.append(int(path.stem.split("_")[1]))
    return texts, labels, ratings


def test_the_reviews_labels_and_ratings_match_a_walk_of_the_folder(tmp_path):
    root = write_aclimdb(tmp_path / "aclImdb")
    for path in (root, tmp_path):  # The folder itself, or the one holding it.
        data = read_aclimdb(path, unsup=True)
        for split in ("train", "test"):
            texts, labels, ratings = reference(root, split)
            assert getattr(data, f"{split}_texts") == texts
            np.testing.assert_array_equal(getattr(data, f"{split}_labels"), labels)
            np.testing.assert_array_equal(getattr(data, f"{split}_ratings"), ratings)
        assert data.unsup_texts == ["no label here"]
    assert read_aclimdb(root).unsup_texts == []
    assert read_aclimdb(root).train_texts[:2] == ["Awful. The worst film", "boring, boring... and DULL"]


def test_the_vocabulary_and_bag_of_words_match_a_count_by_hand(tmp_path):
    data = read_aclimdb(write_aclimdb(tmp_path))
    counts = {}
    for text in data.train_texts:
        for word in (
            text.lower().replace("<br />", " ").replace(",", " ").replace(".", " ").replace("!", " ").split()
        ):
            counts[word] = counts.get(word, 0) + 1
    expected = sorted(counts, key=lambda w: (-counts[w], w))
    assert top_words(data.train_texts, 100) == expected
    assert top_words(data.train_texts, 3) == ["boring", "film", "great"]
    assert review_words("Don't<br />STOP 2night") == ["don't", "stop", "2night"]
    vocabulary = {w: i for i, w in enumerate(top_words(data.train_texts, 5))}
    ids = word_ids(data.test_texts, vocabulary)
    for row, text in zip(ids, data.test_texts, strict=True):
        present = {
            vocabulary[w]
            for w in re.findall(r"[a-z']+", text.lower().replace("<br />", " "))
            if w in vocabulary
        }
        assert set(row[row < 5].tolist()) == present and np.all(row[len(present) :] == 5)


def test_missing_folders_and_bad_files_are_one_line_errors(tmp_path):
    with pytest.raises(MissingDataError, match="no such directory"):
        read_aclimdb(tmp_path / "nowhere")
    root = write_aclimdb(tmp_path / "aclImdb", {k: v for k, v in REVIEWS.items() if k != "test/neg"})
    with pytest.raises(MissingDataError) as excinfo:
        read_aclimdb(root)
    assert "test/neg: missing" in str(excinfo.value) and "\n" not in str(excinfo.value)
    (root / "test/neg").mkdir()
    with pytest.raises(MissingDataError, match="test/neg: no <id>_<rating>.txt reviews"):
        read_aclimdb(root)
    (root / "test/neg/review.txt").write_text("x")
    with pytest.raises(DataFileError, match="review.txt: not named <id>_<rating>.txt"):
        read_aclimdb(root)
    (root / "test/neg/review.txt").unlink()
    (root / "test/neg/1_2.txt").write_bytes(b"\xff\xfe bad")
    with pytest.raises(DataFileError, match="1_2.txt: not UTF-8"):
        read_aclimdb(root)
