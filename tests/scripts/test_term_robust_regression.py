"""The TERM robust-regression script (`scripts/term_robust_regression.py`) in its quick mode."""

from pathlib import Path

import numpy as np
import pytest
from reference import csv_rows, imported_script

# The scripts' and benchmarks' harnesses run in the end-to-end tier (`pytest -m slow`).
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "term_robust_regression.py"


@pytest.fixture(scope="module")
def script():
    with imported_script(SCRIPT) as module:
        yield module


def test_the_outliers_are_drawn_as_the_thesis_draws_them(script):
    x, y, clean, x_test, y_test = script.make_data(0, 0.4, 1000, 5)
    assert x.shape == (800, 5) and x_test.shape == (100, 5) and clean.shape == (800,)
    # Exactly 40% of the training targets, drawn with mean 5 and standard deviation 5 as TERM's code
    # release draws them (np.random.normal(5, 5)); 320 draws: the mean within 3.5 standard errors.
    assert (~clean).sum() == int(0.4 * 800)
    assert abs(y[~clean].mean() - 5.0) < 1.0 and abs(y[~clean].std() - 5.0) < 0.6
    assert abs(y[clean].mean()) < 0.2 and abs(y_test.var() - 1.0) < 0.4


def test_quick_mode_shows_the_thesis_direction(script, tmp_path, capsys):
    assert script.main(["--quick", "--seeds", "0", "--out", str(tmp_path)]) == 0
    rows = csv_rows(tmp_path / "term_robust_regression.csv")
    rmse = {(r["objective"], float(r["noise"])): float(r["test_rmse"]) for r in rows}
    assert len(rmse) == len(script.OBJECTIVES) * len(script.NOISE_LEVELS)
    # At 80% outliers TERM stays near the clean-data oracle while least squares does not (Li 2023, Table 7.2).
    assert rmse[("TERM", 0.8)] < 3 * rmse[("Genie ERM", 0.8)] < rmse[("ERM", 0.8)]
    assert np.isfinite(list(rmse.values())).all()
    assert "| TERM |" in (tmp_path / "term_robust_regression.md").read_text()
    assert "| TERM |" in capsys.readouterr().out


def write_drug_files(directory: Path, rng) -> tuple[Path, Path]:
    """A tiny qsar.mat (TERM's four matrices) and the same table as a CSV with a target column."""
    scipy_io = pytest.importorskip("scipy.io")
    x = rng.normal(size=(300, 6)) * [1, 10, 100, 1, 1, 0.1] + 3.0  # Unscaled, as descriptors are.
    y = x @ (rng.normal(size=6) / [1, 10, 100, 1, 1, 0.1]) + 0.1 * rng.normal(size=300)
    scipy_io.savemat(directory / "qsar.mat", {"X_train": x[:250], "y_train": y[:250, None],
                                              "X_test": x[250:], "y_test": y[250:, None]})  # fmt: skip
    lines = [",".join([*(f"d{j}" for j in range(6)), "activity"])]
    lines += [",".join(repr(float(v)) for v in [*row, target]) for row, target in zip(x, y, strict=True)]
    (directory / "drug.csv").write_text("\n".join(lines) + "\n")
    return directory / "qsar.mat", directory / "drug.csv"


def test_the_users_qsar_mat_and_csv_are_split_as_the_substitute(script, tmp_path):
    mat, table = write_drug_files(tmp_path, np.random.default_rng(0))
    x, y = script.read_table(mat, None)
    np.testing.assert_array_equal(script.read_table(table, "activity")[1], y)
    train_x, _, clean, test_x, _ = script.real_data(0, 0.4, (x, y))
    assert train_x.shape == (240, 7) and test_x.shape == (30, 7) and abs((~clean).mean() - 0.4) < 0.1
    np.testing.assert_allclose(train_x[:, -1], 1 / np.sqrt(7), rtol=1e-6)  # The intercept column.
    with pytest.raises(ValueError, match="needs --label-column"):
        script.read_table(table, None)


@pytest.mark.slow
def test_the_protocol_runs_on_the_users_qsar_mat(script, tmp_path, capsys):
    mat, _ = write_drug_files(tmp_path, np.random.default_rng(0))
    assert script.main(["--quick", "--seeds", "0", "--data", str(mat), "--out", str(tmp_path / "out")]) == 0
    rows = csv_rows(tmp_path / "out" / "term_robust_regression.csv")
    rmse = {(r["objective"], float(r["noise"])): float(r["test_rmse"]) for r in rows}
    assert len(rmse) == len(script.OBJECTIVES) * len(script.NOISE_LEVELS)
    assert np.isfinite(list(rmse.values())).all()
    assert "300 samples x 6 features from qsar.mat" in capsys.readouterr().out
