"""Text vocabularies and example construction (`jaxfl/data/text.py`).

The fast constructions are checked against slow references written here as
plain Python loops from the upstream descriptions, and against small cases
worked out by hand (or copied, as id facts, from the upstream tests: TFF's
`char_prediction_preprocessing_test.py` and FedJAX's `preprocess_client`
docstring).
"""

import json

import numpy as np
import pytest

from jaxfl.data.text import (
    DELTAFL_CHARS,
    DELTAFL_SHAKESPEARE_VOCAB,
    FEDJAX_SHAKESPEARE_VOCAB,
    LEAF_CHARS,
    LEAF_SHAKESPEARE_VOCAB,
    TFF_CHAR_VOCAB,
    TFF_SHAKESPEARE_VOCAB,
    TagVocabulary,
    WordVocabulary,
    char_sequences,
    client_char_sequences,
    leaf_normalize,
    leaf_split_line,
    line_to_indices,
    next_char_windows,
    word_sequences,
)

FEDJAX = FEDJAX_SHAKESPEARE_VOCAB
TFF = TFF_SHAKESPEARE_VOCAB
LEAF = LEAF_SHAKESPEARE_VOCAB
DELTAFL = DELTAFL_SHAKESPEARE_VOCAB
ALL_CHAR_VOCABS = [FEDJAX, TFF, LEAF, DELTAFL]


def _random_text(rng, alphabet, n):
    return "".join(rng.choice(list(alphabet), size=n).tolist())


# ---------------------------------------------------------------------------
# Character vocabularies
# ---------------------------------------------------------------------------


def test_vocabulary_strings_have_the_published_sizes():
    assert len(TFF_CHAR_VOCAB) == len(set(TFF_CHAR_VOCAB)) == 86
    assert TFF_CHAR_VOCAB.startswith("dhlptx@DHLPTX $(,048cgkosw")
    assert TFF_CHAR_VOCAB.endswith("]!%)-159\r")
    assert len(LEAF_CHARS) == len(set(LEAF_CHARS)) == 80
    assert len(DELTAFL_CHARS) == 53 and DELTAFL_CHARS[0] == " "


def test_fedjax_layout():
    assert FEDJAX.size == 90
    assert (FEDJAX.pad_id, FEDJAX.bos_id, FEDJAX.eos_id, FEDJAX.oov_id) == (0, 1, 2, 89)
    np.testing.assert_array_equal(FEDJAX.encode(TFF_CHAR_VOCAB), np.arange(3, 89))
    assert FEDJAX.encode("A").dtype == np.int32


def test_tff_layout_and_ids_from_tffs_tests():
    assert TFF.size == 90
    assert (TFF.pad_id, TFF.oov_id, TFF.bos_id, TFF.eos_id) == (0, 87, 88, 89)
    np.testing.assert_array_equal(TFF.encode(TFF_CHAR_VOCAB), np.arange(1, 87))
    np.testing.assert_array_equal(TFF.encode("abc"), [64, 42, 21])
    np.testing.assert_array_equal(TFF.encode("star wars"), [25, 5, 64, 46, 14, 26, 64, 46, 25])
    np.testing.assert_array_equal(TFF.encode("a\r~"), [64, 86, TFF.oov_id])


def test_leaf_and_deltafl_layouts():
    assert LEAF.size == 80 and LEAF.special_ids == ()
    np.testing.assert_array_equal(LEAF.encode(LEAF_CHARS), np.arange(80))
    assert DELTAFL.size == 53 and DELTAFL.oov_id == 0
    assert (DELTAFL.pad_id, DELTAFL.bos_id, DELTAFL.eos_id) == (None, None, None)
    np.testing.assert_array_equal(DELTAFL.encode(DELTAFL_CHARS), np.arange(53))


@pytest.mark.parametrize("vocab", ALL_CHAR_VOCABS, ids=lambda v: v.name)
def test_special_ids_distinct_and_in_range(vocab):
    assert len(set(vocab.special_ids)) == len(vocab.special_ids)
    ids = set(vocab.char_ids.tolist()) | set(vocab.special_ids)
    assert ids == set(range(vocab.size))
    # Only Delta-FL shares an id between a character and a special token.
    shared = set(vocab.char_ids.tolist()) & set(vocab.special_ids)
    assert shared == ({0} if vocab is DELTAFL else set())


