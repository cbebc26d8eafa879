"""The round profiler reads what a trace says: phases from the round's named scopes, kernel counts, copies.

Synthetic traces shaped like the GPU's (kernels of one CUDA graph overlapping by
a fraction of a microsecond, copies, driver calls) and XLA:CPU's (loop thunks
enclosing their bodies' thunks), and one real CPU profile of a FedAvg round,
whose kernels must land in the round template's phases. Speed is never asserted.
"""

from pathlib import Path

import jax
import numpy as np
import pytest
from reference import imported_script

from jaxfl.algorithms.fedavg import fedavg
from jaxfl.data.population import pack_clients
from jaxfl.models.networks import make_model
from jaxfl.training.local import LocalTraining, Task
from jaxfl.training.strategies import ClientStrategy

# The scripts' and benchmarks' harnesses run in the end-to-end tier (`pytest -m slow`).
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "round_profile.py"

HLO = """\
HloModule jit_round_fn

%fused_select (p: s32[4]) -> s32[4] {
  %p = s32[4]{0} parameter(0)
  ROOT %add.1 = s32[4]{0} add(%p, %p), metadata={op_name="jit(round_fn)/select/add"}
}

ENTRY %main (x: s32[4]) -> s32[4] {
  %x = s32[4]{0} parameter(0)
  %loop_add_fusion.2 = s32[4]{0} fusion(%x), kind=kLoop, calls=%fused_select
  ROOT %dot.3 = s32[4]{0} add(%loop_add_fusion.2, %x), metadata={op_name="jit(round_fn)/client_update/while/body/vmap(local_steps)/dot_general"}
}
"""


@pytest.fixture(scope="module")
def profiler():
    with imported_script(SCRIPT) as module:
        yield module


def test_op_names_follow_fusions_to_their_root(profiler):
    names = profiler.op_names(HLO)
    assert names["loop_add_fusion.2"] == "jit(round_fn)/select/add"
    assert names["dot.3"].endswith("vmap(local_steps)/dot_general")
    assert "x" not in names


@pytest.mark.parametrize(
    "op_name, phase",
    [
        ("jit(round_fn)/client_update/while/body/vmap(local_steps)/dot_general", "local_steps"),
        ("jit(round_fn)/client_update/vmap(epoch_orders)/sort", "epoch_orders"),
        ("jit(round_fn)/client_update/sub", "client_update"),
        ("jit(round_fn)/select/jit(_randint)/add", "select"),
        ("jit(round_fn)/server/add", "server"),
        ("jit(round_fn)/reduce_sum", "other"),
        ("jit(round_fn)/select_n", "other"),
        (None, "other"),
    ],
)
def test_phase_of(profiler, op_name, phase):
    assert profiler.phase_of(op_name) == phase


def _event(name, ts, dur, pid=1, tid=7, **args):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def test_gpu_trace_counts_overlapping_graph_kernels_and_copies(profiler):
    names = profiler.op_names(HLO)
    metadata = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "name": "process_name", "pid": 9, "args": {"name": "/host:CPU"}},
    ]
    rounds = []
    for start in (0.0, 100.0):  # two rounds
        rounds += [
            # Kernels of one graph: the next starts 0.2 us before this one ends.
            _event("loop_add_fusion_2", start, 2.0, hlo_op="command_buffer_1"),
            _event("dot_3", start + 1.8, 10.0, hlo_op="command_buffer_1"),
            _event("MemcpyDtoH", start + 12.0, 1.0),
            _event("cuGraphLaunch (CudaGraph:2)", start, 3.0, pid=9),
            _event("cuStreamSynchronize", start + 3.0, 9.0, pid=9),
        ]
    summary = profiler.summarize_trace(metadata + rounds, names, rounds=2)
    assert summary["kernels_per_round"] == 2
    assert summary["memcpy_per_round"] == 1
    assert summary["host_syncs_per_round"] == 1
    assert summary["host_api_per_round"]["cuGraphLaunch"] == 1
    assert summary["phases"] == {"local_steps": {"kernels": 1, "us": 10.0}, "select": {"kernels": 1, "us": 2.0}}
    assert summary["device_busy_us_per_round"] == pytest.approx(12.0)
    assert summary["device_span_us_per_round"] == pytest.approx((111.8 - 0.0) / 2)


def test_cpu_trace_keeps_the_leaves_of_nested_thunks(profiler):
    names = {"while.1": "jit(round_fn)/client_update/while", "dot.3": "jit(round_fn)/x/vmap(local_steps)/dot"}
    events = [
        _event("while.1", 0.0, 50.0, pid=3, hlo_op="while.1"),
        _event("dot.3", 1.0, 10.0, pid=3, hlo_op="dot.3"),
        _event("dot.3", 20.0, 10.0, pid=3, hlo_op="dot.3"),
        _event("end: dot.3", 31.0, 0.0, pid=3),
        _event("PjitFunction(round_fn)", 0.0, 60.0, pid=3),  # not XLA's work: no hlo_op
    ]
    summary = profiler.summarize_trace(events, names, rounds=1)
    assert summary["kernels_per_round"] == 2
    assert summary["phases"] == {"local_steps": {"kernels": 2, "us": 20.0}}


@pytest.mark.slow
def test_a_real_round_profile_lands_in_the_template_phases(profiler, tmp_path):
    rng = np.random.default_rng(0)
    population = pack_clients([
        {"x": rng.normal(size=(n, 4)).astype(np.float32), "y": rng.integers(0, 3, n).astype(np.int32)}
        for n in (5, 9, 3, 7)
    ])
    task = Task(make_model("linear", (4,), 3))
    algorithm = fedavg(task, LocalTraining(batch_size=2, loop="while"), 3, strategy=ClientStrategy("vmap"))
    state = algorithm.init(task.model.init(jax.random.key(0)), {"lr": 0.1})
    key = jax.random.key(1)
    compiled = jax.jit(algorithm.round).lower(state, population, key).compile()
    summary = profiler.profile(compiled, state, population, key, 1, 2, tmp_path)
    assert "profile_error" not in summary
    assert {"select", "epoch_orders", "local_steps", "server"} <= set(summary["phases"])
    assert summary["kernels_per_round"] >= sum(p["kernels"] for p in summary["phases"].values()) - 1e-9
    again = profiler.summarize_saved(tmp_path, rounds=99)  # rounds.txt says 2
    assert again["phases"] == summary["phases"]
