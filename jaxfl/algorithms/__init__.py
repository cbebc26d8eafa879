"""Federated algorithms as pure init/round pairs over a `ServerState`.

Names load on first use: importing the registry (`jaxfl.algorithms.registry`,
which the configuration reads) imports no JAX.
"""

import importlib
import sys
import types

from jaxfl.algorithms.registry import algorithm_factories

# Public name -> the module that defines it.
_PUBLIC = {
    "FederatedAlgorithm": "jaxfl.algorithms.base",
    "ServerState": "jaxfl.algorithms.base",
    "server_optimizer": "jaxfl.algorithms.base",
    "AggregateStage": "jaxfl.algorithms.stages",
    "Aggregation": "jaxfl.algorithms.stages",
    "ClientPlan": "jaxfl.algorithms.stages",
    "ClientUpdateStage": "jaxfl.algorithms.stages",
    "Cohort": "jaxfl.algorithms.stages",
    "PersonalStage": "jaxfl.algorithms.stages",
    "RoundOptions": "jaxfl.algorithms.stages",
    "SelectStage": "jaxfl.algorithms.stages",
    "compose_round": "jaxfl.algorithms.stages",
    "SPECS": "jaxfl.algorithms.registry",
    "AlgorithmSpec": "jaxfl.algorithms.registry",
    "Engine": "jaxfl.algorithms.registry",
    "algorithm_names": "jaxfl.algorithms.registry",
    "algorithm_spec": "jaxfl.algorithms.registry",
    "build_algorithm": "jaxfl.algorithms.registry",
    "hparam_fields": "jaxfl.algorithms.registry",
}

# Every registered algorithm's factory (`fedavg`, `scaffold`, ...), from the registry.
_PUBLIC.update(algorithm_factories())

__all__ = list(_PUBLIC)


class _Package(types.ModuleType):
    """Keeps `jaxfl.algorithms.fedavg` the factory `fedavg`, not its module.

    Importing a submodule sets the package's attribute of that name to the
    module; most factories share their module's name, so that attribute is
    left unset and `__getattr__` gives the factory (modules stay importable by
    their dotted names).
    """

    def __setattr__(self, name, value):
        if name in _PUBLIC and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'jaxfl.algorithms' has no attribute {name!r}")
    module = importlib.import_module(_PUBLIC[name])
    value = getattr(module, name)
    globals()[name] = value  # Later lookups skip this function.
    return value


def __dir__():
    return sorted(__all__)