@pytest.mark.parametrize("vocab", ALL_CHAR_VOCABS, ids=lambda v: v.name)
def test_round_trip(vocab):
    rng = np.random.default_rng(0)
    text = _random_text(rng, vocab.chars, 500)
    ids = vocab.encode(text)
    assert ids.shape == (500,) and ids.dtype == np.int32
    assert ids.min() >= 0 and ids.max() < vocab.size
    assert vocab.decode(ids) == text


def test_oov_handling():
    # TFF and FedJAX look up bytes: a two-byte UTF-8 character is two oov ids.
    np.testing.assert_array_equal(FEDJAX.encode("a\u00e9~"), [FEDJAX.encode("a")[0], 89, 89, 89])
    assert FEDJAX.decode(FEDJAX.encode("a~")) == "a\ufffd"
    # LEAF has no oov id: strict by default, or drop.
    with pytest.raises(ValueError, match=r"no id for '\$'"):
        LEAF.encode("sha$l")
    np.testing.assert_array_equal(LEAF.encode("sha$l", errors="ignore"), LEAF.encode("shal"))
    with pytest.raises(ValueError, match="errors must be"):
        LEAF.encode("a", errors="replace")
    # Delta-FL maps anything unknown to 0, the space's id.
    np.testing.assert_array_equal(DELTAFL.encode("Hi, you!"), [8, 35, 0, 0, 51, 41, 47, 0])
    assert DELTAFL.decode(DELTAFL.encode("a\u00e9b")) == "a b"


def test_decode_skips_pad_bos_eos_and_checks_range():
    ids = [FEDJAX.bos_id, *FEDJAX.encode("To be").tolist(), FEDJAX.eos_id, FEDJAX.pad_id]
    assert FEDJAX.decode(ids) == "To be"
    with pytest.raises(ValueError, match=r"\[0, 90\)"):
        FEDJAX.decode([90])
    with pytest.raises(ValueError):
        LEAF.decode([-1])


# ---------------------------------------------------------------------------
# TFF and FedJAX sequences
# ---------------------------------------------------------------------------


def _tff_reference(snippet, vocab, length):
    tokens = [vocab.bos_id] + [int(i) for i in vocab.encode(snippet)] + [vocab.eos_id]
    while len(tokens) % (length + 1):
        tokens.append(vocab.pad_id)
    xs, ys = [], []
    for start in range(0, len(tokens), length + 1):
        chunk = tokens[start : start + length + 1]
        xs.append(chunk[:-1])
        ys.append(chunk[1:])
    return np.array(xs, np.int32).reshape(-1, length), np.array(ys, np.int32).reshape(-1, length)


def _fedjax_reference(snippets, vocab, length):
    stream = []
    for snippet in snippets:
        stream += [vocab.bos_id] + [int(i) for i in vocab.encode(snippet)] + [vocab.eos_id]
    x, y = stream[:-1], stream[1:]
    while len(x) % length:
        x.append(vocab.pad_id)
        y.append(vocab.pad_id)
    return np.array(x, np.int32).reshape(-1, length), np.array(y, np.int32).reshape(-1, length)


def test_char_sequences_small_cases():
    bos, eos, pad = TFF.bos_id, TFF.eos_id, TFF.pad_id
    a, b, c = TFF.encode("abc").tolist()
    # 3 characters, L = 4: one chunk of 5 = bos a b c eos, no padding.
    x, y = char_sequences("abc", TFF, 4)
    np.testing.assert_array_equal(x, [[bos, a, b, c]])
    np.testing.assert_array_equal(y, [[a, b, c, eos]])
    # L = 2: chunks of 3, "c" starts the second chunk and is never a target.
    x, y = char_sequences("abc", TFF, 2)
    np.testing.assert_array_equal(x, [[bos, a], [c, eos]])
    np.testing.assert_array_equal(y, [[a, b], [eos, pad]])
    # A last chunk of eos and padding only is kept, as TFF keeps it.
    x, y = char_sequences("ab", TFF, 2)
    np.testing.assert_array_equal(x, [[bos, a], [eos, pad]])
    np.testing.assert_array_equal(y, [[a, b], [pad, pad]])
    # The empty snippet: bos eos.
    x, y = char_sequences("", FEDJAX, 3)
    np.testing.assert_array_equal(x, [[1, 2, 0]])
    np.testing.assert_array_equal(y, [[2, 0, 0]])


