"""Compressed updates from the command line: the bytes in metrics.jsonl and summary.json against the
code's size and the uploads, and the settings that cannot apply refused or warned about in one line."""

import json

import pytest
from reference import TINY_LABEL_SHIFT, assert_cli_refuses

from jaxfl.cli import main

TINY = [*TINY_LABEL_SHIFT, "--rounds", "3", "--clients-per-round", "8", "--eval-every", "1", "--no-progress"]


@pytest.mark.slow
def test_bytes_follow_from_the_code_size_and_the_clients_that_uploaded(tmp_path, capsys):
    out = tmp_path / "run"
    status = main([
        "run", *TINY, "--algorithm", "fedavg,deltafl", "--compression", "qsgd", "--compression-bits", "2",
        "--compression-bucket", "64", "--error-feedback", "--out", str(out),
    ])  # fmt: skip
    assert status == 0, capsys.readouterr().err
    for name in ("fedavg", "deltafl"):
        summary = json.loads((out / name / "summary.json").read_text())
        code = summary["compression"]
        model_bytes = code["uncompressed_update_bytes"]
        d = model_bytes // 4  # A float32 model.
        buckets = -(-d // 64)
        assert code["update_bytes"] == -(-(buckets * 32 + d * 3) // 8)
        assert code["error_feedback"] and not code["unbiased"]  # Scaled to a contraction.
        records = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
        uploads = 0
        for record in records:
            uploads += int(record["round_metrics"]["clients_uploading"])  # Every round is evaluated.
            assert record["client_uploads"] == uploads
            assert record["bytes_up"] == uploads * code["update_bytes"]
            assert record["bytes_down"] == record["round"] * 8 * model_bytes
        assert (summary["bytes_up"], summary["bytes_down"]) == (
            records[-1]["bytes_up"],
            records[-1]["bytes_down"],
        )
        # FedAvg's every client uploads; Delta-FL's tail only (theta = 0.5 of 8 after the first round).
        assert uploads == 24 if name == "fedavg" else 8 <= uploads < 24
    # The report draws error against bytes for a compressed run, from these records.
    from jaxfl.experiment.report import bytes_curve, read_folder, write_report

    (fedavg,) = [run for run in read_folder(out).runs if run.algorithm == "fedavg"]
    lines = (out / "fedavg" / "metrics.jsonl").read_text().splitlines()
    assert bytes_curve(fedavg)[0].tolist() == [json.loads(line)["bytes_up"] for line in lines]
    assert (write_report([out]).parent / "error_vs_bytes.png").exists()


@pytest.mark.parametrize(
    "args, words",
    [
        (["--algorithm", "l2sgd", "--compression", "top-k"], ["l2sgd", "writes its own round"]),
        (["--compression", "top-k", "--compression-fraction", "0"], ["compression_fraction"]),
        (["--compression", "qsgd", "--compression-bits", "17"], ["compression_bits"]),
        (["--compression", "gzip"], ["compression", "qsgd"]),
    ],
)
def test_settings_that_cannot_apply_are_refused_in_one_line(tmp_path, capsys, args, words):
    out = tmp_path / "run"
    assert_cli_refuses(["run", *TINY, *args, "--out", str(out)], words, out, capsys)


def test_compression_and_clock_settings_that_cannot_apply_are_reported_ignored():
    from jaxfl.experiment.config import RunConfig, setting_warnings

    def warnings(changed, **settings):
        return setting_warnings(RunConfig().replace(**settings), changed)

    assert warnings(["error_feedback"], error_feedback=True) == [
        "error_feedback is an option of --compression, which is unset; ignored"
    ]
    assert warnings(["compression_bits"], compression="top-k") == [
        "compression_bits is qsgd's; top-k does not quantize; ignored"
    ]
    assert warnings(["compression_fraction"], compression="qsgd") == [
        "compression_fraction is rand-k's and top-k's; qsgd sends every coordinate; ignored"
    ]
    assert warnings(["overselect"], overselect=1.3) == [
        "overselect is a setting of the simulated clock, which --availability turns on; ignored"
    ]
    assert warnings(["overselect"], overselect=1.3, availability="always") == []
