"""DP from the command line: the privacy object of summary.json (epsilon from
the accountant, delta = 1/n by default), the printed epsilon, a given noise
multiplier, and every refused privacy setting (exit 2, one line, nothing
written)."""

import csv
import json

import dp_accounting
import pytest
from dp_accounting.rdp import rdp_privacy_accountant
from privacy.test_independent_accounting import ORDERS, eps_from_rdp, wor_rdp
from reference import assert_cli_refuses

from jaxfl.cli import main

# The tiny run of tests/experiment/test_cli.py: 40 training clients, 5 per round.
TINY = [
    "--dataset-option", "num_train_clients=40",
    "--dataset-option", "num_validation_clients=0",
    "--dataset-option", "num_test_clients=20",
    "--dataset-option", "pool_size=20000",
    "--rounds", "4", "--clients-per-round", "5", "--eval-every", "2",
    "--no-progress", "--strategy", "vmap",
]  # fmt: skip
PRIVACY_KEYS = {
    "epsilon",
    "delta",
    "noise_multiplier",
    "sampling_rate",
    "rounds",
    "accountant",
    "clip_norm",
    "sensitivity",
}


@pytest.fixture(scope="module")
def dp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "dp"
    status = main(
        ["run", *TINY, "--algorithm", "dp-fedavg,dp-deltafl,adadps,dp2,dp-fedadam", "--epsilon", "8",
         "--clip-norm", "0.7", "--out", str(out)]
    )  # fmt: skip
    assert status == 0
    return out


def _independent_epsilon(noise_multiplier, rounds, delta):
    accountant = rdp_privacy_accountant.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
    )
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.SampledWithoutReplacementDpEvent(
            40, 5, dp_accounting.GaussianDpEvent(noise_multiplier)
        ),
        rounds,
    )
    return accountant.compose(event).get_epsilon(delta)


@pytest.mark.slow
def test_summary_has_the_privacy_object(dp_run):
    for name in ("dp-fedavg", "dp-deltafl"):
        privacy = json.loads((dp_run / name / "summary.json").read_text())["privacy"]
        assert PRIVACY_KEYS <= set(privacy)
        assert 7.9 <= privacy["epsilon"] <= 8.0  # Calibrated to the target.
        assert privacy["target_epsilon"] == 8.0
        assert privacy["delta"] == 1 / 40  # Default: 1/n.
        assert privacy["sampling_rate"] == 5 / 40 and privacy["rounds"] == 4
        assert privacy["clip_norm"] == pytest.approx(0.7)
        assert privacy["sensitivity"] == pytest.approx(1.4)
        # DP^2's RMSProp-phase rounds clip to their own C2 (default 1): their noise is reported too.
        second = privacy.get("rmsprop_phase")
        assert (second is not None) == (name == "dp2")
        if second:
            assert second["sensitivity"] == 2.0
            assert second["noise_stddev"] == pytest.approx(2.0 * privacy["noise_multiplier"])
        assert privacy["noise_stddev"] == pytest.approx(
            1.4 * privacy["noise_multiplier"]
        )
    fedavg = json.loads((dp_run / "dp-fedavg" / "summary.json").read_text())["privacy"]
    assert fedavg["epsilon"] == pytest.approx(
        _independent_epsilon(fedavg["noise_multiplier"], 4, 1 / 40), rel=1e-9
    )
    deltafl = json.loads((dp_run / "dp-deltafl" / "summary.json").read_text())[
        "privacy"
    ]
    quantile = deltafl["quantile"]
    assert quantile["ratio_to_update"] == pytest.approx(0.25, rel=1e-3)
    assert quantile["share"] == pytest.approx(0.2, rel=1e-3)
    assert quantile["sigma"] >= 0.5 and quantile["bins"] == 32
    assert deltafl["epsilon_without_amplification"] > deltafl["epsilon"]
    config = json.loads((dp_run / "dp-deltafl" / "config.json").read_text())
    assert config["epsilon"] == 8.0 and config["delta"] is None


@pytest.mark.slow
def test_the_preconditioned_and_adaptive_variants_calibrate_dp_fedavgs_noise(dp_run):
    # Their preconditioners read public side information or released updates only, so each releases
    # what DP-FedAvg releases: at the same --epsilon the same noise multiplier, and the same epsilon,
    # recomputed here from the hand-composed RDP of sampling without replacement (WBK19).
    fedavg = json.loads((dp_run / "dp-fedavg" / "summary.json").read_text())["privacy"]
    for name in ("adadps", "dp2", "dp-fedadam"):
        privacy = json.loads((dp_run / name / "summary.json").read_text())["privacy"]
        assert privacy["noise_multiplier"] == fedavg["noise_multiplier"], name
        hand = eps_from_rdp(ORDERS, 4 * wor_rdp(5 / 40, privacy["noise_multiplier"]), 1 / 40)
        assert privacy["epsilon"] == pytest.approx(hand, rel=1e-3), name
        assert privacy["sensitivity"] == pytest.approx(1.4)


