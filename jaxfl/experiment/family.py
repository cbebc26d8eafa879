"""The Δ-FL model family: one model per tail fraction, each client served the best.

Pillutla et al. 2023, Section 4.1 (Figure 1): Δ-FL trains r models
w_1..w_r for tail fractions theta_1..theta_r, and each test client picks the
model that does best on its own local data. Here the r models train
together as one sweep (the round vmapped over theta with one seed, so every
model sees the same cohorts and example orders); each test client's examples
are split once into a selection part (its local validation data) and an
evaluation part; the client is served the model with the lowest loss on its
selection part, and every model, and the served one, are measured on the
evaluation parts.

    jaxfl family --thetas 0.8,0.5,0.1 [run settings] --out runs/family

References:
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from jaxfl.data.host import place_population
from jaxfl.data.population import ClientPopulation
from jaxfl.data.splits import split_client_examples as split_clients
from jaxfl.evaluation.per_client import per_client_metrics
from jaxfl.evaluation.summaries import summarize
from jaxfl.experiment.config import ConfigError, RunConfig, defer_warning, implied_setting
from jaxfl.experiment.outputs import write_json
from jaxfl.experiment.run_directory import OutputDirectory
from jaxfl.experiment.runner import setup
from jaxfl.experiment.sweep import SweepPoint, run_sweep
from jaxfl.training.local import Task


@dataclasses.dataclass
class FamilyEvaluation:
    """Per-client results of the family on the evaluation parts.

    Attributes:
      thetas: `[G]` the family's tail fractions.
      loss, error: `[G, N]` every model's per-client metrics.
      chosen: `[N]` index of the model each client is served.
      served_loss, served_error: `[N]` the served model's metrics.
    """

    thetas: np.ndarray
    loss: np.ndarray
    error: np.ndarray
    chosen: np.ndarray
    served_loss: np.ndarray
    served_error: np.ndarray


def serve_family(
    task: Task,
    stacked_params: Any,
    thetas: Sequence[float],
    selection: ClientPopulation,
    evaluation: ClientPopulation,
) -> FamilyEvaluation:
    """Serves each client the model with the lowest loss on its selection part.

    Ties go to the first model in `thetas` order.
    """

    @jax.jit
    def evaluate(params):
        on_selection = jax.vmap(lambda p: per_client_metrics(task, p, selection))(params)
        on_evaluation = jax.vmap(lambda p: per_client_metrics(task, p, evaluation))(params)
        chosen = jnp.argmin(on_selection.loss, axis=0)
        clients = jnp.arange(chosen.shape[0])
        return (
            on_evaluation.loss,
            on_evaluation.error,
            chosen,
            on_evaluation.loss[chosen, clients],
            on_evaluation.error[chosen, clients],
        )

    loss, error, chosen, served_loss, served_error = jax.device_get(evaluate(stacked_params))
    return FamilyEvaluation(
        np.asarray(thetas), loss, error, chosen, served_loss, served_error
    )


def family_table(family: FamilyEvaluation) -> list[dict[str, Any]]:
    """One row per model and one for the served model: test error summaries."""
    rows = []
    for g, theta in enumerate(family.thetas):
        stats = {k: float(v) for k, v in summarize(family.error[g]).items()}
        share = float(np.mean(family.chosen == g))
        rows.append({"model": f"theta={theta:g}", "served_share": share, **stats})
    stats = {k: float(v) for k, v in summarize(family.served_error).items()}
    rows.append({"model": "served (best per client)", "served_share": 1.0, **stats})
    return rows


def run_family_main(config: RunConfig, thetas: Sequence[float], selection_fraction: float) -> int:
    """`jaxfl family`: trains the family, serves test clients, prints the table."""
    if config.algorithms != ["deltafl"]:
        raise ConfigError("family trains Δ-FL models: use --algorithm deltafl (the default here)")
    if not thetas:
        raise ConfigError("family needs --thetas THETA1,THETA2,...")
    if config.options.theta != implied_setting(config, "theta"):
        defer_warning(
            f"theta={config.options.theta:g} is not used: the family trains one model per --thetas; ignored"
        )
    run_setup = setup(config)
    output = None
    if config.runtime.out is not None:
        output = OutputDirectory(config.runtime.out, overwrite=config.runtime.overwrite, command="family")
    # Serving reads every test client on the device.
    test = place_population(run_setup.dataset.test, "device")
    selection, evaluation = split_clients(test, selection_fraction, config.runtime.seed)
    points = [SweepPoint({"theta": float(theta)}, seed=config.runtime.seed) for theta in thetas]
    with tqdm(total=config.server.rounds, desc=f"deltafl family ({len(points)} models)",
              unit="round", disable=not config.runtime.progress, file=sys.stderr) as bar:
        results = run_sweep(run_setup, "deltafl", points, progress=bar)
    stacked = jax.tree.map(lambda *p: jnp.stack(p), *[r.state.params for r in results])
    family = serve_family(run_setup.engine.task, stacked, thetas, selection, evaluation)
    rows = family_table(family)
    if output is not None:
        staging = output.open(rounds=config.server.rounds)
        try:
            write_json(staging / "config.json", {**config.to_dict(), "thetas": list(thetas),
                                                 "selection_fraction": selection_fraction})
            write_json(staging / "family.json", rows)
            with (staging / "clients.csv").open("w") as f:
                f.write("client,served_theta," + ",".join(f"error_theta={t:g}" for t in thetas)
                        + ",served_error\n")
                for i in range(family.chosen.shape[0]):
                    errors = ",".join(f"{family.error[g, i]:.6g}" for g in range(len(thetas)))
                    f.write(f"{i},{thetas[family.chosen[i]]:g},{errors},{family.served_error[i]:.6g}\n")
            output.commit()
        except BaseException:
            output.abandon()
            raise
    print("test misclassification error on the evaluation part of each test client (%)")
    print(f"{'model':26s} {'served':>7s} {'mean':>7s} {'p50':>7s} {'p90':>7s} {'sq90':>7s}")
    for row in rows:
        print(f"{row['model']:26s} {100 * row['served_share']:6.1f}% {100 * row['mean']:7.2f} "
              f"{100 * row['p50']:7.2f} {100 * row['p90']:7.2f} {100 * row['superquantile_90']:7.2f}")
    if output is not None:
        print(f"results in {output.path}")
    return 0
