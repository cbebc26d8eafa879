"""SHA-256 of data files, and the published checksums of the files researchers download.

`verify_published` hashes a file whose name is in `PUBLISHED_SHA256` and
refuses it if the hash is not one of the values published for that name, so
that a truncated download or a different release is caught before it is
parsed. Names not in the table are not checked. A name may have several
accepted hashes: MNIST and Fashion-MNIST share file names (hence the table
is keyed by dataset first), and Debian's `dataset-fashion-mnist` package
ships the same IDX data re-compressed, with other hashes.

Every value below is copied exactly from the source named in its comment;
none is abbreviated or inferred.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Mapping
from typing import Any

from jaxfl.data.errors import DataFileError
from jaxfl.data.formats._common import CHUNK_BYTES, one_line, require_file

__all__ = ["PUBLISHED_SHA256", "PublishedHash", "published_datasets", "sha256_file", "verify_published"]


@dataclasses.dataclass(frozen=True)
class PublishedHash:
    """One accepted SHA-256 of a file, and who published it (shown in error messages)."""

    sha256: str
    source: str


def _h(sha256: str, source: str) -> tuple[PublishedHash, ...]:
    return (PublishedHash(sha256, source),)


_TFDS_FMNIST = "tensorflow-datasets fashion_mnist"
_DEBIAN_FMNIST = "Debian dataset-fashion-mnist"

# dataset -> file name -> accepted hashes.
PUBLISHED_SHA256: Mapping[str, Mapping[str, tuple[PublishedHash, ...]]] = {
    "emnist": {
        # TFF emnist.py `load_data` (`file_hash=`), google-parfait/tensorflow-federated
        # tensorflow_federated/python/simulation/datasets/emnist.py @ 0f1518319f23.
        "fed_emnist.tar.bz2": _h(
            "fe1ed5a502cea3a952eb105920bff8cffb32836b5173cb18a57a32c3606f3ea0", "TFF fed_emnist.tar.bz2"
        ),
        "fed_emnist_digitsonly.tar.bz2": _h(
            "55333deb8546765427c385710ca5e7301e16f4ed8b60c1dc5ae224b42bd5b14b",
            "TFF fed_emnist_digitsonly.tar.bz2",
        ),
        # tensorflow-datasets 4.9.10 url_checksums/emnist.txt (NIST's EMNIST IDX archive).
        "gzip.zip": _h(
            "fb9bb67e33772a9cc0b895e4ecf36d2cf35be8b709693c3564cea2a019fcda8e", "tensorflow-datasets emnist"
        ),
    },
    "shakespeare": {
        # TFF shakespeare.py `load_data` (`file_hash=`), same repository and commit as above.
        "shakespeare.tar.bz2": _h(
            "0285be9906cb5f268092eee4edeeacfc2af4574f2941f7cc2f08a321d7f5c707", "TFF shakespeare.tar.bz2"
        ),
    },
    "stackoverflow": {
        # TFF stackoverflow.py `load_data`, `load_word_counts`, `load_tag_counts` (`file_hash=`),
        # same repository and commit as above.
        "stackoverflow.tar.bz2": _h(
            "99eca2f8b8327a09e5fc123979df2d237acbc5e52322f6d86bf523ee47b961a2", "TFF stackoverflow.tar.bz2"
        ),
        "stackoverflow.word_count.tar.bz2": _h(
            "1dc00256d6e527c54b9756d968118378ae14e6692c0b3b6cad470cdd3f0c519c",
            "TFF stackoverflow.word_count.tar.bz2",
        ),
        "stackoverflow.tag_count.tar.bz2": _h(
            "6fe281cec490d9384a290d560072438e7e2b377bbb823876ce7bd6f82696772d",
            "TFF stackoverflow.tag_count.tar.bz2",
        ),
    },
    "cifar100": {
        # TFF cifar100.py `load_data` (`file_hash=`), same repository and commit as above.
        "fed_cifar100.tar.bz2": _h(
            "e8575e22c038ecef1ce6c7d492d7abee7da13b1e1ba9b70a7fc18531ba7590de", "TFF fed_cifar100.tar.bz2"
        ),
        # Keras keras/src/datasets/cifar100.py (`file_hash=`), keras-team/keras @ 69b9ad08a11e;
        # the same value is in pytorch/vision torchvision/prototype/datasets/_builtin/cifar.py.
        "cifar-100-python.tar.gz": _h(
            "85cd44d02ba6437773c5bbd22e183051d648de2e7d6b014e1ef29b855ba677a7",
            "Keras cifar-100-python.tar.gz",
        ),
        # tensorflow-datasets 4.9.10 url_checksums/cifar100.txt.
        "cifar-100-binary.tar.gz": _h(
            "58a81ae192c23a4be8b1804d68e518ed807d710a4eb253b1f2a199162a40d8ec",
            "tensorflow-datasets cifar100",
        ),
    },
    "cifar10": {
        # Keras tensorflow/python/keras/datasets/cifar10.py (`file_hash=`), tensorflow/tensorflow
        # @ 4180f945a78b; the same value is in pytorch/vision's prototype cifar.py.
        "cifar-10-python.tar.gz": _h(
            "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce",
            "Keras cifar-10-python.tar.gz",
        ),
        # tensorflow-datasets 4.9.10 url_checksums/cifar10.txt.
        "cifar-10-binary.tar.gz": _h(
            "c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd",
            "tensorflow-datasets cifar10",
        ),
    },
    "mnist": {
        # tensorflow-datasets 4.9.10 url_checksums/mnist.txt (storage.googleapis.com/cvdf-datasets/mnist).
        "train-images-idx3-ubyte.gz": _h(
            "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609", "tensorflow-datasets mnist"
        ),
        "train-labels-idx1-ubyte.gz": _h(
            "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c", "tensorflow-datasets mnist"
        ),
        "t10k-images-idx3-ubyte.gz": _h(
            "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6", "tensorflow-datasets mnist"
        ),
        "t10k-labels-idx1-ubyte.gz": _h(
            "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6", "tensorflow-datasets mnist"
        ),
    },
    "fashion_mnist": {
        # First of each pair: tensorflow-datasets 4.9.10 url_checksums/fashion_mnist.txt (Zalando's files).
        # Second: Debian bookworm dataset-fashion-mnist 0.0~git20200523.55506a9-1, re-compressed by
        # Debian; computed with sha256sum from /usr/share/datasets/fashion-mnist/ on Debian 12.
        "train-images-idx3-ubyte.gz": (
            PublishedHash("3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84", _TFDS_FMNIST),
            PublishedHash("b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7", _DEBIAN_FMNIST),
        ),
        "train-labels-idx1-ubyte.gz": (
            PublishedHash("a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845", _TFDS_FMNIST),
            PublishedHash("0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056", _DEBIAN_FMNIST),
        ),
        "t10k-images-idx3-ubyte.gz": (
            PublishedHash("346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073", _TFDS_FMNIST),
            PublishedHash("cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa", _DEBIAN_FMNIST),
        ),
        "t10k-labels-idx1-ubyte.gz": (
            PublishedHash("67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5", _TFDS_FMNIST),
            PublishedHash("8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05", _DEBIAN_FMNIST),
        ),
    },
}


def published_datasets() -> list[str]:
    """The dataset keys of `PUBLISHED_SHA256` (`verify_published`'s `dataset`)."""
    return sorted(PUBLISHED_SHA256)


def sha256_file(path: str | os.PathLike[str], progress: Any = None) -> str:
    """The hex SHA-256 of a file, read in 1 MiB chunks.

    Args:
      path: the file.
      progress: an optional tqdm-like object; `update(n)` is called with the
        bytes read (total: the file size).

    Raises:
      DataFileError: the file is missing or unreadable.
    """
    path = require_file(path)
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK_BYTES):
                digest.update(chunk)
                if progress is not None:
                    progress.update(len(chunk))
    except OSError as err:
        raise DataFileError(f"{path}: cannot read ({one_line(err.strerror or err)})") from None
    return digest.hexdigest()


