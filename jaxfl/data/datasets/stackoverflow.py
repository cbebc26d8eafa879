"""StackOverflow next-word and tag prediction, one client per user (TFF's federated StackOverflow).

Files recognized in `--data-dir` (readers in `jaxfl.data.formats`):

* TFF HDF5: `stackoverflow_{train,held_out,test}.h5`;
* TFF SQLite: `stackoverflow.sqlite[.lzma]` (splits `train`, `heldout`, `test`);
* FedJAX SQLite: `stackoverflow_{train,held_out,test}.sqlite`;
* the vocabulary: TFF's `stackoverflow.word_count` (words by decreasing
  count): the top `vocab_size` words (`jaxfl.data.text.WordVocabulary`,
  FedJAX's id layout: pad 0, bos 1, eos 2, words, oov). Without it, the
  words are counted over the training clients first (one more pass; ties in
  first-seen order) and the description says so.
* the tags (layout 'tags' only, required there): TFF's
  `stackoverflow.tag_count` (a JSON object `{tag: count}`), the top
  `num_tags` tags (`jaxfl.data.text.TagVocabulary`).

Each example is one post's `tokens` (space-separated; TFF's examples are
sentences of posts, each with its post's title and tags). Layouts:

* 'next-word' (one label per example, for the models that predict one
  class): every target of a post, `[bos] + ids + [eos]`, is one example: x
  the `sequence_length` ids before it (left-padded with pad), y the id.
* 'sequence' (FedJAX/TFF, for sequence models): x `[L]`, y `[L]` as
  `jaxfl.data.text.word_sequences` builds them.
* 'tags' (Reddi et al. 2021's StackOverflow LR, multi-label): one example
  per post. x int32 `[max_words]`: the ids of the post's words (pad 0
  after them), y uint8 `[num_tags]`: 1 for each of the post's tags among the
  top `num_tags`. The words are those of TFF's bag of words
  (`google-research/federated : utils/datasets/stackoverflow_lr_dataset.py`,
  `build_to_ids_fn`, and TFF's `tag_prediction_preprocessing.py`):
  `tokens + " " + title` split on ASCII whitespace, out-of-vocabulary words
  kept as the oov id (they count in the bag's denominator in Reddi et al.'s
  code); here the title's words come first, so that a post of more than
  `max_words` words loses its last body words rather than its title (a bag
  does not depend on the order). The features themselves (the mean one-hot)
  are computed from the ids by the model ('bag-logistic'); the description
  and the statistics say how many posts were truncated. Tags are split on
  '|'; tags outside the top `num_tags` are dropped, and a post without any
  has an all-zero label (it counts nothing in recall@5).

Populations: train, test, and the held-out clients as the validation
population. A client's posts are capped at `max_examples_per_client` (its
first posts; Reddi et al. use 1,000 for next-word prediction) before the
examples are made.
"""

from __future__ import annotations

import collections
import contextlib
import re
from pathlib import Path

import numpy as np

from jaxfl.data.datasets.common import (
    ClientSource,
    check_data_dir,
    find_file_or_archive,
    find_tff_sources,
    load_cached,
    missing,
    progress_bar,
    write_population,
)
from jaxfl.data.errors import DataFileError
from jaxfl.data.population import FederatedDataset
from jaxfl.data.text import TagVocabulary, WordVocabulary, word_sequences
from jaxfl.validation import check_choice, check_int

_CONVERTER_VERSION = 3  # 2: excluded_target_ids; 3: layout 'tags'
LAYOUTS = ("next-word", "sequence", "tags")
# TF's `tf.strings.split(s)` (no separator) splits on ASCII whitespace and drops empty words.
_ASCII_WHITESPACE = re.compile("[ \t\n\r\x0b\x0c]+")


