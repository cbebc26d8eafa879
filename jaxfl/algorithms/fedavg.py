"""FedAvg (McMahan et al. 2017), and the weighted-averaging round it shares.

One round (004 Section 3.2; thesis Algorithm 1 with the experiments'
weighting, `shared/notes/thesis-spec.md` section 2.2):

1. sample M of the N training clients uniformly without replacement;
2. each runs local minibatch SGD from w_t (`jaxfl.training.local`);
3. the server averages the updates with weights alpha_i (number of
   examples by default, or uniform): Delta = sum_i alpha_i (w_i - w_t) /
   sum_i alpha_i;
4. a server optimizer takes -Delta as its gradient (SGD with learning rate
   1 gives w_{t+1} = w_t + Delta, plain FedAvg).

Algorithms that only change the weights of step 3 (Delta-FL, FedAvg-Sub,
tilted ERM, ...) reuse `weighted_averaging_algorithm` with a `reweight`
function.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import optax

from jaxfl.algorithms.base import (
    FederatedAlgorithm,
    ServerState,
    apply_server_update,
    local_learning_rate,
    resolve_hparams,
    server_optimizer,
    tree_norm,
)
from jaxfl.data.population import ClientPopulation
from jaxfl.training.cohort import (
    CohortResults,
    round_keys,
    sample_cohort,
    train_cohort,
    weighted_mean,
)
from jaxfl.training.local import LocalHParams, LocalTraining, Task
from jaxfl.training.strategies import ClientStrategy
from jaxfl.types import Key, Metrics, Params, PyTree

# Local-training hyperparameters every algorithm of this family takes.
LOCAL_HPARAM_DEFAULTS = {
    "lr": 0.1,  # Local learning rate lr0.
    "lr_decay": 1.0,  # c of the step decay lr0 * c**floor(t / t0); 1 = constant.
    "lr_decay_period": 1e9,  # t0 (rounds).
    "l2": 0.0,  # lambda of (1 - lr*lambda) w - lr*grad.
}

# reweight(results, alpha, state, key) -> (weights [M], extra, metrics)
Reweight = Callable[
    [CohortResults, jax.Array, ServerState, Key], tuple[jax.Array, PyTree, Metrics]
]


def weighted_averaging_algorithm(
    name: str,
    task: Task,
    local: LocalTraining,
    clients_per_round: int,
    *,
    strategy: ClientStrategy,
    server_tx: optax.GradientTransformation | None = None,
    client_weighting: str = "num_examples",
    reweight: Reweight | None = None,
    with_initial_loss: bool = False,
    extra_hparam_defaults: Mapping[str, float] | None = None,
    init_extra: Callable[[Params], PyTree] = lambda params: (),
    proximal: bool = False,
    use_l2: bool = True,
) -> FederatedAlgorithm:
    """Builds a round that averages client updates with computed weights.

    Args:
      name: registry name.
      task: model and loss.
      local: static local-training shape.
      clients_per_round: M.
      strategy: how clients are laid out on the hardware.
      server_tx: server optimizer (default SGD with learning rate 1).
      client_weighting: 'num_examples' or 'uniform' data weights alpha_i.
      reweight: turns per-client results and alpha into aggregation weights
        (default: alpha itself, i.e. FedAvg).
      with_initial_loss: compute F_i(w_t) before local training.
      extra_hparam_defaults: numeric hyperparameters of the algorithm.
      init_extra: initial algorithm-specific state.
      proximal: include FedProx's proximal term (hyperparameter 'mu').
      use_l2: include the l2 term in local steps (hyperparameter 'l2').

    Returns:
      The `FederatedAlgorithm`.
    """
    if clients_per_round < 1:
        raise ValueError(f"clients_per_round must be >= 1, got {clients_per_round}")
    if client_weighting not in ("num_examples", "uniform"):
        raise ValueError(
            f"client_weighting must be 'num_examples' or 'uniform', got {client_weighting!r}"
        )
    server_tx = server_tx or server_optimizer("sgd", 1.0)
    defaults = {**LOCAL_HPARAM_DEFAULTS, **(extra_hparam_defaults or {})}
    if proximal:
        defaults.setdefault("mu", 0.0)

    def init(params: Params, hparams: Mapping[str, float] | None = None) -> ServerState:
        return ServerState(
            round=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=server_tx.init(params),
            hparams=resolve_hparams(defaults, hparams),
            extra=init_extra(params),
        )

    def round_fn(
        state: ServerState, population: ClientPopulation, key: Key
    ) -> tuple[ServerState, Metrics]:
        if clients_per_round > population.num_clients:
            raise ValueError(
                f"clients_per_round={clients_per_round} exceeds the "
                f"{population.num_clients} training clients"
            )
        keys = round_keys(key, state.round)
        client_ids = sample_cohort(keys.sampling, population, clients_per_round)
        hparams = LocalHParams(
            lr=local_learning_rate(state.hparams, state.round),
            l2=state.hparams["l2"] if use_l2 else None,
            prox_mu=state.hparams["mu"] if proximal else None,
        )
        results = train_cohort(
            task,
            local,
            strategy,
            state.params,
            population,
            client_ids,
            keys.clients,
            hparams,
            with_initial_loss=with_initial_loss,
        )
        alpha = population.client_weights(client_weighting)[client_ids]
        if reweight is None:
            weights, extra, extra_metrics = alpha, state.extra, {}
        else:
            weights, extra, extra_metrics = reweight(results, alpha, state, keys.server)
        mean_delta = weighted_mean(results.deltas, weights)
        params, opt_state = apply_server_update(server_tx, state, mean_delta)
        metrics = {
            "train_loss": jnp.sum(alpha * results.mean_batch_loss) / jnp.sum(alpha),
            "update_norm": tree_norm(mean_delta),
            "clients_with_weight": jnp.sum(weights > 0).astype(jnp.int32),
            "local_steps": jnp.mean(results.num_steps.astype(jnp.float32)),
            **extra_metrics,
        }
        new_state = ServerState(
            round=state.round + 1,
            params=params,
            opt_state=opt_state,
            hparams=state.hparams,
            extra=extra,
        )
        return new_state, metrics

    return FederatedAlgorithm(
        name=name, init=init, round=round_fn, hparam_defaults=defaults
    )


def fedavg(
    task: Task,
    local: LocalTraining,
    clients_per_round: int,
    *,
    strategy: ClientStrategy,
    server_tx: optax.GradientTransformation | None = None,
    client_weighting: str = "num_examples",
) -> FederatedAlgorithm:
    """Federated averaging (see the module docstring)."""
    return weighted_averaging_algorithm(
        "fedavg",
        task,
        local,
        clients_per_round,
        strategy=strategy,
        server_tx=server_tx,
        client_weighting=client_weighting,
    )
