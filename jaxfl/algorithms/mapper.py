"""Mapper (Mansour, Mohri, Ro and Suresh 2020), a personalization baseline of Li 2023 (thesis), App. 5.6.2.

Model interpolation, "one of the three personalization methods proposed in
Mansour et al. that needs the minimal amount of meta-information" (thesis
Appendix 5.6.2). Client k keeps a local model u_k and a mixing weight lam_k;
its personal model is the interpolation

    h_k = lam_k u_k + (1 - lam_k) w,

and the global model w is trained on the interpolated losses, so that it is
the part the clients share (Mansour et al.'s objective
min_{w, u, lam} sum_k F_k(lam_k u_k + (1 - lam_k) w)).

The thesis gives no update rule; this is the authors' solver
(`litian96/ditto`, `flearn/trainers_MTL/mapper.py`, which produced the
thesis's Table 5.2 mapper row). One round, for every sampled client k from
the server model w_t and its (u_k, lam_k):

1. Candidate search: for each lam_j of the candidates (default 0.25, 0.5,
   0.75), local SGD from u_k on the client's minibatches,
       u <- (1 - lr l2) u - lr lam_j grad F_k(lam_j u + (1 - lam_j) w_t; xi),
   then the interpolation's loss F_k(lam_j u + (1 - lam_j) w_t) on all the
   client's training examples; the client keeps the (u, lam_j) of least
   loss (ties and NaN: the first candidate among the least, as Ditto's
   dynamic lambda).
2. Global steps: local SGD from w_t on the same minibatches with the new
   (u_k, lam_k) held fixed,
       w <- (1 - lr l2) w - lr (1 - lam_k) grad F_k(lam_k u_k + (1 - lam_k) w; xi);
   w - w_t is the client's update, which the round template aggregates
   (any aggregator, update attack and server optimizer of the run apply).

All u_k^0 = w^0 and lam_k^0 = 0 (the code's start); a client never sampled
keeps h_k = w. Where this differs from the authors' code: each candidate
takes the run's local steps (the code: local_iters + 1 personal steps and
one global step) on the same minibatches (the code draws fresh ones per
candidate), the loss is taken at the final u (the code: at the last step's
interpolation, before its update), and every sampled client's update is
averaged (the code appends only the last client's update, an indentation
slip). The code's final fine-tuning of h_k is not part of this algorithm
(`--finetune-epochs` fine-tunes from the global model).

Each local step costs 1 + |candidates| gradients (|candidates| + 1 passes
of the client's steps), plus |candidates| passes over the client's data.

References:
  [Mansour et al. 2020] Three Approaches for Personalization with Applications to Federated Learning.
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Unpack

import jax
import jax.numpy as jnp

from jaxfl.algorithms import stages
from jaxfl.algorithms.apfl import client_mixtures, mixture
from jaxfl.algorithms.base import FederatedAlgorithm, ServerState
from jaxfl.algorithms.ditto import lambda_candidates, least_loss_choice
from jaxfl.algorithms.registry import Engine
from jaxfl.training import LocalHParams, LocalTraining, Task, client_loss_and_error, local_sgd
from jaxfl.training.cohort import train_client_rows
from jaxfl.training.local import LocalStep, minibatch_loss, sgd_update
from jaxfl.types import Params

MAPPER_CANDIDATES = (0.25, 0.5, 0.75)


def interpolation_step(
    task: Task, hparams: LocalHParams, lam: jax.Array, other: Params, trains: str
) -> LocalStep:
    """One SGD step on F_k(lam u + (1 - lam) w).

    In u with w = `other` fixed (`trains`='local'), or in w with u = `other`
    fixed ('global').
    """

    def objective(params, batch, valid, key):
        local_model, global_model = (params, other) if trains == "local" else (other, params)
        return minibatch_loss(task, mixture(lam, local_model, global_model), batch, valid, key)

    def step(params: Params, batch, valid, key):
        loss, grads = jax.value_and_grad(objective)(params, batch, valid, key)
        return sgd_update(params, grads, hparams), loss

    return step


def mapper(
    task: Task,
    local: LocalTraining,
    clients_per_round: int,
    num_clients: int,
    *,
    candidates: tuple[float, ...] = MAPPER_CANDIDATES,
    **options: Unpack[stages.RoundOptions],
) -> FederatedAlgorithm:
    """Mapper (module docstring).

    Args:
      task, local, clients_per_round, **options: as `jaxfl.algorithms.stages.compose_round` takes them.
      num_clients: N, the training clients (rows of the local models).
      candidates: the mixing weights each sampled client tries, in [0, 1].

    Returns:
      The `FederatedAlgorithm`; its state's `clients` holds
      {'local': u_k leaves `[N, ...]`, 'lam': `[N]` lam_k}, and
      `personal_models(state)` the interpolations.

    Raises:
      ValueError: num_clients < 1, no candidates, or a candidate outside [0, 1].
    """
    strategy = options["strategy"]
    if num_clients < 1:
        raise ValueError(f"mapper needs num_clients >= 1, got {num_clients}")
    if not candidates:
        raise ValueError("mapper needs at least one mixing-weight candidate")
    if not all(0.0 <= lam <= 1.0 for lam in candidates):
        raise ValueError(f"mapper's mixing-weight candidates must lie in [0, 1], got {list(candidates)}")

    def global_step(hparams: LocalHParams, state_hparams, row) -> LocalStep:
        del state_hparams  # Mapper has no hyperparameters of its own.
        return interpolation_step(task, hparams, row["lam"], row["local"], trains="global")

    def search_fn(shared, client):
        server_params, population, hparams = shared

        def trained_with(lam):
            lam = jnp.float32(lam)
            step = interpolation_step(task, hparams, lam, server_params, trains="local")
            result = local_sgd(
                task, client["start"]["local"], population, client["id"], client["key"], hparams, local,
                active=client["active"], step=step,
            )
            interpolated = mixture(lam, result.params, server_params)
            return result.params, client_loss_and_error(task, interpolated, population, client["id"])[0]

        tried = [trained_with(lam) for lam in candidates]
        losses = jnp.stack([loss for _, loss in tried])
        best, local_model = least_loss_choice(losses, [model for model, _ in tried])
        lam = jnp.asarray(candidates, jnp.float32)[best]
        return {"params": {"local": local_model, "lam": lam}, "loss": losses[best], "lam": lam}

    def search(state, cohort, clients_key, lr, population, active):
        # The round's cohort and each client's key of its global training: the search and the global
        # steps see the same clients and minibatches; the global steps then read the chosen rows.
        del population, active  # Unused: mapper drops no client.
        hparams = LocalHParams(lr=lr, l2=state.hparams["l2"])
        searched, trained = train_client_rows(
            search_fn, (state.params, cohort.population, hparams), state.clients, cohort, clients_key,
            local, strategy,
        )
        # The chosen interpolations' losses on the cohort's training data, and their weights.
        metrics = {
            "personal_train_loss": jnp.mean(trained["loss"]),
            "mapper_lam_mean": jnp.mean(trained["lam"]),
        }
        return searched, metrics

    def personal_models(state: ServerState) -> Params:
        return client_mixtures(state.clients["lam"], state.clients["local"], state.params)

    algorithm = stages.compose_round(
        "mapper",
        task,
        clients_per_round,
        client_update=stages.ClientUpdateStage(local=local, step=global_step, step_reads_rows=True),
        num_clients=num_clients,
        rows_are_models=True,
        personal=stages.PersonalStage(search, init_row=_initial_row),
        **options,
    )
    return algorithm._replace(personal_models=personal_models)


def _initial_row(params: Params, hparams) -> dict:
    """u_k^0 = w^0 and lam_k^0 = 0."""
    del hparams  # Unused.
    return {"local": params, "lam": jnp.float32(0.0)}


def from_engine(engine: Engine, options: Mapping[str, Any]) -> FederatedAlgorithm:
    """The mapper algorithm as the registry builds it for a run."""
    candidates = lambda_candidates(options["mapper_candidates"], "mapper_candidates")
    if not candidates:
        raise ValueError(
            "mapper_candidates needs at least one mixing weight in [0, 1], such as 0.25,0.5,0.75"
        )
    return mapper(
        engine.task, engine.local, engine.clients_per_round, engine.training_clients("mapper"),
        candidates=candidates, **engine.round_options(),
    )
