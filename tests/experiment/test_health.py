"""Divergence never looks like success: the in-round health flags, the diverged run's exit and files,
NaN-free JSON, and summaries within their ranges."""

import functools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import TINY_LABEL_SHIFT, slow_after

from jaxfl.cli import main
from jaxfl.evaluation.summaries import summarize, within_range
from jaxfl.experiment import health
from jaxfl.experiment.health import (
    EXIT_DIVERGED,
    check_round,
    divergence,
    finite_points,
    host_health,
    initial_health,
)
from jaxfl.experiment.main import warn_empty_rounds
from jaxfl.experiment.outputs import TABLE_COLUMNS, json_safe, write_comparison, write_json
from jaxfl.experiment.run_directory import MARKER

TINY = [
    *TINY_LABEL_SHIFT,
    "--rounds", "8", "--clients-per-round", "5", "--eval-every", "2",
    "--no-progress", "--strategy", "vmap", "--algorithm", "fedavg",
]


def _reference(rounds, released_only=False):
    """A loop over rounds: (params, train_loss, clients_with_weight, client rows) -> the expected health."""
    diverged_round, quantity, empty = -1, 0, 0
    for number, (params, loss, weighted, rows) in enumerate(rounds, start=1):
        leaves = [np.asarray(x, np.float64) for x in jax.tree.leaves(params)]
        row_leaves = [np.asarray(x, np.float64) for x in jax.tree.leaves(rows)]
        code = 0
        if not all(np.isfinite(x).all() for x in leaves):
            code = 1
        elif max(np.abs(x).max() for x in leaves) > health.EXPLODED_MAGNITUDE:
            code = 2
        elif not released_only and not np.isfinite(loss):
            code = 3
        elif not released_only and any(
            not np.isfinite(x).all() or np.abs(x).max() > health.EXPLODED_MAGNITUDE for x in row_leaves
        ):
            code = 4
        if code and diverged_round < 0:
            diverged_round, quantity = number, code
        empty += weighted == 0
    return diverged_round, quantity, empty


ROWS = {"v": np.ones((4, 3))}
ROUNDS = [
    ({"w": np.ones(3), "b": np.zeros(1)}, 0.5, 3, ROWS),
    ({"w": np.ones(3), "b": np.zeros(1)}, 0.4, 0, {"v": np.array([[1.0, 2e19, 0.0]] * 4)}),
    ({"w": np.array([1.0, 2e18, 0.0]), "b": np.zeros(1)}, 0.4, 2, ROWS),
    ({"w": np.ones(3), "b": np.zeros(1)}, 0.3, 1, {"v": np.array([[1.0, np.nan, 0.0]] * 4)}),
    ({"w": np.array([np.nan, 1.0, 0.0]), "b": np.zeros(1)}, np.inf, 0, ROWS),
    ({"w": np.ones(3), "b": np.zeros(1)}, np.nan, 1, ROWS),
]


@pytest.mark.parametrize("released_only", [False, True])
@pytest.mark.parametrize("start", range(len(ROUNDS)))
def test_check_round_against_a_loop(start, released_only):
    rounds = ROUNDS[start:]
    step = jax.jit(functools.partial(check_round, released_only=released_only))
    state = initial_health()
    for number, (params, loss, weighted, rows) in enumerate(rounds, start=1):
        metrics = {"train_loss": jnp.float32(loss), "clients_with_weight": jnp.int32(weighted)}
        as_f32 = functools.partial(jax.tree.map, jnp.float32)
        state = step(state, jnp.int32(number), as_f32(params), metrics, as_f32(rows))
    got = host_health(state)
    got = (int(got["diverged_round"]), int(got["quantity"]), int(got["rounds_without_weight"]))
    assert got == _reference(rounds, released_only)


