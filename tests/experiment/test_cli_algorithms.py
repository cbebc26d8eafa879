"""Every algorithm from the command line, with its flags; bad algorithm
settings exit 2 with one line; unused settings are accepted with a warning."""

import dataclasses
import json
import os
import re

import pytest
from reference import StopAfter, assert_cli_refuses
from round_records import RECORDS, assert_matches_record

from jaxfl.algorithms import algorithm_names, algorithm_spec
from jaxfl.cli import main
from jaxfl.experiment import training_loop
from jaxfl.experiment.config import make_config
from jaxfl.experiment.runner import setup

# The tiny run of tests/experiment/test_cli.py.
TINY = [
    "--dataset-option",
    "num_train_clients=40",
    "--dataset-option",
    "num_validation_clients=0",
    "--dataset-option",
    "num_test_clients=20",
    "--dataset-option",
    "pool_size=20000",
    "--rounds",
    "4",
    "--clients-per-round",
    "5",
    "--eval-every",
    "2",
    "--no-progress",
]
FLAGS = [
    "--rounds",
    "3",
    "--eval-every",
    "1",
    "--local-epochs",
    "2",
    "--theta",
    "0.4",
    "--mu",
    "0.1",
    "--q",
    "0.5",
    "--tilt",
    "0.5",
    "--stragglers",
    "0.4",
    "--reweighting",
    "threshold",
    "--threshold-period",
    "2",
    "--filtering",
    "client",
    "--afl-lambda-lr",
    "0.05",
    "--qffl-variant",
    "fedsgd",
    # Given noise: dp-fedavg and dp-deltafl skip the calibration (tested in
    # test_cli_privacy.py) and report the epsilon it spends.
    "--dp-noise-multiplier",
    "1.0",
    # A given seed (a DP run draws one from the OS otherwise): the records' runs are reproducible.
    "--seed",
    "0",
]


def _groups() -> dict[str, list[str]]:
    """Comparisons of several algorithms that together run every registered one, by record name: those
    whose results are recorded (tests/records/cli-*.json), then any not recorded yet."""
    groups = {path.stem: sorted(json.loads(path.read_text())) for path in sorted(RECORDS.glob("cli-*.json"))}
    recorded = {name for group in groups.values() for name in group}
    new = [name for name in algorithm_names() if name not in recorded]
    if new:
        groups["cli-" + "-".join(new)] = new
    return groups


# Every algorithm runs, and runs of several algorithms give each its own hyperparameters.
GROUPS = _groups()


def test_the_groups_cover_every_algorithm():
    assert sorted(sum(GROUPS.values(), [])) == sorted(algorithm_names())


@pytest.mark.slow
@pytest.mark.parametrize("record", GROUPS)
def test_every_algorithm_runs_from_the_cli(record, tmp_path, capsys):
    names = GROUPS[record]
    out = tmp_path / "run"
    # The training clients are evaluated only when asked: here for the group whose personal models are
    # made after training (not saved, their evaluation on the training clients is their only record).
    eval_train = any(algorithm_spec(name).adapts_after_training for name in names)
    status = main(
        ["run", *TINY, *FLAGS, "--algorithm", ",".join(names), "--out", str(out)]
        + ["--eval-train"] * eval_train
    )
    captured = capsys.readouterr()
    assert status == 0, captured.err
    # A run of one algorithm writes its files in the run folder itself.
    folder = {name: out / name if len(names) > 1 else out for name in names}
    for name in names:
        assert f"\n{name} " in captured.out
        summary = json.loads((folder[name] / "summary.json").read_text())
        assert 0.0 <= summary["test_error"]["mean"] <= 1.0
        assert ("train_loss" in summary) == eval_train
        spec = algorithm_spec(name)
        if spec.personal_models or spec.adapts_after_training:
            # Personal models, evaluated beside the global one on their clients' training data (the
            # dataset holds no test data of theirs): with --eval-train only, which the header says.
            personal = f"\n{name} (personal, on train data)" in captured.out
            assert personal == ("personal_train_loss" in summary) == eval_train
            listed = re.search(r"personal models of (.*?) not evaluated", captured.out)
            assert (listed is not None and name in listed[1].split(", ")) != eval_train
        config = json.loads((folder[name] / "config.json").read_text())
        assert config["algorithm"] == name and config["theta"] == 0.4
    metrics = {
        name: json.loads((folder[name] / "metrics.jsonl").read_text().splitlines()[-1])["round_metrics"]
        for name in names
    }
    if "deltafl" in names:
        assert {"clients_with_weight", "threshold"} <= set(metrics["deltafl"])
        assert metrics["fedavg-sub"]["clients_with_weight"] == 2  # round(0.4 * 5)
        assert metrics["fedavg"]["stragglers"] == 2  # --stragglers 0.4, dropped.
    if "fedprox" in names:
        assert metrics["fedprox"]["stragglers"] == 2
        assert metrics["fedsgd"]["local_steps"] == 1
    # Every algorithm's results, pinned: a change to the round that moves a bit shows here.
    if (RECORDS / f"{record}.json").exists() or os.environ.get("JAXFL_RECORDS") == "write":
        assert_matches_record(record, out, names)


