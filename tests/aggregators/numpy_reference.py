"""Slow, independent NumPy references of the aggregators (float64, Python loops over clients).

Each reference takes the updates as a dict of arrays `[M, ...]`, the weights
`[M]`, the state and the losses, exactly like `Aggregator.aggregate`, and
returns `(update, new_state, metrics)` with the update as a dict of float64
arrays. Nothing here calls JAX: every client is a flat float64 vector, the
rules are written from their definitions (docs/aggregators.md), with exact
rational cumulative weights for the weighted median, direct pairwise
distances for Krum (no Gram matrix), `np.median` for the clipping threshold
and a plain Weiszfeld loop for the geometric median.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

FLOAT32_MAX = float(np.finfo(np.float32).max)


def _keys(updates):
    return sorted(updates)


def client_vector(updates, i):
    """Client i's update as one flat float64 vector (leaves in sorted key order)."""
    return np.concatenate([np.asarray(updates[k][i], np.float64).ravel() for k in _keys(updates)])


def unflatten(vector, updates):
    """A flat vector back into a dict shaped like one client's update."""
    out, start = {}, 0
    for k in _keys(updates):
        shape = np.shape(updates[k])[1:]
        size = math.prod(shape)
        out[k] = np.asarray(vector[start : start + size], np.float64).reshape(shape)
        start += size
    return out


def participants(updates, weights, losses=None):
    """(participating client indices, their vectors, number dropped as non-finite).

    A client with weight > 0 is dropped when an entry is NaN or inf, when its
    squared norm exceeds the float32 range, or (k-loss) when its loss is not
    finite.
    """
    kept, vectors, dropped = [], {}, 0
    for i in range(len(weights)):
        if not weights[i] > 0:
            continue
        v = client_vector(updates, i)
        finite = bool(np.all(np.isfinite(v))) and float(np.sum(v * v)) <= FLOAT32_MAX
        if losses is not None:
            finite = finite and bool(np.isfinite(losses[i]))
        if finite:
            kept.append(i)
            vectors[i] = v
        else:
            dropped += 1
    return kept, vectors, dropped


def _size(updates):
    return sum(math.prod(np.shape(updates[k])[1:]) for k in _keys(updates))


def _weighted_mean(vectors, weights, clients, size):
    total = sum(float(weights[i]) for i in clients)
    if total == 0:
        return np.zeros(size)
    acc = np.zeros(size)
    for i in clients:
        acc += float(weights[i]) * vectors[i]
    return acc / total


def _metrics(aggregated, dropped, **extra):
    out = {"aggregated_clients": aggregated, "dropped_nonfinite": dropped}
    out.update(extra)
    return out


def mean(updates, weights, state, losses=None):
    size = _size(updates)
    total = float(np.sum(np.asarray(weights, np.float64)))
    acc = np.zeros(size)
    for i in range(len(weights)):  # every client, so 0 * NaN propagates
        acc += float(weights[i]) * client_vector(updates, i)
    update = acc / total if total > 0 else np.zeros(size)
    return unflatten(update, updates), state, _metrics(int(np.sum(np.asarray(weights) > 0)), 0)


def median(updates, weights, state, losses=None):
    kept, vectors, dropped = participants(updates, weights)
    size = _size(updates)
    out = np.zeros(size)
    if kept:
        total = sum(Fraction(float(weights[i])) for i in kept)
        for c in range(size):
            column = sorted((vectors[i][c], i) for i in kept)
            cumulative, lower, upper = Fraction(0), None, None
            for value, i in column:
                cumulative += Fraction(float(weights[i]))
                if lower is None and 2 * cumulative >= total:
                    lower = value
                if upper is None and 2 * cumulative > total:
                    upper = value
            out[c] = (lower + upper) / 2
    return unflatten(out, updates), state, _metrics(len(kept), dropped)


def trimmed_mean(beta):
    def reference(updates, weights, state, losses=None):
        kept, vectors, dropped = participants(updates, weights)
        size = _size(updates)
        n = len(kept)
        trim = int(math.floor(beta * n))
        out = np.zeros(size)
        if kept:
            for c in range(size):
                column = sorted((vectors[i][c], i) for i in kept)[trim : n - trim]
                total = sum(float(weights[i]) for _, i in column)
                out[c] = sum(float(weights[i]) * value for value, i in column) / total
        return unflatten(out, updates), state, _metrics(n - 2 * trim, dropped)

    return reference


def krum_scores(kept, vectors, byzantine):
    """{client: score}: sum of the squared distances to its nearest participants."""
    n = len(kept)
    neighbours = min(max(n - byzantine - 2, 1), n - 1)
    scores = {}
    for j in kept:
        distances = sorted(float(np.sum((vectors[j] - vectors[i]) ** 2)) for i in kept if i != j)
        scores[j] = sum(distances[:neighbours])
    return scores


