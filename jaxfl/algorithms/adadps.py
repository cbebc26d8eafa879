"""AdaDPS in federated learning (Li 2023, Algorithm 10): DP-FedAvg with preconditioned clients.

One round, as DP-FedAvg (`jaxfl.algorithms.dp_fedavg`) but for the local step:

1. sample m of the n training clients uniformly without replacement;
2. each runs local SGD from w_t with every gradient divided, coordinate by
   coordinate, by the side information A: w <- w - lr grad F_i(w) / A (an
   l2 term's decay (1 - lr lambda) w is not divided); then clips its update
   to l2 norm C;
3. the secure aggregate releases the sum of the clipped updates plus
   N(0, (z 2C)^2 I);
4. the server divides by m and takes its optimizer step (the thesis uses
   SGD with learning rate 1 and momentum 0.9: `--server-optimizer avgm`).

A is *non-sensitive side information* (Li 2023, Section 6.3, option 2):
fixed before training from what is public, such as feature frequencies of a
public corpus (A_j = E|x_j| + eps for the input weights of feature j), never
from the training clients' data. The released quantity is then DP-FedAvg's,
and so is the privacy: the run calibrates and accounts exactly as for
`dp-fedavg` (`jaxfl.privacy.budget.DP_FEDAVG_BUDGET`). With A = 1 it is
DP-FedAvg. A lives in `state.extra` (checkpointed with the run, constant).

On the command line A comes from `--side-information FILE.npz`: one array per
parameter, named by its path as `side_information_names` lists it (for
`linear`: 'dense/bias', 'dense/kernel'), each of the parameter's shape or
broadcastable to it, every entry finite and > 0. Without it A = 1.

References:
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks (thesis), Section 6.4.2 and
    Algorithm 10.
  [Li et al. 2023] T. Li, M. Zaheer, K. Liu, S. J. Reddi, H. B. McMahan, V. Smith. Differentially
    Private Adaptive Optimization with Delayed Preconditioners. ICLR 2023.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Unpack

import jax
import jax.numpy as jnp
import numpy as np

from jaxfl.algorithms import stages
from jaxfl.algorithms.base import FederatedAlgorithm
from jaxfl.algorithms.dp_fedavg import private_averaging, private_round_options
from jaxfl.algorithms.registry import Engine
from jaxfl.training.local import LocalTraining, Task
from jaxfl.types import Params


def side_information_names(params: Params) -> list[str]:
    """The names of the parameters' leaves as a side-information file keys them ('dense/kernel')."""
    return [_leaf_name(path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]


def _leaf_name(path) -> str:
    return jax.tree_util.keystr(path, simple=True, separator="/")


def side_information_tree(params: Params, side_information: Mapping[str, np.ndarray] | Params) -> Params:
    """A, a tree like `params` (float32), from a tree like it or from arrays keyed by leaf name.

    A flat mapping (no value is itself a mapping) is read by leaf name; anything
    else must have the parameters' tree structure.

    Raises:
      ValueError: names missing or unknown, another tree structure, a shape
        that does not broadcast to its parameter's, or an entry not finite
        and > 0.
    """
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    names = [_leaf_name(path) for path, _ in leaves]
    if isinstance(side_information, Mapping) and not any(
        isinstance(value, Mapping) for value in side_information.values()
    ):
        missing = [name for name in names if name not in side_information]
        unknown = sorted(set(side_information) - set(names))
        if missing or unknown:
            wrong = [f"missing {', '.join(missing)}"] if missing else []
            wrong += [f"unknown {', '.join(unknown)}"] if unknown else []
            raise ValueError(
                f"side information must name each parameter once: {'; '.join(wrong)} "
                f"(the model's: {', '.join(names)})"
            )
        values = [side_information[name] for name in names]
    else:
        values, given = jax.tree.flatten(side_information)
        if given != treedef:
            raise ValueError(f"side information is not a tree like the parameters ({', '.join(names)})")
    out = []
    for name, (_, leaf), value in zip(names, leaves, values, strict=True):
        value = np.asarray(value, np.float32)
        try:
            value = np.broadcast_to(value, leaf.shape)
        except ValueError:
            raise ValueError(
                f"side information {name!r} has shape {value.shape}, not broadcastable to {leaf.shape}"
            ) from None
        if not np.all(np.isfinite(value) & (value > 0)):
            raise ValueError(f"side information {name!r} must be finite and > 0 everywhere")
        out.append(jnp.asarray(value))
    return jax.tree.unflatten(treedef, out)


def load_side_information(path: str) -> dict[str, np.ndarray]:
    """The arrays of an .npz file by name. Raises ValueError if it cannot be read."""
    try:
        with np.load(path, allow_pickle=False) as arrays:
            return {name: arrays[name] for name in arrays.files}
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot read side information {path!r}: {error}") from None


def adadps(
    task: Task,
    local: LocalTraining,
    clients_per_round: int,
    *,
    side_information: str | Mapping[str, np.ndarray] | Params | None = None,
    **options: Unpack[stages.RoundOptions],
) -> FederatedAlgorithm:
    """AdaDPS-FL (see the module docstring).

    Args:
      task, local, clients_per_round, **options: as `jaxfl.algorithms.stages.compose_round` takes them,
        client weighting left out: every client counts equally, as in DP-FedAvg.
      side_information: A: a tree like the parameters, arrays keyed by leaf
        name, the path of an .npz file of them, or None (A = 1: DP-FedAvg).

    Returns:
      The `FederatedAlgorithm`.

    Raises:
      ValueError: side information that does not fit the model (see `side_information_tree`).
    """
    if side_information is None:
        return private_averaging("adadps", task, local, clients_per_round, **options)
    if isinstance(side_information, str):
        side_information = load_side_information(side_information)
    divisor = side_information_tree(jax.eval_shape(task.model.init, jax.random.key(0)), side_information)
    return private_averaging(
        "adadps", task, local, clients_per_round,
        preconditioner=lambda state: state.extra,
        init=lambda params: jax.tree.map(jnp.copy, divisor),  # A copy per state: states are donated.
        **options,
    )

def from_engine(engine: Engine, options: Mapping[str, Any]) -> FederatedAlgorithm:
    """AdaDPS-FL as the registry builds it for a run (uniform weights, as DP-FedAvg)."""
    return adadps(
        engine.task, engine.local, engine.clients_per_round,
        side_information=options["side_information"], **private_round_options(engine),
    )