def test_check_round_under_vmap_keeps_each_point_apart():
    params = {"w": jnp.array([[1.0, 2.0], [jnp.nan, 1.0], [1e19, 0.0]])}
    metrics = {"train_loss": jnp.array([0.1, 0.2, 0.3]), "clients_with_weight": jnp.array([0, 2, 2])}
    start = jax.tree.map(lambda x: jnp.stack([x] * 3), initial_health())
    got = host_health(jax.vmap(check_round, in_axes=(0, None, 0, 0))(start, jnp.int32(7), params, metrics))
    assert got["diverged_round"].tolist() == [-1, 7, 7]
    assert got["quantity"].tolist() == [0, 1, 2]
    assert got["rounds_without_weight"].tolist() == [1, 0, 0]
    assert divergence(got, 0) is None and "not finite" in divergence(got, 1)["quantity"]


def test_a_diverged_run_stops_with_status_3_and_says_so(tmp_path, capsys):
    out = tmp_path / "blown"
    status = main(["run", *TINY, "--lr", "1e30", "--out", str(out)])
    captured = capsys.readouterr()
    assert status == EXIT_DIVERGED
    lines = [line for line in captured.err.splitlines() if line.startswith("jaxfl: error")]
    assert len(lines) == 1 and "fedavg diverged at round 1" in lines[0]
    summary = json.loads((out / "summary.json").read_text(), parse_constant=_no_constants)
    assert summary["status"] == "diverged" and summary["diverged"]["round"] == 1
    for line in (out / "metrics.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=_no_constants)
    for name in ("timing.json", "config.json"):
        json.loads((out / name).read_text(), parse_constant=_no_constants)
    assert not (out / "model").exists()  # A diverged model is not an output.
    assert json.loads((out / MARKER).read_text())["status"] == "diverged"


def test_finite_points_against_numpy():
    rng = np.random.default_rng(0)
    models = {"w": rng.normal(size=(4, 3, 2)).astype(np.float32), "ids": np.arange(4), "b": np.zeros((4, 1))}
    models["w"][1, 2, 0] = np.nan
    models["b"][3, 0] = -np.inf
    expected = [np.isfinite(models["w"][g]).all() and np.isfinite(models["b"][g]).all() for g in range(4)]
    assert finite_points(models, 4).tolist() == expected == [True, False, True, False]
    assert finite_points({"w": models["w"][0]}).tolist() == [True]
    assert finite_points({"w": models["w"][1]}).tolist() == [False]
    assert finite_points({"ids": np.arange(3)}, 3).tolist() == [True] * 3  # No float leaf: nothing to fail.


@pytest.mark.parametrize(
    "flags, quantity",
    slow_after([
        (["--algorithm", "ditto", "--lam", "3e38"], "the per-client state (personal models"),
        (["--finetune-epochs", "1", "--finetune-ewc", "3e38"], "personal models made after training"),
    ]),
)
def test_personal_models_that_diverge_stop_the_run(flags, quantity, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["run", *TINY, "--rounds", "2", "--client-split", "0.25", *flags, "--out", str(out)]
    assert main(argv) == EXIT_DIVERGED
    assert quantity in capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text(), parse_constant=_no_constants)
    assert summary["status"] == "diverged" and quantity in summary["diverged"]["quantity"]


def test_a_comparison_lists_a_diverged_algorithm_without_numbers(tmp_path):
    # A diverged algorithm's summary has no evaluation (it diverged before its first one) or one of
    # parameters from before the divergence; neither is a result to compare.
    finished = {
        "status": "finished",
        "test_error": {key: 0.25 for key, _ in TABLE_COLUMNS},
        "train_loss": {"mean": 0.5},
    }
    stale = {**finished, "status": "diverged"}
    write_comparison(tmp_path, {"fedavg": finished, "term": {"status": "diverged"}, "deltafl": stale})
    lines = (tmp_path / "comparison.csv").read_text().splitlines()
    assert lines[1].startswith("fedavg,25.0")
    for line, name in zip(lines[2:], ("term", "deltafl"), strict=True):
        cells = line.split(",")
        assert cells[0] == f"{name} (diverged)" and all(cell == "nan" for cell in cells[1:])
    assert "| term (diverged) | nan |" in (tmp_path / "comparison.md").read_text()


def _no_constants(name):
    raise AssertionError(f"bare {name} in JSON")


@pytest.mark.slow
def test_divergence_keeps_the_last_finite_checkpoint(tmp_path, capsys, monkeypatch):
    # Parameters made non-finite from round 5 on: detected at the evaluation of
    # round 6, after the checkpoint of round 4.
    real = health.check_round

    def breaks_at_5(state, number, params, metrics, *args, **kwargs):
        params = jax.tree.map(lambda p: jnp.where(number >= 5, jnp.nan, p), params)
        return real(state, number, params, metrics, *args, **kwargs)

    monkeypatch.setattr(health, "check_round", breaks_at_5)
    out = tmp_path / "blown"
    status = main(["run", *TINY, "--checkpoint-every", "2", "--out", str(out)])
    err = capsys.readouterr().err
    assert status == EXIT_DIVERGED
    assert "diverged at round 5" in err and "seen at round 6" in err and "round 4" in err
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.isdigit()) == ["2", "4"]
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in history] == [2, 4]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["diverged"] == {
        "round": 5, "quantity": health.QUANTITIES[1], "detected_at_round": 6, "last_checkpoint_round": 4,
    }
    assert summary["evaluated_round"] == 4


