"""Vocabularies and example construction for the federated text datasets.

Pure NumPy and the standard library: Shakespeare next-character prediction,
StackOverflow next-word and tag prediction, and Sent140 tokenization, each
built the way the reference pipelines build them, so that models trained
here see the same ids and the same (x, y) pairs. Vocabularies and constants
are reproduced from the sources cited next to them; the code is jaxfl's own.

Shakespeare character vocabularies (`CharVocabulary`):

* `FEDJAX_SHAKESPEARE_VOCAB`: `google/fedjax : fedjax/datasets/shakespeare.py`
  (`_build_look_up_table(..., num_reserved=3)`, `PAD = 0`, `BOS = 1`,
  `EOS = 2`, `OOV = VOCAB_SIZE - 1`). Ids: pad 0, bos 1, eos 2, the 86
  characters of `TFF_CHAR_VOCAB` at 3..88 in order, oov 89; 90 ids.
* `TFF_SHAKESPEARE_VOCAB`: `google-parfait/tensorflow-federated :
  tensorflow_federated/python/simulation/baselines/shakespeare/
  char_prediction_preprocessing.py` (`get_special_tokens`, and the
  `StaticVocabularyTable(..., num_oov_buckets=1)` lookup `+ 1`). Ids: pad 0,
  the 86 characters at 1..86, oov 87, bos 88, eos 89; 90 ids. Both layouts have
  90 ids and the same characters, in different places: a model trained on one
  cannot be evaluated on the other's ids.
* `LEAF_SHAKESPEARE_VOCAB`: `TalwalkarLab/leaf : models/utils/language_utils.py`
  (`ALL_LETTERS`, 80 symbols, ids 0..79, no special ids). LEAF's
  `word_to_indices` gives -1 (`str.find`) for a character outside the 80;
  `encode` here raises instead, or drops it with `errors="ignore"`.
* `DELTAFL_SHAKESPEARE_VOCAB`: `krishnap25/simplicial-fl :
  models/utils/language_utils.py` (the Delta-FL reference code): space and the
  52 letters, ids 0..52; any other character maps to 0 (`max(0, find(c))`),
  so the "unknown" id is the space's id.

TFF and FedJAX look characters up byte by byte (`tf.strings.bytes_split`;
FedJAX indexes a 256-entry table with the snippet's bytes), so a non-ASCII
character becomes one oov id per UTF-8 byte; `encode` does the same for those
two vocabularies. LEAF and Delta-FL look up Python characters.

Example construction:

* `char_sequences`: TFF's, per snippet (`_build_tokenize_fn` and
  `_split_target` in TFF's `char_prediction_preprocessing.py`):
  `[bos] + ids + [eos]`, padded with pad to a multiple of L + 1, cut into
  chunks of L + 1, x = chunk[:-1], y = chunk[1:]. The chunks do not overlap,
  so the first character of every chunk after the first is never a target
  (FedJAX's docstring: TFF "loses ~1/sequence_length portion of the tokens").
  TFF keeps a last chunk that is `[eos, pad, ...]` (all of its targets pad);
  so does `char_sequences`.
* `client_char_sequences`: FedJAX's `shakespeare.preprocess_client`: a
  client's snippets, each `[bos] + ids + [eos]`, joined into one stream;
  x = stream[:-1], y = stream[1:], each padded with pad to a multiple of L
  and cut into rows of L. No target is lost and no row is all padding.
* `next_char_windows`: LEAF's (`TalwalkarLab/leaf :
  data/shakespeare/preprocess/shake_utils.py`, `__txt_to_data`): for i in
  `range(0, len(text) - window, stride)`, x = text[i:i+window] and
  y = text[i+window]; `leaf_normalize` is the text normalization that comes
  before it (newlines to spaces, runs of two or more spaces to one).
* `word_sequences`: StackOverflow next-word prediction, FedJAX's or TFF's
  rule depending on the vocabulary's layout (see `WordVocabulary`).

Next-character and next-word accuracy in these benchmarks excludes pad, oov,
bos and eos targets; `special_ids` lists them for each vocabulary.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

__all__ = [
    "DELTAFL_CHARS",
    "DELTAFL_SHAKESPEARE_VOCAB",
    "FEDJAX_SHAKESPEARE_VOCAB",
    "LEAF_CHARS",
    "LEAF_SHAKESPEARE_VOCAB",
    "TFF_CHAR_VOCAB",
    "TFF_SHAKESPEARE_VOCAB",
    "CharVocabulary",
    "TagVocabulary",
    "WordVocabulary",
    "char_sequences",
    "client_char_sequences",
    "leaf_normalize",
    "leaf_split_line",
    "line_to_indices",
    "next_char_windows",
    "word_sequences",
]

# `CHAR_VOCAB` of TFF's Shakespeare preprocessing (source above), the
# vocabulary of TFF's "Federated Learning for Text Generation" tutorial; FedJAX
# uses the same 86 characters in the same order. 86 distinct characters.
TFF_CHAR_VOCAB = "dhlptx@DHLPTX $(,048cgkoswCGKOSW[_#'/37;?bfjnrvzBFJNRVZ\"&*.26:\naeimquyAEIMQUY]!%)-159\r"
# LEAF's `ALL_LETTERS` (`TalwalkarLab/leaf : models/utils/language_utils.py`).
LEAF_CHARS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
# `ALL_LETTERS` of the Delta-FL reference code
# (`krishnap25/simplicial-fl : models/utils/language_utils.py`).
DELTAFL_CHARS = " ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

_REPLACEMENT = "\ufffd"


class CharVocabulary:
    """A character vocabulary: characters and special tokens to consecutive int32 ids.

    Attributes:
        name: A short name for messages (`"fedjax"`, `"tff"`, `"leaf"`, `"deltafl"`).
        chars: The vocabulary's characters, in id order.
        char_ids: `char_ids[i]` is the id of `chars[i]`.
        size: The number of ids (characters and special tokens): ids are `0..size-1`.
        pad_id, oov_id, bos_id, eos_id: The special ids; None where the
            vocabulary has no such token. `oov_id` may equal a character's id
            (Delta-FL maps unknown characters to the space's id 0).
        byte_level: Whether text is looked up byte by byte in UTF-8 (TFF,
            FedJAX) rather than character by character (LEAF, Delta-FL).
    """

    def __init__(
        self,
        name: str,
        chars: str,
        first_char_id: int,
        size: int,
        *,
        pad_id: int | None = None,
        oov_id: int | None = None,
        bos_id: int | None = None,
        eos_id: int | None = None,
        byte_level: bool = False,
    ):
        """Builds the lookup tables.

        Args:
            name: A short name for messages.
            chars: Distinct characters; `chars[i]` gets id `first_char_id + i`.
                Byte-level vocabularies need ASCII characters.
            first_char_id: The id of `chars[0]`.
            size: The number of ids.
            pad_id: Id of the padding token, if any.
            oov_id: Id given to characters outside `chars`, if any.
            bos_id: Id of the beginning-of-sequence token, if any.
            eos_id: Id of the end-of-sequence token, if any.
            byte_level: Look text up byte by byte in UTF-8.

        Raises:
            ValueError: Repeated characters, ids outside `[0, size)`, special
                ids that collide with each other or (except `oov_id`) with a
                character, or a non-ASCII character in a byte-level vocabulary.
        """
        if len(set(chars)) != len(chars):
            raise ValueError(f"{name}: the characters of a vocabulary must be distinct")
        if byte_level and not chars.isascii():
            raise ValueError(f"{name}: a byte-level vocabulary needs ASCII characters")
        self.name = name
        self.chars = chars
        self.char_ids = np.arange(first_char_id, first_char_id + len(chars), dtype=np.int32)
        self.size = int(size)
        self.pad_id, self.oov_id, self.bos_id, self.eos_id = pad_id, oov_id, bos_id, eos_id
        self.byte_level = byte_level
        char_id_set = set(self.char_ids.tolist())
        specials = [i for i in (pad_id, bos_id, eos_id) if i is not None]
        if len(set(specials)) != len(specials) or char_id_set & set(specials):
            raise ValueError(f"{name}: pad, bos and eos ids must differ from each other and from characters")
        if oov_id is not None and oov_id in specials:
            raise ValueError(f"{name}: the oov id must differ from pad, bos and eos")
        for i in [*specials, *([oov_id] if oov_id is not None else []), *char_id_set]:
            if not 0 <= i < self.size:
                raise ValueError(f"{name}: id {i} is outside [0, {self.size})")
        # Code points below 128 (bytes, for byte-level vocabularies) go through a
        # table, -1 marking "no id"; its extra last entry serves every code point
        # beyond it, which then falls back to a dict of the non-ASCII characters.
        self._table = np.full((256 if byte_level else 128) + 1, -1 if oov_id is None else oov_id, np.int32)
        self._other: dict[str, int] = {}
        for char, char_id in zip(chars, self.char_ids.tolist(), strict=True):
            if ord(char) < 128:
                self._table[ord(char)] = char_id
            else:
                self._other[char] = char_id
        self._decode = np.full(self.size, "", dtype=object)
        if oov_id is not None:
            self._decode[oov_id] = _REPLACEMENT
        self._decode[self.char_ids] = list(chars)

    @property
    def special_ids(self) -> tuple[int, ...]:
        """The special ids that exist (pad, oov, bos, eos order), for masking them out of metrics."""
        return tuple(i for i in (self.pad_id, self.oov_id, self.bos_id, self.eos_id) if i is not None)

    def __repr__(self) -> str:
        return (
            f"CharVocabulary({self.name!r}, size={self.size}, chars={len(self.chars)}, pad={self.pad_id}, "
            f"oov={self.oov_id}, bos={self.bos_id}, eos={self.eos_id})"
        )

    def encode(self, text: str, errors: str = "strict") -> np.ndarray:
        """Maps text to ids, without bos/eos.

        Args:
            text: The text.
            errors: What to do with a character outside the vocabulary when the
                vocabulary has no oov id: `"strict"` raises, `"ignore"` drops it.
                Ignored when there is an oov id (such characters get it).

        Returns:
            int32 ids, one per character (per UTF-8 byte for byte-level vocabularies).

        Raises:
            ValueError: `errors="strict"` and a character has no id, or an unknown `errors`.
        """
        if errors not in ("strict", "ignore"):
            raise ValueError(f"errors must be 'strict' or 'ignore', got {errors!r}")
        if self.byte_level:
            codes = np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int64)
        else:
            codes = np.frombuffer(text.encode("utf-32-le"), "<u4").astype(np.int64)
        last = len(self._table) - 1
        ids = self._table[np.minimum(codes, last)]
        if self._other:
            for i in np.flatnonzero(codes >= last).tolist():
                ids[i] = self._other.get(chr(codes[i]), ids[i])
        if self.oov_id is None:
            unknown = ids < 0
            if unknown.any():
                if errors == "ignore":
                    return ids[~unknown]
                found = "".join(sorted(set(text) - set(self.chars)))
                raise ValueError(
                    f"the {self.name} vocabulary has no id for {found!r} and no oov id; "
                    "pass errors='ignore' to drop such characters"
                )
        return ids

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """Maps ids back to text.

        Characters decode to themselves; the oov id (where it is not also a
        character's id) to U+FFFD; pad, bos and eos to nothing.

        Raises:
            ValueError: An id outside `[0, size)`.
        """
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.size):
            raise ValueError(f"ids must be in [0, {self.size}) for the {self.name} vocabulary")
        return "".join(self._decode[ids].tolist())


FEDJAX_SHAKESPEARE_VOCAB = CharVocabulary(
    "fedjax", TFF_CHAR_VOCAB, 3, 90, pad_id=0, bos_id=1, eos_id=2, oov_id=89, byte_level=True
)
TFF_SHAKESPEARE_VOCAB = CharVocabulary(
    "tff", TFF_CHAR_VOCAB, 1, 90, pad_id=0, oov_id=87, bos_id=88, eos_id=89, byte_level=True
)
LEAF_SHAKESPEARE_VOCAB = CharVocabulary("leaf", LEAF_CHARS, 0, 80)
DELTAFL_SHAKESPEARE_VOCAB = CharVocabulary("deltafl", DELTAFL_CHARS, 0, 53, oov_id=0)


def _check_length(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _sequence_specials(vocab) -> tuple[int, int, int]:
    if vocab.pad_id is None or vocab.bos_id is None or vocab.eos_id is None:
        raise ValueError(f"the {vocab.name} vocabulary has no pad, bos and eos ids; use next_char_windows")
    return vocab.pad_id, vocab.bos_id, vocab.eos_id


def char_sequences(
    snippet: str, vocab: CharVocabulary, sequence_length: int
) -> tuple[np.ndarray, np.ndarray]:
    """TFF's next-character examples of one snippet.

    `[bos] + ids + [eos]` is padded with pad to a multiple of L + 1 and cut into
    chunks of L + 1; x = chunk[:-1], y = chunk[1:]. A snippet of n ids gives
    `ceil((n + 2) / (L + 1))` rows.

    Args:
        snippet: The text (one TFF snippet, e.g. one speech).
        vocab: A vocabulary with pad, bos and eos ids (FedJAX's or TFF's).
        sequence_length: L.

    Returns:
        `(x, y)`, int32 `[K, L]` each.

    Raises:
        ValueError: L is not a positive integer, or the vocabulary lacks pad/bos/eos.
    """
    length = _check_length("sequence_length", sequence_length)
    pad, bos, eos = _sequence_specials(vocab)
    ids = vocab.encode(snippet)
    total = ids.size + 2
    rows = -(-total // (length + 1))
    tokens = np.full(rows * (length + 1), pad, dtype=np.int32)
    tokens[0] = bos
    tokens[1 : total - 1] = ids
    tokens[total - 1] = eos
    chunks = tokens.reshape(rows, length + 1)
    return chunks[:, :-1].copy(), chunks[:, 1:].copy()


def client_char_sequences(
    snippets: Sequence[str], vocab: CharVocabulary, sequence_length: int
) -> tuple[np.ndarray, np.ndarray]:
    """FedJAX's next-character examples of one client (`shakespeare.preprocess_client`).

    The snippets, each `[bos] + ids + [eos]`, are joined into one stream s;
    x = s[:-1] and y = s[1:] are padded with pad to a multiple of L and cut into
    rows of L. With N ids in the stream, `ceil((N - 1) / L)` rows.

    Args:
        snippets: The client's snippets in order.
        vocab: A vocabulary with pad, bos and eos ids (FedJAX's or TFF's).
        sequence_length: L.

    Returns:
        `(x, y)`, int32 `[K, L]` each (K = 0 when there are no snippets).

    Raises:
        ValueError: L is not a positive integer, or the vocabulary lacks pad/bos/eos.
    """
    length = _check_length("sequence_length", sequence_length)
    pad, bos, eos = _sequence_specials(vocab)
    parts = []
    for snippet in snippets:
        parts += [np.array([bos], np.int32), vocab.encode(snippet), np.array([eos], np.int32)]
    if not parts:
        return np.zeros((0, length), np.int32), np.zeros((0, length), np.int32)
    stream = np.concatenate(parts)
    targets = stream.size - 1
    rows = -(-targets // length)
    x = np.full(rows * length, pad, dtype=np.int32)
    y = np.full(rows * length, pad, dtype=np.int32)
    x[:targets] = stream[:-1]
    y[:targets] = stream[1:]
    return x.reshape(rows, length), y.reshape(rows, length)


def leaf_normalize(text: str) -> str:
    r"""LEAF's text normalization before windowing: newlines to spaces, 2+ spaces to one.

    `shake_utils.__txt_to_data`: `raw_text.replace("\n", " ")`, then
    `re.sub(r"   *", " ", ...)` (two or more spaces become one).
    """
    return re.sub(r" {2,}", " ", text.replace("\n", " "))


def next_char_windows(ids: np.ndarray, window: int, stride: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """LEAF's next-character windows over one client's id stream.

    For i in `range(0, len(ids) - window, stride)`: x = ids[i:i+window],
    y = ids[i+window]. A stream of n ids gives `max(0, ceil((n - window) / stride))`
    windows (n - window for stride 1).

    Args:
        ids: The client's ids, 1-D (e.g. `vocab.encode(leaf_normalize(text))`).
        window: The window length (LEAF: 80; Delta-FL: 20).
        stride: The step between windows (LEAF: 1; a larger stride thins the overlapping windows).

    Returns:
        `(x, y)`: x int32 `[K, window]`, a read-only strided view of `ids` (K
        windows cost no copy; `np.array(x)` makes one), and y int32 `[K]`.

    Raises:
        ValueError: `ids` is not 1-D, or window or stride is not a positive integer.
    """
    window = _check_length("window", window)
    stride = _check_length("stride", stride)
    ids = np.asarray(ids, dtype=np.int32)
    if ids.ndim != 1:
        raise ValueError(f"ids must be 1-D, got shape {ids.shape}")
    if ids.size <= window:
        return np.zeros((0, window), np.int32), np.zeros((0,), np.int32)
    x = np.lib.stride_tricks.sliding_window_view(ids[:-1], window)[::stride]
    y = ids[window::stride]
    return x, y


# ---------------------------------------------------------------------------
# StackOverflow
# ---------------------------------------------------------------------------


class WordVocabulary:
    """StackOverflow word vocabulary with FedJAX's or TFF's id layout.

    With V words and B oov buckets:

    * `layout="fedjax"` (`google/fedjax : fedjax/datasets/stackoverflow.py`,
      `StackoverflowTokenizer`: table ids `+ 3`): pad 0, bos 1, eos 2, words
      3..V+2 in vocabulary order, oov V+3..V+2+B. The default V = 10,000, B = 1
      gives 10,004 ids, oov 10,003.
    * `layout="tff"` (`google-parfait/tensorflow-federated :
      tensorflow_federated/python/simulation/baselines/stackoverflow/
      word_prediction_preprocessing.py`, `get_special_tokens`, table ids `+ 1`):
      pad 0, words 1..V, oov V+1..V+B, bos V+B+1, eos V+B+2.

    Tokens are split on single spaces, as `tf.strings.split(tokens, sep=" ")`
    does (two spaces in a row make an empty, out-of-vocabulary token). With
    B > 1, TF hashes an unknown word into a bucket with FarmHash Fingerprint64;
    this class uses CRC-32 instead, so bucket choices (not the layout) differ
    from TF's. B = 1, the default of both libraries, is exact.

    Attributes:
        words: The vocabulary's words, most frequent first.
        layout: `"fedjax"` or `"tff"`.
        num_oov_buckets: B.
        size: V + 3 + B.
        pad_id, bos_id, eos_id: The special ids.
        oov_ids: The B oov ids; `oov_id` is the first.
    """

    def __init__(self, words: Sequence[str], num_oov_buckets: int = 1, layout: str = "fedjax"):
        """Builds the lookup.

        Args:
            words: Distinct words without special tokens (FedJAX: "This vocabulary
                should NOT have special tokens PAD, EOS, BOS, and OOV").
            num_oov_buckets: B >= 1.
            layout: `"fedjax"` or `"tff"`.

        Raises:
            ValueError: Empty or repeated words, B < 1, or an unknown layout.
        """
        words = tuple(words)
        if not words:
            raise ValueError("a word vocabulary needs at least one word")
        if len(set(words)) != len(words):
            raise ValueError("the words of a vocabulary must be distinct")
        buckets = _check_length("num_oov_buckets", num_oov_buckets)
        if layout not in ("fedjax", "tff"):
            raise ValueError(f"layout must be 'fedjax' or 'tff', got {layout!r}")
        self.words = words
        self.layout = layout
        self.num_oov_buckets = buckets
        size = len(words)
        self.size = size + 3 + buckets
        self.pad_id = 0
        if layout == "fedjax":
            self.bos_id, self.eos_id, first_word, first_oov = 1, 2, 3, size + 3
        else:
            self.bos_id, self.eos_id = size + buckets + 1, size + buckets + 2
            first_word, first_oov = 1, size + 1
        self.oov_ids = tuple(range(first_oov, first_oov + buckets))
        self.oov_id = self.oov_ids[0]
        self._index = {word: first_word + i for i, word in enumerate(words)}

    @classmethod
    def from_word_count(
        cls, word_count_text: str, vocab_size: int = 10_000, num_oov_buckets: int = 1, layout: str = "fedjax"
    ) -> WordVocabulary:
        """The top `vocab_size` words of TFF's `stackoverflow.word_count` file.

        The file has one `word count` line per word, most frequent first; the
        vocabulary is its first `vocab_size` words in file order, as TFF's
        `load_word_counts(vocab_size=...)` and FedJAX's `default_vocab` read it.

        Args:
            word_count_text: The file's content.
            vocab_size: V (TFF/FedJAX default 10,000).
            num_oov_buckets: B.
            layout: `"fedjax"` or `"tff"`.

        Raises:
            ValueError: A line that is not `word count`, or fewer than V words.
        """
        vocab_size = _check_length("vocab_size", vocab_size)
        words = []
        for number, line in enumerate(word_count_text.splitlines(), start=1):
            if len(words) == vocab_size:
                break
            if not line.strip():
                continue
            fields = line.split()
            if len(fields) != 2 or not fields[1].isdigit():
                raise ValueError(
                    f"stackoverflow.word_count line {number}: expected 'word count', got {line!r}"
                )
            words.append(fields[0])
        if len(words) < vocab_size:
            raise ValueError(
                f"stackoverflow.word_count has {len(words)} words, fewer than vocab_size={vocab_size}"
            )
        return cls(words, num_oov_buckets, layout)

    def __repr__(self) -> str:
        return (
            f"WordVocabulary(words={len(self.words)}, layout={self.layout!r}, size={self.size}, "
            f"oov_buckets={self.num_oov_buckets})"
        )

    @property
    def special_ids(self) -> tuple[int, ...]:
        """pad, the oov ids, bos, eos: the ids next-word accuracy leaves out."""
        return (self.pad_id, *self.oov_ids, self.bos_id, self.eos_id)

    def _oov(self, word: str) -> int:
        if self.num_oov_buckets == 1:
            return self.oov_id
        return self.oov_ids[zlib.crc32(word.encode("utf-8")) % self.num_oov_buckets]

    def encode(self, tokens: str) -> np.ndarray:
        """Ids of a space-separated token string (the StackOverflow `tokens` field), without bos/eos."""
        ids = []
        for word in tokens.split(" "):
            i = self._index.get(word)
            ids.append(self._oov(word) if i is None else i)
        return np.array(ids, dtype=np.int32)

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """Space-joined words of `ids`; oov ids become `<oov>`, pad/bos/eos are skipped."""
        first_word = 3 if self.layout == "fedjax" else 1
        out = []
        for i in np.asarray(ids, dtype=np.int64).reshape(-1).tolist():
            if first_word <= i < first_word + len(self.words):
                out.append(self.words[i - first_word])
            elif i in self.oov_ids:
                out.append("<oov>")
            elif not 0 <= i < self.size:
                raise ValueError(f"id {i} is outside [0, {self.size})")
        return " ".join(out)

    def bag_of_words(self, text: str) -> np.ndarray:
        """TFF's tag-prediction input: the mean one-hot of the words of `text`, float32 `[V]`.

        `tag_prediction_preprocessing.build_to_ids_fn` (TFF): `text` is
        `tokens + " " + title`, split on whitespace; each word is a one-hot over
        V + 1 (the last for any unknown word), averaged over the words, and the
        unknown column is dropped, so unknown words count in the denominator.
        Text without words gives zeros (TF's mean over no words is NaN).
        """
        words = text.split()
        bag = np.zeros(len(self.words), np.float32)
        first_word = 3 if self.layout == "fedjax" else 1
        for word in words:
            i = self._index.get(word)
            if i is not None:
                bag[i - first_word] += 1.0
        if words:
            bag /= np.float32(len(words))
        return bag


def word_sequences(
    tokens_text: str, vocab: WordVocabulary, sequence_length: int
) -> tuple[np.ndarray, np.ndarray]:
    """One StackOverflow next-word example, the way the vocabulary's library builds it.

    With w the token ids and L the sequence length, y is the same in both
    layouts, `(w + [eos])[:L]` padded with pad to L (eos appears when
    `len(w) < L`). x differs only where y is pad:

    * FedJAX (`StackoverflowTokenizer.as_preprocess_batch`): `[bos] + w + [eos]`
      then x = [:-1], y = [1:], each padded/truncated to L: x = `([bos] + w)[:L]`.
    * TFF (`build_to_ids_fn` + `batch_and_split`): `[bos] + w[:L]`, plus eos
      when `len(w) < L`, padded to L + 1; x = [:-1], y = [1:]: so x also holds
      eos when `len(w) <= L - 2`.

    Args:
        tokens_text: The space-separated `tokens` field of one post.
        vocab: The word vocabulary; its layout picks the rule.
        sequence_length: L (TFF/FedJAX default 20).

    Returns:
        `(x, y)`, int32 `[L]` each.
    """
    length = _check_length("sequence_length", sequence_length)
    ids = vocab.encode(tokens_text)
    x = np.full(length, vocab.pad_id, np.int32)
    y = np.full(length, vocab.pad_id, np.int32)
    if vocab.layout == "fedjax":
        source = np.concatenate([[vocab.bos_id], ids[: length - 1]])
    else:
        kept = ids[:length]
        tail = [vocab.eos_id] if kept.size < length else []
        source = np.concatenate([[vocab.bos_id], kept, tail])[:length]
    x[: source.size] = source
    target = np.concatenate([ids[:length], [vocab.eos_id]])[:length]
    y[: target.size] = target
    return x, y


class TagVocabulary:
    """StackOverflow tag vocabulary: the most used tags, for multi-label tag prediction.

    Built from TFF's `stackoverflow.tag_count` (a JSON object `{tag: count}`)
    as TFF does (`google-parfait/tensorflow-federated :
    tensorflow_federated/python/simulation/datasets/stackoverflow.py`
    `load_tag_counts`, sorted by decreasing count, ties in file order; and
    `baselines/stackoverflow/tag_prediction_tasks.py`, the first 500). Tag
    ids are 0..T-1 in that order; unknown tags have no id.

    Attributes:
        tags: The tags, most used first.
        size: T.
    """

    def __init__(self, tags: Sequence[str]):
        """Uses `tags` (distinct, most used first) as the vocabulary."""
        tags = tuple(tags)
        if not tags or len(set(tags)) != len(tags):
            raise ValueError("a tag vocabulary needs distinct tags, at least one")
        self.tags = tags
        self.size = len(tags)
        self._index = {tag: i for i, tag in enumerate(tags)}

    @classmethod
    def from_tag_count(cls, tag_count_text: str, vocab_size: int = 500) -> TagVocabulary:
        """The `vocab_size` most used tags of a `stackoverflow.tag_count` JSON text.

        Raises:
            ValueError: Not a JSON object of integer counts, or fewer tags than `vocab_size`.
        """
        vocab_size = _check_length("vocab_size", vocab_size)
        try:
            counts = json.loads(tag_count_text)
        except json.JSONDecodeError as error:
            raise ValueError(f"stackoverflow.tag_count is not JSON: {error}") from None
        if not isinstance(counts, Mapping) or not all(
            isinstance(c, int) and not isinstance(c, bool) for c in counts.values()
        ):
            raise ValueError("stackoverflow.tag_count must be a JSON object {tag: count}")
        ranked = sorted(counts, key=lambda tag: counts[tag], reverse=True)
        if len(ranked) < vocab_size:
            raise ValueError(
                f"stackoverflow.tag_count has {len(ranked)} tags, fewer than vocab_size={vocab_size}"
            )
        return cls(ranked[:vocab_size])

    def __repr__(self) -> str:
        return f"TagVocabulary(size={self.size})"

    def encode(self, tags: str) -> np.ndarray:
        """The ids of the known tags in a `|`-separated `tags` field, in order."""
        return np.array([self._index[t] for t in tags.split("|") if t in self._index], dtype=np.int32)

    def multi_hot(self, tags: str) -> np.ndarray:
        """TFF's tag-prediction label: float32 `[T]`, 1 for each known tag of the post.

        (TFF sums one-hots, so a tag written twice would count 2; StackOverflow
        posts do not repeat tags, and this gives 1.)
        """
        label = np.zeros(self.size, np.float32)
        label[self.encode(tags)] = 1.0
        return label


# ---------------------------------------------------------------------------
# Sent140
# ---------------------------------------------------------------------------

_LEAF_WORD_RE = re.compile(r"[\w']+|[.,!?;]")


def leaf_split_line(text: str) -> list[str]:
    r"""LEAF's Sent140 tokenizer: `re.findall(r"[\w']+|[.,!?;]", text)`.

    From `split_line` in `TalwalkarLab/leaf : models/utils/language_utils.py`
    (the same in `krishnap25/simplicial-fl`): runs of word characters and
    apostrophes, and the punctuation marks `. , ! ? ;` one at a time; anything
    else (`:`, `-`, `@`, `#`, emoji) is dropped. No lower-casing.
    """
    return _LEAF_WORD_RE.findall(text)


def line_to_indices(text: str, word_index: Mapping[str, int], max_words: int = 25) -> np.ndarray:
    """LEAF's Sent140 word ids: the first `max_words` words, unknown and padding = `len(word_index)`.

    `line_to_indices` in LEAF and simplicial-fl: each of the first `max_words`
    words of `leaf_split_line(text)` maps to `word_index[word]`, or to
    `len(word_index)` when absent (the embedding table's extra zero row); the
    list is then padded to `max_words` with the same `len(word_index)`. So
    padding and unknown words share one id. LEAF's Sent140 LSTM uses 25 words,
    the Delta-FL one 20.

    Returns:
        int32 `[max_words]`.
    """
    max_words = _check_length("max_words", max_words)
    unknown = len(word_index)
    ids = np.full(max_words, unknown, np.int32)
    for i, word in enumerate(leaf_split_line(text)[:max_words]):
        ids[i] = word_index.get(word, unknown)
    return ids
