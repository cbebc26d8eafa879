"""The Drug Discovery (QSAR) regression data as TERM's code release ships it: `qsar.mat`.

The data of Li 2023's robust-regression experiment (Section 7.7.1, Table
7.2; 4,085 molecules x 411 descriptors): `robust_regression/data/qsar.mat`
of the TERM code release (github.com/litian96/TERM), the QSAR set of the
robust-regression benchmark of Bhatia et al. 2015 (*Robust Regression via
Hard Thresholding*), a MATLAB (level 5) file with four matrices:

    X_train [n1, 411], y_train [n1, 1], X_test [n2, 411], y_test [n2, 1]

Like TERM's `create_datasets.py` (`data_loader_drug`), the two parts are
concatenated, train first (the experiment splits them 80/10/10 itself).
MATLAB 7.3 files (HDF5) are not this format; re-save with `-v7`. Reading
needs SciPy (`scipy.io.loadmat`).
"""

from __future__ import annotations

import os

import numpy as np

from jaxfl.data.errors import DataFileError
from jaxfl.data.formats._common import missing_dependency, one_line, require_file

__all__ = ["read_qsar_mat"]

_KEYS = ("X_train", "y_train", "X_test", "y_test")


def read_qsar_mat(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """Reads `qsar.mat`: x float64 `[n, d]` and y float64 `[n]`, train rows then test rows.

    Raises:
      MissingDataError: no such file.
      DataFileError: not a level-5 MATLAB file, a matrix is missing, or the
        shapes disagree (the message names the file and what is wrong).
    """
    path = require_file(path)
    try:
        from scipy import io as scipy_io
    except ImportError:
        raise missing_dependency(path, "a MATLAB file", "scipy") from None
    try:
        data = scipy_io.loadmat(path)
    except NotImplementedError:
        raise DataFileError(f"{path}: a MATLAB 7.3 (HDF5) file; re-save it with -v7 (level 5)") from None
    except Exception as error:  # noqa: BLE001 - scipy raises many kinds for a file that is not MATLAB.
        raise DataFileError(f"{path}: not a MATLAB level-5 file ({one_line(error)})") from None
    absent = [key for key in _KEYS if key not in data]
    if absent:
        raise DataFileError(f"{path}: no {', '.join(absent)} (expected X_train, y_train, X_test, y_test)")
    x = [np.asarray(data[k], np.float64) for k in ("X_train", "X_test")]
    y = [np.asarray(data[k], np.float64).reshape(-1) for k in ("y_train", "y_test")]
    if x[0].ndim != 2 or x[1].ndim != 2 or x[0].shape[1] != x[1].shape[1]:
        raise DataFileError(
            f"{path}: X_train {x[0].shape} and X_test {x[1].shape} are not matrices of equal width"
        )
    for features, targets, name in ((x[0], y[0], "train"), (x[1], y[1], "test")):
        if len(features) != len(targets):
            raise DataFileError(
                f"{path}: X_{name} has {len(features)} rows but y_{name} {len(targets)} values"
            )
    return np.concatenate(x), np.concatenate(y)
