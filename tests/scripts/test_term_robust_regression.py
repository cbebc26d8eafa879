"""The TERM robust-regression script (`scripts/term_robust_regression.py`) in its quick mode."""

from pathlib import Path

import numpy as np
import pytest
from reference import csv_rows, imported_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "term_robust_regression.py"


@pytest.fixture(scope="module")
def script():
    with imported_script(SCRIPT) as module:
        yield module


def test_the_outliers_are_drawn_as_the_thesis_draws_them(script):
    x, y, clean, x_test, y_test = script.make_data(0, 0.4, 1000, 5)
    assert x.shape == (800, 5) and x_test.shape == (100, 5) and clean.shape == (800,)
    assert abs((~clean).mean() - 0.4) < 0.06
    assert abs(y[~clean].mean() - 5.0) < 0.4 and abs(y[~clean].var() - 5.0) < 1.5  # N(5, 5).
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
