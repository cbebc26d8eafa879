"""Process-level XLA:CPU settings that jaxfl's CLI and benchmarks start with.

Both must be applied before JAX initializes its CPU backend (the first
array or device query); afterwards they are silently left as they are.

* One XLA device per core. XLA:CPU runs the many small operations of local
  training on one thread per device; with one device per core the sharded
  client strategy keeps every core busy (emnist-linear on 2 cores: 7.1
  rounds/s sharded over 2 devices against 4.9 on one; benchmarks/RESULTS.md).
* Library fusions. XLA:CPU hands some fusions to the YNNPACK library. Its
  convolutions ran the EMNIST ConvNet's local step at 26 ms against 12 ms
  with only its matrix products (`individual_dot`), while the linear
  workloads ran at the same speed either way (2-core x86, jaxlib 0.10.2,
  2026-11-26; docs/strategies.md). The flag is experimental and its name
  may change, and XLA aborts on unknown flags, so it is set only on jaxlib
  versions where it was measured, and never over a user's own setting.
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
