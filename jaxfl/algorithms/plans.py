"""What the server decides about a cohort before local training.

The pieces several algorithms share between sampling and local training:

* `cohort_losses`: every sampled client's loss F_i(w_t) and error on all its
  data, computed before anyone trains (Delta-FL filters on it, so clients
  that are filtered out need not train at all);
* `random_subset_mask`: a uniformly random subset of the cohort of a given
  (possibly traced) size, for FedAvg-Sub and for choosing stragglers;
* `draw_stragglers`: the systems heterogeneity of FedProx (Li 2023 (thesis),
  Section 3.4.2).

Randomness: a client's own random draws use `fold_in(key, client_id)`, so
they do not depend on which other clients were sampled; choosing *which* of
the cohort's clients form a subset of fixed size is a cohort-level choice
(it ranks the clients by those per-client draws).

References:
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
  [Laguel et al. 2020] Device Heterogeneity in Federated Learning: A Superquantile Approach.
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxfl.data.population import ClientPopulation
from jaxfl.training.local import Task, client_loss_and_error
from jaxfl.training.strategies import ClientStrategy, map_clients
from jaxfl.types import Key, Params


def cohort_losses(
    task: Task,
    strategy: ClientStrategy,
    params: Params,
    population: ClientPopulation,
    client_ids: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """F_i(w_t) and the misclassification error of w_t on each sampled client.

    Each client evaluates the server model on all its examples (the loss
    Pillutla et al. 2023, Algorithm 1 line 3 and Laguel et al. 2020,
    Algorithm 2 line 4 ask for), laid out on the hardware like local
    training.

    Args:
      task: model and loss.
      strategy: how clients are laid out.
      params: the server model w_t.
      population: the training clients.
      client_ids: `[M]` the cohort.

    Returns:
      `([M] losses, [M] errors)`, float32.
    """
    per_client = {
        "id": client_ids,
        "active": jnp.ones(client_ids.shape, bool),
    }

    def client_fn(shared, client):
        params, population = shared
        return client_loss_and_error(task, params, population, client["id"])

    return map_clients(client_fn, (params, population), per_client, strategy)


def random_subset_mask(key: Key, client_ids: jax.Array, size) -> jax.Array:
    """`[M]` bool: a uniformly random subset of `size` of the cohort's clients.

    Client i draws u_i ~ U(0, 1) from `fold_in(key, client_id)`; the `size`
    clients with the smallest draws are chosen. Every subset of that size is
    equally likely, and `size` may be traced (FedAvg-Sub's round(theta m)).

    Args:
      key: PRNG key of the choice.
      client_ids: `[M]` the cohort.
      size: number of clients to choose, an int or a traced integer scalar;
        values outside [0, M] choose nobody / everyone.

    Returns:
      `[M]` bool mask with min(max(size, 0), M) True entries.
    """
    draws = jax.vmap(lambda i: jax.random.uniform(jax.random.fold_in(key, i)))(
        client_ids
    )
    ranks = jnp.argsort(jnp.argsort(draws))
    return ranks < size


class Stragglers(NamedTuple):
    """Which clients of a cohort are stragglers, and how much they work.

    Attributes:
      is_straggler: `[M]` bool.
      num_epochs: `[M]` int32 local epochs: E for the others, uniform on
        {1, ..., E - 1} for stragglers.
    """

    is_straggler: jax.Array
    num_epochs: jax.Array


def num_stragglers(clients_per_round: int, fraction: float) -> int:
    """M - round(M (1 - fraction)): the FedProx code's count, Python rounding.

    `active = np.random.choice(selected, round(K * (1 - drop_percent)))` in
    litian96/FedProx (`flearn/trainers/fedprox.py`); the others straggle.
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"stragglers must be in [0, 1), got {fraction}")
    return clients_per_round - round(clients_per_round * (1.0 - fraction))


def check_straggler_epochs(count: int, max_epochs: int) -> None:
    """Raises ValueError if stragglers must run partial work but max_epochs < 2."""
    if count > 0 and max_epochs < 2:
        raise ValueError(
            "stragglers run 1 to local_epochs - 1 local epochs, so stragglers > 0 needs "
            f"local_epochs >= 2, got local_epochs={max_epochs}"
        )


def draw_stragglers(
    key: Key, client_ids: jax.Array, count: int, max_epochs: int
) -> Stragglers:
    """Chooses `count` stragglers of the cohort and their numbers of epochs.

    Li 2023 (thesis), Section 3.4.2: a fixed fraction of the selected
    devices are stragglers, re-drawn every round, that run x local epochs
    "chosen uniformly at random between [1, E]". We follow the authors' code,
    `np.random.randint(low=1, high=E)`, i.e. x uniform on {1, ..., E - 1}:
    a straggler always does strictly less than a full client (the thesis's
    text and its code differ here; with E = 1 there is no such x, and the
    code would fail too). The stragglers are the clients chosen by
    `random_subset_mask(split(key)[0], client_ids, count)`; client i draws
    its epochs from `fold_in(split(key)[1], client_id)`.

    Args:
      key: this round's key for the choice (the same for FedAvg and FedProx,
        so that both see the same stragglers).
      client_ids: `[M]` the cohort.
      count: number of stragglers (static), from `num_stragglers`.
      max_epochs: the full clients' epochs, >= 2.

    Returns:
      The `Stragglers`.

    Raises:
      ValueError: count > 0 and max_epochs < 2.
    """
    check_straggler_epochs(count, max_epochs)
    choice_key, epochs_key = jax.random.split(key)
    is_straggler = random_subset_mask(choice_key, client_ids, count)
    partial = jax.vmap(
        lambda i: jax.random.randint(
            jax.random.fold_in(epochs_key, i),
            (),
            1,
            max(max_epochs, 2),
            dtype=jnp.int32,
        )
    )(client_ids)
    num_epochs = jnp.where(is_straggler, partial, jnp.int32(max_epochs))
    return Stragglers(is_straggler, num_epochs)