def _sources(data_dir: Path) -> tuple[str, dict[str, ClientSource]]:
    # The held-out clients are the validation population, read when the files have them.
    files = {"train": "train", "test": "test", "validation": "held_out"}
    found = find_tff_sources(
        data_dir,
        {population: f"stackoverflow_{name}.h5" for population, name in files.items()},
        ["stackoverflow.sqlite", "stackoverflow.sqlite.lzma"],
        {"train": "train", "test": "test", "validation": "heldout"},
        {population: f"stackoverflow_{name}.sqlite" for population, name in files.items()},
        optional=("validation",),
    )
    if found is not None:
        return found
    raise missing(
        "stackoverflow",
        "stackoverflow_{train,held_out,test}.h5, stackoverflow.sqlite[.lzma] or "
        "FedJAX stackoverflow_*.sqlite",
        [data_dir],
    )


def _posts(features: dict, where: str, name: str = "tokens") -> list[str]:
    if name not in features:
        raise DataFileError(f"{where}: no {name!r} feature (features: {', '.join(features)})")
    return [
        t.decode("utf-8", "replace") if isinstance(t, bytes) else str(t)
        for t in np.asarray(features[name]).reshape(-1)
    ]


def post_words(tokens: str, title: str) -> list[str]:
    """The words of a post's bag: its title's, then its tokens' (TFF splits `tokens + " " + title`)."""
    return [w for w in _ASCII_WHITESPACE.split(f"{title} {tokens}") if w]


