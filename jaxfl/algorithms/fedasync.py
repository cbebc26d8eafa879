"""FedAsync (Xie et al. 2019): the server mixes in each client's model as it arrives.

C clients train at once, each from the model version x_tau it downloaded,
minimizing F_i(x) + rho/2 ||x - x_tau||^2 (their local objective; rho =
`--mu`); as each arrives with its local model x_new, staleness t - tau, the
server mixes

    x <- (1 - alpha_t) x + alpha_t x_new,   alpha_t = alpha s(t - tau)

(their server update, with their staleness functions s, see
`jaxfl.algorithms.asynchronous.staleness_weight`). One arrival per server
step (`jaxfl.algorithms.asynchronous` with K = 1), C = `--concurrency`, alpha =
`--async-mixing`. The mixing is the server's update: the server optimizer does
not apply.

References:
  [Xie et al. 2019] C. Xie, S. Koyejo, I. Gupta. Asynchronous Federated Optimization. arXiv:1903.03934
    (OPT 2020).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jaxfl.algorithms.asynchronous import Arrivals, Fleet, asynchronous_algorithm, staleness_weight
from jaxfl.algorithms.base import FederatedAlgorithm, ServerState
from jaxfl.algorithms.fedbuff import STALENESS_DEFAULTS, async_fleet
from jaxfl.algorithms.registry import Engine
from jaxfl.training.local import LocalTraining, Task
from jaxfl.training.strategies import ClientStrategy


def fedasync(
    task: Task,
    local: LocalTraining,
    fleet: Fleet,
    *,
    strategy: ClientStrategy,
    staleness: str = "polynomial",
) -> FederatedAlgorithm:
    """FedAsync (see the module docstring).

    Numeric hyperparameters: the local ones, 'async_mixing' alpha (0.6),
    'mu' rho (0.01), and the staleness weight's 'staleness_exponent' a (0.5)
    and 'staleness_hinge' b (4).
    """

    def rule(state: ServerState, arrivals: Arrivals):
        weight = state.hparams["async_mixing"] * staleness_weight(
            staleness, arrivals.staleness, state.hparams
        )
        mix = jnp.where(arrivals.holds_result[0], weight[0], 0.0)
        params = jax.tree.map(
            lambda x, new: ((1.0 - mix) * x + mix * new[0]).astype(x.dtype), state.params, arrivals.results
        )
        return params, state.opt_state, {"mixing": mix}

    return asynchronous_algorithm(
        "fedasync", task, local, 1, fleet, rule, strategy=strategy, keeps="model", proximal="mu",
        hparam_defaults={"async_mixing": 0.6, "mu": 0.01, **STALENESS_DEFAULTS}, client_weighting="uniform",
    )  # fmt: skip


def from_engine(engine: Engine, options: Mapping[str, Any]) -> FederatedAlgorithm:
    """FedAsync as the registry builds it for a run (the clock's device profiles)."""
    return fedasync(
        engine.task, engine.local, async_fleet(engine, options, "fedasync"), strategy=engine.strategy,
        staleness=options["staleness"],
    )
