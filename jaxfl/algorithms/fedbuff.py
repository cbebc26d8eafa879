"""FedBuff (Nguyen et al. 2022): asynchronous clients, the server updating once K results are buffered.

C clients train at once, each on the model version it downloaded; the
server keeps a buffer of arriving updates and, once K have arrived, applies

    w <- ServerOpt(w, mean_j alpha_j s(staleness_j) Delta_j)

(their server update, with the data weights alpha_j normalized over the buffer
and the staleness weight s of `jaxfl.algorithms.asynchronous.staleness_weight`,
by default their 1 / sqrt(1 + staleness)). Each server step of the round is
one buffer: its K arrivals, and K new clients started in their slots
(`jaxfl.algorithms.asynchronous`). K = `--clients-per-round`, C =
`--concurrency`, the server optimizer the run's (`--server-optimizer`,
`--server-lr`: their eta_g).

References:
  [Nguyen et al. 2022] J. Nguyen, K. Malik, H. Zhan, A. Yousefpour, M. Rabbat, M. Malek, D. Huba.
    Federated Learning with Buffered Asynchronous Aggregation. AISTATS 2022.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jaxfl.algorithms.asynchronous import Arrivals, Fleet, asynchronous_algorithm, staleness_weight
from jaxfl.algorithms.base import FederatedAlgorithm, ServerState, apply_server_update, server_optimizer
from jaxfl.algorithms.registry import Engine
from jaxfl.clock.profiles import lognormal_profiles
from jaxfl.training.local import LocalTraining, Task
from jaxfl.training.strategies import ClientStrategy

STALENESS_DEFAULTS = {"staleness_exponent": 0.5, "staleness_hinge": 4.0}


def fedbuff(
    task: Task,
    local: LocalTraining,
    buffer_size: int,
    fleet: Fleet,
    *,
    strategy: ClientStrategy,
    staleness: str = "polynomial",
    server_tx=None,
    client_weighting: str = "num_examples",
) -> FederatedAlgorithm:
    """FedBuff (see the module docstring): K = `buffer_size` arrivals per server step, C = `concurrency`.

    Numeric hyperparameters: the local ones, 'staleness_exponent' a (0.5)
    and 'staleness_hinge' b (4) of the staleness weight.
    """
    server = server_tx or server_optimizer("sgd", 1.0)

    def rule(state: ServerState, arrivals: Arrivals):
        scale = jnp.where(arrivals.holds_result, arrivals.alpha, 0.0)
        total = jnp.sum(scale)
        weights = scale * staleness_weight(staleness, arrivals.staleness, state.hparams)
        weights = weights / jnp.where(total > 0, total, 1.0)
        mean = jax.tree.map(lambda leaf: jnp.tensordot(weights, leaf, axes=(0, 0)).astype(leaf.dtype),
                            arrivals.results)  # fmt: skip
        params, opt_state = apply_server_update(server, state, mean)
        # A step without results (the first ones, filling the slots) leaves the server as it is.
        params = jax.tree.map(lambda new, old: jnp.where(total > 0, new, old), params, state.params)
        opt_state = jax.tree.map(lambda new, old: jnp.where(total > 0, new, old), opt_state, state.opt_state)
        return params, opt_state, {}

    return asynchronous_algorithm(
        "fedbuff", task, local, buffer_size, fleet, rule, strategy=strategy, keeps="update",
        hparam_defaults=STALENESS_DEFAULTS, server_tx=server, client_weighting=client_weighting,
    )  # fmt: skip


def from_engine(engine: Engine, options: Mapping[str, Any]) -> FederatedAlgorithm:
    """FedBuff as the registry builds it for a run (the clock's devices and windows)."""
    return fedbuff(
        engine.task, engine.local, engine.clients_per_round, async_fleet(engine, options, "fedbuff"),
        strategy=engine.strategy, staleness=options["staleness"], server_tx=engine.server_tx,
        client_weighting=engine.client_weighting,
    )


def concurrency(options: Mapping[str, Any], clients_per_round: int, num_clients: int) -> int:
    """C: the `concurrency` option, or 4 clients_per_round (at most the N training clients)."""
    return options["concurrency"] or min(4 * clients_per_round, num_clients)


def async_fleet(engine: Engine, options: Mapping[str, Any], name: str) -> Fleet:
    """The `Fleet` of an asynchronous algorithm in a run: C by `concurrency`, the run's clock's devices.

    Without a clock: the default log-normal devices drawn from key 0
    (`jaxfl.clock.profiles`), always online.
    """
    if engine.robustness is not None or engine.compression is not None:
        raise ValueError(f"{name} takes no attack, robust aggregator or compression")
    num_clients = engine.training_clients(name)
    slots = concurrency(options, engine.clients_per_round, num_clients)
    if engine.clock is None:
        return Fleet(slots, num_clients, lognormal_profiles(jax.random.key(0), num_clients))
    return Fleet(slots, num_clients, engine.clock.profiles, engine.clock.availability)
