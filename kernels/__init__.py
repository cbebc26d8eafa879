"""Pallas kernels, each beside a pure-jnp reference (installed as `jaxfl.kernels`)."""
