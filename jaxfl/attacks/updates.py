"""Update attacks: corrupted clients of a cohort send a forged update.

Applied inside the compiled round, after local training and before
aggregation, to the cohort's stacked updates (leaves `[M, ...]`). Notation:
x_i is client i's would-be (honest) update, w_i >= 0 its aggregation weight;
client i *participates* when w_i > 0 (padding and filtered-out clients have
weight 0 and take no part). A = the attacked participants, B = the benign
(not attacked) participants, W_A = sum_{i in A} w_i, W_B = sum_{i in B} w_i,
W = W_A + W_B. Only the rows of A change; every other row is returned bit
for bit. Each attack's formula is in the docstring of its function below.

| name | source | sends |
| --- | --- | --- |
| `random-updates` | Li's thesis (CMU-CS-23-127) Section 5.3.1, A2 | N(0, s_i^2) i.i.d., s_i = std(x_i) |
| `model-replacement` | Li's thesis Section 5.3.1, A3 | `scale` * x_i |
| `sign-flip` | e.g. byzfl (LPD-EPFL) | -`scale` * x_i |
| `gaussian` | e.g. byzfl | N(0, `std`^2) i.i.d. |
| `omniscient` | RFA (Pillutla et al., IEEE TSP 2022) Section 5 | one u: weighted mean = -mean(reference) |
| `alie` | Baruch, Baruch, Goldberg, NeurIPS 2019 | mu_B - z sigma_B |
| `ipm` | Xie, Koyejo, Gupta, UAI 2019 (PMLR 115, 2020) | -`epsilon` * mean_B |

Reference set: the statistics of `omniscient` (reference "benign"), `alie`
and `ipm` are taken over B. When no benign client participates (B empty),
they are taken over A instead (the attackers' own would-be updates, the
estimate of the original ALIE attack), so an attack never divides by zero.

Randomness: client i (its position 0..M-1 in the cohort) draws from
`fold_in(key, i)`, split into one key per leaf of the update, so a client's
noise does not depend on which other clients are attacked. Pass a key that
changes every round (e.g. `fold_in` of the round's server key).

Non-finite values: the attacks create no NaN or inf from finite inputs
(zero-std updates, identical benign updates, zero benign weight, a majority
of attackers included; overflow of huge values aside). A non-finite entry of
an attacked client's own update propagates into its forged row
(`random-updates`, `model-replacement`, `sign-flip`, and `omniscient` with
reference "all"). A non-finite entry of a benign participant propagates
into the forged rows of the attacks that read B (`omniscient`, `alie`,
`ipm`), as it would into the honest mean. Non-participants are masked with
`where`, never multiplied by 0, so their values never propagate. Weights
must be finite; a NaN weight counts as weight 0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import ndtri

from jaxfl.attacks.data import DATA_ATTACKS
from jaxfl.types import Key, PyTree

UPDATE_ATTACKS = ("random-updates", "model-replacement", "sign-flip", "gaussian", "omniscient", "alie", "ipm")

# Defaults of each update attack's options (None: computed in the round, see the functions).
_DEFAULTS: dict[str, dict[str, Any]] = {
    "random-updates": {},
    "model-replacement": {"scale": None},
    "sign-flip": {"scale": 1.0},
    "gaussian": {"std": 1.0},
    "omniscient": {"reference": "benign"},
    "alie": {"z": None},
    "ipm": {"epsilon": 0.1},
}

OMNISCIENT_REFERENCES = ("benign", "all")


def _check_number(attack: str, name: str, value, *, positive: bool = False, nonnegative: bool = False):
    """Validates a concrete numeric option (traced values, e.g. under vmap, pass unchecked)."""
    try:
        array = np.asarray(value)
    except jax.errors.TracerArrayConversionError:
        return
    if array.shape != () or array.dtype.kind not in "iuf":
        raise ValueError(f"{attack} option {name} must be a real scalar, got {value!r}")
    number = float(array)
    if not np.isfinite(number):
        raise ValueError(f"{attack} option {name} must be finite, got {number}")
    if positive and not number > 0:
        raise ValueError(f"{attack} option {name} must be > 0, got {number}")
    if nonnegative and not number >= 0:
        raise ValueError(f"{attack} option {name} must be >= 0, got {number}")


def _resolve(attack: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The attack's options, defaults filled in, validated."""
    if attack not in UPDATE_ATTACKS:
        if attack in DATA_ATTACKS:
            raise ValueError(f"{attack!r} is a data attack: apply it with poison_features, not to updates")
        raise ValueError(f"unknown update attack {attack!r}; update attacks are {UPDATE_ATTACKS}")
    options = {} if options is None else options
    if not isinstance(options, Mapping):
        raise ValueError(f"options must be a mapping, got {type(options).__name__}")
    defaults = _DEFAULTS[attack]
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        takes = ", ".join(defaults) or "no options"
        raise ValueError(f"unknown option(s) {unknown} for attack {attack!r}; it takes: {takes}")
    resolved = {**defaults, **options}
    if attack in ("model-replacement", "sign-flip") and resolved["scale"] is not None:
        _check_number(attack, "scale", resolved["scale"], positive=True)
    elif attack == "gaussian":
        _check_number(attack, "std", resolved["std"], nonnegative=True)
    elif attack == "omniscient" and resolved["reference"] not in OMNISCIENT_REFERENCES:
        raise ValueError(
            f"omniscient option reference must be one of {OMNISCIENT_REFERENCES}, "
            f"got {resolved['reference']!r}"
        )
    elif attack == "alie" and resolved["z"] is not None:
        _check_number(attack, "z", resolved["z"])
    elif attack == "ipm":
        _check_number(attack, "epsilon", resolved["epsilon"], positive=True)
    return resolved


