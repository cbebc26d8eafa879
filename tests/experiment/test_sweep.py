"""Sweeps: a grid point equals the same setting run alone; one trace per sweep."""

import csv
import dataclasses
import json

import jax
import numpy as np
import pytest

from jaxfl.cli import main
from jaxfl.experiment.config import make_config
from jaxfl.experiment.runner import run_algorithm, setup
from jaxfl.experiment.sweep import SweepPoint, run_sweep

TINY = dict(
    dataset_options=dict(
        num_train_clients=40, num_validation_clients=0, num_test_clients=20, pool_size=20000
    ),
    rounds=3, clients_per_round=6, eval_every=3, progress=False, strategy="vmap",
)
TINY_FLAGS = [
    "--dataset-option", "num_train_clients=40", "--dataset-option", "num_validation_clients=0",
    "--dataset-option", "num_test_clients=20", "--dataset-option", "pool_size=20000",
    "--rounds", "3", "--clients-per-round", "6", "--eval-every", "3", "--no-progress",
    "--strategy", "vmap",
]


# Δ-FL is the template with a plan, and its points vary lr, l2, server_lr and the seed
# as FedAvg's would: FedAvg's own case (15 s of the suite) added nothing (Ditto's sweep,
# over FedAvg, is checked against its single run in test_cli_robustness.py).
@pytest.mark.parametrize("algorithm", ["deltafl"])
def test_sweep_points_equal_single_runs(algorithm):
    config = make_config({**TINY, "algorithm": algorithm})
    run_setup = setup(config)
    name = config.algorithms[0]
    points = [
        SweepPoint({"lr": 0.05}, seed=0),
        SweepPoint({"lr": 0.2, "l2": 0.01, "server_lr": 0.5}, seed=2),
    ]
    if algorithm == "deltafl":
        points.append(SweepPoint({"theta": 0.3}, seed=1))
    traces = []
    algo = run_setup.algorithms[name]

    def counted_round(*args):
        traces.append(1)
        return algo.round(*args)

    counted_setup = dataclasses.replace(
        run_setup, algorithms={name: algo._replace(round=counted_round)}
    )
    results = run_sweep(counted_setup, name, points)
    assert len(traces) == 1  # One trace (and compilation) for the whole sweep.
    # Compiling a single run per point is the slow part: check the last two.
    for point, result in list(zip(points, results, strict=True))[-2:]:
        single_config = make_config(
            {**TINY, "algorithm": algorithm, "seed": point.seed, **point.hparams}
        )
        single = run_algorithm(setup(single_config), name)
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
            result.state.params, single.state.params,
        )
        np.testing.assert_allclose(
            result.summary["test_error"]["mean"], single.summary["test_error"]["mean"], atol=1e-6
        )


def test_sweep_cli_writes_rows_and_reproducible_points(tmp_path, capsys):
    out = tmp_path / "sweep"
    status = main([
        "sweep", *TINY_FLAGS, "--algorithm", "deltafl", "--grid", "theta=0.5,1.0",
        "--grid", "batch_size=5,10", "--out", str(out),
    ])
    assert status == 0
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    assert {(r["theta"], r["batch_size"]) for r in rows} == {
        (t, b) for t in ("0.5", "1.0") for b in ("5", "10")
    }
    # Point 2's config (theta 0.5, batch 10), run alone, reproduces its summary.
    point = out / "points" / "002"
    rerun = tmp_path / "rerun"
    assert main(["run", "--config", str(point / "config.json"), "--out", str(rerun)]) == 0
    swept = json.loads((point / "summary.json").read_text())
    alone = json.loads((rerun / "summary.json").read_text())
    assert alone["test_error"]["mean"] == pytest.approx(swept["test_error"]["mean"], abs=1e-6)
    capsys.readouterr()


@pytest.mark.parametrize(
    "grid, words",
    [
        (["--grid", "thetaa=0.5"], ["thetaa"]),
        (["--grid", "theta=0.5,2"], ["theta"]),
        (["--grid", "theta"], ["NAME=V1"]),
        (["--grid", "lr=0.1", "--grid", "lr=0.2"], ["twice"]),
        ([], ["--grid"]),
    ],
)
def test_sweep_errors(grid, words, tmp_path, capsys):
    status = main(["sweep", *TINY_FLAGS, "--algorithm", "deltafl", *grid, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1
    for word in words:
        assert word in err
    assert not (tmp_path / "o").exists()


def test_sweep_needs_one_algorithm(capsys):
    status = main(["sweep", *TINY_FLAGS, "--algorithm", "fedavg,deltafl", "--grid", "lr=0.1"])
    assert status == 2 and "one algorithm" in capsys.readouterr().err
