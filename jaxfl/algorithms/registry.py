"""Algorithms by name, with what each takes from a run's configuration.

Each entry (`AlgorithmSpec`) is the one place that says, of its algorithm,

* how to build it from the shared pieces of a run (`Engine`: task,
  local-training shape, cohort size, client strategy, server optimizer,
  client weighting, number of training clients) and its static options: a
  `from_engine` function in the algorithm's own module, named by its path and
  imported only when the algorithm is built;
* which run settings are its numeric hyperparameters, put into
  `ServerState.hparams` as traced scalars (a sweep vmaps the round over
  them), beyond the local ones every algorithm takes ('lr', 'lr_decay',
  'lr_decay_period', 'l2');
* which run settings are static options (they change the compiled round),
  with their defaults (`RunConfig` takes its defaults from here);
* what it keeps and supports: per-client rows, personal models, differential
  privacy (its budget), full-batch local training, serving as Ditto's global
  solver.

This module imports no JAX (nor any algorithm): the configuration, the
command line's help and its refusals read it before anything is compiled.

Setting names are `jaxfl.experiment.config.RunConfig` field names, and the
hyperparameter names in `state.hparams` are the same names. A built
algorithm's `hparam_defaults` may hold only some of its declared
hyperparameters (Delta-FL takes 'smoothing' only with the smoothed
reweighting): `hparam_fields` says which apply.

References:
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
  [Laguel et al. 2020] Device Heterogeneity in Federated Learning: A Superquantile Approach.
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks.
  [McMahan et al. 2017] Communication-Efficient Learning of Deep Networks from Decentralized Data.
  [Mohri et al. 2019] Agnostic Federated Learning. ICML 2019.
  [McMahan et al. 2018] Learning Differentially Private Recurrent Language Models. ICLR 2018.
  [Deng et al. 2020] Adaptive Personalized Federated Learning. arXiv preprint, 2020.
  [Mansour et al. 2020] Three Approaches for Personalization with Applications to Federated Learning.
  [Fallah et al. 2020] A. Fallah, A. Mokhtari, A. Ozdaglar. Personalized
    Federated Learning with Theoretical Guarantees: A Model-Agnostic
    Meta-Learning Approach. NeurIPS 2020.
  [Karimireddy et al. 2020] SCAFFOLD: Stochastic Controlled Averaging for Federated Learning. ICML 2020.
  [Acar et al. 2021] Federated Learning Based on Dynamic Regularization. ICLR 2021.
  [Li et al. 2019] FedDANE: A Federated Newton-Type Method. Asilomar 2019.
  [Wang et al. 2020] Tackling the Objective Inconsistency Problem in Heterogeneous Federated Optimization.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optax

    from jaxfl.algorithms.base import FederatedAlgorithm
    from jaxfl.algorithms.stages import Robustness
    from jaxfl.clock import Clock
    from jaxfl.communication import UpdateCompression
    from jaxfl.data.population import ClientPopulation
    from jaxfl.privacy.budget import DpBudget
    from jaxfl.training.local import LocalTraining, Task
    from jaxfl.training.strategies import ClientStrategy


@dataclasses.dataclass(frozen=True)
class Engine:
    """What every algorithm is built on (fixed for a run).

    Attributes:
      task: model and loss.
      local: static local-training shape.
      clients_per_round: M.
      strategy: how clients are laid out on the hardware.
      server_tx: the server optimizer.
      client_weighting: 'num_examples' or 'uniform' data weights alpha_i.
      num_clients: N, the number of training clients (needed by algorithms
        with per-client server state, e.g. AFL's mixture weights).
      robustness: the run's update attack and aggregator, or None.
      compression: how clients compress their updates, or None.
      clock: the simulated clock of the rounds, or None.
      personal_validation: validation examples of the N training clients
        (validation client k = training client k), for algorithms that
        choose on them during training (Ditto's dynamic lambda), or None.
        The runner gives them to the round as the training population's
        `held_out` (`jaxfl.experiment.runner.training_input`).
    """

    task: Task
    local: LocalTraining
    clients_per_round: int
    strategy: ClientStrategy
    server_tx: optax.GradientTransformation
    client_weighting: str
    num_clients: int | None = None
    robustness: Robustness | None = None
    compression: UpdateCompression | None = None
    clock: Clock | None = None
    personal_validation: ClientPopulation | None = None

    def round_options(self) -> dict[str, Any]:
        """The `RoundOptions` of a composed round: strategy, optimizer, weighting, robustness, compression."""
        return dict(
            strategy=self.strategy,
            server_tx=self.server_tx,
            client_weighting=self.client_weighting,
            robustness=self.robustness,
            compression=self.compression,
            clock=self.clock,
        )

    def training_clients(self, algorithm: str) -> int:
        """N, for an algorithm that keeps per-client state; ValueError where the engine lacks it."""
        if self.num_clients is None:
            raise ValueError(f"{algorithm} needs the number of training clients (Engine.num_clients)")
        return self.num_clients


Builder = Callable[[Engine, Mapping[str, Any]], "FederatedAlgorithm"]


def _never(options: Mapping[str, Any]) -> bool:
    del options  # Unused.
    return False


def _always(options: Mapping[str, Any]) -> bool:
    del options  # Unused.
    return True


def _resolve(path: str) -> Any:
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
    """A registry entry.

    Attributes:
      builder: 'module:function' of its `(engine, options) ->
        FederatedAlgorithm`, called with every name of `options`, defaults
        filled in (`build`).
      description: one line for `jaxfl list`.
      hparams: run settings that are numeric hyperparameters of the
        algorithm (beyond the local ones), in `state.hparams` under the same
        names.
      options: static options (run setting -> default).
      privacy_budget: for differentially private algorithms, 'module:name'
        of its `jaxfl.privacy.budget.DpBudget` (`privacy`); None otherwise.
      client_rows: model-sized rows of per-client state the algorithm keeps
        per training client (personal models, SCAFFOLD's c_i), 0 for none:
        what the client-state layout (`--client-state`) and the memory
        checks size.
      personal_models: whether those rows make personal models, evaluated
        and saved beside the global one (Ditto's do, SCAFFOLD's do not).
      full_batch: `options -> bool`, whether its local training is then one
        full-batch gradient step per client (batch size, epochs and the step
        cap unused).
      ditto_global: whether Ditto may pull its personal models to this
        algorithm's global model (`--ditto-global`; Li 2023, Section 5.2.1:
        G is any solver of the global objective; the DP algorithms are left
        out, as their budget is calibrated per entry, and so are those with
        per-client state or a single meta-gradient step).
      inherited: the settings among `hparams` and `options` that it takes
        only to pass them to another registered algorithm (Ditto's global
        solver's); `setting_users` leaves it out of theirs.
      host_rows: whether its per-client rows may live in host memory, the
        cohort's moved in each round (not where a round reads all N).
      adapts_after_training: whether it makes every training client's
        personal model from the global one after training (N model-sized
        rows at evaluation, without per-client state during training).
    """

    builder: str
    description: str
    hparams: tuple[str, ...] = ()
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    privacy_budget: str | None = None
    client_rows: int = 0
    personal_models: bool = False
    full_batch: Callable[[Mapping[str, Any]], bool] = _never
    ditto_global: bool = False
    inherited: tuple[str, ...] = ()
    host_rows: bool = True
    adapts_after_training: bool = False

    def build(self, engine: Engine, options: Mapping[str, Any]) -> FederatedAlgorithm:
        """The algorithm, from `builder` (its module imported now)."""
        return _resolve(self.builder)(engine, options)

    @property
    def privacy(self) -> DpBudget | None:
        """How the run's privacy settings become noise and what a run spent; None without DP."""
        return None if self.privacy_budget is None else _resolve(self.privacy_budget)


_STRAGGLERS = {"stragglers": 0.0}
_DP_HISTOGRAM = {"dp_bins": 32, "dp_bits": 32}
_QFFL_VARIANT = {"qffl_variant": "fedavg"}


def _qfedsgd(options: Mapping[str, Any]) -> bool:
    return options["qffl_variant"] == "fedsgd"


SPECS: dict[str, AlgorithmSpec] = {
    "fedavg": AlgorithmSpec(
        "jaxfl.algorithms.fedavg:from_engine",
        "FedAvg (McMahan et al. 2017): average of local SGD updates; drops stragglers",
        options=_STRAGGLERS,
        ditto_global=True,
    ),
    "fedavg-sub": AlgorithmSpec(
        "jaxfl.algorithms.fedavg_sub:from_engine",
        "FedAvg on a random fraction theta of each cohort (Pillutla et al. 2023, Section 7.2)",
        hparams=("theta",),
        ditto_global=True,
    ),
    "fedsgd": AlgorithmSpec(
        "jaxfl.algorithms.fedsgd:from_engine",
        "FedSGD: one full-batch gradient per client, averaged, one server step",
        full_batch=_always,
    ),
    "fedprox": AlgorithmSpec(
        "jaxfl.algorithms.fedprox:from_engine",
        "FedProx (Li 2023, ch. 3): proximal term mu; keeps stragglers' partial work",
        hparams=("mu",),
        options=_STRAGGLERS,
        ditto_global=True,
    ),
    "qffl": AlgorithmSpec(
        "jaxfl.algorithms.qffl:from_engine",
        "q-FFL (Li 2023, ch. 4) by q-FedAvg or q-FedSGD: losses raised to q + 1",
        hparams=("q",),
        options=_QFFL_VARIANT,
        full_batch=_qfedsgd,
        ditto_global=True,
    ),
    "afl": AlgorithmSpec(
        "jaxfl.algorithms.afl:from_engine",
        "AFL (Mohri et al. 2019): minimax over client mixture weights lambda",
        hparams=("afl_lambda_lr",),
        ditto_global=True,
    ),
    "afl-qffl": AlgorithmSpec(
        "jaxfl.algorithms.qffl:afl_from_engine",
        "AFL as q-FFL with large q (q = 10; Pillutla et al. 2023, Section 7.2, Appendix C.2)",
        hparams=("q",),
        options=_QFFL_VARIANT,
        full_batch=_qfedsgd,
    ),
    "term": AlgorithmSpec(
        "jaxfl.algorithms.term:from_engine",
        "Tilted ERM at the client level (Li 2023, ch. 7): weights softmax(t F_i)",
        hparams=("tilt",),
        ditto_global=True,
    ),
    "deltafl": AlgorithmSpec(
        "jaxfl.algorithms.deltafl:from_engine",
        "Delta-FL (Pillutla et al. 2023; Laguel et al. 2020): superquantile of client losses, "
        "tail fraction theta",
        hparams=("theta", "threshold_period", "smoothing", "dp_loss_bound", "dp_sigma", "dp_scale"),
        options={"reweighting": "exact", "filtering": "server", **_DP_HISTOGRAM},
        ditto_global=True,
    ),
    "dp-fedavg": AlgorithmSpec(
        "jaxfl.algorithms.dp_fedavg:from_engine",
        "DP-FedAvg (McMahan et al. 2018): clipped updates, Gaussian noise, "
        "(epsilon, delta) client-level DP",
        hparams=("clip_norm", "dp_noise_multiplier"),
        privacy_budget="jaxfl.privacy.budget:DP_FEDAVG_BUDGET",
    ),
    "dp-deltafl": AlgorithmSpec(
        "jaxfl.algorithms.dp_deltafl:from_engine",
        "DP Delta-FL (Pillutla et al. 2023, Algorithm 4): DP quantile filter, clipped noisy "
        "updates, (epsilon, delta) client-level DP",
        hparams=("theta", "dp_loss_bound", "clip_norm", "dp_noise_multiplier", "dp_quantile_sigma"),
        options={**_DP_HISTOGRAM, "dp_scale": 10, "dp_count": "fixed"},
        privacy_budget="jaxfl.privacy.budget:DP_DELTAFL_BUDGET",
    ),
}

# The global solvers Ditto takes, in registration order.
DITTO_GLOBALS = tuple(name for name, spec in SPECS.items() if spec.ditto_global)

_DITTO_GLOBAL_SETTINGS = tuple(
    dict.fromkeys(setting for g in DITTO_GLOBALS for setting in (*SPECS[g].hparams, *SPECS[g].options))
)
_ASYNCHRONOUS = {"concurrency": None, "staleness": "polynomial"}
SPECS["fedbuff"] = AlgorithmSpec(
    "jaxfl.algorithms.fedbuff:from_engine",
    "FedBuff (Nguyen et al. 2022): asynchronous clients on the simulated clock, a server step per K = "
    "clients-per-round staleness-weighted updates",
    hparams=("staleness_exponent", "staleness_hinge"),
    options=_ASYNCHRONOUS,
)
SPECS["fedasync"] = AlgorithmSpec(
    "jaxfl.algorithms.fedasync:from_engine",
    "FedAsync (Xie et al. 2019): asynchronous clients on the simulated clock, each arrival mixed in with "
    "weight alpha s(staleness)",
    hparams=("async_mixing", "mu", "staleness_exponent", "staleness_hinge"),
    options=_ASYNCHRONOUS,
)
SPECS["ditto"] = AlgorithmSpec(
    "jaxfl.algorithms.ditto:from_engine",
    "Ditto (Li 2023, ch. 5): personal models v_k, lambda/2 ||v_k - w||^2 to the global "
    "model of --ditto-global",
    hparams=("lam", *dict.fromkeys(h for g in DITTO_GLOBALS for h in SPECS[g].hparams)),
    client_rows=1,
    personal_models=True,
    options={
        "ditto_global": "fedavg",
        "ditto_dynamic_lam": "",
        **{k: v for g in DITTO_GLOBALS for k, v in SPECS[g].options.items()},
    },
    inherited=_DITTO_GLOBAL_SETTINGS,
)
SPECS["l2sgd"] = AlgorithmSpec(
    "jaxfl.algorithms.l2sgd:from_engine",
    "L2SGD (Li 2023, App. 5.6.2): personal models w_k, lambda/2 ||w_k - mean of all w||^2; "
    "no server optimizer",
    hparams=("lam",),
    client_rows=1,
    personal_models=True,
    host_rows=False,  # Every round averages all N personal models.
)
SPECS["apfl"] = AlgorithmSpec(
    "jaxfl.algorithms.apfl:from_engine",
    "APFL (Deng et al. 2020; Li 2023, App. 5.6.2): local models v_k beside FedAvg, personal model "
    "alpha v_k + (1 - alpha) w",
    hparams=("apfl_alpha",),
    options={**_STRAGGLERS, "apfl_alpha_lr": 0.0},
    client_rows=2,  # The local models, and the mixtures made at evaluation.
    personal_models=True,
)
SPECS["mapper"] = AlgorithmSpec(
    "jaxfl.algorithms.mapper:from_engine",
    "mapper (Mansour et al. 2020; Li 2023, App. 5.6.2): local models u_k and mixing weights lam_k "
    "chosen each round, personal model lam_k u_k + (1 - lam_k) w, w trained on the interpolated losses",
    options={"mapper_candidates": "0.25,0.5,0.75"},
    client_rows=2,  # The local models, and the mixtures made at evaluation.
    personal_models=True,
)
SPECS["perfedavg"] = AlgorithmSpec(
    "jaxfl.algorithms.perfedavg:from_engine",
    "Per-FedAvg (HF) (Fallah et al. 2020; Li 2023, App. 5.6.2): MAML-trained global model, personal "
    "model one step of size alpha on each client's data",
    hparams=("perfedavg_alpha", "perfedavg_delta"),
    adapts_after_training=True,
)
SPECS["scaffold"] = AlgorithmSpec(
    "jaxfl.algorithms.scaffold:from_engine",
    "SCAFFOLD (Karimireddy et al. 2020): local steps corrected by control variates c - c_i; "
    "c_i kept per client",
    options={"scaffold_option": 2},
    client_rows=1,
)
SPECS["fednova"] = AlgorithmSpec(
    "jaxfl.algorithms.fednova:from_engine",
    "FedNova (Wang et al. 2020): updates normalized by each client's local steps; keeps stragglers' work",
    options=_STRAGGLERS,
)
SPECS["feddyn"] = AlgorithmSpec(
    "jaxfl.algorithms.feddyn:from_engine",
    "FedDyn (Acar et al. 2021): local objectives with a dynamic linear and proximal regularizer; "
    "g_k kept per client",
    hparams=("feddyn_alpha",),
    client_rows=1,
)
SPECS["feddane"] = AlgorithmSpec(
    "jaxfl.algorithms.feddane:from_engine",
    "FedDane (Li et al. 2019; Li 2023, Section 3.6): FedProx's local problems corrected by the "
    "cohort's mean gradient minus the client's",
    hparams=("mu",),
)
SPECS["qmaml"] = AlgorithmSpec(
    "jaxfl.algorithms.qmaml:from_engine",
    "q-MAML (Li 2023, Appendix 4.6.2): q-FFL's weighting of first-order MAML meta-gradients",
    hparams=("q", "perfedavg_alpha"),
    full_batch=_always,
)

# Algorithms that keep per-client state, and how many model-sized rows per
# training client they hold at once; those whose rows are personal models.
CLIENT_STATE_ALGORITHMS = {name: spec.client_rows for name, spec in SPECS.items() if spec.client_rows}
PERSONAL_MODEL_ALGORITHMS = {
    name: spec.client_rows for name, spec in SPECS.items() if spec.personal_models
}
# The differentially private algorithms, whose privacy settings the run calibrates and reports.
PRIVATE_ALGORITHMS = tuple(name for name, spec in SPECS.items() if spec.privacy_budget is not None)


def algorithm_names() -> list[str]:
    """The registered algorithms' names, in registration order."""
    return list(SPECS)


def algorithm_spec(name: str) -> AlgorithmSpec:
    """The entry registered as `name`; ValueError lists valid names."""
    if name not in SPECS:
        raise ValueError(
            f"unknown algorithm {name!r}; choose one of {', '.join(algorithm_names())}"
        )
    return SPECS[name]


def option_default(setting: str) -> Any:
    """The default of static option `setting`, the same in every entry that declares it."""
    defaults = [spec.options[setting] for spec in SPECS.values() if setting in spec.options]
    if not defaults or any(default != defaults[0] for default in defaults):
        raise ValueError(f"{setting} is declared by no entry, or with several defaults: {defaults}")
    return defaults[0]


def setting_users(setting: str) -> list[str]:
    """The entries that declare `setting` as a hyperparameter or an option of their own, in order."""
    return [
        name
        for name, spec in SPECS.items()
        if (setting in spec.hparams or setting in spec.options) and setting not in spec.inherited
    ]


def full_batch_only(names: list[str], options: Mapping[str, Any]) -> bool:
    """Whether every algorithm of `names` takes one full-batch step per client with these option values."""
    return all(algorithm_spec(name).full_batch(options) for name in names)


def build_algorithm(
    name: str, engine: Engine, options: Mapping[str, Any] | None = None
) -> FederatedAlgorithm:
    """Builds the algorithm registered as `name`.

    Args:
      name: registry name.
      engine: the shared pieces.
      options: static options (missing ones take the entry's defaults).

    Returns:
      The `FederatedAlgorithm`.

    Raises:
      ValueError: an unknown name or option, or an invalid option value.
    """
    spec = algorithm_spec(name)
    options = dict(options or {})
    unknown = sorted(set(options) - set(spec.options))
    if unknown:
        raise ValueError(
            f"{name} has no option {', '.join(unknown)}; its options: "
            f"{', '.join(spec.options) or 'none'}"
        )
    return spec.build(engine, {**spec.options, **options})


def hparam_fields(name: str, algorithm: FederatedAlgorithm) -> tuple[str, ...]:
    """The run settings that go into this built algorithm's `state.hparams`."""
    from jaxfl.algorithms.stages import LOCAL_HPARAM_DEFAULTS

    declared = (*LOCAL_HPARAM_DEFAULTS, *algorithm_spec(name).hparams)
    return tuple(field for field in declared if field in algorithm.hparam_defaults)
