"""`read_hiv1_cleavage` on cleavage files written here, against a loop written from TERM's
`create_datasets.py` (`convert_to_binary`, `data_loader_hiv`)."""

from __future__ import annotations

import numpy as np
import pytest

from jaxfl.data.errors import DataFileError, MissingDataError
from jaxfl.data.formats import read_hiv1_cleavage

FILES = {
    "746Data.txt": "SLNLRETN,1\nAAKFERQH,-1\n",
    "1625Data.txt": "ARVLAEAM,1\n\nYVTTSTRT,-1\nWWTEYWQA,-1\n",
    "schillingData.txt": "PQNFLQSR,1\n",
}


def reference(folder):
    letters = "ARNDCQEGHILKMFPSTWYV"
    x, y = [], []
    for name in sorted(p.name for p in folder.iterdir()):
        for line in (folder / name).read_text().splitlines():
            if not line.strip():
                continue
            octamer, label = line.strip().split(",")
            x.append(np.concatenate([np.eye(20)[letters.index(c)] for c in octamer]))
            y.append(0 if label == "-1" else 1)
    return np.array(x), np.array(y)


def test_the_one_hot_octamers_match_terms_loader(tmp_path):
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    x, y, sources = read_hiv1_cleavage(tmp_path)
    expected_x, expected_y = reference(tmp_path)
    assert x.shape == (6, 160) and x.dtype == np.uint8
    np.testing.assert_array_equal(x, expected_x)
    np.testing.assert_array_equal(y, expected_y)
    assert sources == ["1625Data.txt"] * 3 + ["746Data.txt"] * 2 + ["schillingData.txt"]
    single_x, single_y, _ = read_hiv1_cleavage(tmp_path / "746Data.txt")
    np.testing.assert_array_equal(single_x, x[3:5])


def test_missing_files_and_bad_lines_are_one_line_errors(tmp_path):
    with pytest.raises(MissingDataError, match="no such file or directory"):
        read_hiv1_cleavage(tmp_path / "nowhere")
    with pytest.raises(MissingDataError, match="no \\*.txt file"):
        read_hiv1_cleavage(tmp_path)
    for bad in ("SLNLRETN,2", "SLNLRET,1", "SLNLRETB,1", "SLNLRETN"):
        (tmp_path / "a.txt").write_text(f"AAKFERQH,-1\n{bad}\n")
        with pytest.raises(DataFileError, match=r"a.txt:2: .*expected lines of 8 amino-acid letters"):
            read_hiv1_cleavage(tmp_path)