def test_char_sequences_match_tffs_preprocessing_test():
    bos, eos, pad = TFF.bos_id, TFF.eos_id, TFF.pad_id
    x, y = char_sequences("a snippet", TFF, 10)
    np.testing.assert_array_equal(x, [[bos, 64, 14, 25, 45, 66, 4, 4, 65, 5]])
    np.testing.assert_array_equal(y, [[64, 14, 25, 45, 66, 4, 4, 65, 5, eos]])
    x, y = char_sequences("different snippet", TFF, 10)
    np.testing.assert_array_equal(
        x, [[bos, 1, 66, 43, 43, 65, 46, 65, 45, 5], [25, 45, 66, 4, 4, 65, 5, eos, pad, pad]]
    )
    np.testing.assert_array_equal(
        y, [[1, 66, 43, 43, 65, 46, 65, 45, 5, 14], [45, 66, 4, 4, 65, 5, eos, pad, pad, pad]]
    )


@pytest.mark.parametrize("vocab", [FEDJAX, TFF], ids=lambda v: v.name)
@pytest.mark.parametrize("length", [1, 2, 5, 20, 80])
def test_char_sequences_match_reference(vocab, length):
    rng = np.random.default_rng(length)
    for n in [0, 1, length - 1, length, length + 1, 3 * length + 2, int(rng.integers(0, 400))]:
        snippet = _random_text(rng, TFF_CHAR_VOCAB + "~\u00e9", max(n, 0))
        x, y = char_sequences(snippet, vocab, length)
        rx, ry = _tff_reference(snippet, vocab, length)
        assert x.dtype == y.dtype == np.int32
        np.testing.assert_array_equal(x, rx)
        np.testing.assert_array_equal(y, ry)


def test_client_char_sequences_fedjax_docstring_example():
    # FedJAX `preprocess_client`: [b'ABCD', b'E'], sequence_length=3.
    bos, eos, pad = 1, 2, 0
    A, B, C, D, E = FEDJAX.encode("ABCDE").tolist()
    x, y = client_char_sequences(["ABCD", "E"], FEDJAX, 3)
    np.testing.assert_array_equal(x, [[bos, A, B], [C, D, eos], [bos, E, pad]])
    np.testing.assert_array_equal(y, [[A, B, C], [D, eos, bos], [E, eos, pad]])


@pytest.mark.parametrize("length", [1, 3, 20, 80])
def test_client_char_sequences_match_reference(length):
    rng = np.random.default_rng(100 + length)
    for count in [1, 2, 7]:
        snippets = [_random_text(rng, TFF_CHAR_VOCAB, int(rng.integers(0, 200))) for _ in range(count)]
        x, y = client_char_sequences(snippets, FEDJAX, length)
        rx, ry = _fedjax_reference(snippets, FEDJAX, length)
        np.testing.assert_array_equal(x, rx)
        np.testing.assert_array_equal(y, ry)
        # No row is padding only.
        assert np.all((y != FEDJAX.pad_id).any(axis=1))
    x, y = client_char_sequences([], FEDJAX, length)
    assert x.shape == y.shape == (0, length)


def test_sequences_reject_bad_arguments():
    with pytest.raises(ValueError, match="no pad, bos and eos"):
        char_sequences("abc", LEAF, 4)
    with pytest.raises(ValueError, match="no pad, bos and eos"):
        client_char_sequences(["abc"], DELTAFL, 4)
    for bad in [0, -1, 2.0, True]:
        with pytest.raises(ValueError, match="sequence_length"):
            char_sequences("abc", TFF, bad)


# ---------------------------------------------------------------------------
# LEAF windows
# ---------------------------------------------------------------------------


def _windows_reference(ids, window, stride):
    xs, ys = [], []
    for i in range(0, len(ids) - window, stride):
        xs.append(ids[i : i + window])
        ys.append(ids[i + window])
    return np.array(xs, np.int32).reshape(-1, window), np.array(ys, np.int32)


@pytest.mark.parametrize("window", [1, 3, 20, 80])
@pytest.mark.parametrize("stride", [1, 2, 7])
def test_next_char_windows_match_loop(window, stride):
    rng = np.random.default_rng(window * 10 + stride)
    for n in [0, window - 1, window, window + 1, window + 2, 250]:
        ids = rng.integers(0, 80, max(n, 0)).tolist()
        x, y = next_char_windows(np.array(ids), window, stride)
        rx, ry = _windows_reference(ids, window, stride)
        assert x.shape == (len(ry), window) and x.dtype == y.dtype == np.int32
        np.testing.assert_array_equal(x, rx)
        np.testing.assert_array_equal(y, ry)


