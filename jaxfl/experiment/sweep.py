"""Many settings of one algorithm as one compiled function.

A sweep point is a set of numeric hyperparameters (those in
`ServerState.hparams`, plus the server learning rate) and a seed. Points that
share every shape-setting value (clients per round, batch size, epochs, ...)
are run together: their states are stacked along a leading axis G and the
round is `jax.vmap`ped over it (`in_axes=(0, None, 0)`: states and run keys
per point, the population shared), then jitted once. Evaluation is vmapped
the same way. Shape-setting values vary in an outer Python loop
(`jaxfl.experiment.sweep_cli`).

A point gives the same result as the same setting run alone, up to float
rounding (tested): its state, its key, and therefore its cohorts and example
orders are exactly those of the single run.

The vmapped round and evaluator are kept between calls (per round function,
and per dataset, task and client weighting): sweeps of the same algorithm with
the same number of points, e.g. the fixed-width chunks of
`jaxfl.experiment.tuning.run_points`, trace and compile once per process.
A sweep is trained by the single run's code (`jaxfl.experiment.runner.train_points`);
what batching adds is in `jaxfl.experiment.points`, whose names are also
imported from here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Unpack

# What callers import from here (the CLI, the family, tuning, benchmarks).
from jaxfl.experiment.points import SERVER_LR, SweepPoint, batched_round, check_client_state, initial_state  # noqa: F401
from jaxfl.experiment.runner import RunHooks, RunResult, Setup, train_points


def run_sweep(
    run_setup: Setup,
    name: str,
    points: Sequence[SweepPoint],
    *,
    on_evaluation: Callable[[int, dict[str, Any]], None] | None = None,
    **hooks: Unpack[RunHooks],
) -> list[RunResult]:
    """Trains every point for `config.server.rounds` rounds in one vmapped round.

    Args:
      run_setup: the shared setup (static shapes, data, algorithm).
      name: which algorithm of the setup.
      points: the settings.
      on_evaluation: called with (point index, evaluation record).
      **hooks: the `RunHooks`: a progress bar, checkpoints (the stacked
        state of all points), resuming.

    Returns:
      One `RunResult` per point, in order. A point that diverged goes on
      with the others (they share the compiled round) and its summary is
      marked `status: diverged`, with the round and the quantity.

    Raises:
      RunInterrupted: on SIGINT/SIGTERM, after saving a checkpoint.
    """
    return train_points(run_setup, name, points, batched=True, on_evaluation=on_evaluation, **hooks)
