"""SCAFFOLD (Karimireddy et al. 2020): local steps corrected by control variates.

The server keeps a control variate c and each client i its own c_i (both
start at 0, shaped like the model). One round (Karimireddy et al. 2020,
Algorithm 1), with x = w_t and eta the local learning rate:

1. sample M of the N training clients uniformly without replacement;
2. client i runs its K_i local steps from x with the drift correction
   y <- y - eta (g_i(y) - c_i + c), then updates its control variate
   * Option II (default): c_i+ = c_i - c + (x - y_i) / (K_i eta), the
     mean of the (corrected-away) gradients it used;
   * Option I: c_i+ = grad F_i(x), its full-data gradient at x;
   and sends Delta y_i = y_i - x and Delta c_i = c_i+ - c_i;
3. the server averages Delta y_i with the run's weights alpha_i (the
   paper's uniform mean with `client_weighting='uniform'`; the run's robust
   aggregator and update attack apply to them as to FedAvg's) and feeds it
   to the server optimizer (SGD with learning rate eta_g gives x + eta_g
   mean Delta y), and c <- c + (1/N) sum_{i in S} Delta c_i, which keeps c the
   mean of all N clients' c_i.

The l2 term, where set, is part of each step's gradient (and so of
Option II's c_i; Option I adds l2 x to grad F_i(x) to match). A client that
runs no step (a dropped straggler) keeps its c_i. The per-client c_i are
the round's per-client rows (`jaxfl.algorithms.stages.ClientUpdateStage`):
on device, split over devices or in host memory like personal models, and
checkpointed with the state.

References:
  [Karimireddy et al. 2020] SCAFFOLD: Stochastic Controlled Averaging for Federated Learning. ICML 2020.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Unpack

import jax
import jax.numpy as jnp

from jaxfl.aggregators.base import per_client
from jaxfl.algorithms import stages
from jaxfl.algorithms.base import FederatedAlgorithm, ServerState
from jaxfl.algorithms.registry import Engine
from jaxfl.training.cohort import CohortData, CohortResults, cohort_gradients
from jaxfl.training.local import LocalTraining, Task
from jaxfl.types import Params, PyTree

CONTROL_OPTIONS = (1, 2)


def scaffold(
    task: Task,
    local: LocalTraining,
    clients_per_round: int,
    num_clients: int,
    *,
    control_option: int = 2,
    **options: Unpack[stages.RoundOptions],
) -> FederatedAlgorithm:
    """SCAFFOLD (see the module docstring).

    Args:
      task, local, clients_per_round, **options: as `jaxfl.algorithms.stages.compose_round` takes them.
      num_clients: N, the training clients (each keeps its c_i).
      control_option: 1 or 2, the paper's Option I or II for c_i+.

    Returns:
      The `FederatedAlgorithm`; its state's `extra` is c and `clients` the c_i.

    Raises:
      ValueError: an unknown control option.
    """
    strategy = options["strategy"]
    if control_option not in CONTROL_OPTIONS:
        raise ValueError(
            f"scaffold_option must be 1 or 2 (the paper's Option I or II), got {control_option!r}"
        )

    def correction(state: ServerState, rows: Params, cohort: stages.Cohort, data: CohortData) -> Params:
        del cohort, data  # Unused: c - c_i for each cohort client.
        return jax.tree.map(lambda c, c_i: c[None] - c_i, state.extra, rows)

    def finalize(
        state: ServerState, rows: Params, results: CohortResults, lr: jax.Array, cohort: CohortData
    ) -> tuple[Params, Params]:
        trained = results.num_steps > 0
        if control_option == 2:
            steps = jnp.maximum(results.num_steps, 1).astype(jnp.float32)

            def option_2(c, c_i, delta):
                return c_i - c[None] - per_client(1.0 / (steps * lr), delta) * delta

            new_rows = jax.tree.map(option_2, state.extra, rows, results.deltas)
        else:
            gradients = cohort_gradients(task, strategy, state.params, cohort)
            new_rows = jax.tree.map(lambda g, x: g + state.hparams["l2"] * x[None], gradients, state.params)
        new_rows = jax.tree.map(
            lambda new, old: jnp.where(per_client(trained, new), new, old),
            new_rows,
            rows,
        )
        return new_rows, jax.tree.map(jnp.subtract, new_rows, rows)

    def update_state(results: CohortResults, cohort: stages.Cohort, state: ServerState) -> PyTree:
        del cohort  # Unused: c moves by the cohort's Delta c_i summed, over N.
        return jax.tree.map(
            lambda c, delta_c: c + jnp.sum(delta_c, axis=0) / num_clients, state.extra, results.outputs
        )

    return stages.compose_round(
        "scaffold",
        task,
        clients_per_round,
        client_update=stages.ClientUpdateStage(
            local=local, init_row=stages.zeros_row, correction=correction, finalize=finalize,
            side_messages=1,  # c down, Delta c_i up.
        ),
        aggregate=stages.AggregateStage(update_state=update_state, init=stages.zeros_row),
        num_clients=num_clients,
        **options,
    )


def from_engine(engine: Engine, options: Mapping[str, Any]) -> FederatedAlgorithm:
    """SCAFFOLD as the registry builds it for a run."""
    return scaffold(
        engine.task, engine.local, engine.clients_per_round, engine.training_clients("scaffold"),
        control_option=options["scaffold_option"], **engine.round_options(),
    )
