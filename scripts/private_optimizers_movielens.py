"""DP-SGD, DP-RMSProp, AdaDPS and DP^2 on MovieLens-100k matrix factorization, Li 2023, Table 6.11's last row.

The thesis's Table 6.11 reports, on MovieLens-100k (943 users, 1,682 items, 100,000 ratings; matrix
factorization with embeddings of size 100, 262,500 parameters; each rating one DP record), test mean
squared errors 3.02 / 2.96 / 2.86 / 2.78 for DP-SGD, DP-RMSProp, AdaDPS and DP^2-RMSProp (Li et al.
2023; batch 64, 50 epochs, delta = 10^-k <= 1/n). MovieLens is not on this machine: `--dataset
movielens --data-dir DIR` reads GroupLens's `u.data` (`jaxfl.data.formats.movielens`); without it the
script runs on a **synthetic substitute** of the same shape (943 x 1,682, 100,000 ratings: users and
items drawn by a power law, ratings from rank-5 factors, rounded and clipped to 1..5), to show the
protocol runs, not to reproduce the thesis's numbers.

Chosen here (the thesis leaves them unstated): prediction <u_user, v_item> without biases (262,500
parameters, the thesis's count), embeddings initialized N(0, 0.1^2) from the seed, the ratings split
80/20 at random per seed, 1% of the training ratings held out as *public* (AdaDPS's side information
A: each user's and item's share of the public ratings, + 1e-3, over its maximum, for its embedding row;
they are not trained on), batch 64 (each epoch a random order; accounted as Poisson sampling at q =
64/n, the usual practice), clip norm 1, example-level (2, delta)-DP with delta = `power_of_ten_delta(n)`
(DP^2's choice), DP^2 with s1 = s2 = one epoch of steps, beta 0.9, eps 1e-3, the same rate and clip
in both phases; plain SGD (no clipping, no noise) as the floor. Each method's learning rate is tuned on a
grid by the mean test MSE over the seeds, as the thesis tunes.

    python scripts/private_optimizers_movielens.py --dataset movielens --data-dir ~/ml-100k --seeds 0 1 2
    python scripts/private_optimizers_movielens.py --seeds 0 --epochs 5       # the substitute, shorter

Per step the per-example gradients of the two tables are materialized (64 x 262,500 floats, 67 MB).

References:
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks. PhD thesis, CMU, 2023,
    Algorithms 8, 9 and 11, Table 6.11.
  [Li et al. 2023] Differentially Private Adaptive Optimization with Delayed Preconditioners. ICLR 2023.
  [Harper and Konstan 2015] The MovieLens Datasets: History and Context. ACM TiiS 2015.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxfl.data.formats.movielens import read_movielens_100k
from jaxfl.privacy import optimizers

EPSILON, BATCH, EPOCHS, CLIP_NORM, EMBEDDING, PUBLIC_FRACTION = 2.0, 64, 50, 1.0, 100, 0.01
NUM_USERS, NUM_ITEMS, NUM_RATINGS = 943, 1682, 100_000
LEARNING_RATES = {
    "sgd (not private)": (0.03, 0.1, 0.3, 1.0),
    "dp-sgd": (0.1, 0.3, 1.0, 3.0, 5.0),
    "dp-rmsprop": (0.001, 0.003, 0.01, 0.03),
    "adadps": (0.1, 0.3, 1.0, 3.0, 5.0),
    "dp2-rmsprop": (0.1, 0.3, 1.0, 3.0, 5.0),
}
THESIS = {"sgd (not private)": "", "dp-sgd": "3.02", "dp-rmsprop": "2.96", "adadps": "2.86",
          "dp2-rmsprop": "2.78"}


def synthetic_ratings(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The substitute's (users, items, ratings) (module docstring), fixed by `seed`."""
    rng = np.random.default_rng(seed)

    def power_law(count):
        weights = 1.0 / np.arange(1, count + 1) ** 0.8
        return rng.permutation(weights / weights.sum())

    users = rng.choice(NUM_USERS, NUM_RATINGS, p=power_law(NUM_USERS))
    items = rng.choice(NUM_ITEMS, NUM_RATINGS, p=power_law(NUM_ITEMS))
    user_factors, item_factors = rng.normal(size=(NUM_USERS, 5)), rng.normal(size=(NUM_ITEMS, 5))
    scores = 3.5 + 0.5 * np.sum(user_factors[users] * item_factors[items], axis=1)
    scores = scores + rng.normal(0, 0.5, NUM_RATINGS)
    return users.astype(np.int32), items.astype(np.int32), np.clip(np.round(scores), 1, 5).astype(np.float32)


def predict(params, users, items):
    return jnp.sum(params["users"][users] * params["items"][items], axis=-1)


def loss(params, users, items, ratings):
    return jnp.mean((predict(params, users, items) - ratings) ** 2)


def optimizer(method: str, learning_rate, noise_multiplier: float, key, side_information, steps_per_epoch):
    """The method as an optax chain over per-example gradients (`optimizers.table_6_11_method`)."""
    return optimizers.table_6_11_method(
        method.removesuffix(" (not private)"), learning_rate, CLIP_NORM, noise_multiplier, key,
        side_information=side_information, phase_steps=steps_per_epoch,
    )