def _rows(mask: jax.Array, x: jax.Array) -> jax.Array:
    """`[M]` mask reshaped to broadcast against `x` `[M, ...]`."""
    return mask.reshape(mask.shape + (1,) * (x.ndim - 1))


def _compute_dtype(x: jax.Array):
    return jnp.promote_types(x.dtype, jnp.float32)


def _masked_sum(mask: jax.Array, x: jax.Array, weights: jax.Array | None = None) -> jax.Array:
    """sum_{i: mask_i} (w_i) x_i over the leading axis; rows outside the mask never enter (no 0 * NaN)."""
    x = x.astype(_compute_dtype(x))
    if weights is not None:
        x = _rows(weights.astype(x.dtype), x) * x
    return jnp.sum(jnp.where(_rows(mask, x), x, 0), axis=0)


def _safe(total: jax.Array) -> jax.Array:
    """`total`, or 1 where it is 0 (the quotient is then unused or of an empty sum)."""
    return jnp.where(total > 0, total, 1)


def _per_client_normal(key: Key, leaves: list[jax.Array]) -> list[jax.Array]:
    """Standard normal noise shaped like `leaves`; row i from `split(fold_in(key, i), L)`."""
    num_clients = leaves[0].shape[0]
    client_keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(num_clients))
    leaf_keys = jax.vmap(lambda k: jax.random.split(k, len(leaves)))(client_keys)  # [M, L]
    return [
        jax.vmap(lambda k, x=x: jax.random.normal(k, x.shape[1:], _compute_dtype(x)))(leaf_keys[:, j])
        for j, x in enumerate(leaves)
    ]


class _AttackMasks:
    """The masks and weights every attack reads."""

    def __init__(self, attacked: jax.Array, weights: jax.Array):
        self.participates = weights > 0
        dtype = jnp.promote_types(weights.dtype, jnp.float32)
        self.weights = jnp.where(self.participates, weights, 0).astype(dtype)
        self.changed = attacked & self.participates  # A
        self.benign = ~attacked & self.participates  # B
        self.any_benign = jnp.any(self.benign)
        # The reference set of the statistics: B, or A when B is empty.
        self.reference = jnp.where(self.any_benign, self.benign, self.changed)


