"""Ditto (Li 2023 (thesis), chapter 5): personal models next to any global algorithm.

Each client k keeps a personal model v_k that solves (the thesis's objective
(Ditto), Section 5.2.1)

    min_v F_k(v) + lambda/2 ||v - w*||^2,

w* being what the global algorithm G trains. One round (thesis Algorithm 6;
Algorithm 7 for G = FedAvg):

1. G's round runs unchanged: it samples S_t, trains and aggregates (its own
   aggregation rule, robust or not) and yields w_{t+1};
2. every client k of S_t also runs the same number of personal steps from
   its v_k on the same minibatches as its global steps,
   v_k <- v_k - lr (grad F_k(v_k) + lambda (v_k - w_t)),
   and keeps v_k (stateful clients: v_k persists across the rounds in which k
   is sampled; all v_k^0 = w^0, as the authors' code).

The global trajectory does not depend on the v_k (only Delta is sent), so
G's state, metrics and model are bit for bit those of G alone. The personal
models live in `ServerState.clients` as leaves `[N, ...]` (one model per
training client: N times the model's bytes; docs/personalization.md gives
the N this allows); the round gathers the cohort's rows and scatters them
back inside the one compiled round. lambda is the hyperparameter 'lam' (a
traced scalar, so sweeps vary it without recompiling). lambda = 0 trains
purely local models; large lambda keeps v_k near w_t.

Keys: the cohort is G's (`round_keys(key, round).sampling`, the same draw),
and client k's personal steps use `fold_in(keys.clients, k)`, the key of its
global local training, hence its minibatches.

Dynamic lambda (thesis Section 5.3 and Appendix 5.7.2; the authors'
`dynamic_lam`): with candidates Lambda, every personal step tries each
lambda_j in Lambda,

    v_j = v - lr (grad F_k(v; batch) + lambda_j (v - w_t)),

and keeps the v_j of least loss on client k's validation examples (validation
client k is training client k; ties and NaN losses: the first candidate
among the least). A client with fewer than `MIN_VALIDATION_EXAMPLES`
validation examples steps with the fixed lambda 'lam' (the thesis's
small-device fallback). Each step then costs one gradient and |Lambda|
passes over the client's validation examples.

References:
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxfl.algorithms.base import FederatedAlgorithm
from jaxfl.algorithms.registry import DITTO_GLOBALS, Engine, algorithm_spec
from jaxfl.algorithms.stages import PersonalStage
from jaxfl.data.population import ClientPopulation, GatheredCohort
from jaxfl.training import LocalHParams, LocalTraining, Task, client_loss_and_error, local_sgd
from jaxfl.training.cohort import train_client_rows, update_personal_models
from jaxfl.training.local import LocalStep, minibatch_loss
from jaxfl.types import Params

DITTO_HPARAM_DEFAULTS = {"lam": 1.0}
# Fewer validation examples than this: the fixed lambda (thesis section 5.3).
MIN_VALIDATION_EXAMPLES = 4


def lambda_candidates(text: str, what: str = "dynamic lambda candidates") -> tuple[float, ...]:
    """Dynamic lambda's candidates from '0.1,1,2' ('' : none, a fixed lambda); `what` names them in errors.

    Raises:
      ValueError: a value that is not a finite number >= 0, or one given twice.
    """
    if not text.strip():
        return ()
    values = []
    for item in text.split(","):
        try:
            value = float(item)
        except ValueError:
            raise ValueError(f"{what} must be numbers, got {item.strip()!r} in {text!r}") from None
        if not (np.isfinite(value) and value >= 0):
            raise ValueError(f"{what} must be finite and >= 0, got {item.strip()} in {text!r}")
        if value in values:
            raise ValueError(f"{what}: {value:g} is given twice in {text!r}")
        values.append(value)
    return tuple(values)


def least_loss_choice(losses: jax.Array, candidates: list[Params]) -> tuple[jax.Array, Params]:
    """(index, candidate) of the least of `losses`; NaN counts as +inf and ties go to the first."""
    best = jnp.argmin(jnp.where(jnp.isnan(losses), jnp.inf, losses))
    return best, jax.tree.map(lambda *leaves: jnp.stack(leaves)[best], *candidates)


def greedy_lambda_step(
    task: Task,
    candidates: tuple[float, ...],
    fallback_lam: jax.Array,
    lr: jax.Array,
    anchor: Params,
    validation: ClientPopulation,
    client_id: jax.Array,
    chunk_size: int,
) -> LocalStep:
    """Dynamic lambda's personal step for one client (module docstring), as a `local_sgd` step.

    The validation losses are summed in chunks of `chunk_size` examples (the
    batch size), as many as the client's own examples need: a chunk of the
    largest client's size would pad a typical client's few validation
    examples many times over (Fashion-MNIST's Ditto partition: about 11 of
    them against chunks of up to 128).
    """
    enough = validation.counts[client_id] >= MIN_VALIDATION_EXAMPLES

    def validation_loss(params):
        return client_loss_and_error(task, params, validation, client_id, chunk_size=chunk_size)[0]

    def with_lambda(params, grads, lam):
        return jax.tree.map(lambda v, g, w: v - lr * (g + lam * (v - w)), params, grads, anchor)

    def step(params: Params, batch, valid, key) -> tuple[Params, jax.Array]:
        loss, grads = jax.value_and_grad(minibatch_loss, argnums=1)(task, params, batch, valid, key)
        tried = [with_lambda(params, grads, jnp.float32(lam)) for lam in candidates]
        losses = jnp.stack([validation_loss(v) for v in tried])
        _, chosen = least_loss_choice(losses, tried)
        fixed = with_lambda(params, grads, fallback_lam)
        return jax.tree.map(lambda c, f: jnp.where(enough, c, f), chosen, fixed), loss

    return step


def ditto(
    global_algorithm: FederatedAlgorithm,
    local: LocalTraining,
    num_clients: int,
    *,
    dynamic_lam: tuple[float, ...] = (),
    validation: ClientPopulation | None = None,
    name: str = "ditto",
) -> FederatedAlgorithm:
    """Ditto with `global_algorithm` as its global solver G (module docstring).

    Args:
      global_algorithm: G, any composed round (FedAvg, FedProx, Delta-FL,
        q-FFL, ..., with any aggregator); the personal models train on its
        cohort, with its task and client strategy.
      local: the personal models' local training (r = s local iterations:
        G's, unless G's own is a function of the population, as FedSGD's).
      num_clients: N, the training clients (rows of the personal models).
      dynamic_lam: dynamic lambda's candidates (module docstring); () : the
        fixed lambda 'lam'.
      validation: with `dynamic_lam`, the validation examples, client k's
        being training client k's (device-resident, N clients), compiled
        into the round as constants; None: the round reads them from its
        population argument's `held_out` (`ClientPopulation.held_out`, what
        the runner gives), an argument of the compiled round.
      name: registry name.

    Returns:
      The `FederatedAlgorithm`; its state's `clients` holds the personal
      models, leaves `[N, ...]`.

    Raises:
      ValueError: num_clients < 1, G already takes a 'lam', or dynamic
        lambda without N clients' validation examples.
    """
    if num_clients < 1:
        raise ValueError(f"ditto needs num_clients >= 1, got {num_clients}")
    def check_validation(validation, expected_clients):
        if validation is None or validation.num_clients != expected_clients:
            given = "none" if validation is None else f"{validation.num_clients} clients"
            raise ValueError(
                "dynamic lambda chooses on each client's own validation examples: it needs a validation "
                f"population of {expected_clients} clients (validation client k = training client k; a "
                "gathered cohort's own clients'), as `validation` or as the population's `held_out`, "
                f"got {given}"
            )

    validation_given = validation is not None
    if dynamic_lam and validation_given:
        check_validation(validation, num_clients)
    composition = global_algorithm.composition
    if composition is None:
        raise ValueError(
            f"ditto builds on a composed round's stages; {global_algorithm.name} writes its own round"
        )
    task, clients_per_round, strategy = composition.task, composition.clients_per_round, composition.strategy
    if composition.personal is not None or composition.client_update.init_row is not None:
        raise ValueError(f"ditto's personal models would replace {global_algorithm.name}'s per-client state")
    if "lam" in global_algorithm.hparam_defaults:
        raise ValueError(f"{global_algorithm.name} already has a hyperparameter 'lam'")

    def personal_update(state, cohort, clients_key, lr, population, active):
        del active  # Ditto's G drops no client.
        # The round's own cohort, and each client's key of its global training: the same minibatches.
        hparams = LocalHParams(lr=lr, prox_mu=state.hparams["lam"])
        if dynamic_lam:
            examples = validation
            if not validation_given:
                examples = population.held_out
                gathered = isinstance(population, GatheredCohort)
                check_validation(examples, clients_per_round if gathered else num_clients)
            clients, personal_loss = dynamic_personal_steps(state, cohort, clients_key, hparams, examples)
        else:
            clients, trained = update_personal_models(
                task, local, strategy, state.params, state.clients, cohort, clients_key, hparams
            )
            personal_loss = trained.mean_batch_loss
        return clients, {"personal_train_loss": jnp.mean(personal_loss)}

    def dynamic_personal_steps(state, cohort, clients_key, hparams, validation):
        def client_fn(shared, client):
            anchor, population, validation, hparams = shared
            step = greedy_lambda_step(
                task, dynamic_lam, hparams.prox_mu, hparams.lr, anchor, validation, client["validation_id"],
                local.batch_size,
            )
            result = local_sgd(
                task, client["start"], population, client["id"], client["key"], hparams, local,
                active=client["active"], anchor=anchor, step=step,
            )
            return {"params": result.params, "loss": result.mean_batch_loss}

        shared = (state.params, cohort.population, validation, hparams)
        clients, trained = train_client_rows(
            client_fn, shared, state.clients, cohort, clients_key, local, strategy,
            # Constructor examples are all N clients'; a population's `held_out` is laid out like
            # the population: all N on the device, the cohort's slots in a gathered cohort.
            extra={"validation_id": cohort.client_ids if validation_given else cohort.slots},
        )
        return clients, trained["loss"]

    personal = PersonalStage(personal_update, init_row=_initial_model, hparam_defaults=DITTO_HPARAM_DEFAULTS)
    return composition.rebuilt(
        name=name, num_clients=num_clients, rows_are_models=True, personal=personal
    )


def _initial_model(params: Params, hparams) -> Params:
    """Every v_k^0 = w^0."""
    del hparams  # Unused.
    return params


def from_engine(engine: Engine, options: Mapping[str, Any]) -> FederatedAlgorithm:
    """Ditto over the registered algorithm `options['ditto_global']`, as the registry builds it for a run."""
    global_name = options["ditto_global"]
    if global_name not in DITTO_GLOBALS:
        raise ValueError(f"ditto_global must be one of {', '.join(DITTO_GLOBALS)}, got {global_name!r}")
    if options["ditto_dynamic_lam"] and engine.personal_validation is None:
        raise ValueError(
            "ditto's dynamic lambda needs the training clients' own validation examples "
            "(Engine.personal_validation)"
        )
    inner_spec = algorithm_spec(global_name)
    inner = inner_spec.build(engine, {k: options[k] for k in inner_spec.options})
    return ditto(
        inner, engine.local, engine.training_clients("ditto"),
        dynamic_lam=lambda_candidates(options["ditto_dynamic_lam"]),
    )