def krum(byzantine):
    def reference(updates, weights, state, losses=None):
        kept, vectors, dropped = participants(updates, weights)
        if not kept:
            return unflatten(np.zeros(_size(updates)), updates), state, _metrics(0, dropped)
        scores = krum_scores(kept, vectors, byzantine)
        best = min(kept, key=lambda j: (scores[j], j))
        return unflatten(vectors[best], updates), state, _metrics(1, dropped)

    return reference


def multi_krum(byzantine, selected):
    def reference(updates, weights, state, losses=None):
        kept, vectors, dropped = participants(updates, weights)
        n = len(kept)
        scores = krum_scores(kept, vectors, byzantine)
        target = n - byzantine if selected == 0 else selected
        count = min(max(target, 1), n)
        chosen = sorted(kept, key=lambda j: (scores[j], j))[:count]
        update = _weighted_mean(vectors, weights, chosen, _size(updates))
        return unflatten(update, updates), state, _metrics(len(chosen), dropped)

    return reference


def norm_clipping(updates, weights, state, losses=None):
    kept, vectors, dropped = participants(updates, weights)
    size = _size(updates)
    if not kept:
        return unflatten(np.zeros(size), updates), state, _metrics(0, dropped, clip_threshold=0.0)
    norms = {i: float(np.linalg.norm(vectors[i])) for i in kept}
    threshold = float(np.median([norms[i] for i in kept]))
    clipped = {}
    for i in kept:
        factor = 1.0 if norms[i] <= threshold else threshold / norms[i]
        clipped[i] = vectors[i] * factor
    update = _weighted_mean(clipped, weights, kept, size)
    return unflatten(update, updates), state, _metrics(len(kept), dropped, clip_threshold=threshold)


def k_norm(byzantine):
    def reference(updates, weights, state, losses=None):
        kept, vectors, dropped = participants(updates, weights)
        by_norm = sorted(kept, key=lambda i: (float(np.linalg.norm(vectors[i])), i))
        remaining = by_norm[: max(len(kept) - byzantine, 0)]
        update = _weighted_mean(vectors, weights, remaining, _size(updates))
        return unflatten(update, updates), state, _metrics(len(remaining), dropped)

    return reference


def k_loss(byzantine):
    def reference(updates, weights, state, losses=None):
        kept, vectors, dropped = participants(updates, weights, losses)
        n = len(kept)
        if n <= byzantine:
            return unflatten(np.zeros(_size(updates)), updates), state, _metrics(0, dropped)
        by_loss = sorted(kept, key=lambda i: (float(losses[i]), i))  # later client larger on ties
        chosen = by_loss[n - 1 - byzantine]
        return unflatten(vectors[chosen], updates), state, _metrics(1, dropped)

    return reference


def centered_clipping(radius, iterations):
    def reference(updates, weights, state, losses=None):
        kept, vectors, dropped = participants(updates, weights)
        size = _size(updates)
        if not kept:
            return unflatten(np.zeros(size), updates), state, _metrics(0, dropped)
        center = np.concatenate([np.asarray(state[k], np.float64).ravel() for k in _keys(updates)])
        total = sum(float(weights[i]) for i in kept)
        for _ in range(iterations):
            move = np.zeros(size)
            for i in kept:
                difference = vectors[i] - center
                norm = float(np.linalg.norm(difference))
                factor = 1.0 if norm <= radius else radius / norm
                move += float(weights[i]) * difference * factor
            center = center + move / total
        update = unflatten(center, updates)
        return update, update, _metrics(len(kept), dropped)

    return reference


def weighted_objective(point, vectors, weights, clients):
    """sum_k alpha_k ||point - x_k|| (float64)."""
    return sum(float(weights[k]) * float(np.linalg.norm(point - vectors[k])) for k in clients)


def geometric_median(nu, max_iterations, ftol):
    def reference(updates, weights, state, losses=None):
        kept, vectors, dropped = participants(updates, weights)
        size = _size(updates)
        if not kept:
            metrics = _metrics(0, dropped, geometric_median_iterations=0)
            return unflatten(np.zeros(size), updates), state, metrics
        center = _weighted_mean(vectors, weights, kept, size)
        value = weighted_objective(center, vectors, weights, kept)
        iterations = 0
        while iterations < max_iterations:
            beta = {k: float(weights[k]) / max(nu, float(np.linalg.norm(center - vectors[k]))) for k in kept}
            center = sum(beta[k] * vectors[k] for k in kept) / sum(beta.values())
            new_value = weighted_objective(center, vectors, weights, kept)
            iterations += 1
            converged = abs(value - new_value) <= ftol * new_value
            value = new_value
            if converged:
                break
        metrics = _metrics(len(kept), dropped, geometric_median_iterations=iterations)
        return unflatten(center, updates), state, metrics

    return reference
