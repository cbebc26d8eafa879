"""Tuning on validation clients, with sweeps laid out to compile once.

Three pieces used by `scripts/compare_methods.py` (Pillutla et al. 2023,
Section 7.2 and Appendix C.2) and usable on their own:

* `rebuild_setup`: the same run on another dataset (e.g. the training
  clients minus a held-out half, `jaxfl.data.splits.hold_out_clients`) or
  with another client layout (strategy, local loop). Everything that depends
  on them (the engine, AFL's number of clients, the algorithms) is rebuilt
  through the registry, exactly as `setup` builds it.
* `run_points`: `run_sweep` over any number of points in chunks of a fixed
  width. Every chunk of one algorithm then has the same shapes, hence the
  same compiled program: with JAX's persistent compilation cache switched on
  (`jax_compilation_cache_dir`), only the first chunk compiles, later ones
  (and later stages, and later invocations) load it. The last chunk is
  padded by repeating its last point; padding results are dropped. A point's
  result does not depend on the chunk it runs in (a sweep point equals its
  single run).
* `choose_best`: the candidate with the smallest score averaged over seeds
  (Pillutla et al. 2023: the 90th percentile of the validation clients'
  misclassification error), ties broken by a second score, then by
  candidate order.

References:
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from jaxfl.algorithms.registry import build_algorithm
from jaxfl.data.population import FederatedDataset
from jaxfl.experiment.runner import (
    RunResult,
    Setup,
    algorithm_hparams,
    algorithm_options,
)
from jaxfl.experiment.sweep import SweepPoint, run_sweep
from jaxfl.training.strategies import ClientStrategy, parse_strategy


def rebuild_setup(
    run_setup: Setup,
    *,
    dataset: FederatedDataset | None = None,
    strategy: ClientStrategy | str | None = None,
    local_loop: str | None = None,
) -> Setup:
    """The same run with another dataset, client strategy or local loop.

    Args:
      run_setup: from `jaxfl.experiment.runner.setup`.
      dataset: replaces the dataset (its shapes must fit the model: same
        input shape and classes). The engine's number of training clients
        follows it.
      strategy: a `ClientStrategy` or its text ('vmap', 'sequential', ...).
      local_loop: 'scan' or 'while' (`jaxfl.training.local.LocalTraining`):
        'while' runs each client's own number of steps, which saves the
        padding steps when client sizes are spread out and clients run one
        at a time.

    Returns:
      A new `Setup`; the configuration object is unchanged (it still names
      the original dataset, strategy and loop).
    """
    engine = run_setup.engine
    dataset = dataset or run_setup.dataset
    if dataset.input_shape != run_setup.dataset.input_shape or (
        dataset.num_classes != run_setup.dataset.num_classes
    ):
        raise ValueError("the new dataset must have the same input shape and classes")
    if isinstance(strategy, str):
        strategy = parse_strategy(strategy)
    local = engine.local
    if local_loop is not None:
        local = dataclasses.replace(local, loop=local_loop)
    engine = dataclasses.replace(
        engine,
        strategy=strategy or engine.strategy,
        local=local,
        num_clients=dataset.train.num_clients,
    )
    if engine.clients_per_round > dataset.train.num_clients:
        raise ValueError(
            f"{engine.clients_per_round} clients per round but only "
            f"{dataset.train.num_clients} training clients in {dataset.name}"
        )
    config = run_setup.config
    algorithms, hparams = {}, {}
    for name in run_setup.algorithms:
        algorithms[name] = build_algorithm(name, engine, algorithm_options(config, name))
        hparams[name] = algorithm_hparams(config, name, algorithms[name])
    return dataclasses.replace(
        run_setup, dataset=dataset, engine=engine, algorithms=algorithms, hparams=hparams
    )


def run_points(
    run_setup: Setup,
    name: str,
    points: Sequence[SweepPoint],
    *,
    width: int | None = None,
    on_chunk: Callable[[int, int], None] | None = None,
    progress: Any = None,
) -> list[RunResult]:
    """Runs the points as sweeps of exactly `width` points each.

    Args:
      run_setup: the shared setup.
      name: the algorithm.
      points: any number of settings (at least one).
      width: points per compiled sweep; None runs them all as one sweep.
      on_chunk: called with (points done, points total) after each chunk.
      progress: a tqdm-like bar passed to `run_sweep` (one update per round
        of each chunk).

    Returns:
      One `RunResult` per point, in order.
    """
    if not points:
        raise ValueError("run_points needs at least one point")
    if width is None:
        width = len(points)
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    results: list[RunResult] = []
    for start in range(0, len(points), width):
        chunk = list(points[start : start + width])
        padded = chunk + [chunk[-1]] * (width - len(chunk))
        results.extend(run_sweep(run_setup, name, padded, progress=progress)[: len(chunk)])
        if on_chunk is not None:
            on_chunk(len(results), len(points))
    return results


def choose_best(
    scores: Sequence[Sequence[float]],
    tie_scores: Sequence[Sequence[float]] | None = None,
    *,
    tolerance: float = 1e-9,
) -> int:
    """Index of the candidate with the smallest mean score over seeds.

    Args:
      scores: `scores[c]` holds candidate c's score for each seed (e.g. the
        validation clients' 90th percentile of error); NaN scores (a diverged
        run) rank last.
      tie_scores: the same shape; among candidates whose mean score is within
        `tolerance` of the best, the smallest mean tie score wins.
        Percentiles of errors measured on 100 examples move in steps of 0.01,
        so exact ties are common and the mean error is a natural tie-break.
      tolerance: how close two mean scores must be to count as tied.

    Returns:
      The chosen index; among candidates tied on both scores, the first (so
      order candidates by preference).
    """
    if len(scores) == 0:
        raise ValueError("choose_best needs at least one candidate")

    def means(values):
        out = np.array([np.mean(np.asarray(v, np.float64)) for v in values])
        return np.where(np.isnan(out), np.inf, out)

    primary = means(scores)
    tied = np.flatnonzero(primary <= primary.min() + tolerance)
    if tie_scores is not None and tied.size > 1:
        secondary = means(tie_scores)[tied]
        tied = tied[secondary <= secondary.min() + tolerance]
    return int(tied[0])