@pytest.mark.slow
def test_a_given_noise_multiplier_is_used_and_its_epsilon_reported(tmp_path, capsys):
    out = tmp_path / "given"
    status = main(
        ["run", *TINY, "--algorithm", "dp-fedavg", "--dp-noise-multiplier", "1.5",
         "--delta", "0.001", "--out", str(out)]
    )  # fmt: skip
    stdout = capsys.readouterr().out
    assert status == 0
    privacy = json.loads((out / "summary.json").read_text())["privacy"]
    assert privacy["noise_multiplier"] == 1.5 and privacy["target_epsilon"] is None
    assert privacy["delta"] == 0.001
    assert privacy["epsilon"] == pytest.approx(
        _independent_epsilon(1.5, 4, 0.001), rel=1e-9
    )
    assert f"dp-fedavg: spent ({privacy['epsilon']:.3f}, 0.001)-DP against an observer" in stdout
    assert f"and ({privacy['epsilon_against_server']:.3f}, 0.001)-DP against the server" in stdout
    assert "noise multiplier 1.5 (given: epsilon only reported)" in stdout


def _server_epsilon(noise_multiplier, rounds, delta):
    """No amplification: every round a Gaussian of the update's noise, composed in full."""
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(noise_multiplier), rounds)
    accountant = rdp_privacy_accountant.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
    )
    return accountant.compose(event).get_epsilon(delta)


@pytest.mark.slow
def test_both_trust_models_are_reported_and_the_target_names_one(dp_run, tmp_path, capsys):
    observer = json.loads((dp_run / "dp-fedavg" / "summary.json").read_text())["privacy"]
    assert observer["trust_model"] == "observer" and set(observer["trust_models"]) == {"observer", "server"}
    assert observer["epsilon"] == observer["epsilon_against_observer"]
    assert observer["epsilon_against_server"] == pytest.approx(
        _server_epsilon(observer["noise_multiplier"], 4, 1 / 40), rel=1e-9
    )
    assert observer["epsilon_against_server"] > observer["epsilon"]
    out = tmp_path / "server"
    argv = ["run", *TINY, "--algorithm", "dp-fedavg", "--epsilon", "8", "--clip-norm", "0.7",
            "--dp-trust-model", "server", "--out", str(out)]
    assert main(argv) == 0
    assert "(calibrated against the server)" in capsys.readouterr().out
    server = json.loads((out / "summary.json").read_text())["privacy"]
    assert server["trust_model"] == "server" and server["epsilon"] == server["epsilon_against_server"]
    assert 7.9 <= server["epsilon"] <= 8.0  # The target holds against the server.
    assert server["noise_multiplier"] > observer["noise_multiplier"]
    assert server["epsilon_against_observer"] < server["epsilon"]


@pytest.mark.parametrize(
    "args, words",
    [
        (["--algorithm", "dp-fedavg", "--epsilon", "0"], ["epsilon", "> 0"]),
        (["--algorithm", "dp-fedavg", "--epsilon", "-1"], ["epsilon", "> 0"]),
        (["--algorithm", "dp-fedavg", "--delta", "0"], ["delta", "(0.0, 1.0)"]),
        (["--algorithm", "dp-fedavg", "--delta", "1"], ["delta", "(0.0, 1.0)"]),
        (["--algorithm", "dp-fedavg", "--clip-norm", "0"], ["clip_norm", "> 0"]),
        (
            ["--algorithm", "dp-fedavg", "--dp-noise-multiplier", "0"],
            ["dp_noise_multiplier", "> 0"],
        ),
        (
            ["--algorithm", "dp-deltafl", "--dp-quantile-ratio", "0"],
            ["dp_quantile_ratio", "> 0"],
        ),
        (
            ["--algorithm", "dp-deltafl", "--dp-quantile-sigma", "0.3"],
            ["dp_quantile_sigma", ">= 0.5"],
        ),
        (
            ["--algorithm", "dp-deltafl", "--dp-bins", "2"],
            ["dp-deltafl", "dp_bins", ">= 4"],
        ),
        (
            [
                "--algorithm",
                "dp-deltafl",
                "--dp-bits",
                "8",
                "--dp-noise-multiplier",
                "1",
            ],
            ["dp-deltafl", "dp_bits=8", "Theorem 6", "dp_bits >= 12"],
        ),  # fmt: skip
        (
            [
                "--algorithm",
                "dp-deltafl",
                "--dp-scale",
                "1",
                "--dp-noise-multiplier",
                "0.3",
                "--dp-quantile-ratio",
                "100",
            ],
            ["dp-deltafl", "sigma >= 1/2", "raise dp_scale"],
        ),  # fmt: skip
        (
            ["--algorithm", "dp-fedavg", "--dp-noise-multiplier", "3"],
            ["dp-fedavg", "noise multiplier 3 > 2.5", "learn nothing"],
        ),
        (  # Calibrated: so small an epsilon needs absurd noise.
            ["--algorithm", "dp-fedavg", "--epsilon", "0.01"],
            ["dp-fedavg", "> 2.5", "learn nothing"],
        ),
    ],
)
def test_refused_privacy_settings_exit_2_with_one_line(args, words, tmp_path, capsys):
    out = tmp_path / "out"
    assert_cli_refuses(["run", *TINY, *args, "--out", str(out)], words, out, capsys)


