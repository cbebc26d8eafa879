"""Federated data: packed client populations and dataset generators."""

from jaxfl.data.population import (
    ClientPopulation,
    FederatedDataset,
    pack_arrays,
    pack_clients,
)
from jaxfl.data.registry import (
    DATASETS,
    dataset_names,
    dataset_options,
    load_dataset,
)
from jaxfl.data.synthetic import (
    fedprox_synthetic,
    label_shift,
    many_clients,
    peer_benchmark,
)

__all__ = [
    "DATASETS",
    "ClientPopulation",
    "FederatedDataset",
    "dataset_names",
    "dataset_options",
    "fedprox_synthetic",
    "label_shift",
    "load_dataset",
    "many_clients",
    "pack_arrays",
    "pack_clients",
    "peer_benchmark",
]
