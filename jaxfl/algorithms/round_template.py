"""The round template: the four stages of a round given as hooks and flags.

`weighted_averaging_algorithm` builds a round that samples, plans, trains,
aggregates and steps, as `jaxfl.algorithms.stages.compose_round` of the
stages its hooks and flags describe (FedAvg is the template with no hooks:
`jaxfl.algorithms.fedavg`):

* `plan(cohort, state, key)` (the select stage), before training:
  aggregation weights that are known already, which clients train and
  per-client epochs; it may read F_i(w_t) (`plan_uses_loss`). Delta-FL,
  FedAvg-Sub and stragglers use it.
* `aggregate(results, cohort, plan, state, key)` (the aggregate stage),
  after training: turns the per-client updates into the server's update
  Delta (q-FFL, AFL).
* `reweight(results, alpha, state, key)`, after training: only the weights
  of the default weighted mean (tilted ERM).

Keys, robustness and metrics are the composed round's
(`jaxfl.algorithms.stages`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import optax

from jaxfl.algorithms.base import FederatedAlgorithm
from jaxfl.algorithms.stages import (
    ATTACK_STREAM,
    LOCAL_HPARAM_DEFAULTS,
    Aggregate,
    AggregateStage,
    Aggregation,
    ClientPlan,
    ClientUpdateStage,
    Cohort,
    Plan,
    Reweight,
    Robustness,
    SelectStage,
    compose_round,
    default_weights,
    single_pass_preferred,
)
from jaxfl.data.population import ClientPopulation
from jaxfl.training.cohort import StepFactory
from jaxfl.training.local import LocalTraining, Task
from jaxfl.training.strategies import ClientStrategy
from jaxfl.types import Params, PyTree

__all__ = [
    "ATTACK_STREAM",
    "LOCAL_HPARAM_DEFAULTS",
    "Aggregate",
    "Aggregation",
    "ClientPlan",
    "Cohort",
    "Plan",
    "Reweight",
    "Robustness",
    "default_weights",
    "single_pass_preferred",
    "weighted_averaging_algorithm",
]


def weighted_averaging_algorithm(
    name: str,
    task: Task,
    local: LocalTraining | Callable[[ClientPopulation], LocalTraining],
    clients_per_round: int,
    *,
    strategy: ClientStrategy,
    server_tx: optax.GradientTransformation | None = None,
    client_weighting: str = "num_examples",
    reweight: Reweight | None = None,
    with_initial_loss: bool = False,
    plan: Plan | None = None,
    plan_uses_loss: bool = False,
    plan_selects_only: bool = False,
    aggregate: Aggregate | None = None,
    extra_hparam_defaults: Mapping[str, float] | None = None,
    init_extra: Callable[[Params], PyTree] = lambda params: (),
    proximal: bool = False,
    use_l2: bool = True,
    robustness: Robustness | None = None,
    local_step: StepFactory | None = None,
    local_step_reads_rows: bool = False,
) -> FederatedAlgorithm:
    """Builds a round that samples, plans, trains, aggregates, steps.

    Args:
      name: registry name.
      task: model and loss.
      local: static local-training shape, or a function of the training
        population giving it (FedSGD's full batch needs the largest client's
        size, a static property of the population).
      clients_per_round: M.
      strategy: how clients are laid out on the hardware.
      server_tx: server optimizer (default SGD with learning rate 1).
      client_weighting: 'num_examples' or 'uniform' data weights alpha_i.
      reweight: turns per-client results and alpha into aggregation weights
        (default: the plan's weights, else alpha, i.e. FedAvg).
      with_initial_loss: compute F_i(w_t) with local training (one pass);
        hooks find it in `cohort.initial_loss` (and `results.initial_loss`).
      plan: decides weights, active clients and epochs before training.
      plan_uses_loss: compute F_i(w_t) before training, for the plan.
      plan_selects_only: the plan only weights clients (its `active` is
        `weights > 0`, it sets no epochs), so the round may instead let every
        client compute F_i(w_t) and train in one pass and apply the plan
        after: the same aggregate. It does so where a second pass over the
        cohort costs more than the filtered-out clients' training: layouts
        sharded over several devices, where each pass meets the devices at
        collectives (see `single_pass_preferred`).
      aggregate: computes the server update from the results (default: the
        weighted mean of the updates with `reweight`'s or the plan's weights).
      extra_hparam_defaults: numeric hyperparameters of the algorithm.
      init_extra: initial algorithm-specific state.
      proximal: include FedProx's proximal term (hyperparameter 'mu').
      use_l2: include the l2 term in local steps (hyperparameter 'l2').
      robustness: the run's update attack and aggregator (see the module
        docstring), or None.
      local_step: replaces the local SGD step (`train_cohort`; Per-FedAvg's
        meta step), reading the state's hyperparameters.
      local_step_reads_rows: `local_step` also takes the client's row of the
        state's per-client state `clients` (mapper's global steps read the
        client's local model and mixing weight).

    Returns:
      The `FederatedAlgorithm`.

    Raises:
      ValueError: invalid static settings.
    """
    return compose_round(
        name,
        task,
        clients_per_round,
        select=SelectStage(
            plan=plan,
            reads_initial_loss=plan_uses_loss,
            weights_only=plan_selects_only,
            client_weighting=client_weighting,
            init=init_extra if plan is not None else SelectStage().init,
        ),
        client_update=ClientUpdateStage(
            local=local,
            l2=use_l2,
            proximal="mu" if proximal else None,
            reports_initial_loss=with_initial_loss,
            step=local_step,
            step_reads_rows=local_step_reads_rows,
        ),
        aggregate=AggregateStage(
            aggregate=aggregate,
            reweight=reweight,
            hparam_defaults=extra_hparam_defaults or {},
            init=AggregateStage().init if plan is not None else init_extra,
        ),
        server=server_tx,
        strategy=strategy,
        robustness=robustness,
        # The state's rows, where a wrapping algorithm adds them (Ditto's, mapper's), are models.
        rows_are_models=True,
    )
