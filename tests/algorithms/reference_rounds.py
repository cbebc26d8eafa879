"""A slow NumPy reference of the round template, and helpers shared by the
algorithm tests.

`reference_rounds` runs rounds one client at a time in NumPy float64 with the
hand-written softmax-regression gradients of `tests/reference.py`. Only the
random choices come from the engine, through its public functions: the
cohort (`sample_cohort`), each client's example orders (`epoch_orders` with
`fold_in(round keys.clients, client_id)`), and the plan key
`split(round keys.server)[0]` that algorithms draw their own choices from
(stragglers, sub-cohorts, DP noise). What an algorithm does with them is
supplied as two plain-Python functions, `plan` and `aggregate`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from reference import (
    client_loss_reference,
    local_sgd_reference,
    softmax_regression_grad,
    tilted_risk_reference,
    tiny_population,
)

from jaxfl.algorithms.base import place_state
from jaxfl.models import make_model
from jaxfl.training import LocalTraining, Task
from jaxfl.training.cohort import round_keys, sample_cohort
from jaxfl.training.local import epoch_orders

# The engine's own random choices, jitted once here (called op by op, their
# loops would be traced and compiled again at every call).
_sample_cohort = jax.jit(sample_cohort, static_argnums=2)
_epoch_orders = jax.jit(epoch_orders, static_argnums=(2, 3))

# Distinct sizes, so that client losses are distinct (no ties) in practice.
SIZES = [7, 23, 10, 2, 31, 12, 5, 18]
POPULATION = tiny_population(SIZES, seed=4)
TASK = Task(make_model("linear", (5,), 3))
LOCAL = LocalTraining(batch_size=4, num_epochs=2)


def initial_params(scale: float = 0.5):
    """A fixed random starting model, so that client losses differ (no ties)."""
    params = TASK.model.init(jax.random.key(0))
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(42), len(leaves))
    return jax.tree.unflatten(
        treedef,
        [
            scale * jax.random.normal(k, x.shape, x.dtype)
            for k, x in zip(keys, leaves, strict=True)
        ],
    )


# Jitted rounds by algorithm, with their trace counts: every test that runs
# an algorithm reuses one compiled round, and "traced once" is checked over
# all of a test process's uses of it.
_COMPILED = {}


def run_rounds(algorithm, state, num_rounds, key, population=POPULATION, strategy=None):
    """Runs the jitted round like the runner (state donated, and replicated
    with `strategy` when given) and checks that the algorithm's round has
    been traced exactly once in this process.

    Returns the final state and the per-round metrics (NumPy).
    """
    cache_key = (id(algorithm), id(population))
    if cache_key not in _COMPILED:
        traces = []

        def counted(state, population, key):
            traces.append(1)  # Runs at trace time only.
            return algorithm.round(state, population, key)

        _COMPILED[cache_key] = (
            (algorithm, population),  # Keeps the ids valid.
            jax.jit(counted, donate_argnums=0),
            traces,
            population if strategy is None else strategy.replicate(population),
        )
    _, round_fn, traces, placed_population = _COMPILED[cache_key]
    # The state is donated: copy it, so the caller's arrays stay usable.
    state = jax.tree.map(jnp.copy, state)
    if strategy is not None:
        state = place_state(state, strategy)
    history = []
    for _ in range(num_rounds):
        state, metrics = round_fn(state, placed_population, key)
        history.append(jax.device_get(metrics))
    jax.block_until_ready(state)
    assert len(traces) == 1, f"{algorithm.name}: traced {len(traces)} times"
    return state, history


def plan_key(key, round_index: int):
    """The key the template hands to an algorithm's plan in that round."""
    return jax.random.split(round_keys(key, jnp.int32(round_index)).server)[0]


def assert_params_close(params, kernel, bias, rtol=1e-4, atol=1e-5):
    np.testing.assert_allclose(params["dense"]["kernel"], kernel, rtol=rtol, atol=atol)
    np.testing.assert_allclose(params["dense"]["bias"], bias, rtol=rtol, atol=atol)


def normalized(weights):
    weights = np.asarray(weights, np.float64)
    total = weights.sum()
    return weights / total if total > 0 else np.zeros_like(weights)


