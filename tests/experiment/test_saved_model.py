"""The model is an output: saved with the run, loaded back bit for bit, evaluated, trained on."""

import json

import jax
import numpy as np
import pytest

from jaxfl.cli import main
from jaxfl.experiment.config import ConfigError, make_config
from jaxfl.experiment.evaluate_main import evaluate_model, evaluation_config
from jaxfl.experiment.runner import run_algorithm, setup
from jaxfl.experiment.saved_model import load_model

OPTIONS = {"num_train_clients": 40, "num_validation_clients": 0, "num_test_clients": 20, "pool_size": 20000}
SETTINGS = dict(
    dataset="label-shift", dataset_options=OPTIONS, rounds=4, clients_per_round=5, eval_every=2,
    progress=False, strategy="vmap",
)
ARGV = [
    *(a for k, v in OPTIONS.items() for a in ("--dataset-option", f"{k}={v}")),
    "--rounds", "4", "--clients-per-round", "5", "--eval-every", "2", "--no-progress", "--strategy", "vmap",
]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("saved") / "both"
    assert main(["run", *ARGV, "--algorithm", "fedavg,deltafl", "--out", str(out)]) == 0
    return out


@pytest.mark.slow
def test_saved_params_are_the_trained_ones_bit_for_bit(finished):
    result = run_algorithm(setup(make_config({**SETTINGS, "algorithm": "deltafl"})), "deltafl")
    saved = load_model(finished, "deltafl")
    assert saved.algorithm == "deltafl" and saved.config.network.model == "linear"
    for a, b in zip(jax.tree.leaves(saved.params), jax.tree.leaves(result.state.params), strict=True):
        np.testing.assert_array_equal(a, np.asarray(b))
    assert jax.tree.structure(saved.params) == jax.tree.structure(jax.device_get(result.state.params))


def test_evaluating_the_saved_model_reproduces_the_runs_summary(finished):
    saved = load_model(finished / "fedavg")
    summaries, clients = evaluate_model(saved, evaluation_config(saved, None, None, None))
    written = json.loads((finished / "fedavg" / "summary.json").read_text())
    assert summaries["test_error"] == written["test_error"]
    assert summaries["test_loss"] == written["test_loss"]
    # `jaxfl evaluate` evaluates every population, the training clients too (a run only with --eval-train).
    assert "train_loss" in summaries and "train_loss" not in written
    assert clients["test"]["error"].shape == (20,)


def test_several_models_need_a_choice(finished):
    with pytest.raises(ConfigError, match="choose one"):
        load_model(finished)
    with pytest.raises(ConfigError, match="no saved model"):
        load_model(finished.parent)


def test_continue_training_from_a_saved_model(finished):
    saved = load_model(finished, "fedavg")
    run_setup = setup(make_config({**SETTINGS, "algorithm": "fedavg"}))
    algorithm = run_setup.algorithms["fedavg"]
    state = algorithm.init(jax.device_put(saved.params), run_setup.hparams["fedavg"])
    state, metrics = jax.jit(algorithm.round)(state, run_setup.dataset.train, jax.random.key(0))
    assert int(state.round) == 1 and np.isfinite(float(metrics["train_loss"]))


def test_jaxfl_evaluate_on_another_population(finished, tmp_path, capsys):
    out = tmp_path / "evaluated"
    argv = ["--algorithm", "fedavg", "--dataset-option", "partition_seed=5", "--out", str(out)]
    status = main(["evaluate", str(finished), *argv])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "fedavg" in captured.out and "test misclassification error" in captured.out
    summary = json.loads((out / "summary.json").read_text())
    original = json.loads((finished / "fedavg" / "summary.json").read_text())
    assert summary["test_error"]["mean"] != original["test_error"]["mean"]  # Other clients.
    assert json.loads((out / "config.json").read_text())["dataset_options"]["partition_seed"] == 5
    assert (out / "clients.csv").read_text().count("\n") == 1 + 40 + 20


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--dataset", "synthetic"], ["inputs of shape"]),
        (["--algorithm", "qffl"], ["no model of 'qffl'"]),
    ],
)
def test_jaxfl_evaluate_refuses_in_one_line(finished, argv, words, capsys):
    status = main(["evaluate", str(finished), *argv])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and err.startswith("jaxfl: error:"), err
    for word in words:
        assert word in err


def test_jaxfl_evaluate_of_a_folder_without_model(tmp_path, capsys):
    assert main(["evaluate", str(tmp_path)]) == 2
    assert "no saved model" in capsys.readouterr().err


def test_padding_rows_of_split_personal_models_are_not_saved(tmp_path):
    """Personal models split over devices carry rows past the N training clients (padding)."""
    from jaxfl.experiment.saved_model import save_model

    run_setup = setup(make_config({**SETTINGS, "algorithm": "ditto"}))
    params = run_setup.engine.task.model.init(jax.random.key(0))
    personal = jax.tree.map(lambda leaf: np.stack([np.asarray(leaf) + row for row in range(48)]), params)
    save_model(tmp_path / "model", params, run_setup.config, run_setup.dataset, "ditto", personal=personal)
    saved = load_model(tmp_path / "model")
    for got, written in zip(jax.tree.leaves(saved.personal), jax.tree.leaves(personal), strict=True):
        np.testing.assert_array_equal(got, written[:40])
