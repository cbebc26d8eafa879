"""Independent NumPy references for jaxfl.attacks: plain loops over clients and examples.

Written from the papers' formulas (and RFA's code for the omniscient update
and the prefix rule), in float64, without reusing any jaxfl code.
"""

import math
import statistics

import numpy as np


def _copy(updates):
    return {name: np.array(leaf, np.float64) for name, leaf in updates.items()}


def _forged(attacked, weights):
    return [i for i in range(len(attacked)) if attacked[i] and weights[i] > 0]


def _benign(attacked, weights):
    return [i for i in range(len(attacked)) if not attacked[i] and weights[i] > 0]


def scaled(updates, attacked, weights, factor):
    """model-replacement (factor = scale) and sign-flip (factor = -scale)."""
    out = _copy(updates)
    for i in _forged(attacked, weights):
        for name in out:
            out[name][i] = factor * np.asarray(updates[name][i], np.float64)
    return out


def omniscient(updates, attacked, weights, reference="benign"):
    """RFA: one u for every attacker; "all" is RFA's code, u = xbar_A - 2 (W / W_A) xbar."""
    out = _copy(updates)
    forged, benign = _forged(attacked, weights), _benign(attacked, weights)
    if not forged:
        return out
    w_a = sum(weights[i] for i in forged)
    w_b = sum(weights[i] for i in benign)
    total = w_a + w_b
    for name, leaf in updates.items():
        leaf = np.asarray(leaf, np.float64)
        s_a = sum(weights[i] * leaf[i] for i in forged)
        s_b = sum(weights[i] * leaf[i] for i in benign) if benign else np.zeros(leaf.shape[1:])
        if reference == "all":
            u = s_a / w_a - 2 * (total / w_a) * (s_a + s_b) / total
        elif benign:
            u = -((total + w_b) / w_a) * (s_b / w_b)
        else:
            u = -s_a / w_a
        for i in forged:
            out[name][i] = u
    return out


def alie_z(n, f):
    """Baruch et al. 2019: s = floor(n/2 + 1) - f, z = Phi^{-1}((n - s)/n), with jaxfl's clamps."""
    s = max(math.floor(n / 2 + 1) - f, 1)
    p = max((n - s) / max(n, 1), 0.5)
    return statistics.NormalDist().inv_cdf(p)


def alie(updates, attacked, weights, z=None):
    out = _copy(updates)
    forged, benign = _forged(attacked, weights), _benign(attacked, weights)
    if not forged:
        return out
    reference = benign or forged
    if z is None:
        z = alie_z(len(forged) + len(benign), len(forged))
    for name, leaf in updates.items():
        leaf = np.asarray(leaf, np.float64)
        mu = sum(leaf[i] for i in reference) / len(reference)
        var = sum((leaf[i] - mu) ** 2 for i in reference) / len(reference)
        for i in forged:
            out[name][i] = mu - z * np.sqrt(var)
    return out


def ipm(updates, attacked, weights, epsilon=0.1):
    out = _copy(updates)
    forged, benign = _forged(attacked, weights), _benign(attacked, weights)
    if not forged:
        return out
    reference = benign or forged
    total = sum(weights[i] for i in reference)
    for name, leaf in updates.items():
        leaf = np.asarray(leaf, np.float64)
        mean = sum(weights[i] * leaf[i] for i in reference) / total
        for i in forged:
            out[name][i] = -epsilon * mean
    return out


def client_std(updates, i):
    """get_stdev of the thesis code: np.std of client i's flattened update."""
    flat = np.concatenate([np.asarray(leaf[i], np.float64).ravel() for leaf in updates.values()])
    return float(np.std(flat))


def prefix_until_fraction(order, counts, fraction):
    """RFA's apply_corruption_all: shuffled users, a prefix until the fraction is reached."""
    target = fraction * sum(int(c) for c in counts)
    corrupted = np.zeros(len(counts), bool)
    held, end = 0, 0
    while held < target:
        held += int(counts[order[end]])
        corrupted[order[end]] = True
        end += 1
    return corrupted


def relabel(labels, attack, num_classes, pad_id=None):
    """label-flip and label-shift-7 on the C (or C - 1 real) classes, one label at a time."""
    real_ids = [c for c in range(num_classes) if c != pad_id]
    out = np.array(labels, copy=True)
    for index in np.ndindex(out.shape):
        y = int(out[index])
        if y == pad_id:
            continue
        rank = real_ids.index(y)
        if attack == "label-flip":
            new_rank = len(real_ids) - 1 - rank
        else:
            new_rank = (7 * rank + 1) % len(real_ids)
        out[index] = real_ids[new_rank]
    return out
