"""Low-quality annotators with annotator-level TERM (t = -2) against ERM and the clean-annotator oracle.

Li 2023, Section 7.7.1.3: 100 annotators label CIFAR-10, 20 "hammers" always correctly and 80 "spammers"
uniformly at random; TERM tilts at the annotator level (Algorithm 16, the groups the annotators, tau = 0
inside each) with t = -2, so that annotators whose labels the model cannot fit are discounted; it reaches
nearly the accuracy of training on the hammers' labels alone (Genie ERM), far above ERM on all labels.
CIFAR-10 is not on this machine: Fashion-MNIST (Debian's `dataset-fashion-mnist`, or `--data-dir`) is the
substitute. Per seed, each of the 60,000 training images is assigned to one of the 100 annotators
uniformly at random; a hammer keeps its images' true labels, a spammer replaces each with a uniformly
random class (possibly the true one); the test set is the clean 10,000.

Chosen here: a one-hidden-layer ReLU network of 128 units, SGD with learning rate 0.1 and batches of 100
for 3,000 steps (5 epochs), from a seeded initialization. TERM draws each step's annotator with
probability proportional to |g| e^{t R_g} (`sample_group`) and its batch uniformly from that annotator's
images, with t lowered linearly from 0 to -2 over the first 500 steps (the thesis's continuation for
negative tilts, Section 7.5) and the running risks' decay 0.2; ERM and the oracle draw uniform batches
of all images and of the hammers' images.

    python scripts/term_annotators.py --seeds 0 1 2

On the thesis's data, `--dataset cifar10 --data-dir DIR` reads CIFAR-10 (the python or binary version,
folder or archive; `jaxfl.data.formats.cifar`): 50,000 training images of 3,072 pixels in [0, 1], the
clean 10,000 as the test set, the same annotators, network (on 3,072 inputs; the thesis trains a
ResNet-20) and steps:

    python scripts/term_annotators.py --dataset cifar10 --data-dir ~/cifar-10-batches-py --seeds 0 1 2

References:
  [Li 2023] T. Li. Scalable and Trustworthy Learning in Heterogeneous Networks. PhD thesis, Carnegie
    Mellon University, 2023 (Section 7.7.1.3, Figure 7.9; Algorithm 16; Section 7.5).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxfl.training.tilted_erm import per_example_losses_and_grads, sample_group, tilted_erm

ANNOTATORS, HAMMERS, CLASSES = 100, 20, 10
METHODS = ("ERM", "TERM t=-2 (annotators)", "Genie ERM (hammers only)")
HIDDEN, STEPS, BATCH, LEARNING_RATE = 128, 3000, 100, 0.1
TILT, CONTINUATION, NORMALIZER_DECAY = -2.0, 500, 0.2


def images(data_dir=None, dataset: str = "fashion-mnist"):
    """(train x [n, pixels] in [0, 1], train y, test x, test y) of Fashion-MNIST or CIFAR-10."""
    from jaxfl.data.registry import load_dataset

    if dataset == "fashion-mnist":
        dataset = load_dataset("fashion-mnist", data_dir=data_dir)
    else:  # One client holding every example: the loader's partition plays no part.
        dataset = load_dataset(dataset, data_dir=data_dir, num_clients=1, partition="iid", num_test_clients=1)

    def flat(population):
        x = np.asarray(population.features["x"], np.float32).reshape(population.num_examples, -1)
        return x, np.asarray(population.features["y"], np.int32)

    return (*flat(dataset.train), *flat(dataset.test))


def annotate(y: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(each image's annotator, its given label): annotators < HAMMERS are correct, the rest random."""
    rng = np.random.default_rng(seed)
    annotator = rng.integers(0, ANNOTATORS, len(y)).astype(np.int32)
    given = np.where(annotator < HAMMERS, y, rng.integers(0, CLASSES, len(y))).astype(np.int32)
    return annotator, given


def init(key, num_inputs: int = 784):
    first, second = jax.random.split(key)
    return {
        "w1": jax.random.normal(first, (num_inputs, HIDDEN)) * jnp.sqrt(2.0 / num_inputs),
        "b1": jnp.zeros(HIDDEN),
        "w2": jax.random.normal(second, (HIDDEN, CLASSES)) * jnp.sqrt(1.0 / HIDDEN), "b2": jnp.zeros(CLASSES),
    }