def _random_updates(leaves, cohort: _AttackMasks, key: Key, options) -> list[jax.Array]:
    """Thesis A2: x_i <- s_i * g_i, g_i ~ N(0, I) i.i.d., s_i = std(x_i).

    s_i = sqrt(mean_k (x_ik - mean_k x_ik)^2) is the population standard
    deviation of all the entries k of client i's flattened would-be update
    (every leaf together), as the authors' `get_stdev` (`np.std` of the
    flattened update; `litian96/ditto : flearn/utils/tf_utils.py`). Li's
    thesis Section 5.3.1: "malicious devices send random zero-mean Gaussian
    parameters". A zero update (s_i = 0) sends zeros.
    """
    del cohort, options  # Unused: rows are selected by the caller.
    size = sum(int(np.prod(x.shape[1:])) for x in leaves)
    flat = [x.astype(_compute_dtype(x)).reshape(x.shape[0], -1) for x in leaves]
    mean = sum(jnp.sum(f, axis=1) for f in flat) / max(size, 1)
    var = sum(jnp.sum(jnp.square(f - mean[:, None]), axis=1) for f in flat) / max(size, 1)
    std = jnp.sqrt(var)
    return [g * _rows(std.astype(g.dtype), g) for g in _per_client_normal(key, leaves)]


def _model_replacement(leaves, cohort: _AttackMasks, key: Key, options) -> list[jax.Array]:
    """Thesis A3: x_i <- scale * x_i, scale defaulting to the cohort size M.

    Li's thesis Section 5.3.1: malicious devices "scale their adversarial
    updates to make them dominate the aggregate updates"; the authors' code
    multiplies by `clients_per_round` (`litian96/ditto :
    flearn/trainers_global/fedavg.py`, `boosting`), so that under plain
    averaging one attacker's update replaces the whole aggregate. M is the
    static cohort size (the leading axis), padding slots included.
    """
    del cohort, key  # Unused.
    scale = options["scale"]
    scale = leaves[0].shape[0] if scale is None else scale
    return [x.astype(_compute_dtype(x)) * jnp.asarray(scale, _compute_dtype(x)) for x in leaves]


def _sign_flip(leaves, cohort: _AttackMasks, key: Key, options) -> list[jax.Array]:
    """x_i <- -scale * x_i (sign flipping; `scale` = 1 by default, the plain reversal)."""
    del cohort, key  # Unused.
    return [-(x.astype(_compute_dtype(x)) * jnp.asarray(options["scale"], _compute_dtype(x))) for x in leaves]


def _gaussian(leaves, cohort: _AttackMasks, key: Key, options) -> list[jax.Array]:
    """x_i <- std * g_i, g_i ~ N(0, I) i.i.d. (`std` = 1 by default, byzfl's Gaussian attack)."""
    del cohort  # Unused.
    return [g * jnp.asarray(options["std"], g.dtype) for g in _per_client_normal(key, leaves)]


def _omniscient(leaves, cohort: _AttackMasks, key: Key, options) -> list[jax.Array]:
    """RFA's omniscient attack: every i in A sends the same u = (W T - S_B) / W_A.

    u solves (sum_{b in B} w_b x_b + W_A u) / W = T: the weighted mean of all
    the participants' sent updates is the target T, with S_B = sum_{b in B}
    w_b x_b and T = -(weighted mean of the reference):

    * reference "benign" (default): T = -xbar_B, xbar_B = S_B / W_B, so
      u = -((W + W_B) / W_A) xbar_B: the aggregate is the negated benign mean;
    * reference "all": T = -xbar, xbar = (S_A + S_B) / W the weighted mean of
      all the participants' would-be updates, so u = xbar_A - 2 (W / W_A) xbar,
      with xbar_A = S_A / W_A; this is RFA's code (`krishnap25/RFA :
      models/server.py`, `update_model`): the aggregate is the negation of
      the one the round would have made without attack.

    Pillutla, Kakade, Harchaoui, "Robust Aggregation for Federated
    Learning", IEEE TSP 2022, Section 5: corrupted devices send updates that
    make the weighted mean -wbar. With no benign participant (W_B = 0) both
    references give T = -xbar_A, so u = -xbar_A (the weighted mean of the
    attackers' would-be updates, negated).
    """
    del key  # Unused.
    w_a = jnp.sum(jnp.where(cohort.changed, cohort.weights, 0))
    w_b = jnp.sum(jnp.where(cohort.benign, cohort.weights, 0))
    total = w_a + w_b
    out = []
    for x in leaves:
        s_a = _masked_sum(cohort.changed, x, cohort.weights)
        s_b = _masked_sum(cohort.benign, x, cohort.weights)
        if options["reference"] == "benign":
            # `where`, not arithmetic, so an unused S_A / W_A never propagates a NaN.
            mean = jnp.where(cohort.any_benign, s_b / _safe(w_b), s_a / _safe(w_a))
        else:
            mean = (s_a + s_b) / _safe(total)
        u = (total * -mean - s_b) / _safe(w_a)
        out.append(jnp.broadcast_to(u, (x.shape[0],) + u.shape))
    return out


