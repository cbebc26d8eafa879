"""A run's attack and aggregator, from its settings.

* The corrupted clients are chosen once per run from the run's seed
  (`jaxfl.attacks.corrupted_clients` with key `fold_in(key(seed),
  CORRUPTION_STREAM)`), as a fraction of the training clients (Li 2023,
  Section 5.3.1) or of their examples (RFA).
* A data attack (`--attack random-labels`, or `--attack-data` next to an
  update attack) poisons the corrupted clients' training examples once,
  before the population is placed (the authors' code poisons labels once at
  load); their test examples stay clean.
* An update attack forges the corrupted clients' updates inside every
  compiled round (`jaxfl.algorithms.stages.Robustness`).
* The aggregator (`--aggregator`) replaces the weighted mean.

Summaries of a run with an attack count the benign clients only (robustness =
their mean, fairness = their spread: Li 2023, Section 5.3 and Definitions 1
and 2); `clients.csv` marks the corrupted ones.

References:
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxfl.aggregators import aggregator
from jaxfl.algorithms.stages import Robustness
from jaxfl.attacks import DATA_ATTACKS, corrupted_clients, poison_features
from jaxfl.data.host import HostPopulation
from jaxfl.data.population import ClientPopulation, FederatedDataset
from jaxfl.experiment.config import ConfigError, RunConfig
from jaxfl.training.local import Task

PAD_ID = Task._field_defaults["pad_id"]  # jaxfl's token datasets pad targets with 0.

# fold_in data of the run key's corruption stream (apart from training's).
CORRUPTION_STREAM = 0x434F5252
POISON_STREAM = 0x504F4953


def run_aggregator(config: RunConfig):
    """The aggregator of the run's settings (`jaxfl.aggregators.aggregator`)."""
    robustness = config.robustness
    options = {
        "trimmed-mean": {"beta": robustness.trim_fraction},
        "krum": {"byzantine": robustness.byzantine},
        "multi-krum": {"byzantine": robustness.byzantine, "selected": robustness.krum_selected},
        "k-norm": {"byzantine": robustness.byzantine},
        "k-loss": {"byzantine": robustness.byzantine},
        "centered-clipping": {
            "radius": robustness.clipping_radius, "iterations": robustness.clipping_iterations
        },
        "geometric-median": {
            "nu": robustness.weiszfeld_smoothing,
            "max_iterations": robustness.weiszfeld_iterations,
            "ftol": robustness.weiszfeld_tolerance,
        },
    }.get(robustness.aggregator, {})
    try:
        return aggregator(robustness.aggregator, **options)
    except ValueError as error:
        raise ConfigError(f"aggregator: {str(error).splitlines()[0]}") from None


def update_attack_options(config: RunConfig) -> dict[str, Any]:
    """The update attack's options from the run's settings."""
    robustness = config.robustness
    return {
        "model-replacement": {"scale": robustness.attack_scale},
        "sign-flip": {"scale": 1.0 if robustness.attack_scale is None else robustness.attack_scale},
        "gaussian": {"std": robustness.attack_std},
        "ipm": {"epsilon": robustness.attack_epsilon},
        "alie": {"z": robustness.alie_z},
    }.get(robustness.attack, {})


def corrupted_training_clients(config: RunConfig, population) -> np.ndarray:
    """`[N]` bool: the run's corrupted training clients (chosen once, from the seed)."""
    robustness = config.robustness
    key = jax.random.fold_in(jax.random.key(config.runtime.seed), CORRUPTION_STREAM)
    counts = np.asarray(population.counts)
    return corrupted_clients(key, counts, robustness.attack_fraction, unit=robustness.attack_unit)


def poisoned_population(
    population: ClientPopulation | HostPopulation, corrupted: np.ndarray, attack: str, num_classes: int, key
) -> ClientPopulation:
    """The population with the corrupted clients' examples poisoned by `attack`."""
    counts = np.asarray(population.counts)
    example_is_corrupted = np.repeat(corrupted, counts)
    targets = np.asarray(population.features["y"])
    features = poison_features(
        key,
        {name: jnp.asarray(value) for name, value in population.features.items()},
        jnp.asarray(example_is_corrupted),
        attack,
        num_classes=num_classes,
        # Sequences: padding stays padding, and no poisoned label becomes it.
        pad_id=PAD_ID if targets.ndim > 1 and np.issubdtype(targets.dtype, np.integer) else None,
    )
    features = {name: np.asarray(value) for name, value in features.items()}
    if isinstance(population, HostPopulation):
        # A cached dataset: the poisoned copy is held in memory, not mapped.
        return HostPopulation.from_arrays(features, counts)
    return dataclasses.replace(population, features=features)


def run_robustness(
    config: RunConfig, dataset: FederatedDataset
) -> tuple[Robustness | None, FederatedDataset, np.ndarray | None]:
    """(the round's `Robustness` or None, the dataset after any data attack, the corrupted mask).

    A data attack on a cached dataset reads its training examples whole into
    memory (the poisoned copy).

    Raises:
      ConfigError: an invalid aggregator or attack setting.
    """
    settings = config.robustness
    aggregate = run_aggregator(config) if settings.aggregator != "mean" else None
    if settings.attack is None:
        if settings.attack_data is not None:
            raise ConfigError("attack_data needs an update attack (--attack NAME)")
        return (Robustness(aggregator=aggregate) if aggregate else None), dataset, None
    data_attack = settings.attack if settings.attack in DATA_ATTACKS else settings.attack_data
    update_attack = None if settings.attack in DATA_ATTACKS else settings.attack
    if settings.attack in DATA_ATTACKS and settings.attack_data is not None:
        raise ConfigError(f"attack_data is for update attacks; {settings.attack} is a data attack already")
    try:
        corrupted = corrupted_training_clients(config, dataset.train)
        if data_attack is not None:
            key = jax.random.fold_in(jax.random.key(config.runtime.seed), POISON_STREAM)
            train = poisoned_population(dataset.train, corrupted, data_attack, dataset.num_classes, key)
            dataset = dataclasses.replace(dataset, train=train)
    except ValueError as error:
        raise ConfigError(f"attack: {str(error).splitlines()[0]}") from None
    robustness = Robustness(
        aggregator=aggregate,
        attack=update_attack,
        attack_options=update_attack_options(config) if update_attack else None,
        attacked=corrupted,
    )
    return robustness, dataset, corrupted


def attack_record(config: RunConfig, corrupted: np.ndarray | None) -> dict[str, Any] | None:
    """The summary's `attack` object, or None without an attack."""
    if corrupted is None:
        return None
    return {
        "attack": config.robustness.attack,
        "attack_data": config.robustness.attack_data,
        "fraction": config.robustness.attack_fraction,
        "unit": config.robustness.attack_unit,
        "corrupted_clients": int(corrupted.sum()),
        "summaries_over": "benign clients (the corrupted ones are marked in clients.csv)",
    }