def reference_rounds(
    params,
    key,
    num_rounds,
    *,
    clients_per_round,
    lr,
    weighting="num_examples",
    local=LOCAL,
    full_batch=False,
    l2=0.0,
    mu=0.0,
    plan=None,
    aggregate=None,
    compress=None,
    select=None,
    preconditioner=None,
    sample_tilt=0.0,
    example_clip=None,
    population=POPULATION,
):
    """Rounds of the template in NumPy float64, one client at a time.

    Args:
      params: the initial model.
      key: the run key.
      num_rounds: rounds to run.
      clients_per_round: M.
      lr: local learning rate (constant).
      weighting: 'num_examples' or 'uniform' alpha.
      local: batch size and epochs.
      full_batch: one full-batch gradient step per client (FedSGD).
      l2, mu: local l2 and proximal weights.
      plan: `plan(round, ids, alpha, losses, key, memory) -> dict` with
        optional 'active' ([M] bool), 'epochs' ([M] int), 'weights' ([M]);
        `memory` is a dict the reference keeps across rounds.
      aggregate: `aggregate(ids, alpha, losses, deltas, decision, memory) ->
        [M] coefficients c` with w_{t+1} = w_t + sum_k c_k delta_k, where
        deltas are (kernel, bias) pairs; default: the normalized plan
        weights (alpha if none) of the clients that trained.
      compress: `compress(ids, deltas, active, memory) -> deltas`, what the
        server receives in place of the clients' updates, or None.
      select: `select(round, sampling key, memory) -> ids`, the cohort in
        place of `sample_cohort`'s, or None.
      preconditioner: `preconditioner(round, memory) -> (kernel, bias)`
        dividing every local gradient of that round, or None.
      sample_tilt: tau of hierarchical tilting: the clients' `losses` are
        their tau-tilted risks, and local steps descend the minibatch's.
      example_clip: C of DP-SGD's per-example clipping in local steps (no noise), or None.
      population: the clients.

    Returns:
      (kernel, bias, history): the final model and, per round, the ids,
      losses, decision and coefficients.
    """
    kernel = np.array(params["dense"]["kernel"], np.float64)
    bias = np.array(params["dense"]["bias"], np.float64)
    counts = np.asarray(population.counts)
    memory, history = {}, []
    for r in range(num_rounds):
        keys = round_keys(key, jnp.int32(r))
        if select is None:
            ids = np.asarray(_sample_cohort(keys.sampling, population, clients_per_round))
        else:
            ids = np.asarray(select(r, keys.sampling, memory))
        alpha = (
            counts[ids].astype(np.float64)
            if weighting == "num_examples"
            else (np.ones(len(ids)))
        )
        data = [population.client(int(i)) for i in ids]
        losses = np.array(
            [client_loss_reference(kernel, bias, d["x"], d["y"])[0] for d in data]
        )
        if sample_tilt != 0:
            losses = np.array([
                tilted_risk_reference(
                    [client_loss_reference(kernel, bias, d["x"][i : i + 1], d["y"][i : i + 1])[0]
                     for i in range(len(d["y"]))], sample_tilt,
                )[0]
                for d in data
            ])
        decision = (
            {}
            if plan is None
            else plan(r, ids, alpha, losses, plan_key(key, r), memory)
        )
        active = np.asarray(decision.get("active", np.ones(len(ids), bool)))
        epochs = decision.get("epochs", [local.num_epochs] * len(ids))
        divisor = (1.0, 1.0) if preconditioner is None else preconditioner(r, memory)
        deltas = []
        for j, (i, d) in enumerate(zip(ids, data, strict=True)):
            if not active[j]:
                deltas.append((np.zeros_like(kernel), np.zeros_like(bias)))
                continue
            if full_batch:
                g_kernel, g_bias, _ = softmax_regression_grad(
                    kernel, bias, d["x"], d["y"]
                )
                k = (1 - lr * l2) * kernel - lr * g_kernel
                b = (1 - lr * l2) * bias - lr * g_bias
            else:
                orders = _epoch_orders(
                    jax.random.fold_in(keys.clients, int(i)),
                    population.counts[i],
                    population.max_count,
                    local.num_epochs,
                )
                k, b, _ = local_sgd_reference(
                    kernel,
                    bias,
                    d["x"],
                    d["y"],
                    np.asarray(orders),
                    batch_size=local.batch_size,
                    num_epochs=int(epochs[j]),
                    lr=lr,
                    l2=l2,
                    mu=mu,
                    preconditioner=divisor,
                    sample_tilt=sample_tilt,
                    example_clip=example_clip,
                )
            deltas.append((k - kernel, b - bias))
        if compress is not None:
            deltas = compress(ids, deltas, active, memory)
        if aggregate is None:
            weights = np.asarray(decision.get("weights", alpha), np.float64)
            coefficients = normalized(np.where(active, weights, 0.0))
        else:
            coefficients = np.asarray(
                aggregate(ids, alpha, losses, deltas, decision, memory)
            )
        kernel = kernel + sum(
            c * d[0] for c, d in zip(coefficients, deltas, strict=True)
        )
        bias = bias + sum(c * d[1] for c, d in zip(coefficients, deltas, strict=True))
        history.append(
            {
                **decision,
                "ids": ids,
                "losses": losses,
                "coefficients": coefficients,
                "active": active,
            }
        )
    return kernel, bias, history


def fedavg_reference(params, key, num_rounds, **kwargs):
    """Plain FedAvg by the reference (alpha-weighted mean of updates)."""
    kernel, bias, _ = reference_rounds(params, key, num_rounds, **kwargs)
    return kernel, bias


def proximal_steps_reference(kernel, bias, data, orders, anchor_kernel, anchor_bias, lam, lr, local=LOCAL):
    """A personal model's local SGD by hand: v <- v - lr (grad F_k(v) + lam (v - anchor)).

    Over the minibatches of `orders` (`[E, max_count]`, the engine's epoch
    orders), float64; Ditto's and L2SGD's personal steps.
    """
    kernel, bias = np.array(kernel, np.float64), np.array(bias, np.float64)
    count = len(data["y"])
    for epoch in range(local.num_epochs):
        order = orders[epoch][:count]
        for start in range(0, count, local.batch_size):
            rows = order[start : start + local.batch_size]
            x, y = data["x"][rows], data["y"][rows]
            grad_kernel, grad_bias, _ = softmax_regression_grad(kernel, bias, x, y)
            kernel = kernel - lr * (grad_kernel + lam * (kernel - anchor_kernel))
            bias = bias - lr * (grad_bias + lam * (bias - anchor_bias))
    return kernel, bias


def client_orders(keys, client):
    """The epoch orders of `client`'s local training in the round of `keys`."""
    return np.asarray(
        _epoch_orders(
            jax.random.fold_in(keys.clients, int(client)),
            POPULATION.counts[client],
            POPULATION.max_count,
            LOCAL.num_epochs,
        )
    )
