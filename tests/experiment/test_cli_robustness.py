"""Ditto, attacks and robust aggregators from the command line: personal and
global metrics side by side, corrupted clients marked and left out of the
summaries, bad combinations refused in one line."""

import csv
import json

import jax
import numpy as np
import pytest
from reference import TINY_LABEL_SHIFT, StopAfter, assert_cli_refuses
from round_records import assert_matches_record

from jaxfl.cli import main
from jaxfl.data.registry import load_dataset
from jaxfl.data.splits import split_client_examples
from jaxfl.experiment import training_loop

TINY = [*TINY_LABEL_SHIFT, "--rounds", "3", "--clients-per-round", "8", "--eval-every", "3", "--no-progress"]


@pytest.mark.slow
def test_ditto_under_attack_with_a_robust_aggregator(tmp_path, capsys):
    out = tmp_path / "run"
    status = main([
        "run", *TINY, "--algorithm", "ditto", "--lam", "0.5", "--client-split", "0.25",
        "--attack", "model-replacement", "--attack-data", "random-labels", "--attack-fraction", "0.25",
        "--aggregator", "geometric-median", "--client-state", "split", "--out", str(out),
    ])  # fmt: skip
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "ditto (personal)" in captured.out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["attack"]["corrupted_clients"] == 10  # round(0.25 * 40)
    assert summary["client_state"] == "split"  # Over the test process's CPU devices.
    with (out / "clients.csv").open() as f:
        rows = list(csv.DictReader(f))
    test = [r for r in rows if r["population"] == "test"]
    assert len(test) == 40  # --client-split: test client k is training client k.
    attacked = np.array([int(r["attacked"]) for r in test], bool)
    assert attacked.sum() == 10
    for column, key in (("error", "test_error"), ("personal_error", "personal_test_error")):
        values = np.array([float(r[column]) for r in test])
        # The summaries count the benign clients only (thesis section 5.6).
        np.testing.assert_allclose(summary[key]["mean"], values[~attacked].mean(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(summary[key]["std"], values[~attacked].std(), rtol=1e-4, atol=1e-6)
    metrics = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["round_metrics"]
    assert metrics["geometric_median_iterations"] >= 1 and "personal_train_loss" in metrics
    # The personal models are saved with the global one: row k is client k's.
    from jaxfl.evaluation.per_client import personal_client_metrics
    from jaxfl.experiment.saved_model import load_model
    from jaxfl.training import Task

    saved = load_model(out)
    assert all(leaf.shape[0] == 40 for leaf in jax.tree.leaves(saved.personal))
    population = load_dataset(
        "label-shift", num_train_clients=40, num_validation_clients=0, num_test_clients=20, pool_size=20000
    ).train
    test_population = split_client_examples(population, 0.75, 0)[1]
    _, errors = personal_client_metrics(Task(saved.model), saved.personal, test_population)
    np.testing.assert_allclose(errors, [float(r["personal_error"]) for r in test], rtol=1e-5, atol=1e-6)
    assert_matches_record("ditto-attacked-geometric-median-split", out, ["ditto"])


@pytest.mark.parametrize(
    "args, words",
    [
        (["--algorithm", "qffl", "--aggregator", "krum"], ["qffl", "computes its own server update"]),
        (["--attack-data", "random-labels"], ["attack_data", "update attack"]),
        (["--attack", "random-labels", "--attack-data", "label-flip"], ["attack_data", "data attack"]),
        (["--attack", "sign-flip", "--attack-fraction", "1.5"], ["attack_fraction"]),
        (["--aggregator", "trimmed-mean", "--trim-fraction", "0.5"], ["trim_fraction"]),
        (["--algorithm", "ditto", "--lam", "-1"], ["lam"]),
        (["--algorithm", "ditto", "--ditto-global", "dp-fedavg"], ["ditto_global"]),
        (["--client-split", "1"], ["client_split"]),
    ],
)
def test_bad_robustness_settings_exit_2_with_one_line(args, words, tmp_path, capsys):
    out = tmp_path / "run"
    assert_cli_refuses(["run", *TINY, *args, "--out", str(out)], words, out, capsys)


def test_a_cached_host_population_can_be_split_and_poisoned():
    # Real datasets load as host populations (memory-mapped cache): the
    # client split and the data attack read them whole and stay on the host.
    import dataclasses

    from jaxfl.data.host import HostPopulation
    from jaxfl.data.registry import load_dataset
    from jaxfl.experiment.config import make_config
    from jaxfl.experiment.robustness import run_robustness
    from jaxfl.experiment.runner import personal_test_split

    device = load_dataset("label-shift", num_train_clients=12, num_test_clients=4, num_validation_clients=0,
                          pool_size=5000)  # fmt: skip
    host = dataclasses.replace(device, train=HostPopulation.from_device(device.train))
    split = personal_test_split(host, 0.25, seed=0)
    assert isinstance(split.train, HostPopulation) and split.personal_splits
    assert split.test.num_clients == 12
    np.testing.assert_array_equal(
        np.asarray(split.train.counts) + np.asarray(split.test.counts), np.asarray(device.train.counts)
    )
    config = make_config({"attack": "random-labels", "attack_fraction": 0.5})
    _, poisoned, corrupted = run_robustness(config, split)
    assert isinstance(poisoned.train, HostPopulation) and corrupted.sum() == 6
    changed = np.array([
        not np.array_equal(poisoned.train.client(i)["y"], split.train.client(i)["y"]) for i in range(12)
    ])  # fmt: skip
    assert not changed[~corrupted].any()  # Benign clients' examples are untouched.
    assert changed[corrupted].all()  # Random labels over 10 classes change some of each.
    for i in range(12):
        np.testing.assert_array_equal(poisoned.train.client(i)["x"], split.train.client(i)["x"])


@pytest.mark.slow
def test_a_ditto_sweep_point_is_the_single_run(tmp_path, capsys, monkeypatch):
    # lambda is a traced hyperparameter: a grid over it is one compiled sweep,
    # each point (personal models included) equal to its single run up to
    # float rounding; the corrupted clients are the base seed's.
    common = [
        *TINY, "--algorithm", "ditto", "--client-split", "0.25", "--client-validation-split", "0.15",
        "--attack", "sign-flip",
    ]  # fmt: skip
    assert main(["sweep", *common, "--grid", "lam=0,2", "--out", str(tmp_path / "sweep")]) == 0
    # The single run keeps its personal models in host memory, and is stopped after round 2 and resumed
    # from its checkpoint (which holds the host rows): still the sweep point's models.
    single = ["run", *common, "--lam", "2", "--client-state", "host", "--checkpoint-every", "1"]
    request = StopAfter(1)
    monkeypatch.setattr(training_loop, "current_request", lambda: request)
    assert main([*single, "--out", str(tmp_path / "single")]) == 130
    monkeypatch.undo()
    assert main(["run", "--resume", str(tmp_path / "single"), "--no-progress"]) == 0
    assert json.loads((tmp_path / "single" / "timing.json").read_text())["resumed_from_round"] == 2
    capsys.readouterr()
    with (tmp_path / "sweep" / "results.csv").open() as f:
        rows = {r["lam"]: r for r in csv.DictReader(f)}
    # Each client's lambda chosen on its own validation data: one more row.
    per_client = rows.pop("per-client")
    with (tmp_path / "sweep" / "lambda-per-client-0-0.csv").open() as f:
        chosen = list(csv.DictReader(f))
    assert len(chosen) == 40 and {r["lam"] for r in chosen} <= {"0", "2"}
    benign = [float(r["test_personal_error"]) for r in chosen if r["attacked"] == "0"]
    np.testing.assert_allclose(float(per_client["personal_test_error_mean"]), np.mean(benign), rtol=1e-5)
    rows = {float(k): r for k, r in rows.items()}
    single = json.loads((tmp_path / "single" / "summary.json").read_text())
    assert single["attack"]["corrupted_clients"] == 8 and single["client_state"] == "host"
    for key in ("test_error", "personal_test_error"):
        column = f"{key}_mean"
        np.testing.assert_allclose(float(rows[2.0][column]), single[key]["mean"], rtol=1e-4, atol=1e-5)
    # lambda = 0 (local models) and lambda = 2 differ only in the personal models.
    assert rows[0.0]["test_error_mean"] == rows[2.0]["test_error_mean"]
    # Each point saves its models as the single run does (point 1 is lambda = 2).
    from jaxfl.experiment.saved_model import load_model

    point, alone = load_model(tmp_path / "sweep" / "points" / "001"), load_model(tmp_path / "single")
    assert point.config.options.lam == 2.0 and point.config.runtime.out is None
    for saved in ("params", "personal"):
        leaves = [jax.tree.leaves(getattr(model, saved)) for model in (point, alone)]
        for got, want in zip(*leaves, strict=True):
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert_matches_record("ditto-host-state-resumed", tmp_path / "single", ["ditto"])


@pytest.mark.slow
def test_finetuning_baseline_from_the_cli(tmp_path, capsys):
    out = tmp_path / "run"
    # Host-resident clients (streamed evaluation) under an attack: the summaries count the benign ones too.
    # --eval-train: the training clients too (their streamed evaluation, and the fine-tuned models' fit).
    argv = [
        "run", *TINY, "--algorithm", "fedavg", "--client-split", "0.25", "--finetune-epochs", "2",
        "--finetune-ewc", "0.5", "--residency", "host", "--attack", "sign-flip", "--attack-fraction", "0.25",
        "--eval-train",
    ]  # fmt: skip
    assert main([*argv, "--out", str(out)]) == 0
    assert "fedavg (personal)" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["residency"] == "host"
    # Fine-tuned on their own data, the clients' models fit it better than the global model.
    assert summary["personal_train_loss"]["mean"] < summary["train_loss"]["mean"]
    with (out / "clients.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["population"] == "test"]
    assert "personal_error" in rows[0]
    attacked = np.array([r["attacked"] == "1" for r in rows])
    errors = np.array([float(r["error"]) for r in rows])
    assert attacked.sum() == 10
    np.testing.assert_allclose(summary["test_error"]["mean"], errors[~attacked].mean(), rtol=1e-5)
    assert_matches_record("fedavg-host-residency-sign-flip-finetuned", out, ["fedavg"])


def test_the_header_says_what_will_run_before_it_runs(tmp_path, capsys, monkeypatch):
    from jaxfl.experiment import main as experiment_main

    def training_fails(*args, **kwargs):
        raise RuntimeError("stopped before training")

    monkeypatch.setattr(experiment_main, "run_algorithm", training_fails)
    argv = ["run", *TINY, "--attack", "gaussian", "--attack-fraction", "0.25", "--aggregator", "median",
            "--out", str(tmp_path / "run")]  # fmt: skip
    with pytest.raises(RuntimeError, match="stopped before training"):
        main(argv)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("label-shift: 40 training / 20 test clients, 3 rounds, 8 clients per round")
    assert lines[1].startswith("training clients: device-resident")
    assert lines[2] == (
        "running fedavg, deltafl: attack gaussian by 10 corrupted clients; summaries over the benign ones; "
        "aggregator median"
    )