def _normalized(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())


def _dataset_of(what: str) -> str | None:
    """The table's dataset that `what` starts with ("Fashion-MNIST x.gz" -> "fashion_mnist"), if any."""
    text = _normalized(what)
    # Longest first, so that "cifar100" wins over "cifar10" and "fashionmnist" over "mnist".
    for key in sorted(PUBLISHED_SHA256, key=lambda k: -len(_normalized(k))):
        if text.startswith(_normalized(key)):
            return key
    return None


def verify_published(
    path: str | os.PathLike[str], *, what: str, dataset: str | None = None, progress: Any = None
) -> bool:
    """Checks a downloaded file against its published SHA-256, where one is known.

    The file's name selects the entry. MNIST and Fashion-MNIST share file
    names, so the dataset narrows the accepted hashes: `dataset` if given,
    else the dataset `what` starts with ("Fashion-MNIST ...", "MNIST ...",
    "CIFAR-100 ..."), else every dataset's entry for that name.

    Args:
      path: the file, e.g. `fed_emnist.tar.bz2`.
      what: what the file is, for the message, e.g. "Fashion-MNIST train-images-idx3-ubyte.gz".
      dataset: a key of `PUBLISHED_SHA256` ("emnist", "shakespeare",
        "stackoverflow", "cifar10", "cifar100", "mnist", "fashion_mnist").
      progress: passed to `sha256_file`.

    Returns:
      True if the file was hashed and matched; False if its name has no
      published checksum (nothing was checked).

    Raises:
      DataFileError: the hash differs from every accepted value for the name;
        the message names the file, the publishers and `what`.
      ValueError: `dataset` is not a key of the table (a programming error).
    """
    if dataset is not None and dataset not in PUBLISHED_SHA256:
        known = ", ".join(published_datasets())
        raise ValueError(f"unknown dataset {dataset!r} for checksums; known: {known}")
    path = require_file(path)
    dataset = dataset or _dataset_of(what)
    tables = [PUBLISHED_SHA256[dataset]] if dataset else list(PUBLISHED_SHA256.values())
    accepted = [entry for table in tables for entry in table.get(path.name, ())]
    if not accepted:
        return False
    digest = sha256_file(path, progress)
    if any(digest == entry.sha256 for entry in accepted):
        return True
    sources = "; ".join(dict.fromkeys(entry.source for entry in accepted))
    of = "" if what.strip() == sources else f" of {what}"
    raise DataFileError(
        f"{path}: sha256 {digest[:12]}… does not match the published checksum{of} ({sources}) — "
        "the file is corrupt or a different version"
    )
