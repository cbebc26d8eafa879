"""Two processes joined by jax.distributed train the same model as one process.

The client axis is sharded over a mesh spanning both processes (CPU
collectives over gloo); the reference is the same script in one process with
the same number of devices.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "multiprocess_run.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _command(*args):
    return [sys.executable, str(SCRIPT), "--rounds", "2", *args]


@pytest.mark.slow
def test_two_processes_match_one(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    coordinator = f"localhost:{_free_port()}"
    workers = [
        subprocess.Popen(
            _command("--num-processes", "2", "--process-id", str(i), "--coordinator", coordinator,
                     "--out", str(tmp_path / "multi.npz")),
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for i in range(2)
    ]
    outputs = [w.communicate(timeout=240)[0] for w in workers]
    for worker, output in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, output[-2000:]
    assert all("2 devices" in output for output in outputs)  # One mesh over both processes.
    single = subprocess.run(
        _command("--local-devices", "2", "--out", str(tmp_path / "single.npz")),
        env=env, capture_output=True, text=True, timeout=240,
    )
    assert single.returncode == 0, single.stderr[-2000:]
    multi, one = np.load(tmp_path / "multi.npz"), np.load(tmp_path / "single.npz")
    assert set(multi) == set(one)
    for name in multi:
        np.testing.assert_allclose(multi[name], one[name], rtol=1e-6, atol=1e-7)
        assert np.any(multi[name] != 0)  # Training happened.
