"""Type aliases and the axis vocabulary used in docstrings.

Shapes in docstrings use these letters:

* N: clients in a population; M: clients sampled in a round (the cohort);
* E: examples in a population (all clients packed); B: minibatch size;
* S: local steps of one client (static upper bound of the `lax.scan`);
* G: points of a hyperparameter sweep.
"""

from typing import Any

import jax

Params = Any  # A pytree of arrays: the model's parameters.
PyTree = Any
Key = jax.Array  # A typed PRNG key from `jax.random.key`.
Metrics = dict[str, jax.Array]