def alie_z(num_participants: jax.Array, num_attacked: jax.Array) -> jax.Array:
    """ALIE's default z = Phi^{-1}((n - s) / n), s = floor(n/2 + 1) - f.

    Baruch, Baruch, Goldberg, "A Little Is Enough: Circumventing Defenses For
    Distributed Learning", NeurIPS 2019, Section 4 (Algorithm 3): with n
    participants of which f are corrupted, s is the number of benign
    "supporters" the attackers need for a majority, and z the largest shift
    (in standard deviations) that still leaves s benign values beyond it.
    Clamped so that z is always finite: s >= 1 (f > n/2, where the formula
    leaves the range, gives the z of s = 1) and (n - s) / n >= 1/2 (so z >= 0;
    this only binds when no one is attacked, or n = 1).

    Args:
      num_participants: n, int.
      num_attacked: f, int.

    Returns:
      float32 z >= 0.
    """
    n = jnp.asarray(num_participants, jnp.int32)
    f = jnp.asarray(num_attacked, jnp.int32)
    supporters = jnp.maximum(n // 2 + 1 - f, 1)
    quantile = (n - supporters).astype(jnp.float32) / jnp.maximum(n, 1).astype(jnp.float32)
    return ndtri(jnp.maximum(quantile, 0.5))


def _alie(leaves, cohort: _AttackMasks, key: Key, options) -> list[jax.Array]:
    """ALIE: every i in A sends mu - z * sigma (coordinate-wise).

    mu and sigma are the coordinate-wise mean and population standard
    deviation (divisor |B|) of the benign participants' updates,
    *unweighted* (the paper's statistics, and what coordinate-wise
    defenses see), as in the omniscient variant of byzfl. The original
    paper (Baruch et al., NeurIPS 2019, Algorithm 3) estimates them from the
    corrupted workers' own gradients; that is what is used here when no
    benign client participates. z defaults to `alie_z(n, f)` with n the
    participants and f the attacked participants of the round; an explicit
    `z` option (finite, may be traced) replaces it.
    """
    del key  # Unused.
    reference = cohort.reference
    count = jnp.sum(reference)
    if options["z"] is None:
        z = alie_z(jnp.sum(cohort.participates), jnp.sum(cohort.changed))
    else:
        z = options["z"]
    out = []
    for x in leaves:
        dtype = _compute_dtype(x)
        size = _safe(count).astype(dtype)
        mu = _masked_sum(reference, x) / size
        var = _masked_sum(reference, jnp.square(x.astype(dtype) - mu[None])) / size
        value = mu - jnp.asarray(z, dtype) * jnp.sqrt(var)
        out.append(jnp.broadcast_to(value, (x.shape[0],) + value.shape))
    return out


def _ipm(leaves, cohort: _AttackMasks, key: Key, options) -> list[jax.Array]:
    """IPM: every i in A sends -epsilon * xbar_B, xbar_B = S_B / W_B.

    Xie, Koyejo, Gupta, "Fall of Empires: Breaking Byzantine-tolerant SGD
    by Inner Product Manipulation", UAI 2019 (PMLR 115, 2020), Section 4:
    the Byzantine workers send -epsilon times the mean of the correct
    gradients, whose inner product with the true mean is negative. The mean
    here is the weighted mean the server's weighted average estimates (the
    paper's plain mean when the weights are equal). epsilon = 0.1 by
    default: the paper's small-epsilon setting, against median / Krum-type
    defenses, under which the forged updates stay close to the benign ones
    (it also studies large epsilon, e.g. 100, against the mean).
    """
    del key  # Unused.
    w_ref = jnp.sum(jnp.where(cohort.reference, cohort.weights, 0))
    out = []
    for x in leaves:
        mean = _masked_sum(cohort.reference, x, cohort.weights) / _safe(w_ref)
        value = -jnp.asarray(options["epsilon"], mean.dtype) * mean
        out.append(jnp.broadcast_to(value, (x.shape[0],) + value.shape))
    return out


_ATTACKS: dict[str, Callable] = {
    "random-updates": _random_updates,
    "model-replacement": _model_replacement,
    "sign-flip": _sign_flip,
    "gaussian": _gaussian,
    "omniscient": _omniscient,
    "alie": _alie,
    "ipm": _ipm,
}


def attack_updates(
    attack: str,
    updates: PyTree,
    attacked: jax.Array,
    weights: jax.Array,
    key: Key,
    *,
    options: Mapping[str, Any] | None = None,
) -> PyTree:
    """The cohort's updates with the attacked participants' rows forged.

    Row i changes iff `attacked[i]` and `weights[i] > 0`; it becomes the
    attack's forged update (cast to the leaf's dtype). Every other row is
    returned bit for bit. Per attack (x_i the would-be update, B the benign
    participants; see the module docstring and each function):

    * `random-updates`: N(0, std(x_i)^2) i.i.d. (thesis A2);
    * `model-replacement`: scale * x_i, scale = M by default (thesis A3);
    * `sign-flip`: -scale * x_i, scale = 1;
    * `gaussian`: N(0, std^2) i.i.d., std = 1;
    * `omniscient`: u with weighted mean of all participants = -mean(reference);
    * `alie`: mu_B - z sigma_B, z = Phi^{-1}((n - s)/n), s = floor(n/2 + 1) - f;
    * `ipm`: -epsilon * xbar_B, epsilon = 0.1.

    Pure `jnp`: jit with `attack` static; vmaps over a leading sweep axis of
    every argument, numeric options included.

    Args:
      attack: one of `UPDATE_ATTACKS`.
      updates: per-client updates, float leaves `[M, ...]`.
      attacked: `[M]` bool, the cohort's corrupted clients.
      weights: `[M]` float aggregation weights (>= 0, finite).
      key: PRNG key of this round's attack (the random attacks use it).
      options: the attack's options (`attack_options(attack)` lists them
        with their defaults); numeric ones may be traced.

    Returns:
      The updates, the same pytree structure, shapes and dtypes.

    Raises:
      ValueError: an unknown attack or option, a bad option value, or
        masks / leaves whose leading axes differ.
    """
    resolved = _resolve(attack, options)
    leaves, treedef = jax.tree.flatten(updates)
    if not leaves:
        return updates
    num_clients = leaves[0].shape[0] if leaves[0].ndim else None
    attacked = jnp.asarray(attacked)
    weights = jnp.asarray(weights)
    for x in leaves:
        if x.ndim == 0 or x.shape[0] != num_clients or not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(
                "updates must be float leaves [M, ...] with one M, got "
                f"{[(x.dtype, x.shape) for x in leaves]}"
            )
    if attacked.shape != (num_clients,) or attacked.dtype != jnp.bool_:
        raise ValueError(f"attacked must be bool [{num_clients}], got {attacked.dtype} {attacked.shape}")
    if weights.shape != (num_clients,) or not jnp.issubdtype(weights.dtype, jnp.number):
        raise ValueError(f"weights must be real [{num_clients}], got {weights.dtype} {weights.shape}")
    cohort = _AttackMasks(attacked, weights)
    forged = _ATTACKS[attack](leaves, cohort, key, resolved)
    out = [
        jnp.where(_rows(cohort.changed, x), new.astype(x.dtype), x)
        for x, new in zip(leaves, forged, strict=True)
    ]
    return jax.tree.unflatten(treedef, out)

