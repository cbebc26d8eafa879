"""Tail-risk primitives and the differentially private quantile (public API).

Pure, jit/vmap-compatible functions on 1-D vectors (batch with `jax.vmap`),
from Pillutla et al. 2023 and Laguel et al. 2020, and the risk measures of
Li 2023, Chapter 7 (`risk.py`), and compressors of client updates
(`compression.py`). See docs/primitives.md for the semantics,
edge cases and paper references.

References:
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
  [Laguel et al. 2020] Device Heterogeneity in Federated Learning: A Superquantile Approach.
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks. PhD thesis, CMU, 2023.
"""

from jaxfl.primitives.compression import (
    error_feedback,
    hadamard_rotation,
    inverse_hadamard_rotation,
    random_k,
    stochastic_quantize,
    top_k,
)
from jaxfl.primitives.discrete_gaussian import discrete_gaussian
from jaxfl.primitives.dp_quantile import (
    dp_hierarchical_histogram,
    dp_quantile,
    dp_quantile_epsilon,
    dp_quantile_modulus,
    dp_quantile_scale,
    dp_quantile_sigma,
)
from jaxfl.primitives.histogram import (
    dyadic_cdf,
    hierarchical_histogram,
    histogram_quantile,
)
from jaxfl.primitives.mm_quantile import mm_quantile
from jaxfl.primitives.risk import (
    evar,
    hierarchical_tilted_risk,
    hierarchical_tilted_weights,
    inverse_superquantile,
    tivar,
    value_at_risk,
)
from jaxfl.primitives.tail import (
    smoothed_superquantile,
    smoothed_superquantile_weights,
    superquantile,
    superquantile_weights,
    tail_threshold,
    tilted_risk,
    tilted_risk_weights,
)

__all__ = [
    "error_feedback",
    "hadamard_rotation",
    "inverse_hadamard_rotation",
    "random_k",
    "stochastic_quantize",
    "top_k",
    "discrete_gaussian",
    "dp_hierarchical_histogram",
    "dp_quantile",
    "dp_quantile_epsilon",
    "dp_quantile_modulus",
    "dp_quantile_scale",
    "dp_quantile_sigma",
    "dyadic_cdf",
    "evar",
    "hierarchical_histogram",
    "hierarchical_tilted_risk",
    "hierarchical_tilted_weights",
    "histogram_quantile",
    "inverse_superquantile",
    "mm_quantile",
    "smoothed_superquantile",
    "smoothed_superquantile_weights",
    "superquantile",
    "superquantile_weights",
    "tail_threshold",
    "tilted_risk",
    "tilted_risk_weights",
    "tivar",
    "value_at_risk",
]
