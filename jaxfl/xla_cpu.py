"""Process-level XLA:CPU settings that jaxfl's CLI and benchmarks start with.

Both must be applied before JAX initializes its CPU backend (the first
array or device query); afterwards they are silently left as they are.

* One XLA device per core. XLA:CPU runs the many small operations of local
  training on one thread per device, so with a single device a round uses
  one core; with one device per core the sharded client strategy keeps every
  core busy (measured: docs/strategies.md, section
  "The measurements behind them").
* Library fusions. XLA:CPU hands some fusions to the YNNPACK library. Its
  convolutions made the EMNIST ConvNet's local step slower than with only
  its matrix products (`individual_dot`), while the linear workloads ran at
  the same speed either way (measured: benchmarks/RESULTS.md, sections
  "The ConvNet on CPU: a layout bug in autodiff, found and fixed" and
  "NVIDIA H100 80GB HBM3 (JAX 0.11.2, CUDA 13), 2026-11-27: where a round's time goes (issue 27)",
  its paragraph on XLA:CPU's library flags). The flag is experimental and
  its name may change, and XLA aborts on unknown flags, so it is set only on
  the jaxlib versions where it was measured (`MEASURED_JAXLIB_PREFIXES`),
  and never over a user's own setting.
"""

from __future__ import annotations

import importlib.metadata
import os

LIBRARY_FUSION_FLAG = "--xla_cpu_experimental_ynn_fusion_type"
LIBRARY_FUSIONS = "individual_dot"
# jaxlib versions on which LIBRARY_FUSION_FLAG exists and was measured.
MEASURED_JAXLIB_PREFIXES = ("0.10.",)


def configure_cpu(num_devices: int | None = None) -> None:
    """Sets up XLA:CPU as jaxfl measured it fastest (see the module docstring).

    Args:
      num_devices: CPU devices to create; None reads `JAXFL_CPU_DEVICES`, else
        one per core. A count already forced through
        `--xla_force_host_platform_device_count` in `XLA_FLAGS` is kept.

    Set `JAXFL_XLA_CPU_DEFAULTS=1` to keep XLA's own library fusions (e.g. to
    measure against them). Has no effect on GPU/TPU computations.
    """
    import jax

    flags = os.environ.get("XLA_FLAGS", "")
    if (
        os.environ.get("JAXFL_XLA_CPU_DEFAULTS") != "1"
        and LIBRARY_FUSION_FLAG not in flags
        and _jaxlib_version().startswith(MEASURED_JAXLIB_PREFIXES)
    ):
        os.environ["XLA_FLAGS"] = f"{flags} {LIBRARY_FUSION_FLAG}={LIBRARY_FUSIONS}".strip()
    if "xla_force_host_platform_device_count" in flags:
        return
    if num_devices is None:
        num_devices = int(os.environ.get("JAXFL_CPU_DEVICES", os.cpu_count() or 1))
    try:
        jax.config.update("jax_num_cpu_devices", max(1, num_devices))
    except RuntimeError:
        pass  # JAX already started (e.g. called from Python): keep its devices.


def _jaxlib_version() -> str:
    try:
        return importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:
        return ""
