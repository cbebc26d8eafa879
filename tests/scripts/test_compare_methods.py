"""The comparison script (`scripts/compare_methods.py`) in its smoke mode.

Run in-process through `main(argv)`; only two methods so that the test stays
fast (compiling each algorithm's round is most of its time).
"""

import json
from pathlib import Path

import pytest
from reference import csv_rows, imported_script

# The scripts' and benchmarks' harnesses run in the end-to-end tier (`pytest -m slow`).
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "compare_methods.py"


@pytest.fixture(scope="module")
def script():
    with imported_script(SCRIPT) as module:
        yield module




@pytest.mark.slow
def test_quick_mode_writes_tables_figures_and_protocol(script, tmp_path):
    out = tmp_path / "compare"
    status = script.main([
        "--dataset", "label-shift", "--quick", "--methods", "fedavg,deltafl",
        "--out", str(out), "--jax-cache", "",
    ])
    assert status == 0
    thetas = script.QUICK_GRIDS["delta"]
    labels = ["FedAvg", *(f"Δ-FL θ={t:g}" for t in thetas)]

    table = csv_rows(out / "table_all.csv")
    assert [row["method"] for row in table] == labels
    for row in table:
        for _, column in script.TABLE_COLUMNS:
            mean, std = float(row[f"{column}_mean"]), float(row[f"{column}_std"])
            assert 0.0 <= mean <= 100.0 and std >= 0.0
        assert "λ=" in row["tuned"]
    assert [row["method"] for row in csv_rows(out / "table_main.csv")] == labels
    assert (out / "table_main.md").read_text().count("\n|") == len(labels) + 2  # Header, rule, rows.

    runs = csv_rows(out / "runs.csv")
    assert len(runs) == len(labels) * 2  # Two seeds in quick mode.
    tuning = csv_rows(out / "tuning.csv")
    assert {row["stage"] for row in tuning} == {"lr", "lambda"}
    curves = csv_rows(out / "curves.csv")
    assert {int(row["round"]) for row in curves} >= {4}

    protocol = json.loads((out / "protocol.json").read_text())
    assert protocol["tuned_lr"] in script.QUICK_GRIDS["lr"]
    assert set(protocol["tuned"]) == set(labels)
    assert protocol["seeds"] == [0, 1]

    for name in ("histograms.png", "scatter.png", "curves.png"):
        size = (out / name).stat().st_size
        assert 1000 < size < 200_000


def test_full_grids_give_the_papers_rows(script):
    grids = dict(lr=script.LR_GRID, l2=script.L2_GRID, mu=script.MU_GRID,
                 sub=script.SUB_THETAS, q=script.Q_GRID, tilt=script.TILT_GRID,
                 delta=script.DELTA_THETAS)
    rows = script.table_rows(script.METHOD_KEYS, grids)
    assert len(rows) == 1 + 3 + 1 + 5 + 8 + 1 + 3
    # Fake statistics: the main table picks, per method, the smallest test p90.
    stats = {row.label: {"p90": (float(i % 7), 0.0), "mean": (0.0, 0.0)}
             for i, row in enumerate(rows)}
    named = script.main_rows(rows, stats)
    methods = [row.method for _, row in named]
    assert methods == ["FedAvg", "FedAvg-Sub", "FedProx", "q-FFL", "Tilted-ERM", "AFL",
                       "q-FFL", "Δ-FL θ=0.8", "Δ-FL θ=0.5", "Δ-FL θ=0.1"]
    for name, row in named:
        members = [r for r in rows if r.method == row.method]
        if "paper's AFL" in name:
            assert row.fixed == {"q": 10.0}
        else:
            assert stats[row.label]["p90"][0] == min(stats[r.label]["p90"][0] for r in members)
