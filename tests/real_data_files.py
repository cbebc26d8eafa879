"""Tiny copies of the real data sets the experiment scripts read (`--data-dir`), written in the users'
on-disk formats: MNIST's IDX files, CIFAR-10's python batches, the HIV-1 cleavage text files and the
IMDB aclImdb folder. Every test that uses them writes them under its own tmp_path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from data.writers import write_cifar10_python, write_idx


def write_mnist(directory: Path, rng, train_labels, test_labels) -> Path:
    """The four IDX files (uncompressed: no published checksum applies), random 28x28 digits."""
    directory.mkdir(parents=True, exist_ok=True)
    for stem, labels in (("train", train_labels), ("t10k", test_labels)):
        labels = np.asarray(labels, np.uint8)
        images = rng.integers(0, 256, (len(labels), 28, 28), dtype=np.uint8)
        write_idx(directory / f"{stem}-images-idx3-ubyte", images, gz=False)
        write_idx(directory / f"{stem}-labels-idx1-ubyte", labels, gz=False)
    return directory


def write_cifar10(directory: Path, rng, num_train: int, num_test: int) -> Path:
    """`cifar-10-batches-py/` under `directory`, random images, labels cycling over the 10 classes."""
    images = rng.integers(0, 256, (num_train + num_test, 32, 32, 3), dtype=np.uint8)
    labels = np.arange(num_train + num_test) % 10
    return write_cifar10_python(
        directory, (images[:num_train], labels[:num_train]), (images[num_train:], labels[num_train:])
    )


def write_hiv1(directory: Path, rng, sizes=(("746Data.txt", 120), ("1625Data.txt", 180))) -> Path:
    """HIV-1 cleavage files: random octamers, about one in four cleaved (1), the rest -1."""
    directory.mkdir(parents=True, exist_ok=True)
    letters = np.array(list("ARNDCQEGHILKMFPSTWYV"))
    for name, n in sizes:
        lines = [f"{''.join(rng.choice(letters, 8))},{1 if rng.random() < 0.25 else -1}" for _ in range(n)]
        (directory / name).write_text("\n".join(lines) + "\n")
    return directory


def write_aclimdb(directory: Path, rng, per_folder: int = 12, unsup: int = 6) -> Path:
    """`aclImdb/` with per_folder reviews in each of train/test pos/neg: positive reviews use more "good"
    words, negative ones more "bad" words; unsup reviews mix both."""
    good, bad, neutral = ["great", "loved", "superb"], ["awful", "boring", "worst"], ["film", "the", "plot"]
    root = directory / "aclImdb"
    folders = {"train/pos": (good, 7), "train/neg": (bad, 1), "test/pos": (good, 8), "test/neg": (bad, 2)}
    for folder, (words, rating) in folders.items():
        (root / folder).mkdir(parents=True)
        for i in range(per_folder):
            text = " ".join(rng.choice(words + neutral, 12)) + "<br /><br />The End."
            (root / folder / f"{i}_{rating}.txt").write_text(text)
    (root / "train/unsup").mkdir()
    for i in range(unsup):
        (root / "train/unsup" / f"{i}_0.txt").write_text(" ".join(rng.choice(good + bad + neutral, 12)))
    return root


def write_stackoverflow(
    directory: Path, rng, train_sizes=(6, 5, 7), test_sizes=(4, 3), held_out=(3,)
) -> Path:
    """TFF's HDF5 files (train, held_out, test) with `stackoverflow.word_count` and `.tag_count`."""
    import json

    from data.writers import stackoverflow_like, write_tff_hdf5

    directory.mkdir(parents=True, exist_ok=True)
    for split, sizes in (("train", train_sizes), ("test", test_sizes), ("held_out", held_out)):
        write_tff_hdf5(directory / f"stackoverflow_{split}.h5", stackoverflow_like(rng, sizes))
    words = [f"tok{i}" for i in range(40)]  # tok40-tok49 are out of the vocabulary.
    (directory / "stackoverflow.word_count").write_text(
        "".join(f"{w} {100 - i}\n" for i, w in enumerate(words))
    )
    (directory / "stackoverflow.tag_count").write_text(json.dumps({"python": 9, "c++": 7, "numpy": 5}))
    return directory
