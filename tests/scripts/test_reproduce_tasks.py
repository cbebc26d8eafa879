"""scripts/reproduce_tasks.py: the report reads the CLI's outputs (pooled accuracy by counted targets)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

# The scripts' and benchmarks' harnesses run in the end-to-end tier (`pytest -m slow`).
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "reproduce_tasks.py"


@pytest.fixture(scope="module")
def reproduce():
    spec = importlib.util.spec_from_file_location("reproduce_tasks", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_run(directory: Path, algorithm: str, errors, targets, **config):
    directory.mkdir(parents=True)
    config = {"algorithm": algorithm, "server_optimizer": "sgd", **config}
    (directory / "config.json").write_text(json.dumps(config))
    summary = {"test_error": {"mean": 0.5, "p90": 0.6, "superquantile_90": 0.7, "best_10": 0.1}}
    (directory / "summary.json").write_text(json.dumps(summary))
    rows = ["population,client,num_examples,loss,error,targets", "train,0,9,1.0,0.9,90"]
    rows += [f"test,{i},1,1.0,{e},{t}" for i, (e, t) in enumerate(zip(errors, targets, strict=True))]
    (directory / "clients.csv").write_text("\n".join(rows) + "\n")
    (directory / "metrics.jsonl").write_text(json.dumps({"round": 10, "test_error": {"mean": 0.5}}) + "\n")


def test_pooled_accuracy_weights_test_clients_by_their_counted_targets(reproduce, tmp_path):
    write_run(tmp_path / "run", "fedavg", errors=[0.5, 0.1], targets=[10, 30])
    # (0.5 * 10 + 0.9 * 30) / 40 correct; the training row is left out.
    assert reproduce.pooled_accuracy(tmp_path / "run") == pytest.approx((5 + 27) / 40)


def test_report_labels_sweep_points_and_server_optimizers(reproduce, tmp_path, capsys):
    root = tmp_path / "shakespeare-fedavg" / "seed0"
    write_run(root / "fedavg", "fedavg", [0.5], [4])
    write_run(root / "fedadam", "fedavg", [0.25], [4], server_optimizer="adam", server_lr=0.01)
    write_run(root / "deltafl" / "points" / "000", "deltafl", [0.5], [4], theta=0.5)
    reproduce.report(tmp_path)
    printed = capsys.readouterr().out
    assert "| 0 | fedavg | 50.0% | 50.0% | 60.0% | 70.0% | 10.0% |" in printed
    assert "fedavg server adam lr 0.01 | 75.0%" in printed
    assert "deltafl theta=0.5" in printed and "10: 50.0%" in printed