def tag_examples(
    tokens: list[str], titles: list[str], tags: list[str], vocab: WordVocabulary, tag_vocab: TagVocabulary,
    max_words: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Layout 'tags' of one client's posts.

    Returns:
      x int32 `[n, max_words]` (word ids, then pad), y uint8 `[n, num_tags]`
      (multi-hot), and each post's number of words before truncation.
    """
    n = len(tokens)
    x = np.full((n, max_words), vocab.pad_id, np.int32)
    y = np.zeros((n, tag_vocab.size), np.uint8)
    lengths = np.zeros(n, np.int64)
    for i, (text, title, post_tags) in enumerate(zip(tokens, titles, tags, strict=True)):
        words = post_words(text, title)
        lengths[i] = len(words)
        if words:
            ids = vocab.encode(" ".join(words[:max_words]))
            x[i, : ids.size] = ids
        y[i, tag_vocab.encode(post_tags)] = 1
    return x, y, lengths


def _length_summary(histogram: np.ndarray, max_words: int) -> dict[str, float | int]:
    """Words per post (percentiles from the histogram) and how many posts were truncated."""
    total = int(histogram.sum())
    cumulative = np.cumsum(histogram)
    summary: dict[str, float | int] = {}
    for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999)):
        summary[name] = int(np.searchsorted(cumulative, q * total)) if total else 0
    summary["max"] = int(np.flatnonzero(histogram)[-1]) if total else 0
    summary["truncated_posts"] = int(histogram[max_words + 1 :].sum())
    summary["dropped_words"] = int(
        (histogram[max_words + 1 :] * (np.arange(max_words + 1, histogram.size) - max_words)).sum()
    )
    return summary


def next_word_examples(ids_per_post: list[np.ndarray], vocab: WordVocabulary, length: int):
    """Every target of every post with the `length` ids before it (left-padded)."""
    xs, ys = [], []
    for ids in ids_per_post:
        stream = np.concatenate([[vocab.bos_id], ids, [vocab.eos_id]]).astype(np.int32)
        padded = np.concatenate([np.full(length, vocab.pad_id, np.int32), stream])
        # Target t (t >= 1) of the stream sees padded[t : t + length].
        windows = np.lib.stride_tricks.sliding_window_view(padded[:-1], length)[1:]
        xs.append(windows)
        ys.append(stream[1:])
    if not xs:
        return np.zeros((0, length), np.int32), np.zeros(0, np.int32)
    return np.concatenate(xs), np.concatenate(ys)


def _word_vocabulary(
    word_count: Path | None, train: ClientSource, vocab_size: int, cap: int | None
) -> tuple[WordVocabulary, str]:
    """The top `vocab_size` words of `word_count`, or counted over the training clients; and a note."""
    if word_count is not None:
        try:
            text = word_count.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise DataFileError(f"{word_count}: unreadable ({error})") from None
        try:
            return WordVocabulary.from_word_count(text, vocab_size), f"top {vocab_size} of {word_count.name}"
        except ValueError as error:
            raise DataFileError(f"{word_count}: {error}") from None
    counts: collections.Counter = collections.Counter()
    with (
        progress_bar(train.total, "stackoverflow: counting words") as bar,
        contextlib.closing(train.clients()) as clients,
    ):
        for client, features in clients:
            bar.update(1)
            for post in _posts(features, f"{train.path}: {client}")[:cap]:
                counts.update(post.split(" "))
    counts.pop("", None)
    words = [w for w, _ in counts.most_common(vocab_size)]
    return WordVocabulary(words), f"top {len(words)} words counted over the training clients"


def _tag_vocabulary(tag_count: Path, num_tags: int) -> TagVocabulary:
    try:
        text = tag_count.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise DataFileError(f"{tag_count}: unreadable ({error})") from None
    try:
        return TagVocabulary.from_tag_count(text, num_tags)
    except ValueError as error:
        raise DataFileError(f"{tag_count}: {error}") from None


class _Histogram:
    """Counts of non-negative integers (words per post), grown as larger ones appear."""

    def __init__(self, size: int):
        self.counts = np.zeros(size, np.int64)

    def add(self, values: np.ndarray) -> None:
        counts = np.bincount(values)
        if counts.size > self.counts.size:
            self.counts = np.pad(self.counts, (0, counts.size - self.counts.size))
        self.counts[: counts.size] += counts


def _post_examples(
    features: dict, where: str, options: dict, vocab: WordVocabulary, tag_vocab: TagVocabulary | None
) -> tuple[dict[str, np.ndarray] | None, np.ndarray | None]:
    """A client's examples in `options["layout"]` (None without posts) and, for 'tags', its posts' lengths."""
    cap = options["max_examples_per_client"]
    posts = _posts(features, where)[:cap]
    if not posts:
        return None, None
    if options["layout"] == "tags":
        titles = _posts(features, where, "title")[:cap]
        tags = _posts(features, where, "tags")[:cap]
        x, y, lengths = tag_examples(posts, titles, tags, vocab, tag_vocab, options["max_words"])
        return {"x": x, "y": y}, lengths
    length = options["sequence_length"]
    if options["layout"] == "sequence":
        pairs = [word_sequences(p, vocab, length) for p in posts]
        x, y = np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])
    else:
        x, y = next_word_examples([vocab.encode(p) for p in posts], vocab, length)
    return {"x": x.astype(np.int32), "y": y.astype(np.int32)}, None


def _clients(source: ClientSource, options: dict, vocab, tag_vocab, words_per_post: _Histogram):
    """(client, examples) of every client of `source`; counts the words per post ('tags')."""
    with contextlib.closing(source.clients()) as clients:
        for client, features in clients:
            where = f"{source.path}: {client}"
            examples, lengths = _post_examples(features, where, options, vocab, tag_vocab)
            if lengths is not None:
                words_per_post.add(lengths)
            yield client, examples


def _metadata(statistics, vocab, vocab_note, tag_vocab, tag_count, source_format, directory, options):
    cap = options["max_examples_per_client"]
    if options["layout"] != "tags":
        length = options["sequence_length"]
        return {
            "num_classes": vocab.size,
            "input_shape": [length],
            "input_vocab_size": vocab.size,
            # Next-word accuracy as Reddi et al. and FedJAX count it (both layouts).
            "excluded_target_ids": list(vocab.special_ids),
            "description": (
                f"StackOverflow by user ({source_format}, {directory}), {options['layout']} examples of "
                f"{length} words, vocabulary: {vocab_note}, <= {cap} posts per client"
            ),
            "statistics": statistics,
            "format": source_format,
        }
    max_words = options["max_words"]
    words, posts = statistics["train"]["words_per_post"], statistics["train"]["examples"]
    return {
        "num_classes": tag_vocab.size,
        "input_shape": [max_words],
        "input_vocab_size": vocab.size,
        "description": (
            f"StackOverflow by user ({source_format}, {directory}), tag prediction: the "
            f"{tag_vocab.size} most used tags of {tag_count.name} (multi-hot) from the words of "
            f"title + tokens (<= {max_words} ids per post; {words['truncated_posts']} of {posts} "
            f"training posts longer, 99th percentile {words['p99']} words), vocabulary: "
            f"{vocab_note}, <= {cap} posts per client"
        ),
        "statistics": statistics,
        "format": source_format,
    }


def stackoverflow(
    *,
    data_dir: str | None = None,
    vocab_size: int = 10_000,
    sequence_length: int = 20,
    layout: str = "next-word",
    max_examples_per_client: int | None = 1000,
    num_tags: int = 500,
    max_words: int = 128,
) -> FederatedDataset:
    """Federated StackOverflow from TFF or FedJAX files (see the module docstring).

    Args:
      data_dir: where the files are (required).
      vocab_size: words in the vocabulary (Reddi et al., TFF, FedJAX: 10,000).
      sequence_length: L, words of context (TFF, FedJAX: 20); not used by 'tags'.
      layout: 'next-word', 'sequence' or 'tags'.
      max_examples_per_client: posts kept per client (its first ones); None
        keeps all.
      num_tags: layout 'tags': the tags predicted, the most used ones
        (Reddi et al., TFF: 500).
      max_words: layout 'tags': words kept per post (title first); longer
        posts are truncated (counted in the statistics and the description).

    Returns:
      The `FederatedDataset` (memory-mapped from the cache), token inputs.
    """
    vocab_size = check_int("vocab_size", vocab_size)
    sequence_length = check_int("sequence_length", sequence_length)
    check_choice("layout", layout, LAYOUTS)
    cap = check_int("max_examples_per_client", max_examples_per_client, optional=True)
    num_tags = check_int("num_tags", num_tags)
    max_words = check_int("max_words", max_words)
    directory = check_data_dir(data_dir, "stackoverflow")
    if directory is None:
        raise missing("stackoverflow", "StackOverflow files", "(no --data-dir given)")
    source_format, sources = _sources(directory)
    directories = [directory, *sorted(p for p in directory.iterdir() if p.is_dir())]
    word_count = find_file_or_archive(directories, "stackoverflow.word_count")
    tag_count = None
    if layout == "tags":
        tag_count = find_file_or_archive(directories, "stackoverflow.tag_count")
        if tag_count is None:
            raise missing(
                "stackoverflow",
                "stackoverflow.tag_count (or stackoverflow.tag_count.tar.bz2; layout 'tags' needs it)",
                directories,
            )
    options = dict(
        vocab_size=vocab_size, sequence_length=sequence_length, layout=layout, max_examples_per_client=cap
    )
    if layout == "tags":
        options.update(num_tags=num_tags, max_words=max_words)
        del options["sequence_length"]

    def build(builder):
        vocab, vocab_note = _word_vocabulary(word_count, sources["train"], vocab_size, cap)
        tag_vocab = _tag_vocabulary(tag_count, num_tags) if layout == "tags" else None
        statistics = {}
        for population, source in sources.items():
            words_per_post = _Histogram(max_words + 2)
            statistics[population] = write_population(
                builder,
                population,
                _clients(source, options, vocab, tag_vocab, words_per_post),
                total=source.total,
                description=f"stackoverflow {population} clients",
                empty_error=f"{source.path}: no {population} client has a post",
            )
            if layout == "tags":
                statistics[population]["words_per_post"] = _length_summary(words_per_post.counts, max_words)
        return _metadata(
            statistics, vocab, vocab_note, tag_vocab, tag_count, source_format, directory, options
        )

    files = [s.path for s in sources.values()] + [f for f in (word_count, tag_count) if f is not None]
    return load_cached("stackoverflow", options, files, build, converter_version=_CONVERTER_VERSION)