def test_next_char_windows_leaf_text():
    text = leaf_normalize("To be,\nor   not")
    assert text == "To be, or not"
    x, y = next_char_windows(LEAF.encode(text), 10)
    assert [LEAF.decode(row) for row in x] == ["To be, or ", "o be, or n", " be, or no"]
    assert LEAF.decode(y) == "not"
    # A view of the stream, not a copy.
    assert not x.flags.writeable
    with pytest.raises(ValueError, match="1-D"):
        next_char_windows(np.zeros((2, 3)), 2)
    with pytest.raises(ValueError, match="stride"):
        next_char_windows(np.zeros(5), 2, 0)


# ---------------------------------------------------------------------------
# StackOverflow
# ---------------------------------------------------------------------------

WORD_COUNT = "the 900\nto 800\n. 700\ni 600\na 500\nof 400\n"


def test_word_vocabulary_fedjax_layout():
    vocab = WordVocabulary.from_word_count(WORD_COUNT, vocab_size=4)
    assert vocab.words == ("the", "to", ".", "i")
    assert vocab.size == 4 + 3 + 1
    assert (vocab.pad_id, vocab.bos_id, vocab.eos_id, vocab.oov_id) == (0, 1, 2, 7)
    np.testing.assert_array_equal(vocab.encode("i to the . a"), [6, 4, 3, 5, 7])
    # Two spaces make an empty token, out of vocabulary (tf.strings.split with sep=" ").
    np.testing.assert_array_equal(vocab.encode("the  to"), [3, 7, 4])
    assert vocab.decode([1, 3, 4, 7, 2, 0]) == "the to <oov>"
    assert set(vocab.special_ids) == {0, 1, 2, 7}


def test_word_vocabulary_tff_layout():
    vocab = WordVocabulary.from_word_count(WORD_COUNT, vocab_size=4, layout="tff")
    assert (vocab.pad_id, vocab.oov_id, vocab.bos_id, vocab.eos_id) == (0, 5, 6, 7)
    np.testing.assert_array_equal(vocab.encode("i to the . a"), [4, 2, 1, 3, 5])
    buckets = WordVocabulary(["x", "y"], num_oov_buckets=3, layout="tff")
    assert buckets.oov_ids == (3, 4, 5) and (buckets.bos_id, buckets.eos_id) == (6, 7)
    assert buckets.size == 8


def test_word_vocabulary_default_size():
    text = "".join(f"w{i} {100_000 - i}\n" for i in range(10_050))
    vocab = WordVocabulary.from_word_count(text)
    assert len(vocab.words) == 10_000 and vocab.size == 10_004 and vocab.oov_id == 10_003
    np.testing.assert_array_equal(vocab.encode("w0 w9999 w10000"), [3, 10_002, 10_003])


def test_word_vocabulary_oov_buckets_and_errors():
    vocab = WordVocabulary(["a"], num_oov_buckets=4)
    ids = vocab.encode("zz yy xx ww vv uu a")
    assert set(ids[:-1].tolist()) <= set(vocab.oov_ids) and ids[-1] == 3
    np.testing.assert_array_equal(ids, vocab.encode("zz yy xx ww vv uu a"))
    with pytest.raises(ValueError, match="expected 'word count'"):
        WordVocabulary.from_word_count("the 9\nbad line here\n", vocab_size=2)
    with pytest.raises(ValueError, match="fewer than vocab_size"):
        WordVocabulary.from_word_count(WORD_COUNT, vocab_size=10)
    with pytest.raises(ValueError, match="distinct"):
        WordVocabulary(["a", "a"])
    with pytest.raises(ValueError, match="layout"):
        WordVocabulary(["a"], layout="keras")


def _word_reference(words_ids, bos, eos, pad, length, layout):
    if layout == "fedjax":
        full = [bos] + words_ids + [eos]
        x, y = full[:-1][:length], full[1:][:length]
    else:
        kept = words_ids[:length]
        seq = [bos] + kept + ([eos] if len(kept) < length else [])
        seq += [pad] * (length + 1 - len(seq))
        x, y = seq[:-1], seq[1:]
    x = x + [pad] * (length - len(x))
    y = y + [pad] * (length - len(y))
    return np.array(x, np.int32), np.array(y, np.int32)