def test_settings_reach_the_state_hyperparameters():
    config = make_config(
        dict(
            algorithm="deltafl,fedavg-sub,term",
            theta=0.4,
            tilt=-1.5,
            clients_per_round=5,
            dataset_options=dict(
                num_train_clients=40,
                num_validation_clients=0,
                num_test_clients=20,
                pool_size=20000,
            ),
        )
    )
    run_setup = setup(config)
    assert run_setup.hparams["deltafl"]["theta"] == 0.4
    assert run_setup.hparams["fedavg-sub"]["theta"] == 0.4
    assert run_setup.hparams["term"]["tilt"] == -1.5
    assert "theta" not in run_setup.hparams["term"]
    assert run_setup.ignored_settings == ()


def test_unused_settings_are_accepted_with_a_warning(capsys):
    config = make_config(
        dict(
            algorithm="fedavg",
            theta=0.3,
            reweighting="smoothed",
            clients_per_round=5,
            dataset_options=dict(
                num_train_clients=40,
                num_validation_clients=0,
                num_test_clients=20,
                pool_size=20000,
            ),
        )
    )
    run_setup = setup(config)
    err = capsys.readouterr().err
    assert run_setup.ignored_settings == ("reweighting", "theta")
    assert "jaxfl: warning: theta is not used by fedavg; ignored" in err
    # The client-state layout serves per-client state; fine-tuning, algorithms without personal models.
    base = dict(clients_per_round=5, dataset_options=config.data.dataset_options)

    def ignored(**settings):
        return setup(make_config({**base, **settings})).ignored_settings

    assert ignored(algorithm="fedavg", client_state="split") == ("client_state",)
    assert ignored(algorithm="apfl", finetune_epochs=2) == ("finetune_epochs",)
    assert ignored(algorithm="fedavg,apfl", finetune_epochs=2) == ()


def test_dp_fedadam_warns_of_a_server_learning_rate_made_for_sgd():
    from jaxfl.experiment.config import RunConfig, setting_warnings

    def warnings(**settings):
        return setting_warnings(RunConfig().replace(**settings), ())

    assert any("dp-fedadam runs adam with server_lr=1" in line for line in warnings(algorithm="dp-fedadam"))
    assert warnings(algorithm="dp-fedadam", server_lr=0.01) == []
    assert warnings(algorithm="dp-fedavg") == []


@pytest.mark.slow
def test_dp_fedadam_steps_with_adam_and_the_runs_server_settings():
    import jax
    import optax

    from jaxfl.algorithms.base import server_optimizer

    base = dict(clients_per_round=5, server_beta1=0.5, rounds=4, epsilon=8.0, dataset_options=dict(
        num_train_clients=40, num_validation_clients=0, num_test_clients=20, pool_size=20000))
    run_setup = setup(make_config({**base, "algorithm": "dp-fedavg,dp-fedadam"}))
    # The run's --server-optimizer (sgd) for dp-fedavg, adam for dp-fedadam; beta1 is read, not ignored.
    assert run_setup.ignored_settings == ()
    params = run_setup.engine.task.model.init(jax.random.key(0))
    opt_states = {
        name: algorithm.init(params, {}).opt_state for name, algorithm in run_setup.algorithms.items()
    }
    adam = server_optimizer("adam", 1.0, beta1=0.5)
    assert jax.tree.structure(opt_states["dp-fedadam"]) == jax.tree.structure(adam.init(params))
    assert jax.tree.structure(opt_states["dp-fedavg"]) != jax.tree.structure(adam.init(params))
    found = [s for s in jax.tree.leaves(opt_states["dp-fedadam"], is_leaf=lambda x: isinstance(
        x, optax.ScaleByAdamState)) if isinstance(s, optax.ScaleByAdamState)]
    assert len(found) == 1
    assert run_setup.algorithms["dp-fedadam"].name == "dp-fedadam"
    # The public registry builds it so too, from an engine without the run's settings (adam's defaults).
    from jaxfl.algorithms import build_algorithm

    engine = dataclasses.replace(run_setup.engine, server_settings=None)
    state = build_algorithm("dp-fedadam", engine).init(params, {})
    assert jax.tree.structure(state.opt_state) == jax.tree.structure(server_optimizer("adam").init(params))


