"""StackOverflow next-word prediction, one client per user (TFF's federated StackOverflow).

Files recognized in `--data-dir` (data-sources.md 2(a), 2(a'), 2(b)):

* TFF HDF5: `stackoverflow_{train,held_out,test}.h5`;
* TFF SQLite: `stackoverflow.sqlite[.lzma]` (splits `train`, `heldout`, `test`);
* FedJAX SQLite: `stackoverflow_{train,held_out,test}.sqlite`;
* the vocabulary: TFF's `stackoverflow.word_count` (words by decreasing
  count): the top `vocab_size` words (`jaxfl.data.text.WordVocabulary`,
  FedJAX's id layout: pad 0, bos 1, eos 2, words, oov). Without it, the
  words are counted over the training clients first (one more pass; ties in
  first-seen order) and the description says so.

Each example is one post's `tokens` (space-separated). Layouts:

* 'next-word' (one label per example, for the models that predict one
  class): every target of a post, `[bos] + ids + [eos]`, is one example: x
  the `sequence_length` ids before it (left-padded with pad), y the id.
* 'sequence' (FedJAX/TFF, for sequence models): x `[L]`, y `[L]` as
  `jaxfl.data.text.word_sequences` builds them.

Populations: train, test, and the held-out clients as the validation
population. A client's posts are capped at `max_examples_per_client` (its
first posts; Reddi et al. use 1,000 for next-word prediction) before the
examples are made.
"""

from __future__ import annotations

import collections
import contextlib
from pathlib import Path

import numpy as np

from jaxfl.data.datasets.common import (
    ClientSource,
    check_data_dir,
    check_option,
    check_positive_int,
    fedjax_sqlite_source,
    find_file,
    find_file_or_archive,
    load_cached,
    missing,
    progress_bar,
    size_statistics,
    tff_hdf5_source,
    tff_sqlite_source,
    tff_sqlite_splits,
)
from jaxfl.data.errors import DataFileError
from jaxfl.data.population import FederatedDataset
from jaxfl.data.text import WordVocabulary, word_sequences

_CONVERTER_VERSION = 2  # 2: excluded_target_ids
LAYOUTS = ("next-word", "sequence")


def _sources(data_dir: Path) -> tuple[str, dict[str, ClientSource]]:
    directories = [data_dir, *sorted(p for p in data_dir.iterdir() if p.is_dir())]
    h5 = {
        s: find_file_or_archive(directories, f"stackoverflow_{s}.h5") for s in ("train", "held_out", "test")
    }
    if h5["train"] and h5["test"]:
        sources = {"train": tff_hdf5_source(h5["train"]), "test": tff_hdf5_source(h5["test"])}
        if h5["held_out"]:
            sources["validation"] = tff_hdf5_source(h5["held_out"])
        return "TFF HDF5", sources
    sqlite = find_file(directories, ["stackoverflow.sqlite", "stackoverflow.sqlite.lzma"])
    if sqlite:
        sources = {"train": tff_sqlite_source(sqlite, "train"), "test": tff_sqlite_source(sqlite, "test")}
        if "heldout" in tff_sqlite_splits(sqlite):
            sources["validation"] = tff_sqlite_source(sqlite, "heldout")
        return "TFF SQLite", sources
    fj = {s: find_file(directories, [f"stackoverflow_{s}.sqlite"]) for s in ("train", "held_out", "test")}
    if fj["train"] and fj["test"]:
        sources = {"train": fedjax_sqlite_source(fj["train"]), "test": fedjax_sqlite_source(fj["test"])}
        if fj["held_out"]:
            sources["validation"] = fedjax_sqlite_source(fj["held_out"])
        return "FedJAX SQLite", sources
    raise missing(
        "stackoverflow",
        "stackoverflow_{train,held_out,test}.h5, stackoverflow.sqlite[.lzma] or "
        "FedJAX stackoverflow_*.sqlite",
        [data_dir],
    )


def _posts(features: dict, where: str) -> list[str]:
    if "tokens" not in features:
        raise DataFileError(f"{where}: no 'tokens' feature (features: {', '.join(features)})")
    return [
        t.decode("utf-8", "replace") if isinstance(t, bytes) else str(t)
        for t in np.asarray(features["tokens"]).reshape(-1)
    ]


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


