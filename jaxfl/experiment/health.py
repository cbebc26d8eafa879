"""Divergence and empty rounds, detected inside the compiled round.

`monitored(round_fn)` carries a `RunHealth` beside the server state: after
every round it checks, on the device, that the new parameters are finite
and below `EXPLODED_MAGNITUDE` in magnitude, that the round's training
loss is finite and that so are the per-client rows the state keeps
(personal models, control variates; the cohort's when they live in host
memory), and records the first round where one is not (and which), and it
counts the rounds in which no client got weight (every client a straggler,
a threshold that filtered everyone: the model did not move) and the updates
clients sent (the round metric `clients_uploading`, from which the run's bytes
follow: `jaxfl.communication.traffic`).

A differentially private algorithm's run checks only what it releases, the
parameters (`released_only`): its training loss and round metrics are
functions of the clients' data outside the privacy accounting, so they must
not decide a visible stop.
The host reads these integers only when it stops anyway (at an
evaluation or a checkpoint), so the check costs no round trip per round.

A run whose health says diverged stops with a one-line message, exit status
`EXIT_DIVERGED`, and its summary marked as diverged; its checkpoints are
only ever of finite states (the host checks before saving).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

EXIT_DIVERGED = 3

# A parameter this large is a run that blew up, though still finite: its
# squares (l2 penalties, norms) already overflow float32 (max 3.4e38), and a
# healthy model sits many orders of magnitude below.
EXPLODED_MAGNITUDE = 1e18

QUANTITIES = {
    1: "the model parameters are not finite (NaN or inf)",
    2: f"the model parameters exceed {EXPLODED_MAGNITUDE:.0e} in magnitude",
    3: "the training loss is not finite (NaN or inf)",
    4: f"the per-client state (personal models, control variates) is not finite or exceeds "
    f"{EXPLODED_MAGNITUDE:.0e} in magnitude",
}


class RunHealth(NamedTuple):
    """int32 scalars carried through the rounds (a pytree; vmapped in sweeps).

    Attributes:
      diverged_round: the first round (1-based) whose outcome failed a check; -1 if none.
      quantity: which check it failed (a key of `QUANTITIES`); 0 if none.
      rounds_without_weight: rounds in which no client got weight.
      client_uploads: updates sent by clients so far (0 for a round that
        does not report `clients_uploading`).
    """

    diverged_round: jax.Array
    quantity: jax.Array
    rounds_without_weight: jax.Array
    client_uploads: jax.Array


def initial_health() -> RunHealth:
    # Four buffers: the carry is donated, and one buffer cannot be donated twice.
    return RunHealth(*(jnp.asarray(value, jnp.int32) for value in (-1, 0, 0, 0)))


def _finite_and_bounded(tree: Any) -> tuple[jax.Array, jax.Array]:
    """(all finite, largest magnitude) over the floating-point leaves of `tree`."""
    leaves = [jnp.asarray(leaf) for leaf in jax.tree.leaves(tree)]
    leaves = [leaf for leaf in leaves if jnp.issubdtype(leaf.dtype, jnp.floating)]
    if not leaves:
        return jnp.asarray(True), jnp.asarray(0.0, jnp.float32)
    finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in leaves]))
    largest = jnp.max(jnp.stack([jnp.max(jnp.abs(leaf), initial=0.0).astype(jnp.float32) for leaf in leaves]))
    return finite, largest


def check_round(
    health: RunHealth,
    round_number: jax.Array,
    params: Any,
    metrics: dict,
    clients: Any = (),
    *,
    released_only: bool = False,
) -> RunHealth:
    """`health` updated with one round's outcome (round_number is 1-based).

    `clients` are the state's per-client rows; with `released_only` (a DP
    algorithm) only `params` are checked.
    """
    finite, largest = _finite_and_bounded(params)
    loss = None if released_only else metrics.get("train_loss")
    loss_finite = jnp.isfinite(loss) if loss is not None else jnp.asarray(True)
    rows_finite, rows_largest = _finite_and_bounded(() if released_only else clients)
    rows_ok = rows_finite & (rows_largest <= EXPLODED_MAGNITUDE)
    quantity = jnp.where(
        ~finite,
        1,
        jnp.where(largest > EXPLODED_MAGNITUDE, 2, jnp.where(~loss_finite, 3, jnp.where(~rows_ok, 4, 0))),
    ).astype(jnp.int32)
    first = (health.diverged_round < 0) & (quantity > 0)
    weighted = metrics.get("clients_with_weight")
    empty = (weighted == 0) if weighted is not None else jnp.asarray(False)
    return RunHealth(
        diverged_round=jnp.where(first, round_number.astype(jnp.int32), health.diverged_round),
        quantity=jnp.where(first, quantity, health.quantity),
        rounds_without_weight=health.rounds_without_weight + empty.astype(jnp.int32),
        client_uploads=health.client_uploads + jnp.asarray(metrics.get("clients_uploading", 0), jnp.int32),
    )


def monitored(round_fn: Callable, *, released_only: bool = False) -> Callable:
    """`round_fn` over a carry `(state, RunHealth)` instead of the state.

    `(carry, population, key) -> (carry, metrics)`, jittable and vmappable
    like `round_fn`; the state and metrics are unchanged. `released_only`:
    check only the parameters (a DP algorithm's; see the module docstring).
    """

    def round_with_health(carry, population, key):
        state, health = carry
        new_state, metrics = round_fn(state, population, key)
        health = check_round(
            health, new_state.round, new_state.params, metrics, new_state.clients, released_only=released_only
        )
        return (new_state, health), metrics

    return round_with_health


def host_health(health: RunHealth) -> dict[str, np.ndarray]:
    """The health as host arrays (one value, or one per sweep point)."""
    return {name: np.asarray(value) for name, value in jax.device_get(health)._asdict().items()}


def divergence(health: dict[str, np.ndarray], index: int | None = None) -> dict[str, Any] | None:
    """`{'round', 'quantity'}` of a diverged run (or sweep point `index`), else None."""
    diverged_round = health["diverged_round"] if index is None else health["diverged_round"][index]
    if int(diverged_round) < 0:
        return None
    code = health["quantity"] if index is None else health["quantity"][index]
    return {"round": int(diverged_round), "quantity": QUANTITIES[int(code)]}


# What failed when the personal models made after training (fine-tuning, Per-FedAvg's
# adaptation) are not finite.
AFTER_TRAINING = "the personal models made after training are not finite (NaN or inf)"


def finite_points(models: Any, num_points: int = 1) -> np.ndarray:
    """Whether `models` (leaves `[num_points, ...]`; one point: any shape) are finite, one bool per point."""
    leaves = [jnp.asarray(leaf) for leaf in jax.tree.leaves(models)]
    per_leaf = [
        jnp.all(jnp.isfinite(leaf).reshape(num_points, -1), axis=1)
        for leaf in leaves
        if jnp.issubdtype(leaf.dtype, jnp.floating)
    ]
    if not per_leaf:
        return np.ones(num_points, bool)
    return np.asarray(jnp.all(jnp.stack(per_leaf), axis=0))  # One transfer.
