"""TensorFlow Federated's legacy HDF5 files (TFF up to early 2021).

The archives `fed_emnist[_digitsonly].tar.bz2`, `shakespeare.tar.bz2`,
`stackoverflow.tar.bz2` and `fed_cifar100.tar.bz2` hold `<name>_{train,test}.h5`
(StackOverflow also `_held_out`), read by TFF's `HDF5ClientData`
(`tensorflow_federated/python/simulation/hdf5_client_data.py` at
google-parfait/tensorflow-federated 0f1518319f23). The layout:

    /examples/<client_id>/<feature>   one dataset per feature, axis 0 = examples

All features of a client have the same length; TFF sorts the client ids.
Features: EMNIST `pixels` float32 [N,28,28] and `label`; Shakespeare
`snippets` (variable-length strings); StackOverflow `creation_date`, `title`,
`score`, `tags`, `tokens`, `type`; CIFAR-100 `image` uint8 [N,32,32,3],
`label`, `coarse_label`. Labels sometimes carry a trailing unit dimension
([N, 1]), which this reader drops. Strings come back as object arrays of bytes,
as h5py 3 returns variable-length strings.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np

from jaxfl.data.errors import DataFileError
from jaxfl.data.formats._common import ClosingReader, missing_dependency, one_line, require_file

__all__ = ["TffHdf5"]

# What h5py raises for a damaged file or a layout it cannot follow.
_H5_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError)


def _bytes_array(values: np.ndarray) -> np.ndarray:
    """Strings (fixed-length `S`, or object arrays of bytes/str) as an object array of bytes."""
    out = np.empty(values.shape, dtype=object)
    flat = out.reshape(-1)
    for i, item in enumerate(values.reshape(-1)):
        flat[i] = item.encode("utf-8") if isinstance(item, str) else bytes(item)
    return out


class TffHdf5(ClosingReader):
    """One TFF HDF5 file (e.g. `fed_emnist_train.h5`), read client by client.

    The format is described in this module's docstring; it was checked
    against TFF's `hdf5_client_data.py` and `hdf5_client_data_test.py`
    (google-parfait/tensorflow-federated @ 0f1518319f23).

    Use as a context manager, or call `close()`.

    Attributes:
      path: the file.
    """

    def __init__(self, path: str | os.PathLike[str]):
        """Opens the file and lists its clients.

        Raises:
          DataFileError: missing, not HDF5, truncated, no group `examples`, or
            h5py not installed.
        """
        self.path = require_file(path)
        try:
            import h5py
        except ImportError:
            raise missing_dependency(self.path, "TFF HDF5 files", "h5py") from None
        self._h5py = h5py
        try:
            signature = h5py.is_hdf5(self.path)
        except _H5_ERRORS as err:
            raise DataFileError(f"{self.path}: cannot read ({one_line(err)})") from None
        if not signature:
            raise DataFileError(f"{self.path}: not an HDF5 file (expected a TFF HDF5 file)")
        try:
            self._file = h5py.File(self.path, "r")
        except _H5_ERRORS as err:
            message = one_line(err)
            if "truncated" in message:
                raise DataFileError(f"{self.path}: truncated HDF5 file ({message})") from None
            raise DataFileError(f"{self.path}: damaged HDF5 file ({message})") from None
        try:
            examples = self._file.get("examples")
            if not isinstance(examples, h5py.Group):
                raise DataFileError(f"{self.path}: not a TFF HDF5 file (no group 'examples')")
            self._examples = examples
            self._ids = sorted(examples.keys())
            self._features = self._client_features(self._ids[0]) if self._ids else []
        except DataFileError:
            self._file.close()
            raise
        except _H5_ERRORS as err:
            self._file.close()
            raise DataFileError(f"{self.path}: damaged HDF5 file ({one_line(err)})") from None
        except BaseException:
            self._file.close()
            raise

    def close(self) -> None:
        """Closes the file."""
        self._file.close()

    def _group(self, cid: str):
        group = self._examples.get(cid)
        if not isinstance(group, self._h5py.Group):
            raise DataFileError(f"{self.path}: examples/{cid} is not a group of features")
        return group

    def _client_features(self, cid: str) -> list[str]:
        return sorted(self._group(cid).keys())

    def features(self) -> list[str]:
        """Feature names (sorted), as found in the first client."""
        return list(self._features)

    def client_ids(self) -> list[str]:
        """Client ids, sorted."""
        return list(self._ids)

    def client_counts(self) -> list[tuple[str, int]]:
        """(client id, number of examples) for every client, by sorted client id.

        Only dataset shapes are read (of the first feature), not the data.
        """
        if not self._features:
            return [(cid, 0) for cid in self._ids]
        name = self._features[0]
        counts = []
        for cid in self._ids:
            try:
                dataset = self._group(cid).get(name)
                if not isinstance(dataset, self._h5py.Dataset) or not dataset.shape:
                    raise DataFileError(f"{self.path}: examples/{cid}/{name} is not an array of examples")
                counts.append((cid, int(dataset.shape[0])))
            except DataFileError:
                raise
            except _H5_ERRORS as err:
                raise DataFileError(f"{self.path}: damaged at examples/{cid} ({one_line(err)})") from None
        return counts

    def iter_clients(self) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        """Yields (client id, feature name -> array) for every client, by sorted client id.

        Arrays have one row per example. A trailing unit dimension ([N, 1]) is
        dropped; strings come back as object arrays of bytes.

        Raises:
          DataFileError: a client's features differ from the first client's,
            have different lengths, or the file is damaged.
        """
        for cid in self._ids:
            try:
                arrays = self._read_client(cid)
            except DataFileError:
                raise
            except _H5_ERRORS as err:
                raise DataFileError(f"{self.path}: damaged at examples/{cid} ({one_line(err)})") from None
            yield cid, arrays

    def _read_client(self, cid: str) -> dict[str, np.ndarray]:
        group = self._group(cid)
        names = sorted(group.keys())
        if names != self._features:
            raise DataFileError(
                f"{self.path}: client {cid!r} has features {names}, the first client has {self._features}"
            )
        arrays = {}
        for name in names:
            dataset = group[name]
            if not isinstance(dataset, self._h5py.Dataset) or not dataset.shape:
                raise DataFileError(f"{self.path}: examples/{cid}/{name} is not an array of examples")
            values = dataset[()]
            if values.dtype.kind in "SOU":
                values = _bytes_array(values)
            if values.ndim == 2 and values.shape[1] == 1:
                values = values.reshape(-1)
            arrays[name] = values
        lengths = {name: len(values) for name, values in arrays.items()}
        if len(set(lengths.values())) > 1:
            raise DataFileError(f"{self.path}: client {cid!r} has features of different lengths {lengths}")
        return arrays