def logits(params, x):
    hidden = jax.nn.relu(x @ params["w1"] + params["b1"][None])
    return hidden @ params["w2"] + params["b2"][None]


def example_loss(params, example):
    x, y = example
    return -jax.nn.log_softmax(logits(params, x[None])[0])[y]


def train(method: str, key, x, y, annotator):
    """The trained parameters (jit-compiled per method; the data are arguments)."""
    init_key, data_key = jax.random.split(key)
    params = init(init_key, x.shape[1])
    tilt = optax.linear_schedule(0.0, TILT, CONTINUATION)
    term = method.startswith("TERM")
    tx = optax.sgd(LEARNING_RATE)
    if term:
        tx = optax.chain(
            tilted_erm(tilt, tau=0.0, num_groups=ANNOTATORS, normalizer_decay=NORMALIZER_DECAY), tx
        )
    sizes = jnp.zeros(ANNOTATORS).at[annotator].add(1.0)
    # The images sorted by annotator: annotator g's are order[starts[g]:starts[g] + sizes[g]], and the
    # hammers' (annotators 0..HAMMERS-1) the first ones.
    order = jnp.argsort(annotator, stable=True)
    starts = (jnp.cumsum(sizes) - sizes).astype(jnp.int32)
    counts = sizes.astype(jnp.int32)
    pool_start, pool_size = 0, jnp.sum(counts[:HAMMERS]) if method.startswith("Genie") else x.shape[0]

    def step(carry, step_key):
        params, state = carry
        group_key, batch_key = jax.random.split(step_key)
        if term:
            group = sample_group(group_key, state[0], sizes, tilt)
            start, size = starts[group], counts[group]
        else:
            group, start, size = None, pool_start, pool_size
        rows = order[start + jax.random.randint(batch_key, (BATCH,), 0, size)]
        if term:
            losses, grads = per_example_losses_and_grads(example_loss, params, (x[rows], y[rows]))
            updates, state = tx.update(grads, state, params, losses=losses, group=group)
        else:
            mean_loss = lambda p: jnp.mean(jax.vmap(example_loss, in_axes=(None, 0))(p, (x[rows], y[rows])))  # noqa: E731
            updates, state = tx.update(jax.grad(mean_loss)(params), state, params)
        return (optax.apply_updates(params, updates), state), None

    (params, _), _ = jax.lax.scan(step, (params, tx.init(params)), jax.random.split(data_key, STEPS))
    return params


def accuracy(params, x, y) -> float:
    return float(np.mean(np.asarray(jnp.argmax(logits(params, jnp.asarray(x)), axis=-1)) == y))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--dataset", choices=("fashion-mnist", "cifar10"), default="fashion-mnist",
        help="fashion-mnist: the substitute; cifar10: the thesis's data, from --data-dir",
    )  # fmt: skip
    parser.add_argument("--data-dir", help="folder of the dataset's files (Fashion-MNIST default: Debian's)")
    args = parser.parse_args(argv)
    train_x, train_y, test_x, test_y = images(args.data_dir, args.dataset)
    compiled = {m: jax.jit(lambda key, x, y, a, m=m: train(m, key, x, y, a)) for m in METHODS}
    results = {m: [] for m in METHODS}
    for seed in args.seeds:
        annotator, given = annotate(train_y, seed)
        arrays = tuple(jnp.asarray(a) for a in (train_x, given, annotator))
        for method in METHODS:
            results[method].append(accuracy(compiled[method](jax.random.key(seed), *arrays), test_x, test_y))
    spammers = ANNOTATORS - HAMMERS
    print(f"{args.dataset}: clean test accuracy, {HAMMERS} hammers and {spammers} spammers, mean (std), "
          f"seeds {args.seeds}")  # fmt: skip
    print("| method | test accuracy |\n|---|---|")
    for method in METHODS:
        print(f"| {method} | {np.mean(results[method]):.4f} ({np.std(results[method]):.4f}) |")


if __name__ == "__main__":
    main()
