"""How fast each client's device computes and communicates, and how long its part of a round takes.

A client i that is sent a model of D bytes, runs tau_i local steps and sends
U bytes back takes

    duration_i = D / down_i + tau_i * step_i + U / up_i

seconds (its download, its training, its upload, one after another), with
`step_i` its seconds per local step and `down_i`, `up_i` its bandwidths in
bytes per second.

`lognormal_profiles` draws each quantity independently per client from a
log-normal law given by its median and the standard deviation `sigma` of its
logarithm, a right-skewed spread over orders of magnitude such as measured
phones show (FedScale, Lai et al. 2022, simulates devices from such
measurements; its traces can be given as a profile file). The defaults (a 0.1 s step, 2.5 MB/s
down, 0.625 MB/s up, i.e. 20 and 5 Mbit/s) are illustrative, not a measurement:
give a profile file (`jaxfl.clock.traces`) to simulate particular devices.

References:
  [Lai et al. 2022] F. Lai, Y. Dai, S. Singapuram, J. Liu, X. Zhu, H. Madhyastha, M. Chowdhury.
    FedScale: Benchmarking Model and System Performance of Federated Learning at Scale. ICML 2022.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

STEP_SECONDS = 0.1
DOWNLOAD_BYTES_PER_S = 2.5e6
UPLOAD_BYTES_PER_S = 6.25e5
SIGMA = 0.8


class DeviceProfiles(NamedTuple):
    """`[N]` float32 per training client: seconds per local step, bytes per second down and up."""

    step_seconds: jax.Array
    download_bytes_per_s: jax.Array
    upload_bytes_per_s: jax.Array


def lognormal_profiles(
    key: jax.Array,
    num_clients: int,
    *,
    step_seconds: float = STEP_SECONDS,
    download_bytes_per_s: float = DOWNLOAD_BYTES_PER_S,
    upload_bytes_per_s: float = UPLOAD_BYTES_PER_S,
    sigma: float = SIGMA,
) -> DeviceProfiles:
    """Each quantity median * exp(sigma Z), Z standard normal, independent per client and quantity."""
    for name, value in (("step_seconds", step_seconds), ("download_bytes_per_s", download_bytes_per_s),
                        ("upload_bytes_per_s", upload_bytes_per_s)):  # fmt: skip
        if not (np.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive number, got {value!r}")
    if not (np.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma must be >= 0, got {sigma!r}")
    noise = jnp.exp(sigma * jax.random.normal(key, (3, num_clients), jnp.float32))
    medians = jnp.asarray([step_seconds, download_bytes_per_s, upload_bytes_per_s], jnp.float32)[:, None]
    return DeviceProfiles(*(medians * noise))


def client_durations(
    profiles: DeviceProfiles,
    client_ids: jax.Array,
    num_steps: jax.Array,
    download_bytes: int,
    upload_bytes: int,
) -> jax.Array:
    """`[M]` seconds each client takes: download, `num_steps` local steps, upload (module docstring)."""
    return (
        download_bytes / profiles.download_bytes_per_s[client_ids]
        + num_steps.astype(jnp.float32) * profiles.step_seconds[client_ids]
        + upload_bytes / profiles.upload_bytes_per_s[client_ids]
    )


def check_profiles(profiles: DeviceProfiles, num_clients: int) -> None:
    """Refuses profiles of another size, or with a non-positive or non-finite entry (host check)."""
    for name, values in profiles._asdict().items():
        values = np.asarray(values, np.float64)
        if values.shape != (num_clients,):
            raise ValueError(f"device profiles: {name} holds {values.shape} values for {num_clients} clients")
        bad = ~(np.isfinite(values) & (values > 0))
        if bad.any():
            raise ValueError(
                f"device profiles: client {int(np.argmax(bad))}'s {name} is not a positive number"
            )
