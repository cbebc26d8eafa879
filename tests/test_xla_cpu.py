import subprocess
import sys

import pytest

from jaxfl import xla_cpu


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "")
    monkeypatch.delenv("JAXFL_XLA_CPU_DEFAULTS", raising=False)
    monkeypatch.setattr(xla_cpu, "_jaxlib_version", lambda: "0.10.2")
    return monkeypatch


def _flags():
    import os

    return os.environ["XLA_FLAGS"]


def test_library_fusions_are_set_on_measured_jaxlib(clean_env):
    xla_cpu.configure_cpu()
    assert f"{xla_cpu.LIBRARY_FUSION_FLAG}=individual_dot" in _flags()


@pytest.mark.parametrize("case", ["other jaxlib", "opted out", "user's own"])
def test_library_fusions_are_left_alone(clean_env, case):
    if case == "other jaxlib":
        clean_env.setattr(xla_cpu, "_jaxlib_version", lambda: "0.11.0")
    elif case == "opted out":
        clean_env.setenv("JAXFL_XLA_CPU_DEFAULTS", "1")
    else:
        clean_env.setenv("XLA_FLAGS", f"{xla_cpu.LIBRARY_FUSION_FLAG}=dot")
    before = _flags()
    xla_cpu.configure_cpu()
    assert _flags() == before


def test_a_fresh_process_gets_its_devices_and_xla_accepts_the_flags():
    # XLA aborts on unknown flags: this is what would catch a renamed flag.
    code = (
        "from jaxfl.xla_cpu import configure_cpu; configure_cpu(3); import jax, os; "
        "print(jax.device_count(), jax.numpy.ones(4).sum(), os.environ.get('XLA_FLAGS'))"
    )
    env = {"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("3 4.0")
