"""Personal models after training: fine-tuning baselines, an algorithm's own, and host-resident ones.

`personal_models` is what a run evaluates and saves as personal models:
the algorithm's (Ditto's rows, APFL's mixtures), or, for host-resident rows,
models made block by block on the device.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxfl.algorithms.base import (
    FederatedAlgorithm,
    ServerState,
    local_learning_rate,
    no_personal_models,
    own_models,
)
from jaxfl.data.host import place_population
from jaxfl.experiment.run_setup import Setup
from jaxfl.training.client_state import HostPersonalModels, is_on_host
from jaxfl.training.cohort import finetune_models

FINETUNE_STREAM = 0x46494E45


def finetuned_models(run_setup: Setup, state: ServerState, run_key) -> Any:
    """`--finetune-epochs`: every training client's fine-tuned global model, leaves `[N, ...]`.

    `finetune_epochs` epochs of the run's local SGD (batch size, learning rate at the final
    round) from the final global model on each client's training examples,
    with key `fold_in(fold_in(run_key, FINETUNE_STREAM), k)`, with EWC's
    Fisher-weighted penalty under `--finetune-ewc`, the symmetrized KL
    divergence to the global model's outputs under `--finetune-skl`; evaluated as personal
    models (`personal_*` summaries and columns).
    """
    config, engine = run_setup.config, run_setup.engine
    personalization = config.personalization
    local = dataclasses.replace(engine.local, num_epochs=personalization.finetune_epochs, max_steps=None)
    population = place_population(run_setup.dataset.train, "device")
    lr = local_learning_rate(state.hparams, state.round)
    ewc_lam = None if personalization.finetune_ewc is None else jnp.float32(personalization.finetune_ewc)
    skl_lam = None if personalization.finetune_skl is None else jnp.float32(personalization.finetune_skl)
    return _finetune(
        engine.task, local, engine.strategy, state.params, population,
        jax.random.fold_in(run_key, FINETUNE_STREAM), lr, ewc_lam=ewc_lam, skl_lam=skl_lam,
    ).params


_finetune = jax.jit(finetune_models, static_argnums=(0, 1, 2))


def personalized_models(
    run_setup: Setup, algorithm: FederatedAlgorithm, state: ServerState, *, batched: bool = False
) -> Any:
    """An algorithm's personal models made after training (`FederatedAlgorithm.personalize`:
    Per-FedAvg's adaptation step), from the final state and the training clients' examples
    (copied to the device if they are host-resident); evaluated as personal models.
    `batched`: the state carries a leading sweep axis, and so do the models.
    """
    population = place_population(run_setup.dataset.train, "device")
    personalize = jax.vmap(algorithm.personalize, in_axes=(0, None)) if batched else algorithm.personalize
    return jax.jit(personalize)(state, run_setup.engine.strategy.replicate(population))


def after_training_models(
    run_setup: Setup, algorithm: FederatedAlgorithm, state: ServerState, run_key, *, batched: bool = False
) -> Any | None:
    """The personal models made after training, evaluated in place of the last evaluation's, or None.

    The algorithm's own (`personalized_models`), else under `--finetune-epochs`
    the fine-tuned global model of an algorithm without per-client state
    (`finetuned_models`; those with personal models of their own report
    those). `batched`: the state and `run_key` carry a leading sweep axis, and
    each point is fine-tuned as its single run would be.
    """
    if algorithm.personalize is not None:
        return personalized_models(run_setup, algorithm, state, batched=batched)
    if not run_setup.config.personalization.finetune_epochs or jax.tree.leaves(state.clients):
        return None
    if not batched:
        return finetuned_models(run_setup, state, run_key)
    points = [
        finetuned_models(run_setup, jax.tree.map(lambda x, g=g: x[g], state), run_key[g])
        for g in range(len(run_key))
    ]
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *points)


def personal_models(algorithm: FederatedAlgorithm, state: ServerState) -> Any:
    """`algorithm.personal_models(state)`, or for host-resident client rows the
    `HostPersonalModels` that make them block by block on the device.
    """
    if not is_on_host(state.clients) or algorithm.personal_models is no_personal_models:
        return algorithm.personal_models(state)
    if algorithm.personal_models is own_models:
        return HostPersonalModels(state.clients)
    device_part = dataclasses.replace(state, clients=())
    return HostPersonalModels(
        state.clients, functools.partial(_block_personal_models, algorithm.personal_models, device_part)
    )


@functools.partial(jax.jit, static_argnums=0)
def _block_personal_models(personal_models_fn: Callable, device_part: ServerState, rows: Any) -> Any:
    """`personal_models_fn` of a block of host rows; the state is an argument (not a constant of the
    program), so one compilation serves every evaluation and the save.
    """
    return personal_models_fn(dataclasses.replace(device_part, clients=rows))


def saved_personal_models(algorithm: FederatedAlgorithm, state: ServerState) -> Any:
    """The personal models a run saves: `personal_models`, host-resident ones brought to host arrays."""
    models = personal_models(algorithm, state)
    return models.to_host() if isinstance(models, HostPersonalModels) else models
