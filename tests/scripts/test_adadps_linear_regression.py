"""The AdaDPS linear-regression script (`scripts/adadps_linear_regression.py`)."""

from pathlib import Path

import jax
import numpy as np
import pytest
from reference import imported_script

# The scripts' and benchmarks' harnesses run in the end-to-end tier (`pytest -m slow`).
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "adadps_linear_regression.py"


@pytest.fixture(scope="module")
def script():
    with imported_script(SCRIPT) as module:
        yield module


def test_the_data_are_drawn_as_the_thesis_draws_them(script):
    x, y = (np.asarray(a) for a in script.problem(jax.random.key(0)))
    assert x.shape == (1000, 500) and set(np.unique(x)) <= {0.0, 1.0}
    assert abs(x[:, :50].mean() - 0.9) < 0.01 and abs(x[:, 50:].mean() - 0.01) < 0.002
    w = np.where(np.arange(500) < 50, 0.01, 1.0)
    residual = y - x @ w
    assert abs(residual.mean()) < 0.02 and abs(residual.std() - 0.1) < 0.01  # b ~ N(0, 0.01)


@pytest.mark.slow
def test_side_information_speeds_up_private_and_plain_training(script, capsys):
    script.main(["--seeds", "0", "1"])
    out = capsys.readouterr().out
    final = {line.split("|")[1].strip(): float(line.split("|")[-2].split("±")[0]) for line in out.splitlines()
             if line.startswith("| ") and "method" not in line}
    # Li 2023, Figure 6.4: preconditioning with the frequencies lowers the training loss, private or not.
    assert final["adadps"] < 0.7 * final["dp-sgd"]
    assert final["preconditioned sgd"] < 0.1 * final["sgd"]
    assert "(4.130, 0.001)-DP" in out
