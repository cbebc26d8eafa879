"""The benchmark script's JSON contract, on a tiny configuration.

Speed itself is measured by the benchmarks, never asserted here; this checks
that the script runs and reports the fields benchmarks/RESULTS.md relies on.
"""

from pathlib import Path

import pytest
from reference import imported_script

# The scripts' and benchmarks' harnesses run in the end-to-end tier (`pytest -m slow`).
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "rounds_per_second.py"


@pytest.fixture(scope="module")
def benchmark():
    with imported_script(SCRIPT) as module:
        yield module


@pytest.mark.slow
def test_measure_reports_the_documented_fields(benchmark):
    args = benchmark._parse([
        "--workload", "population", "--population", "50", "--clients-per-round", "8",
        "--algorithm", "deltafl", "--rounds", "2", "--repeats", "1", "--strategy", "sequential",
    ])
    result = benchmark.measure(args)
    for field in ("workload", "algorithm", "strategy", "devices", "backend", "rounds_per_s",
                  "compile_s", "useful_gflops_per_s", "peak_fraction"):
        assert field in result
    assert result["strategy"] == "sequential" and result["clients"] == 50
    assert result["loop"] in ("scan", "while")  # 'auto' resolved.
    assert result["rounds_per_s"] > 0 and 0 < result["peak_fraction"] < 1


def test_useful_flops_count_real_examples_only(benchmark):
    from jaxfl.models.networks import make_model

    model = make_model("linear", (784,), 62)
    counts = [20, 400]
    # Linear: forward (2 FLOPs per weight) and weight gradient, per example.
    expected = 420 * 2 * (2 * 784 * 62)
    assert benchmark.useful_flops_per_round(model, counts, 1, False) == expected
    assert benchmark.useful_flops_per_round(model, counts, 1, True) == expected + 420 * 2 * 784 * 62
