"""jaxfl: federated learning simulation in JAX, one compiled function per round.

The public surface, by what a user does with it:

* **data**: `load_dataset`, `dataset_names`, `ClientPopulation`,
  `FederatedDataset`;
* **models and local training**: `make_model`, `Task`, `LocalTraining`,
  `ClientStrategy`;
* **the round and its stages**: `FederatedAlgorithm` (pure `init` and
  `round`), `ServerState`, `compose_round` of a `SelectStage`, a
  `ClientUpdateStage`, an `AggregateStage` and a server optimizer
  (`server_optimizer`), with `Cohort`, `ClientPlan`, `Aggregation` and
  `Robustness` (docs/write-an-algorithm.md builds FedNova from them);
* **algorithms**: one factory each (`fedavg`, ..., `scaffold`), and by name
  through the registry: `algorithm_names`, `build_algorithm`, `Engine`;
* **aggregators** (`aggregator`, `AGGREGATORS`) and **tail primitives**
  (`superquantile`, `dp_quantile`, ...);
* **runs**: `make_config`, `setup`, `run_algorithm`, `run_sweep`.

Names load on first use, so `import jaxfl` (and the command line) does not
import JAX until something needs it.
"""

import importlib

from jaxfl.algorithms.registry import algorithm_factories

__version__ = "0.1.0"

# Public name -> the module that defines it.
_PUBLIC = {
    # Data.
    "load_dataset": "jaxfl.data.registry",
    "dataset_names": "jaxfl.data.registry",
    "ClientPopulation": "jaxfl.data.population",
    "FederatedDataset": "jaxfl.data.population",
    # Models and local training.
    "make_model": "jaxfl.models.networks",
    "Task": "jaxfl.training.local",
    "LocalTraining": "jaxfl.training.local",
    "ClientStrategy": "jaxfl.training.strategies",
    # The round and its stages.
    "FederatedAlgorithm": "jaxfl.algorithms.base",
    "ServerState": "jaxfl.algorithms.base",
    "server_optimizer": "jaxfl.algorithms.base",
    "compose_round": "jaxfl.algorithms.stages",
    "SelectStage": "jaxfl.algorithms.stages",
    "ClientUpdateStage": "jaxfl.algorithms.stages",
    "AggregateStage": "jaxfl.algorithms.stages",
    "Cohort": "jaxfl.algorithms.stages",
    "ClientPlan": "jaxfl.algorithms.stages",
    "Aggregation": "jaxfl.algorithms.stages",
    "Robustness": "jaxfl.algorithms.stages",
    # Algorithms.
    "algorithm_names": "jaxfl.algorithms.registry",
    "build_algorithm": "jaxfl.algorithms.registry",
    "Engine": "jaxfl.algorithms.registry",
    # Aggregators and primitives.
    "aggregator": "jaxfl.aggregators",
    "AGGREGATORS": "jaxfl.aggregators",
    "superquantile": "jaxfl.primitives",
    "superquantile_weights": "jaxfl.primitives",
    "smoothed_superquantile": "jaxfl.primitives",
    "tilted_risk": "jaxfl.primitives",
    "hierarchical_tilted_risk": "jaxfl.primitives",
    "evar": "jaxfl.primitives",
    "tivar": "jaxfl.primitives",
    "value_at_risk": "jaxfl.primitives",
    "inverse_superquantile": "jaxfl.primitives",
    "dp_quantile": "jaxfl.primitives",
    # Runs.
    "RunConfig": "jaxfl.experiment.config",
    "make_config": "jaxfl.experiment.config",
    "setup": "jaxfl.experiment.runner",
    "run_algorithm": "jaxfl.experiment.runner",
    "run_sweep": "jaxfl.experiment.sweep",
}

# Every registered algorithm's factory (`fedavg`, `scaffold`, ...), from the registry.
_PUBLIC.update(algorithm_factories())

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'jaxfl' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value  # Later lookups skip this function.
    return value


def __dir__():
    return sorted(__all__)
