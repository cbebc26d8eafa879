"""A run's points: the settings that one compiled round trains together.

A point is a set of numeric hyperparameters (those in `ServerState.hparams`,
plus the server learning rate) and a seed. A single run is one point; a sweep
stacks its points' states along a leading axis and `vmap`s the round over
them (`jaxfl.experiment.sweep`). Both are trained by
`jaxfl.experiment.runner.train_points`; this module holds what the batched
path adds: the points' initial states, and the vmapped round and evaluator,
kept between calls.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jaxfl.algorithms.base import ServerState
from jaxfl.algorithms.registry import CLIENT_STATE_ALGORITHMS
from jaxfl.experiment.config import ConfigError
from jaxfl.experiment.evaluator import evaluation_clients, make_evaluator, personal_evaluation_group
from jaxfl.experiment.health import monitored
from jaxfl.experiment.run_setup import Setup
from jaxfl.experiment.training_loop import compile_rounds

SERVER_LR = "server_lr"


@dataclasses.dataclass(frozen=True)
class SweepPoint:
    """One setting: numeric hyperparameter overrides and a seed."""

    hparams: Mapping[str, float]
    seed: int

    def label(self) -> str:
        parts = [f"{k}={v:g}" for k, v in sorted(self.hparams.items())]
        return ",".join(parts + [f"seed={self.seed}"])


def set_server_lr(state: ServerState, learning_rate: float) -> ServerState:
    """Sets the server learning rate held by an injected optax optimizer."""
    opt_state = state.opt_state
    if not hasattr(opt_state, "hyperparams") or "learning_rate" not in opt_state.hyperparams:
        raise ValueError("this server optimizer has no injectable learning_rate")
    hyperparams = dict(opt_state.hyperparams)
    hyperparams["learning_rate"] = jnp.asarray(
        learning_rate, jnp.asarray(hyperparams["learning_rate"]).dtype
    )
    return dataclasses.replace(state, opt_state=opt_state._replace(hyperparams=hyperparams))


def initial_state(run_setup: Setup, name: str, point: SweepPoint) -> tuple[ServerState, jax.Array]:
    """The state and run key a single run of this point would start from."""
    algorithm = run_setup.algorithms[name]
    init_key, run_key = jax.random.split(jax.random.key(point.seed))
    params = run_setup.engine.task.model.init(init_key)
    hparams = dict(run_setup.hparams[name])
    overrides = {k: v for k, v in point.hparams.items() if k != SERVER_LR}
    unknown = sorted(set(overrides) - set(algorithm.hparam_defaults))
    if unknown:
        raise ValueError(
            f"{name} has no hyperparameter {unknown[0]!r}; sweepable: "
            f"{', '.join(sorted([*algorithm.hparam_defaults, SERVER_LR]))}, seed"
        )
    hparams.update(overrides)
    state = algorithm.init(params, hparams)
    if SERVER_LR in point.hparams:
        state = set_server_lr(state, point.hparams[SERVER_LR])
    return state, run_key


def stack(trees: Sequence[Any]) -> Any:
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)


# Evaluators go away with their dataset: datasets hold arrays and cannot be
# hashed, so they are keyed by id, and the entry is dropped when the dataset
# is collected (before the id can be reused).
_BATCHED_EVALUATORS: dict[int, tuple[weakref.ref, dict]] = {}


@functools.lru_cache(maxsize=16)  # The jitted round keeps round_fn alive: bounded.
def batched_round(
    round_fn: Callable, rounds_per_call: int = 1, cohort_per_point: bool = False, released_only: bool = False
) -> Callable:
    """`vmap(monitored(round_fn))` over (state, health) carries and keys, compiled
    as `rounds_per_call` rounds per call (`jaxfl.experiment.runner.compile_rounds`); the same
    object per (round_fn, rounds_per_call, cohort_per_point, released_only). With
    `cohort_per_point` (a host-resident population) the population argument
    holds each point's gathered cohort, batched like the states.
    `released_only`: the health checks only the parameters (a DP
    algorithm's; `jaxfl.experiment.health`).

    Every point keeps its own batched key and round counter, even when the
    points share a seed: unbatching them (so that all points read the same
    minibatch) was measured slower on CPU, as XLA then transposes the
    stacked models at every local step (benchmarks/RESULTS.md, section
    "The suite on this CPU (`suite.py --preset cpu --devices 2`, 2026-11-26)").
    """
    population_axis = 0 if cohort_per_point else None
    return compile_rounds(
        jax.vmap(monitored(round_fn, released_only=released_only), in_axes=(0, population_axis, 0)),
        rounds_per_call,
        cohort_per_round=cohort_per_point,
    )


# Per-client columns that are the same for every point of a sweep (no leading point axis).
SHARED_COLUMNS = ("num_examples", "attacked", "client")


def batched_evaluator(run_setup: Setup) -> Callable:
    """The batched `make_evaluator` of the setup, the same object per dataset."""
    engine, dataset = run_setup.engine, run_setup.dataset
    entry = _BATCHED_EVALUATORS.get(id(dataset))
    if entry is None or entry[0]() is not dataset:
        # The defaults bind the weakref callback to this dataset's id and to the cache itself (module
        # teardown may have cleared the global by the time the callback runs).
        forget = lambda _, key=id(dataset), cache=_BATCHED_EVALUATORS: cache.pop(key, None)  # noqa
        entry = (weakref.ref(dataset, forget), {})
        _BATCHED_EVALUATORS[id(dataset)] = entry
    evaluators = entry[1]
    corrupted = run_setup.corrupted
    # Setups of one dataset may differ in who is corrupted (a grid over attack_fraction).
    key = (
        engine.task,
        engine.client_weighting,
        personal_evaluation_group(engine.strategy),
        engine.strategy.mesh,
        None if corrupted is None else corrupted.tobytes(),
        run_setup.config.evaluation.eval_clients,
        run_setup.config.evaluation.eval_train,
        run_setup.config.runtime.seed,
    )
    if key not in evaluators:
        # The corrupted clients depend on the dataset's setup (seed, attack), as the dataset does.
        evaluators[key] = make_evaluator(
            engine.task, dataset, engine.client_weighting, batched=True, corrupted=run_setup.corrupted,
            personal_group=personal_evaluation_group(engine.strategy), sample=evaluation_clients(run_setup),
            train=run_setup.config.evaluation.eval_train, mesh=engine.strategy.mesh,
        )
    return evaluators[key]


def check_client_state(run_setup: Setup, name: str) -> None:
    """A one-line ConfigError when a sweep of `name` would need host-resident personal models."""
    personalization = run_setup.config.personalization
    if run_setup.engine.strategy.host_client_state and name in CLIENT_STATE_ALGORITHMS:
        why = (
            "--client-state auto chose host memory, as the personal models fit the devices neither "
            "replicated nor split" if personalization.client_state == "auto" else "--client-state host"
        )
        raise ConfigError(
            f"a sweep of {name} keeps its points' personal models on the device, but {why}: "
            "run the settings one at a time, or with fewer training clients"
        )
