"""Federated data: packed client populations, real and synthetic datasets, partitioners.

`load_dataset(name, data_dir=..., **options)` loads any dataset of the
registry (`jaxfl list`, docs/datasets.md); `jaxfl.data.partition` splits
labelled arrays over clients; `jaxfl.data.formats` reads the file formats.
"""

from jaxfl.data.datasets.centralized import PARTITION_DEFAULTS, PartitionOptions
from jaxfl.data.errors import DataFileError, MissingDataError
from jaxfl.data.host import HostPopulation
from jaxfl.data.population import (
    ClientPopulation,
    FederatedDataset,
    GatheredCohort,
    pack_arrays,
    pack_clients,
)
from jaxfl.data.registry import (
    DATASETS,
    dataset_names,
    dataset_options,
    dataset_run_defaults,
    load_dataset,
)
from jaxfl.data.synthetic import fedprox_synthetic, label_shift, many_clients, peer_benchmark

__all__ = [
    "DATASETS",
    "PARTITION_DEFAULTS",
    "ClientPopulation",
    "DataFileError",
    "FederatedDataset",
    "GatheredCohort",
    "HostPopulation",
    "MissingDataError",
    "PartitionOptions",
    "dataset_names",
    "dataset_options",
    "dataset_run_defaults",
    "fedprox_synthetic",
    "label_shift",
    "load_dataset",
    "many_clients",
    "pack_arrays",
    "pack_clients",
    "peer_benchmark",
]
