"""Datasets by name: `load_dataset("label-shift", partition_seed=3)`.

Each entry maps a name to a generator of `jaxfl.data.synthetic` plus the
options the name fixes (`synthetic-iid` fixes `iid=True`) or defaults
differently (`synthetic` defaults to Synthetic(1, 1)). A dataset's options are
its generator's keyword arguments minus the fixed ones, so the generator's
docstring documents them and its argument checks give the error messages.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from jaxfl.data.population import FederatedDataset
from jaxfl.data.synthetic import (
    fedprox_synthetic,
    label_shift,
    many_clients,
    peer_benchmark,
)

__all__ = [
    "DATASETS",
    "DatasetSpec",
    "dataset_names",
    "dataset_options",
    "load_dataset",
]


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """How a dataset name maps to a generator.

    Attributes:
      generator: the function that builds the dataset.
      summary: one line for listings (CLI help, README).
      defaults: option values used when the caller does not give them, where
        they differ from the generator's own defaults.
      fixed: arguments the name sets and the caller may not.
    """

    generator: Callable[..., FederatedDataset]
    summary: str
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    fixed: Mapping[str, Any] = dataclasses.field(default_factory=dict)


DATASETS: Mapping[str, DatasetSpec] = {
    "label-shift": DatasetSpec(
        generator=label_shift,
        summary=(
            "Delta-FL label shift (004 App. D.2): 2500/500/500 clients of 100 "
            "examples, 20 features, 10 classes"
        ),
    ),
    "synthetic": DatasetSpec(
        generator=fedprox_synthetic,
        summary=(
            "FedProx Synthetic(alpha, beta), default Synthetic(1,1): 100 "
            "clients, 60 features, 10 classes"
        ),
        defaults={"alpha": 1.0, "beta": 1.0},
        fixed={"iid": False},
    ),
    "synthetic-iid": DatasetSpec(
        generator=fedprox_synthetic,
        summary="FedProx Synthetic-IID: 100 clients, 60 features, 10 classes",
        # The IID variant ignores alpha and beta: fixed so that no caller
        # thinks they change anything.
        fixed={"iid": True, "alpha": 0.0, "beta": 0.0},
    ),
    "peer-benchmark": DatasetSpec(
        generator=peer_benchmark,
        summary=(
            "the peers' FedAvg workload: 100 clients of 20-400 examples, "
            "784 -> 62 (or num_features=60, num_classes=10)"
        ),
    ),
    "many-clients": DatasetSpec(
        generator=many_clients,
        summary="population scaling: num_clients clients of 1-10 examples",
        defaults={"num_clients": 10_000},
    ),
}


def dataset_names() -> list[str]:
    """The registered dataset names, sorted."""
    return sorted(DATASETS)


def _spec(name: str) -> DatasetSpec:
    try:
        return DATASETS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown dataset {name!r}; valid datasets: {', '.join(dataset_names())}"
        ) from None


def dataset_options(name: str) -> dict[str, Any]:
    """The options of dataset `name` and their default values.

    Raises:
      ValueError: an unknown dataset name.
    """
    spec = _spec(name)
    options = {}
    for parameter in inspect.signature(spec.generator).parameters.values():
        if parameter.name in spec.fixed:
            continue
        if parameter.name in spec.defaults:
            options[parameter.name] = spec.defaults[parameter.name]
        elif parameter.default is not inspect.Parameter.empty:
            options[parameter.name] = parameter.default
        else:
            raise AssertionError(
                f"dataset {name!r}: option {parameter.name!r} has no default; "
                "give it one in DATASETS"
            )
    return options


def load_dataset(name: str, **options: Any) -> FederatedDataset:
    """Generates the dataset registered as `name`.

    Args:
      name: one of `dataset_names()`.
      **options: keyword arguments of the dataset's generator (see
        `dataset_options(name)` and the generator's docstring).

    Returns:
      The `FederatedDataset`.

    Raises:
      ValueError: an unknown dataset or option, or an option outside its
        range; the message names the dataset, the option and what is allowed.
    """
    spec = _spec(name)
    valid = dataset_options(name)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        fixed_note = ""
        if any(option in spec.fixed for option in unknown):
            fixed_note = f" ({', '.join(sorted(spec.fixed))} are set by the name)"
        raise ValueError(
            f"dataset {name!r} has no option {unknown[0]!r}{fixed_note}; "
            f"valid options: {', '.join(sorted(valid))}"
        )
    arguments = {**valid, **options, **spec.fixed}
    try:
        return spec.generator(**arguments)
    except ValueError as error:
        raise ValueError(f"dataset {name!r}: {error}") from error
