"""Tuning helpers (`jaxfl/experiment/tuning.py`): choice rule, chunked sweeps, rebuilt setups."""

import math

import jax
import numpy as np
import pytest

from jaxfl.data.splits import hold_out_clients
from jaxfl.experiment.config import make_config
from jaxfl.experiment.runner import setup
from jaxfl.experiment.sweep import SweepPoint, initial_state, run_sweep
from jaxfl.experiment.tuning import choose_best, rebuild_setup, run_points

TINY = dict(
    dataset_options=dict(
        num_train_clients=30, num_validation_clients=10, num_test_clients=10, pool_size=20000
    ),
    rounds=2, clients_per_round=5, eval_every=2, progress=False, strategy="vmap",
)


def test_choose_best_takes_the_smallest_mean_over_seeds():
    assert choose_best([[0.5, 0.3], [0.2, 0.5], [0.45, 0.45]]) == 1  # means .4, .35, .45


def test_choose_best_breaks_ties_by_the_second_score_then_by_order():
    scores = [[0.5, 0.5], [0.4, 0.6], [0.6, 0.4], [0.7, 0.7]]  # three tie at 0.5
    assert choose_best(scores) == 0
    assert choose_best(scores, [[0.3], [0.2], [0.2], [0.0]]) == 1


def test_choose_best_ranks_diverged_runs_last():
    assert choose_best([[math.nan], [0.9]]) == 1
    assert choose_best([[math.nan], [math.nan]]) == 0
    with pytest.raises(ValueError):
        choose_best([])


def _assert_same_run(a, b):
    jax.tree.map(
        lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7),
        a.state.params, b.state.params,
    )
    np.testing.assert_allclose(a.clients["test"]["error"], b.clients["test"]["error"])


@pytest.mark.slow
def test_run_points_results_do_not_depend_on_the_chunks():
    run_setup = setup(make_config({**TINY, "algorithm": "deltafl"}))
    a = SweepPoint({"theta": 0.5, "l2": 1e-3}, seed=0)
    b = SweepPoint({"theta": 0.2}, seed=1)
    c = SweepPoint({"theta": 0.8, "lr": 0.3}, seed=2)
    first = run_points(run_setup, "deltafl", [a, b, c], width=2)  # chunks [a b] [c c]
    second = run_points(run_setup, "deltafl", [c, a], width=2)  # one chunk [c a]
    assert len(first) == 3 and len(second) == 2
    _assert_same_run(first[0], second[1])
    _assert_same_run(first[2], second[0])
    assert first[1].summary["hparams"] == {"theta": 0.2}


@pytest.mark.slow
def test_rebuild_setup_on_held_out_clients_with_a_while_loop():
    config = make_config({
        "algorithm": "fedavg,afl", "dataset": "synthetic",
        "dataset_options": {"num_clients": 12}, "rounds": 2, "clients_per_round": 3,
        "eval_every": 2, "progress": False, "strategy": "sequential",
        "local_loop": "scan",
    })
    full = setup(config)
    split = hold_out_clients(full.dataset, 0.5, seed=0)
    rebuilt = rebuild_setup(full, dataset=split, local_loop="while")
    assert rebuilt.dataset is split
    assert rebuilt.engine.num_clients == 6
    assert rebuilt.engine.local.loop == "while"
    assert full.engine.local.loop == "scan"
    # AFL's mixture weights cover the remaining training clients only.
    state, _ = initial_state(rebuilt, "afl", SweepPoint({}, seed=0))
    assert state.extra["lambda"].shape == (6,)
    # The while loop gives the scan's result (same clients, same steps).
    scan = rebuild_setup(full, dataset=split)
    point = [SweepPoint({"lr": 0.05}, seed=4)]
    _assert_same_run(
        run_sweep(rebuilt, "fedavg", point)[0], run_sweep(scan, "fedavg", point)[0]
    )
    assert rebuilt.dataset.validation.num_clients == 6
    with pytest.raises(ValueError, match="clients per round"):
        rebuild_setup(full, dataset=hold_out_clients(full.dataset, 0.9))
