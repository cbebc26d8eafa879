"""HIV-1 protease cleavage sites (Rögnvaldsson et al.), as TERM's code reads them.

The data of Li 2023's variance-reduction and hierarchical TERM experiments
(Section 7.7; 6,590 octamers x 160 features): the UCI Machine Learning
Repository's "HIV-1 protease cleavage" set, four text files that the TERM
code release (github.com/litian96/TERM, `DRO/data/hiv1/raw/` and
`hierarchical/data/hiv1/raw/`) ships as they are:

    746Data.txt  1625Data.txt  impensData.txt  schillingData.txt

Each line is an octamer of one-letter amino-acid codes, a comma and its
label, 1 (cleaved) or -1 (not cleaved), e.g. `SLNLRETN,1`. Blank lines are
skipped. Like TERM's `create_datasets.py` (`data_loader_hiv`), the files of
a folder are read in sorted name order, each octamer becomes 8 one-hot
blocks of 20 (the alphabet `ARNDCQEGHILKMFPSTWYV`, in that order), 160
features, and the label 1 for -1's opposite (cleaved) and 0 otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from jaxfl.data.errors import DataFileError, MissingDataError

__all__ = ["AMINO_ACIDS", "read_hiv1_cleavage"]

AMINO_ACIDS = "ARNDCQEGHILKMFPSTWYV"
_INDEX = {letter: i for i, letter in enumerate(AMINO_ACIDS)}
_EXPECTED = "expected lines of 8 amino-acid letters, a comma and 1 or -1 (e.g. SLNLRETN,1)"


def _read_file(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        lines = path.read_text(encoding="ascii").splitlines()
    except UnicodeDecodeError:
        raise DataFileError(f"{path}: not ASCII text ({_EXPECTED})") from None
    except OSError as error:
        raise DataFileError(f"{path}: unreadable ({error.strerror})") from None
    codes, labels = [], []
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        octamer, _, label = line.partition(",")
        octamer, label = octamer.strip(), label.strip()
        if len(octamer) != 8 or label not in ("1", "-1") or any(c not in _INDEX for c in octamer):
            raise DataFileError(f"{path}:{number}: {line[:40]!r}: {_EXPECTED}")
        codes.append([_INDEX[c] for c in octamer])
        labels.append(label == "1")
    if not codes:
        raise DataFileError(f"{path}: no octamers ({_EXPECTED})")
    one_hot = np.zeros((len(codes), 8 * len(AMINO_ACIDS)), np.uint8)
    columns = np.asarray(codes) + len(AMINO_ACIDS) * np.arange(8)
    one_hot[np.arange(len(codes))[:, None], columns] = 1
    return one_hot, np.asarray(labels, np.int32)


def read_hiv1_cleavage(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Reads one cleavage file, or every `*.txt` file of a folder in name order.

    Returns:
      x uint8 `[n, 160]` (the one-hot octamers), y int32 `[n]` (1 cleaved, 0
      not), and the name of the file each example came from.

    Raises:
      MissingDataError: the path is missing, or a folder holds no `*.txt` file.
      DataFileError: a line is not an octamer and a label (the message names
        the file and the line).
    """
    path = Path(path)
    if not path.exists():
        raise MissingDataError(f"{path}: no such file or directory (expected the HIV-1 cleavage *.txt files)")
    files = sorted(path.glob("*.txt")) if path.is_dir() else [path]
    if not files:
        raise MissingDataError(
            f"{path}: no *.txt file (expected 746Data.txt, 1625Data.txt, impensData.txt, schillingData.txt)"
        )
    parts = [_read_file(f) for f in files]
    sources = [f.name for f, (x, _) in zip(files, parts, strict=True) for _ in range(len(x))]
    return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts]), sources
