"""Sweeps: a grid point equals the same setting run alone; one trace per sweep."""

import dataclasses

import jax
import numpy as np
import pytest

from jaxfl.cli import main
from jaxfl.experiment.config import make_config
from jaxfl.experiment.runner import run_algorithm, setup, train_points
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
@pytest.mark.slow
def test_sweep_points_equal_single_runs(algorithm):
    # Fine-tuned after training (`--finetune-epochs`), each point as its single run is: evaluated on
    # their clients' training data (the dataset holds no test data of theirs), asked for.
    finetuned = {"finetune_epochs": 1, "eval_train": True}
    config = make_config({**TINY, **finetuned, "algorithm": algorithm})
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
    # Compiling a single run per point is the slow part: check the second point (its lr, l2,
    # server_lr and seed; theta at its default). A point of another theta (lr, l2, server_lr at
    # their defaults) is checked against its single run, model and summary, on the CLI's sweep of
    # test_resume.py's test_sweep_resumes_the_points_that_did_not_finish.
    point, result = points[1], results[1]
    single_config = make_config(
        {**TINY, **finetuned, "algorithm": algorithm, "seed": point.seed, **point.hparams}
    )
    single = run_algorithm(setup(single_config), name)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
        result.state.params, single.state.params,
    )
    for key in ("test_error", "personal_train_loss"):
        np.testing.assert_allclose(result.summary[key]["mean"], single.summary[key]["mean"], atol=1e-6)


# The CLI's sweep (results.csv's rows; a point's config.json run alone reproduces the point) is
# checked on the uninterrupted sweep of test_resume.py's
# test_sweep_resumes_the_points_that_did_not_finish: a sweep of its own here cost 12-18 s.


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


def test_a_single_run_is_one_unbatched_point():
    # `run_algorithm` and `run_sweep` are `train_points`, unbatched and batched: a single run of
    # two points, or a sweep of none, is refused before anything is built.
    run_setup = setup(make_config({**TINY, "algorithm": "fedavg"}))
    points = [SweepPoint({}, seed=0), SweepPoint({}, seed=1)]
    with pytest.raises(ValueError, match="a single run is one point, got 2"):
        train_points(run_setup, "fedavg", points, batched=False)
    with pytest.raises(ValueError, match="a sweep needs at least one point"):
        run_sweep(run_setup, "fedavg", [])
    # The hooks are keywords of `RunHooks`: a misspelt one is refused, not ignored.
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['progres'\]"):
        run_sweep(run_setup, "fedavg", points[:1], progres=None)
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['checkpoint'\]"):
        run_algorithm(run_setup, "fedavg", checkpoint=None)
