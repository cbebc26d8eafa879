"""The Drug Discovery readers: `read_qsar_mat` on a MATLAB file written by SciPy, and
`read_numeric_csv` against NumPy's `genfromtxt`."""

from __future__ import annotations

import numpy as np
import pytest

from jaxfl.data.errors import DataFileError, MissingDataError
from jaxfl.data.formats import read_numeric_csv, read_qsar_mat


def test_qsar_mat_concatenates_train_then_test_as_term_does(tmp_path):
    scipy_io = pytest.importorskip("scipy.io")
    rng = np.random.default_rng(0)
    parts = {"X_train": rng.random((5, 3)), "y_train": rng.random((5, 1)), "X_test": rng.random((2, 3)),
             "y_test": rng.random((2, 1))}  # fmt: skip
    scipy_io.savemat(tmp_path / "qsar.mat", parts)
    x, y = read_qsar_mat(tmp_path / "qsar.mat")
    np.testing.assert_array_equal(x, np.vstack([parts["X_train"], parts["X_test"]]))
    np.testing.assert_array_equal(y, np.concatenate([parts["y_train"][:, 0], parts["y_test"][:, 0]]))
    scipy_io.savemat(tmp_path / "partial.mat", {"X_train": parts["X_train"], "y_train": parts["y_train"]})
    with pytest.raises(DataFileError, match="no X_test, y_test"):
        read_qsar_mat(tmp_path / "partial.mat")
    (tmp_path / "text.mat").write_text("not matlab")
    with pytest.raises(DataFileError, match="text.mat: not a MATLAB level-5 file"):
        read_qsar_mat(tmp_path / "text.mat")
    with pytest.raises(MissingDataError):
        read_qsar_mat(tmp_path / "absent.mat")


def test_numeric_csv_matches_genfromtxt(tmp_path):
    rng = np.random.default_rng(1)
    table = rng.normal(size=(6, 4))
    path = tmp_path / "drug.csv"
    lines = ["a,b,activity,c"] + [",".join(repr(float(v)) for v in row) for row in table] + [""]
    path.write_text("\n".join(lines))
    x, y, names = read_numeric_csv(path, "activity")
    reference = np.genfromtxt(path, delimiter=",", names=True)
    np.testing.assert_array_equal(y, reference["activity"])
    np.testing.assert_array_equal(x, np.stack([reference[n] for n in ("a", "b", "c")], axis=1))
    assert names == ["a", "b", "c"]
    with pytest.raises(DataFileError, match="no column 'target'"):
        read_numeric_csv(path, "target")
    path.write_text("a,b\n1,2\n3,x\n")
    with pytest.raises(DataFileError, match=r"drug.csv:3: column 'b' holds 'x', not a number"):
        read_numeric_csv(path, "a")
    path.write_text("a,b\n1,2,3\n")
    with pytest.raises(DataFileError, match=r"drug.csv:2: 3 cells, the header has 2"):
        read_numeric_csv(path, "a")