@pytest.mark.parametrize(
    "args, words",
    [
        (
            ["--algorithm", "deltafl", "--filtering", "client"],
            ["deltafl", "filtering", "threshold or dp"],
        ),
        (
            ["--algorithm", "fedprox", "--stragglers", "0.5"],
            ["fedprox", "local_epochs >= 2"],
        ),
        (
            ["--algorithm", "deltafl", "--reweighting", "median"],
            ["reweighting", "exact"],
        ),
        (["--algorithm", "deltafl", "--dp-bins", "48"], ["dp_bins", "power of two"]),
        (["--algorithm", "perfedavg", "--batch-size", "2"], ["perfedavg", "batch_size must be >= 3"]),
        (["--theta", "0"], ["theta", "(0.0, 1.0]"]),
        (["--theta", "1.5"], ["theta", "(0.0, 1.0]"]),
        (["--stragglers", "1"], ["stragglers", "[0.0, 1.0)"]),
        (["--q", "-1"], ["q", ">= 0"]),
        (["--mu", "-0.1"], ["mu", ">= 0"]),
        (["--smoothing", "0"], ["smoothing", "> 0"]),
        (["--threshold-period", "0"], ["threshold_period", ">= 1"]),
        (["--afl-lambda-lr", "0"], ["afl_lambda_lr", "> 0"]),
        (["--dp-bits", "40"], ["dp_bits", "[2, 32]"]),
        (["--qffl-variant", "sgd"], ["qffl_variant", "fedavg"]),
        # List-valued settings: every element as its scalar twin, no empty or repeated one, a bounded count.
        (["--ditto-dynamic-lam", " "], ["ditto_dynamic_lam", "comma-separated numbers"]),
        (["--ditto-dynamic-lam", "0.1,,1"], ["ditto_dynamic_lam", "comma-separated numbers"]),
        (["--ditto-dynamic-lam", "1e39,1"], ["ditto_dynamic_lam", "float32", "--lam"]),
        (["--ditto-dynamic-lam=-1,1"], ["ditto_dynamic_lam", ">= 0", "--lam"]),
        (["--ditto-dynamic-lam", "nan"], ["ditto_dynamic_lam", "--lam"]),
        (["--ditto-dynamic-lam", "1,1.0"], ["ditto_dynamic_lam", "twice"]),
        (["--mapper-candidates", ""], ["mapper_candidates", "comma-separated numbers"]),
        (["--mapper-candidates", "0.5,1.5"], ["mapper_candidates", "[0, 1]"]),
        (["--mapper-candidates", ",".join(map(str, range(1000)))], ["mapper_candidates", "at most 32"]),
    ],
)
def test_bad_algorithm_settings_exit_2_with_one_line(args, words, tmp_path, capsys):
    out = tmp_path / "out"
    assert_cli_refuses(["run", *TINY, *args, "--out", str(out)], words, out, capsys)


@pytest.mark.slow
def test_scaffold_control_variates_in_host_memory_resume_to_the_uninterrupted_run(
    tmp_path, monkeypatch, capsys
):
    # SCAFFOLD's c_i are per-client state that is not a model: kept in host memory, checkpointed
    # with the run and resumed, they give the uninterrupted run's results (its record); no personal
    # models.
    argv = ["run", *TINY, "--algorithm", "scaffold", "--scaffold-option", "1", "--client-state", "host",
            "--rounds", "3", "--eval-every", "3", "--checkpoint-every", "1", "--out", str(tmp_path / "run")]
    request = StopAfter(1)
    monkeypatch.setattr(training_loop, "current_request", lambda: request)
    assert main(argv) == 130
    monkeypatch.undo()
    assert main(["run", "--resume", str(tmp_path / "run"), "--no-progress"]) == 0
    assert "scaffold (personal" not in capsys.readouterr().out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["client_state"] == "host" and "personal_test_error" not in summary
    assert json.loads((tmp_path / "run" / "timing.json").read_text())["resumed_from_round"] >= 1
    assert_matches_record("scaffold-option-1-host-state", tmp_path / "run", ["scaffold"])