@pytest.mark.slow
def test_a_sweep_marks_its_diverged_points_and_finishes_the_others(tmp_path, capsys):
    out = tmp_path / "sweep"
    status = main(["sweep", *TINY, "--grid", "lr=0.05,1e30", "--out", str(out)])
    err = capsys.readouterr().err
    assert status == EXIT_DIVERGED and "point 1 diverged at round 1" in err
    rows = (out / "results.csv").read_text().splitlines()
    assert ",finished," in rows[1] and ",diverged," in rows[2]
    assert json.loads((out / "points" / "000" / "summary.json").read_text())["status"] == "finished"


def test_json_never_holds_nan_or_infinity(tmp_path):
    data = {"a": float("nan"), "b": {"c": [1.0, float("inf")]}, "d": np.float32(-np.inf), "e": 2}
    safe = json_safe(data)
    assert safe == {"a": None, "b": {"c": [1.0, None]}, "d": None, "e": 2,
                    "nonfinite": {"a": "nan", "b.c[1]": "inf", "d": "-inf"}}
    write_json(tmp_path / "x.json", data)
    json.loads((tmp_path / "x.json").read_text(), parse_constant=_no_constants)


def test_summaries_stay_within_their_ranges():
    all_wrong = jnp.ones(7)
    errors = within_range(summarize(all_wrong), 0.0, 1.0)
    assert all(0.0 <= float(v) <= 1.0 for v in errors.values())
    zeros = within_range(summarize(jnp.zeros(7)), 0.0, 1.0)
    assert math.copysign(1.0, float(zeros["best_10"])) == 1.0  # Not -0.0.
    assert math.copysign(1.0, float(summarize(jnp.zeros(7))["best_10"])) == 1.0
    rounded = {"mean": jnp.float32(1.0000001), "std": jnp.float32(-0.0), "p10": jnp.float32(-1e-9)}
    clipped = within_range(rounded, 0.0, 1.0)
    assert float(clipped["mean"]) == 1.0 and math.copysign(1.0, float(clipped["std"])) == 1.0
    assert float(clipped["p10"]) == 0.0


def test_most_rounds_without_weight_warn(capsys):
    warn_empty_rounds("fedavg", {"rounds": 10, "rounds_without_weight": 6})
    err = capsys.readouterr().err
    assert err.startswith("jaxfl: warning: fedavg: no client got weight in 6 of 10 rounds")
    warn_empty_rounds("fedavg", {"rounds": 10, "rounds_without_weight": 5})
    assert capsys.readouterr().err == ""