@pytest.mark.slow
def test_a_private_sweep_keeps_each_points_privacy(tmp_path):
    # A grid over epsilon (an outer setting: one calibration per point) and the
    # clip norm (vmapped): every point's summary and row carry what it spent.
    out = tmp_path / "sweep"
    grid = ["--grid", "epsilon=4,8", "--grid", "clip_norm=0.5,1"]
    assert main(["sweep", *TINY, "--algorithm", "dp-fedavg", *grid, "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "results.csv").read_text().splitlines()))
    assert len(rows) == 4
    for row in rows:
        summary = json.loads((out / "points" / f"{int(row['point']):03d}" / "summary.json").read_text())
        privacy = summary["privacy"]
        assert PRIVACY_KEYS <= set(privacy)
        assert privacy["clip_norm"] == float(row["clip_norm"])
        assert float(row["privacy_epsilon"]) == privacy["epsilon"]
        # Calibrated to the point's own target, never above it.
        assert privacy["epsilon"] <= float(row["epsilon"]) * (1 + 1e-6)
        assert privacy["epsilon"] == pytest.approx(float(row["epsilon"]), rel=0.05)
        assert float(row["privacy_noise_multiplier"]) == privacy["noise_multiplier"]
        assert float(row["privacy_epsilon_against_server"]) == privacy["epsilon_against_server"]
        assert row["privacy_trust_model"] == "observer"


@pytest.mark.slow
def test_dp_deltafl_divides_by_a_public_count_unless_told_otherwise(dp_run, tmp_path, capsys):
    privacy = json.loads((dp_run / "dp-deltafl" / "summary.json").read_text())["privacy"]
    quantile = privacy["quantile"]
    assert quantile["selected_count_public"] is False and quantile["divisor"].startswith("theta * m")
    # m_t is then a diagnostic: listed with what is not private, as every round metric but the threshold
    # and the norm of the released update.
    not_private = " ".join(privacy["not_private"])
    assert "clients_with_weight (m_t" in not_private and "rounds_without_weight" in not_private
    record = json.loads((dp_run / "dp-deltafl" / "metrics.jsonl").read_text().splitlines()[-1])
    for metric in set(record["round_metrics"]) - {"threshold", "update_norm", "clients_with_weight"}:
        assert metric in not_private
    # The training clients' evaluation is listed where it is written (--eval-train), not here.
    assert "train_loss" not in record and "train_* summaries" not in not_private
    out = tmp_path / "exact"
    argv = ["run", *TINY, "--algorithm", "dp-deltafl", "--epsilon", "8", "--dp-count", "exact",
            "--out", str(out)]
    assert main(argv) == 0
    stdout = capsys.readouterr().out
    assert "dp-deltafl: divides by the exact count m_t" in stdout and "NOT accounted" in stdout
    exact = json.loads((out / "summary.json").read_text())["privacy"]
    assert exact["quantile"]["selected_count_public"] is True
    assert "m_t" in exact["released_update"] and "m_t" not in " ".join(exact["not_private"])


def test_a_dp_run_without_a_seed_draws_a_secret_one_and_says_so():
    # The observer's epsilon assumes secret cohort sampling: the default seed (0) is public.
    from jaxfl.cli import build_parser, resolve_config
    from jaxfl.experiment.main import composition_note, format_privacy

    def config(*flags):
        return resolve_config(build_parser().parse_args(["run", *flags]))

    drawn, again = config("--algorithm", "dp-fedavg"), config("--algorithm", "fedavg,dp-deltafl")
    first, second = drawn.runtime, again.runtime
    assert first.seed_drawn and second.seed_drawn and first.seed != second.seed  # 2^-31 to collide.
    given, plain = config("--algorithm", "dp-fedavg", "--seed", "0"), config("--algorithm", "fedavg")
    assert (given.runtime.seed, given.runtime.seed_drawn) == (0, False)
    assert (plain.runtime.seed, plain.runtime.seed_drawn) == (0, False)
    privacy = {
        "epsilon_against_observer": 1.0, "epsilon_against_server": 3.0, "delta": 1e-5, "rounds": 2,
        "noise_multiplier": 1.0, "trust_model": "observer", "sampling_rate": 0.1,
    }
    assert "drawn from the OS" in format_privacy("dp-fedavg", privacy, drawn)
    assert "seed 0 was given" in format_privacy("dp-fedavg", privacy, given)
    assert "neither epsilon holds against whoever knows it" in format_privacy("dp-fedavg", privacy, given)
    # Several DP models of the same clients: basic composition, said once.
    assert composition_note(1) is None
    note = composition_note(3)
    assert "3 models" in note and "sum of their epsilons, sum of their deltas" in note
