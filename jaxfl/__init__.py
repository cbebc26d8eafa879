"""jaxfl: federated learning simulation in JAX, one compiled function per round."""

__version__ = "0.1.0"