@pytest.mark.parametrize("layout", ["fedjax", "tff"])
def test_word_sequences_match_reference(layout):
    vocab = WordVocabulary.from_word_count(WORD_COUNT, vocab_size=6, layout=layout)
    rng = np.random.default_rng(7)
    words = ["the", "to", ".", "i", "a", "of", "zebra"]
    for length in [1, 2, 5, 20]:
        for n in [1, length - 2, length - 1, length, length + 1, 3 * length]:
            text = " ".join(rng.choice(words, size=max(n, 1)).tolist())
            x, y = word_sequences(text, vocab, length)
            rx, ry = _word_reference(
                vocab.encode(text).tolist(), vocab.bos_id, vocab.eos_id, vocab.pad_id, length, layout
            )
            assert x.shape == y.shape == (length,) and x.dtype == y.dtype == np.int32
            np.testing.assert_array_equal(x, rx)
            np.testing.assert_array_equal(y, ry)


def test_word_sequences_hand_checked():
    fedjax = WordVocabulary(["the", "a", "b"])
    tff = WordVocabulary(["the", "a", "b"], layout="tff")
    # FedJAX: x never holds eos; TFF: x holds eos when it fits, where y is pad.
    np.testing.assert_array_equal(word_sequences("the a", fedjax, 4)[0], [1, 3, 4, 0])
    np.testing.assert_array_equal(word_sequences("the a", fedjax, 4)[1], [3, 4, 2, 0])
    np.testing.assert_array_equal(word_sequences("the a", tff, 4)[0], [5, 1, 2, 6])
    np.testing.assert_array_equal(word_sequences("the a", tff, 4)[1], [1, 2, 6, 0])
    # Truncated: no eos when the post has at least L tokens.
    np.testing.assert_array_equal(word_sequences("a b a", fedjax, 2)[1], [4, 5])
    np.testing.assert_array_equal(word_sequences("a b a", tff, 2)[1], [2, 3])


def test_bag_of_words():
    vocab = WordVocabulary(["the", "a", "b"])
    np.testing.assert_allclose(vocab.bag_of_words("a the  a zz"), [0.25, 0.5, 0.0])
    np.testing.assert_array_equal(vocab.bag_of_words(" "), [0.0, 0.0, 0.0])


def test_tag_vocabulary():
    counts = json.dumps({"sql": 5, "python": 9, "java": 5, "c": 1, "git": 7})
    tags = TagVocabulary.from_tag_count(counts, vocab_size=4)
    # Decreasing count, ties in file order.
    assert tags.tags == ("python", "git", "sql", "java")
    np.testing.assert_array_equal(tags.encode("java|c|python"), [3, 0])
    np.testing.assert_array_equal(tags.multi_hot("java|c|python"), [1, 0, 0, 1])
    assert tags.multi_hot("").sum() == 0
    with pytest.raises(ValueError, match="fewer than vocab_size"):
        TagVocabulary.from_tag_count(counts, vocab_size=6)
    with pytest.raises(ValueError, match="not JSON"):
        TagVocabulary.from_tag_count("{", vocab_size=1)
    with pytest.raises(ValueError, match=r"\{tag: count\}"):
        TagVocabulary.from_tag_count("[1, 2]", vocab_size=1)
    # The TFF default is the top 500.
    many = json.dumps({f"t{i}": 1000 - i for i in range(600)})
    assert TagVocabulary.from_tag_count(many).tags[-1] == "t499"


# ---------------------------------------------------------------------------
# Sent140
# ---------------------------------------------------------------------------


def test_leaf_split_line():
    assert leaf_split_line("I'm SO happy!! :) see u @bob #fun") == [
        "I'm",
        "SO",
        "happy",
        "!",
        "!",
        "see",
        "u",
        "bob",
        "fun",
    ]
    assert leaf_split_line("a,b;c...d?") == ["a", ",", "b", ";", "c", ".", ".", ".", "d", "?"]
    assert leaf_split_line("e-mail: don't_stop") == ["e", "mail", "don't_stop"]
    assert leaf_split_line("") == []


def test_line_to_indices():
    index = {"i": 0, "love": 1, "it": 2, "!": 3}
    unknown = len(index)
    np.testing.assert_array_equal(line_to_indices("I love it!", index, 6), [4, 1, 2, 3, 4, 4])
    np.testing.assert_array_equal(line_to_indices("i love it", index, 2), [0, 1])
    ids = line_to_indices("", index)
    assert ids.shape == (25,) and ids.dtype == np.int32 and (ids == unknown).all()
