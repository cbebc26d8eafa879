"""Several rounds per compiled call give the same run as one round per call."""

import jax
import numpy as np
import pytest

from jaxfl.experiment import runner, training_loop
from jaxfl.experiment.config import make_config
from jaxfl.experiment.runner import rounds_per_call, run_algorithm, setup
from jaxfl.experiment.sweep import SweepPoint, run_sweep
from jaxfl.training.strategies import ClientStrategy

CONFIG = dict(
    algorithm="deltafl", dataset="synthetic", dataset_options={"num_clients": 24},
    rounds=4, clients_per_round=5, eval_every=2, progress=False, strategy="sharded",
)


@pytest.mark.parametrize(
    "rounds, eval_every, expected",
    [(2000, 200, 10), (12, 6, 6), (7, 7, 7), (9, 6, 3), (13, 13, 1), (4, 2, 2)],
)
def test_rounds_per_call_divides_rounds_and_evaluations(rounds, eval_every, expected):
    sharded = ClientStrategy("sharded", num_devices=2)
    assert rounds_per_call(sharded, rounds, eval_every) == min(expected, runner.MAX_ROUNDS_PER_CALL)
    assert rounds_per_call(ClientStrategy("sequential"), rounds, eval_every) == 1


@pytest.mark.parametrize("fused, start_round, expected", [(10, 0, 10), (10, 30, 10), (10, 7, 1), (10, 4, 2)])
def test_a_resumed_run_starts_calls_at_its_checkpoint(fused, start_round, expected):
    resumed = runner.resumed_rounds_per_call(fused, start_round)
    assert resumed == expected
    assert start_round % resumed == 0 and fused % resumed == 0


@pytest.mark.parametrize("backend, expected", [("gpu", 10), ("tpu", 10), ("cpu", 1)])
def test_accelerators_fuse_rounds_on_one_device(monkeypatch, backend, expected):
    monkeypatch.setattr(runner.jax, "default_backend", lambda: backend)
    assert rounds_per_call(ClientStrategy("vmap"), 2000, 200) == expected


def _assert_same(a, b):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6), a, b)


@pytest.mark.slow
def test_fused_rounds_equal_one_round_per_call(monkeypatch):
    run_setup = setup(make_config(CONFIG))
    fused = run_algorithm(run_setup, "deltafl")
    sweep_fused = run_sweep(run_setup, "deltafl", [SweepPoint({"theta": 0.3}, seed=1)])[0]
    assert fused.timing["rounds_per_call"] == 2  # 8 CPU devices in tests: sharded rounds fuse.
    monkeypatch.setattr(training_loop, "MAX_ROUNDS_PER_CALL", 1)
    single = run_algorithm(run_setup, "deltafl")
    sweep_single = run_sweep(run_setup, "deltafl", [SweepPoint({"theta": 0.3}, seed=1)])[0]
    assert single.timing["rounds_per_call"] == 1
    _assert_same(fused.state, single.state)
    _assert_same(sweep_fused.state, sweep_single.state)
    assert [r["round"] for r in fused.history] == [2, 4]
    for a, b in zip(fused.history, single.history, strict=True):
        assert a["round_metrics"] == pytest.approx(b["round_metrics"], rel=1e-5)
