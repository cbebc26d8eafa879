"""Tilted empirical risk minimization (TERM) as optax transformations of per-example gradients.

`tilted_erm(t)` turns per-example gradients g_x (leaves with a leading batch
axis, e.g. `jax.vmap(jax.grad(loss), (None, 0))(params, batch)`) and their
losses f_x into the gradient of the tilted risk, sum_x w_x g_x; chain it with
any optimizer, `optax.chain(tilted_erm(-2.0), optax.sgd(0.01))`, and call
`update(per_example_grads, state, params, losses=f)`. The four solvers of
Li 2023, Chapter 7:

* Algorithm 13 (batch): w = softmax(t f) over the whole data set;
* Algorithm 14 (stochastic, `normalizer_decay=lam`): the batch's tilted risk
  folded into a running normalizer R <- (1/t) log((1 - lam) e^{t R} +
  lam e^{t R_B}) (kept in log space), w_x = e^{t (f_x - R)} / |B|;
* Algorithm 15 (batch hierarchical, `tau=`, `groups=` at update): the
  weights of `jaxfl.primitives.hierarchical_tilted_weights`;
* Algorithm 16 (stochastic hierarchical, `tau=`, `num_groups=`,
  `normalizer_decay=`, `group=` at update): a running tau-tilted risk per
  group, w_x = e^{tau (f_x - R_g)} / |B| on a batch from group g, drawn with
  `sample_group` (P(g) proportional to |g| e^{t R_g}).

The tilt may be a schedule of the step (`optax.linear_schedule(0.0, -2.0,
n)`: the continuation from 0 that negative tilts need, Li 2023, Section 7.5).

References:
  [Li 2023] T. Li. Scalable and Trustworthy Learning in Heterogeneous Networks.
    PhD thesis, Carnegie Mellon University, 2023 (Chapter 7: Algorithms
    13-16, eq. 7.2, Lemmas 26 and 31).
  [TERM] T. Li, A. Beirami, M. Sanjabi, V. Smith. Tilted Empirical Risk
    Minimization. ICLR 2021.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxfl.primitives.risk import hierarchical_tilted_weights
from jaxfl.primitives.tail import tilted_risk, tilted_risk_weights
from jaxfl.types import Key, PyTree

Tilt = float | Callable[[jax.Array], jax.Array]


class TiltedState(NamedTuple):
    """The step count (for a tilt schedule) and the running normalizers (Algorithms 14 and 16).

    Attributes:
      count: int32 steps taken.
      risk: the running tilted risk R (Algorithm 14: a scalar; 16: one per
        group, tau-tilted); unused by the batch solvers.
      seen: whether R holds an estimate yet (the first batch sets it).
    """

    count: jax.Array
    risk: jax.Array
    seen: jax.Array


def _weighted_sum(weights: jax.Array, per_example: PyTree) -> PyTree:
    return jax.tree.map(lambda g: jnp.tensordot(weights.astype(g.dtype), g, axes=1), per_example)


def _running(risk: jax.Array, batch_risk: jax.Array, tilt: jax.Array, decay: float, seen: jax.Array):
    """(1/tilt) log((1 - decay) e^{tilt risk} + decay e^{tilt batch_risk}) in log space (tilt 0: the mean)."""
    log_mix = jnp.logaddexp(jnp.log1p(-decay) + tilt * risk, jnp.log(decay) + tilt * batch_risk)
    safe = jnp.where(tilt == 0, 1.0, tilt)
    mixed = jnp.where(tilt == 0, (1 - decay) * risk + decay * batch_risk, log_mix / safe)
    return jnp.where(seen, mixed, batch_risk)


def tilted_erm(
    t: Tilt,
    *,
    tau: Tilt | None = None,
    normalizer_decay: float | None = None,
    num_groups: int | None = None,
    initial_risk: float | None = None,
) -> optax.GradientTransformationExtraArgs:
    r"""The gradient of the (hierarchical) tilted risk from per-example gradients (Li 2023, Algs 13-16).

    Args:
      t: the tilt (Python number or a schedule of the step count). t > 0
        emphasizes high losses, t < 0 suppresses them, t = 0 is the mean.
      tau: the within-group tilt of hierarchical TERM (None: not
        hierarchical).
      normalizer_decay: lambda in (0, 1) of the stochastic solvers' running
        normalizer (None: the batch solvers, which see all the data at each
        step).
      num_groups: G, the number of groups (hierarchical solvers).
      initial_risk: Algorithm 14's starting normalizer, the tilted risk of
        the whole data set at the initial model as the thesis starts it
        (None: the first batch's). Algorithm 16 starts every group's at 0,
        as the thesis does.

    Returns:
      An optax transformation whose `update(per_example_grads, state,
      params=None, *, losses, groups=None, group=None)` returns the tilted
      gradient (leaves without the batch axis). `groups` ([B] ids) is the
      batch hierarchical solver's, `group` (the batch's group id) the
      stochastic hierarchical one's.

    Raises:
      ValueError: a decay outside (0, 1), or tau without num_groups.
    """
    if normalizer_decay is not None and not 0 < normalizer_decay < 1:
        raise ValueError(f"normalizer_decay must be in (0, 1), got {normalizer_decay!r}")
    hierarchical, stochastic = tau is not None, normalizer_decay is not None
    if hierarchical and (num_groups is None or num_groups < 1):
        raise ValueError("hierarchical tilting (tau given) needs num_groups >= 1, the number of groups")

    def at(tilt: Tilt, count: jax.Array) -> jax.Array:
        return jnp.asarray(tilt(count) if callable(tilt) else tilt, jnp.float32)

    def init(params: PyTree) -> TiltedState:
        del params  # Unused.
        if hierarchical and stochastic:
            zeros = jnp.zeros(num_groups, jnp.float32)
            return TiltedState(jnp.zeros((), jnp.int32), zeros, jnp.ones(num_groups, bool))
        risk = jnp.asarray(0.0 if initial_risk is None else initial_risk, jnp.float32)
        return TiltedState(jnp.zeros((), jnp.int32), risk, jnp.asarray(initial_risk is not None))

    def update(per_example_grads, state: TiltedState, params=None, *, losses, groups=None, group=None, **_):
        del params  # Unused.
        losses = jnp.asarray(losses, jnp.float32)
        tilt = at(t, state.count)
        risk, seen = state.risk, state.seen
        if not hierarchical and not stochastic:  # Algorithm 13.
            weights = tilted_risk_weights(losses, tilt)
        elif not hierarchical:  # Algorithm 14.
            risk = _running(risk, tilted_risk(losses, tilt), tilt, normalizer_decay, seen)
            seen = jnp.asarray(True)
            weights = jnp.exp(tilt * (losses - risk)) / losses.shape[0]
        elif not stochastic:  # Algorithm 15.
            if groups is None:
                raise ValueError("the batch hierarchical solver needs the examples' groups: groups=ids")
            weights = hierarchical_tilted_weights(losses, groups, num_groups, tilt, at(tau, state.count))
        else:  # Algorithm 16: a batch of one group.
            if group is None:
                raise ValueError("the stochastic hierarchical solver needs the batch's group: group=g")
            inner = at(tau, state.count)
            batch_risk = tilted_risk(losses, inner)
            group_risk = _running(risk[group], batch_risk, inner, normalizer_decay, seen[group])
            risk, seen = risk.at[group].set(group_risk), seen.at[group].set(True)
            weights = jnp.exp(inner * (losses - group_risk)) / losses.shape[0]
        return _weighted_sum(weights, per_example_grads), TiltedState(state.count + 1, risk, seen)

    return optax.GradientTransformationExtraArgs(init, update)


def sample_group(key: Key, state: TiltedState, group_sizes: jax.Array, t: Tilt) -> jax.Array:
    r"""Algorithm 16's group draw: P(g) proportional to |g| e^{t R_g} (Gumbel-max over the logits).

    Args:
      key: the step's key.
      state: the solver's state (its running group risks R_g; 0 before any
        batch of g, as the thesis initializes them).
      group_sizes: [G] examples per group (a group of size 0 is never drawn).
      t: the tilt across groups (or its schedule).

    Returns:
      int32 scalar group id.
    """
    tilt = jnp.asarray(t(state.count) if callable(t) else t, jnp.float32)
    sizes = jnp.asarray(group_sizes, jnp.float32)
    log_sizes = jnp.log(jnp.where(sizes > 0, sizes, 1))
    logits = jnp.where(sizes > 0, log_sizes + tilt * state.risk, -jnp.inf)
    return jax.random.categorical(key, logits).astype(jnp.int32)


def per_example_losses_and_grads(loss: Callable[..., jax.Array], params: PyTree, batch: Any):
    """(`[B]` losses, per-example gradients, leaves `[B, ...]`) of `loss(params, example)` over a batch."""
    return jax.vmap(jax.value_and_grad(loss), in_axes=(None, 0))(params, batch)