def stackoverflow(
    *,
    data_dir: str | None = None,
    vocab_size: int = 10_000,
    sequence_length: int = 20,
    layout: str = "next-word",
    max_examples_per_client: int | None = 1000,
) -> FederatedDataset:
    """Federated StackOverflow from TFF or FedJAX files (see the module docstring).

    Args:
      data_dir: where the files are (required).
      vocab_size: words in the vocabulary (Reddi et al., TFF, FedJAX: 10,000).
      sequence_length: L, words of context (TFF, FedJAX: 20).
      layout: 'next-word' or 'sequence'.
      max_examples_per_client: posts kept per client (its first ones); None
        keeps all.

    Returns:
      The `FederatedDataset` (memory-mapped from the cache), token inputs.
    """
    vocab_size = check_positive_int("vocab_size", vocab_size)
    sequence_length = check_positive_int("sequence_length", sequence_length)
    check_option("layout", layout, LAYOUTS)
    cap = check_positive_int("max_examples_per_client", max_examples_per_client, optional=True)
    directory = check_data_dir(data_dir, "stackoverflow")
    if directory is None:
        raise missing("stackoverflow", "StackOverflow files", "(no --data-dir given)")
    source_format, sources = _sources(directory)
    directories = [directory, *sorted(p for p in directory.iterdir() if p.is_dir())]
    word_count = find_file_or_archive(directories, "stackoverflow.word_count")
    options = dict(
        vocab_size=vocab_size, sequence_length=sequence_length, layout=layout, max_examples_per_client=cap
    )

    def vocabulary() -> tuple[WordVocabulary, str]:
        if word_count is not None:
            try:
                text = word_count.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as error:
                raise DataFileError(f"{word_count}: unreadable ({error})") from None
            try:
                return WordVocabulary.from_word_count(
                    text, vocab_size
                ), f"top {vocab_size} of {word_count.name}"
            except ValueError as error:
                raise DataFileError(f"{word_count}: {error}") from None
        counts: collections.Counter = collections.Counter()
        source = sources["train"]
        with (
            progress_bar(source.total, "stackoverflow: counting words") as bar,
            contextlib.closing(source.clients()) as clients,
        ):
            for client, features in clients:
                bar.update(1)
                for post in _posts(features, f"{source.path}: {client}")[:cap]:
                    counts.update(post.split(" "))
        counts.pop("", None)
        words = [w for w, _ in counts.most_common(vocab_size)]
        return WordVocabulary(words), f"top {len(words)} words counted over the training clients"

    def build(builder):
        vocab, vocab_note = vocabulary()
        statistics = {}
        for population, source in sources.items():
            writer = builder.population(population)
            counts = []
            with (
                progress_bar(source.total, f"stackoverflow {population} clients") as bar,
                contextlib.closing(source.clients()) as clients,
            ):
                for client, features in clients:
                    bar.update(1)
                    posts = _posts(features, f"{source.path}: {client}")[:cap]
                    if not posts:
                        continue
                    if layout == "sequence":
                        pairs = [word_sequences(p, vocab, sequence_length) for p in posts]
                        x = np.stack([p[0] for p in pairs])
                        y = np.stack([p[1] for p in pairs])
                    else:
                        x, y = next_word_examples([vocab.encode(p) for p in posts], vocab, sequence_length)
                    writer.add(client, {"x": x.astype(np.int32), "y": y.astype(np.int32)})
                    counts.append(len(y))
            if not counts:
                raise DataFileError(f"{source.path}: no {population} client has a post")
            statistics[population] = size_statistics(np.asarray(counts))
        return {
            "num_classes": vocab.size,
            "input_shape": [sequence_length],
            "input_vocab_size": vocab.size,
            # Next-word accuracy as Reddi et al. and FedJAX count it (both layouts).
            "excluded_target_ids": list(vocab.special_ids),
            "description": (
                f"StackOverflow by user ({source_format}, {directory}), {layout} examples of "
                f"{sequence_length} words, vocabulary: {vocab_note}, <= {cap} posts per client"
            ),
            "statistics": statistics,
            "format": source_format,
        }

    files = [s.path for s in sources.values()] + ([word_count] if word_count else [])
    return load_cached("stackoverflow", options, files, build, converter_version=_CONVERTER_VERSION)
