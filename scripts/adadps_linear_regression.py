"""AdaDPS against DP-SGD on the sparse linear regression of Li 2023, Section 6.2.1 (Figure 6.4).

The problem (Li 2023, Section 6.2.1): min_w 1/(2n) sum_i (w.x_i - y_i)^2 with n = 1,000 examples in
d = 500 binary features, P(x_j = 1) = 0.9 for j <= 50 (frequent, uninformative: w_j = 0.01) and 0.01
for j > 50 (rare, informative: w_j = 1), y = w.x + b, b ~ N(0, 0.01). AdaDPS (Algorithm 8, option 2)
knows which features are frequent and preconditions with A_j = 1 for j <= 50 and 0.01 otherwise; DP-SGD
is A = 1. Both privatize per-example gradients (`jaxfl.privacy.optimizers.privatize`) at the thesis's
(4.13, 1e-3)-DP, the noise multiplier calibrated by `dp_sgd_noise_multiplier` for the batches and steps
below; the non-private SGD and preconditioned SGD run beside them. As in the thesis, each method's
learning rate is tuned (here: the grid value of least mean final training loss over the seeds).

What the thesis does not state and is chosen here: batch size 10 (sampling rate 0.01), 2,000 steps
(20 epochs), clip norm 1, w_0 = 0, batches uniform without replacement within a step (accounted as
Poisson sampling, `dp_sgd_epsilon`'s convention).

    python scripts/adadps_linear_regression.py --seeds 0 1 2 3 4

prints, per method, the tuned learning rate and the training loss (mean +- std over seeds) at a few
steps. docs/private-optimizers.md quotes its output.

References:
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks. PhD thesis, CMU, 2023, Section 6.2.1.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxfl.privacy import optimizers

NUM_EXAMPLES, DIMENSION, FREQUENT = 1000, 500, 50
EPSILON, DELTA = 4.13, 1e-3
BATCH, STEPS, CLIP_NORM = 10, 2000, 1.0
LEARNING_RATES = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
REPORTED_STEPS = (100, 500, 1000, 2000)
METHODS = ("sgd", "preconditioned sgd", "dp-sgd", "adadps")


def problem(key):
    """The thesis's data: (x [n, d] in {0, 1}, y [n])."""
    features_key, noise_key = jax.random.split(key)
    frequent = jnp.arange(DIMENSION) < FREQUENT
    probability = jnp.broadcast_to(jnp.where(frequent, 0.9, 0.01), (NUM_EXAMPLES, DIMENSION))
    x = jax.random.bernoulli(features_key, probability)
    x = x.astype(jnp.float32)
    w = jnp.where(frequent, 0.01, 1.0)
    y = x @ w + jnp.sqrt(0.01) * jax.random.normal(noise_key, (NUM_EXAMPLES,))
    return x, y


def loss(w, x, y):
    return 0.5 * jnp.mean((x @ w - y) ** 2)


def side_information():
    """AdaDPS's A: 1 on the frequent features, 0.01 on the rare ones."""
    return jnp.where(jnp.arange(DIMENSION) < FREQUENT, 1.0, 0.01)


def train(method: str, noise_multiplier: float, learning_rate, key):
    """Training losses after each of `STEPS` steps of `method` (jittable; vmap over rates and keys)."""
    data_key, batch_key, noise_key = jax.random.split(key, 3)
    x, y = problem(data_key)
    preconditioner = side_information() if method in ("preconditioned sgd", "adadps") else jnp.ones(DIMENSION)
    z = noise_multiplier if method in ("dp-sgd", "adadps") else 0.0
    # Non-private runs average the unclipped gradients: clipping at a norm no example reaches.
    clip_norm = CLIP_NORM if z else 1e30
    tx = optax.chain(
        optimizers.scale_by_side_information(preconditioner),
        optimizers.privatize(clip_norm, z, noise_key),
        optax.sgd(learning_rate),
    )
    per_example = jax.vmap(jax.grad(lambda w, xi, yi: 0.5 * (xi @ w - yi) ** 2), in_axes=(None, 0, 0))

    def step(carry, step_key):
        w, state = carry
        rows = jax.random.choice(step_key, NUM_EXAMPLES, (BATCH,), replace=False)
        updates, state = tx.update(per_example(w, x[rows], y[rows]), state, w)
        w = optax.apply_updates(w, updates)
        return (w, state), loss(w, x, y)

    w0 = jnp.zeros(DIMENSION)
    _, losses = jax.lax.scan(step, (w0, tx.init(w0)), jax.random.split(batch_key, STEPS))
    return losses


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    args = parser.parse_args(argv)
    noise_multiplier = optimizers.dp_sgd_noise_multiplier(EPSILON, BATCH / NUM_EXAMPLES, STEPS, DELTA)
    spent = optimizers.dp_sgd_epsilon(noise_multiplier, BATCH / NUM_EXAMPLES, STEPS, DELTA)
    print(
        f"noise multiplier {noise_multiplier:.4f}: ({spent:.3f}, {DELTA:g})-DP over {STEPS} steps of "
        f"{BATCH} examples (q = {BATCH / NUM_EXAMPLES:g}); seeds {args.seeds}"
    )
    keys = jnp.stack([jax.random.key(seed) for seed in args.seeds])
    rates = jnp.asarray(LEARNING_RATES)
    print("| method | tuned lr | " + " | ".join(f"loss at step {s}" for s in REPORTED_STEPS) + " |")
    print("|---|---|" + "---|" * len(REPORTED_STEPS))
    for method in METHODS:
        over_seeds = jax.vmap(lambda lr, key, m=method: train(m, noise_multiplier, lr, key), (None, 0))
        run = jax.jit(jax.vmap(over_seeds, (0, None)))
        losses = np.asarray(run(rates, keys))  # [rates, seeds, steps]
        final = np.where(np.isfinite(losses[:, :, -1]), losses[:, :, -1], np.inf).mean(axis=1)
        best = int(np.argmin(final))
        at = [losses[best, :, s - 1] for s in REPORTED_STEPS]
        cells = [f"{values.mean():.4f} ± {values.std():.4f}" for values in at]
        print(f"| {method} | {LEARNING_RATES[best]:g} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
