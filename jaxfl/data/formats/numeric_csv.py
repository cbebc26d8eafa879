"""A plain numeric table: a CSV file with a header row and one label column.

For users whose copy of a regression or classification data set (the
Drug Discovery descriptors, HIV-1 features, or any other) is a CSV: the
first row names the columns, every other row holds numbers (Python's
`float` syntax; no blank cells), one column is the label or target and all
the others are the features, in file order. Comma-separated by default
(`delimiter=`). Export a MATLAB or spreadsheet copy to this shape to run
the experiments on it.
"""

from __future__ import annotations

import csv
import os

import numpy as np

from jaxfl.data.errors import DataFileError
from jaxfl.data.formats._common import require_file

__all__ = ["read_numeric_csv"]


def read_numeric_csv(
    path: str | os.PathLike[str], label_column: str, *, delimiter: str = ","
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Reads the table: x float64 `[n, d]`, y float64 `[n]` and the d feature names.

    Args:
      path: the CSV file.
      label_column: the header name of the label (target) column.
      delimiter: the field separator.

    Raises:
      MissingDataError: no such file.
      DataFileError: no header, no such label column, a row of the wrong
        length or a cell that is not a number (the message names the file,
        the line and the column).
    """
    path = require_file(path)
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f, delimiter=delimiter))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise DataFileError(f"{path}: unreadable as CSV text ({error})") from None
    if not rows or not any(cell.strip() for cell in rows[0]):
        raise DataFileError(f"{path}: empty; expected a header row naming the columns")
    header = [cell.strip() for cell in rows[0]]
    if label_column not in header:
        raise DataFileError(f"{path}: no column {label_column!r} in the header ({', '.join(header[:8])}...)")
    label = header.index(label_column)
    values = np.empty((len(rows) - 1, len(header)), np.float64)
    count = 0
    for number, row in enumerate(rows[1:], 2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise DataFileError(f"{path}:{number}: {len(row)} cells, the header has {len(header)}")
        for column, cell in enumerate(row):
            try:
                values[count, column] = float(cell)
            except ValueError:
                raise DataFileError(
                    f"{path}:{number}: column {header[column]!r} holds {cell[:20]!r}, not a number"
                ) from None
        count += 1
    if count == 0:
        raise DataFileError(f"{path}: no data rows after the header")
    values = values[:count]
    features = [c for c in range(len(header)) if c != label]
    return values[:, features], values[:, label], [header[c] for c in features]