def side_information(public_users, public_items, num_users, num_items):
    """A per embedding row: each user's (item's) share of the public ratings, + 1e-3, over its maximum."""

    def shares(ids, count):
        share = np.bincount(ids, minlength=count) / max(len(ids), 1) + 1e-3
        return share / share.max()

    return {
        "users": np.repeat(shares(public_users, num_users)[:, None], EMBEDDING, axis=1).astype(np.float32),
        "items": np.repeat(shares(public_items, num_items)[:, None], EMBEDDING, axis=1).astype(np.float32),
    }


def train(method, noise_multiplier, learning_rate, key, data, epochs: int = EPOCHS):
    """Test MSE after `epochs` epochs (jittable; vmap over rates)."""
    train_users, train_items, train_ratings, test_users, test_items, test_ratings, side = data
    steps_per_epoch = train_ratings.shape[0] // BATCH
    init_users, init_items, order_key, noise_key = jax.random.split(key, 4)
    params = {
        "users": 0.1 * jax.random.normal(init_users, side["users"].shape),
        "items": 0.1 * jax.random.normal(init_items, side["items"].shape),
    }
    tx = optimizer(method, learning_rate, noise_multiplier, noise_key, side, steps_per_epoch)
    per_example = jax.vmap(
        jax.grad(lambda p, u, i, r: loss(p, u[None], i[None], r[None])), in_axes=(None, 0, 0, 0)
    )

    def step(carry, rows):
        params, state = carry
        grads = per_example(params, train_users[rows], train_items[rows], train_ratings[rows])
        updates, state = tx.update(grads, state, params)
        return (optax.apply_updates(params, updates), state), None

    orders = [jax.random.permutation(k, train_ratings.shape[0]) for k in jax.random.split(order_key, epochs)]
    rows = jnp.concatenate([order[: steps_per_epoch * BATCH] for order in orders])
    (params, _), _ = jax.lax.scan(step, (params, tx.init(params)), rows.reshape(-1, BATCH))
    return loss(params, test_users, test_items, test_ratings)


def split(users, items, ratings, seed: int):
    """(private training, public, test) index arrays: 80/20 at random, 1% of the training part public."""
    order = np.random.default_rng(seed).permutation(len(ratings))
    num_train = int(0.8 * len(ratings))
    num_public = int(PUBLIC_FRACTION * num_train)
    return order[num_public:num_train], order[:num_public], order[num_train:]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--dataset", choices=("synthetic-ratings", "movielens"), default="synthetic-ratings",
        help="synthetic-ratings: the substitute; movielens: the thesis's data, u.data from --data-dir",
    )  # fmt: skip
    parser.add_argument("--data-dir", help="movielens: the ml-100k folder (or u.data itself)")
    parser.add_argument(
        "--epochs", type=int, default=EPOCHS, help="passes over the private ratings (thesis: 50)"
    )
    args = parser.parse_args(argv)
    if args.epochs < 1:
        raise SystemExit("--epochs must be >= 1")
    if args.dataset == "movielens":
        if args.data_dir is None:
            raise SystemExit("--dataset movielens needs --data-dir (the ml-100k folder)")
        data = read_movielens_100k(args.data_dir)
        users, items, ratings = data.users, data.items, data.ratings
        num_users, num_items, what = data.num_users, data.num_items, "MovieLens-100k"
    else:
        users, items, ratings = synthetic_ratings()
        num_users, num_items, what = NUM_USERS, NUM_ITEMS, "the synthetic substitute"
    num_private = len(split(users, items, ratings, 0)[0])
    delta = optimizers.power_of_ten_delta(num_private)
    steps = args.epochs * (num_private // BATCH)
    noise_multiplier = optimizers.dp_sgd_noise_multiplier(EPSILON, BATCH / num_private, steps, delta)
    print(
        f"{what}: {len(ratings)} ratings of {num_users} users and {num_items} items, {num_private} private "
        f"training ratings; noise multiplier {noise_multiplier:.4f}: ({EPSILON}, {delta:g})-DP over {steps} "
        f"steps of {BATCH}; seeds {args.seeds}"
    )
    print("| method | tuned lr | test MSE (mean ± std over seeds) | thesis, MovieLens |")
    print("|---|---|---|---|")
    for method, rates in LEARNING_RATES.items():
        errors = []  # [seeds, rates]
        for seed in args.seeds:
            private, public, test = split(users, items, ratings, seed)
            side = side_information(users[public], items[public], num_users, num_items)
            arrays = (
                users[private], items[private], ratings[private], users[test], items[test], ratings[test]
            )
            data = (*(jnp.asarray(a) for a in arrays), {k: jnp.asarray(v) for k, v in side.items()})
            run = jax.jit(
                jax.vmap(
                    lambda lr, d, m=method, s=seed: train(
                        m, noise_multiplier, lr, jax.random.key(s), d, args.epochs
                    ),
                    in_axes=(0, None),
                )
            )
            errors.append(np.asarray(run(jnp.asarray(rates), data)))
        errors = np.asarray(errors)
        # A diverged rate (inf or NaN) is never the best.
        best = int(np.argmin(np.where(np.isfinite(errors), errors, np.inf).mean(axis=0)))
        column = errors[:, best]
        print(f"| {method} | {rates[best]:g} | {column.mean():.4f} ± {column.std():.4f} | {THESIS[method]} |")


if __name__ == "__main__":
    main()
