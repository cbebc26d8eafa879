"""Algorithms by name, with what each takes from a run's configuration.

Each entry (`AlgorithmSpec`) declares

* how to build the algorithm from the shared pieces of a run (`Engine`: task,
  local-training shape, cohort size, client strategy, server optimizer,
  client weighting, number of training clients) and its static options;
* which run settings are its numeric hyperparameters, put into
  `ServerState.hparams` as traced scalars (a sweep vmaps the round over
  them), beyond the local ones every algorithm takes ('lr', 'lr_decay',
  'lr_decay_period', 'l2');
* which run settings are static options (they change the compiled round),
  with their defaults.

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
from collections.abc import Callable, Mapping
from typing import Any

import optax

from jaxfl.algorithms.afl import afl
from jaxfl.algorithms.apfl import apfl
from jaxfl.algorithms.base import FederatedAlgorithm
from jaxfl.algorithms.deltafl import deltafl
from jaxfl.algorithms.ditto import ditto, lambda_candidates
from jaxfl.algorithms.dp_deltafl import dp_deltafl
from jaxfl.algorithms.dp_fedavg import dp_fedavg
from jaxfl.algorithms.fedavg import fedavg
from jaxfl.algorithms.fedavg_sub import fedavg_sub
from jaxfl.algorithms.feddane import feddane
from jaxfl.algorithms.feddyn import feddyn
from jaxfl.algorithms.fednova import fednova
from jaxfl.algorithms.fedprox import fedprox
from jaxfl.algorithms.fedsgd import fedsgd
from jaxfl.algorithms.l2sgd import l2sgd
from jaxfl.algorithms.mapper import MAPPER_CANDIDATES, mapper
from jaxfl.algorithms.perfedavg import perfedavg
from jaxfl.algorithms.qffl import qffl
from jaxfl.algorithms.qmaml import qmaml
from jaxfl.algorithms.scaffold import scaffold
from jaxfl.algorithms.stages import LOCAL_HPARAM_DEFAULTS, Robustness
from jaxfl.algorithms.term import term
from jaxfl.data.population import ClientPopulation
from jaxfl.privacy.budget import DP_DELTAFL_BUDGET, DP_FEDAVG_BUDGET, DpBudget
from jaxfl.training.local import LocalTraining, Task
from jaxfl.training.strategies import ClientStrategy

# The q of "AFL as q-FFL with large q" (Pillutla et al. 2023, Section 7.2, Appendix C.2).
AFL_QFFL_Q = 10.0


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
    personal_validation: ClientPopulation | None = None


Builder = Callable[[Engine, Mapping[str, Any]], FederatedAlgorithm]


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
    """A registry entry.

    Attributes:
      build: `(engine, options) -> FederatedAlgorithm`; `options` holds every
        name of `options`, defaults filled in.
      description: one line for `jaxfl list`.
      hparams: run settings that are numeric hyperparameters of the
        algorithm (beyond the local ones), in `state.hparams` under the same
        names.
      options: static options (run setting -> default).
      privacy: for differentially private algorithms, how the run's privacy
        settings become noise hyperparameters before training and what the
        run spent after it (`jaxfl.privacy.budget.DpBudget`); None otherwise.
      client_rows: model-sized rows of per-client state the algorithm keeps
        per training client (personal models, SCAFFOLD's c_i), 0 for none:
        what the client-state layout (`--client-state`) and the memory
        checks size.
      personal_models: whether those rows make personal models, evaluated
        and saved beside the global one (Ditto's do, SCAFFOLD's do not).
    """

    build: Builder
    description: str
    hparams: tuple[str, ...] = ()
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    privacy: DpBudget | None = None
    client_rows: int = 0
    personal_models: bool = False


def _shared(engine: Engine) -> dict[str, Any]:
    return dict(
        strategy=engine.strategy,
        server_tx=engine.server_tx,
        client_weighting=engine.client_weighting,
        robustness=engine.robustness,
    )


def _build_afl(engine: Engine, options: Mapping[str, Any]) -> FederatedAlgorithm:
    del options  # Unused.
    if engine.num_clients is None:
        raise ValueError(
            "afl needs the number of training clients (Engine.num_clients)"
        )
    return afl(
        engine.task,
        engine.local,
        engine.clients_per_round,
        engine.num_clients,
        strategy=engine.strategy,
        server_tx=engine.server_tx,
        robustness=engine.robustness,
    )


SPECS: dict[str, AlgorithmSpec] = {
    "fedavg": AlgorithmSpec(
        lambda engine, options: fedavg(
            engine.task,
            engine.local,
            engine.clients_per_round,
            stragglers=options["stragglers"],
            **_shared(engine),
        ),
        "FedAvg (McMahan et al. 2017): average of local SGD updates; drops stragglers",
        options={"stragglers": 0.0},
    ),
    "fedavg-sub": AlgorithmSpec(
        lambda engine, options: fedavg_sub(
            engine.task, engine.local, engine.clients_per_round, **_shared(engine)
        ),
        "FedAvg on a random fraction theta of each cohort (Pillutla et al. 2023, Section 7.2)",
        hparams=("theta",),
    ),
    "fedsgd": AlgorithmSpec(
        lambda engine, options: fedsgd(
            engine.task, engine.clients_per_round, **_shared(engine)
        ),
        "FedSGD: one full-batch gradient per client, averaged, one server step",
    ),
    "fedprox": AlgorithmSpec(
        lambda engine, options: fedprox(
            engine.task,
            engine.local,
            engine.clients_per_round,
            stragglers=options["stragglers"],
            **_shared(engine),
        ),
        "FedProx (Li 2023, ch. 3): proximal term mu; keeps stragglers' partial work",
        hparams=("mu",),
        options={"stragglers": 0.0},
    ),
    "qffl": AlgorithmSpec(
        lambda engine, options: qffl(
            engine.task,
            engine.local,
            engine.clients_per_round,
            variant=options["qffl_variant"],
            **_shared(engine),
        ),
        "q-FFL (Li 2023, ch. 4) by q-FedAvg or q-FedSGD: losses raised to q + 1",
        hparams=("q",),
        options={"qffl_variant": "fedavg"},
    ),
    "afl": AlgorithmSpec(
        _build_afl,
        "AFL (Mohri et al. 2019): minimax over client mixture weights lambda",
        hparams=("afl_lambda_lr",),
    ),
    "afl-qffl": AlgorithmSpec(
        lambda engine, options: qffl(
            engine.task,
            engine.local,
            engine.clients_per_round,
            variant=options["qffl_variant"],
            q=AFL_QFFL_Q,
            name="afl-qffl",
            **_shared(engine),
        ),
        "AFL as q-FFL with large q (q = 10; Pillutla et al. 2023, Section 7.2, Appendix C.2)",
        hparams=("q",),
        options={"qffl_variant": "fedavg"},
    ),
    "term": AlgorithmSpec(
        lambda engine, options: term(
            engine.task, engine.local, engine.clients_per_round, **_shared(engine)
        ),
        "Tilted ERM at the client level (Li 2023, ch. 7): weights softmax(t F_i)",
        hparams=("tilt",),
    ),
    "deltafl": AlgorithmSpec(
        lambda engine, options: deltafl(
            engine.task,
            engine.local,
            engine.clients_per_round,
            reweighting=options["reweighting"],
            filtering=options["filtering"],
            dp_bins=options["dp_bins"],
            dp_bits=options["dp_bits"],
            **_shared(engine),
        ),
        "Delta-FL (Pillutla et al. 2023; Laguel et al. 2020): superquantile of client losses, "
        "tail fraction theta",
        hparams=(
            "theta",
            "threshold_period",
            "smoothing",
            "dp_loss_bound",
            "dp_sigma",
            "dp_scale",
        ),
        options={
            "reweighting": "exact",
            "filtering": "server",
            "dp_bins": 32,
            "dp_bits": 32,
        },
    ),
    "dp-fedavg": AlgorithmSpec(
        lambda engine, options: dp_fedavg(
            engine.task,
            engine.local,
            engine.clients_per_round,
            strategy=engine.strategy,
            server_tx=engine.server_tx,
            robustness=engine.robustness,
        ),
        "DP-FedAvg (McMahan et al. 2018): clipped updates, Gaussian noise, "
        "(epsilon, delta) client-level DP",
        hparams=("clip_norm", "dp_noise_multiplier"),
        privacy=DP_FEDAVG_BUDGET,
    ),
    "dp-deltafl": AlgorithmSpec(
        lambda engine, options: dp_deltafl(
            engine.task,
            engine.local,
            engine.clients_per_round,
            strategy=engine.strategy,
            server_tx=engine.server_tx,
            dp_bins=options["dp_bins"],
            dp_bits=options["dp_bits"],
            dp_scale=options["dp_scale"],
            count=options["dp_count"],
            robustness=engine.robustness,
        ),
        "DP Delta-FL (Pillutla et al. 2023, Algorithm 4): DP quantile filter, clipped noisy "
        "updates, (epsilon, delta) client-level DP",
        hparams=(
            "theta",
            "dp_loss_bound",
            "clip_norm",
            "dp_noise_multiplier",
            "dp_quantile_sigma",
        ),
        options={"dp_bins": 32, "dp_bits": 32, "dp_scale": 10, "dp_count": "fixed"},
        privacy=DP_DELTAFL_BUDGET,
    ),
}

# The global solvers Ditto takes (Li 2023 (thesis), Section 5.2.1: G is any
# "function that aggregates the local objectives"). The DP algorithms are left
# out: their budget is calibrated per registry entry, and Ditto's personal
# steps would need their own account.
DITTO_GLOBALS = ("fedavg", "fedprox", "fedavg-sub", "qffl", "term", "deltafl", "afl")


def _build_ditto(engine: Engine, options: Mapping[str, Any]) -> FederatedAlgorithm:
    global_name = options["ditto_global"]
    if global_name not in DITTO_GLOBALS:
        raise ValueError(
            f"ditto_global must be one of {', '.join(DITTO_GLOBALS)}, got {global_name!r}"
        )
    if engine.num_clients is None:
        raise ValueError("ditto needs the number of training clients (Engine.num_clients)")
    if options["ditto_dynamic_lam"] and engine.personal_validation is None:
        raise ValueError(
            "ditto's dynamic lambda needs the training clients' own validation examples "
            "(Engine.personal_validation)"
        )
    inner_spec = SPECS[global_name]
    inner = inner_spec.build(engine, {k: options[k] for k in inner_spec.options})
    return ditto(
        inner,
        engine.task,
        engine.local,
        engine.clients_per_round,
        engine.num_clients,
        strategy=engine.strategy,
        dynamic_lam=lambda_candidates(options["ditto_dynamic_lam"]),
    )


SPECS["ditto"] = AlgorithmSpec(
    _build_ditto,
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
)

def _build_l2sgd(engine: Engine, options: Mapping[str, Any]) -> FederatedAlgorithm:
    del options  # None.
    robustness = engine.robustness
    if robustness is not None and (
        (robustness.aggregator is not None and robustness.aggregator.name != "mean")
        or robustness.attack is not None
    ):
        raise ValueError(
            "l2sgd sends no updates to aggregate: robust aggregators and update attacks do not apply "
            "(data attacks do)"
        )
    if engine.num_clients is None:
        raise ValueError("l2sgd needs the number of training clients (Engine.num_clients)")
    return l2sgd(
        engine.task, engine.local, engine.clients_per_round, engine.num_clients, strategy=engine.strategy
    )


SPECS["l2sgd"] = AlgorithmSpec(
    _build_l2sgd,
    "L2SGD (Li 2023, App. 5.6.2): personal models w_k, lambda/2 ||w_k - mean of all w||^2; "
    "no server optimizer",
    hparams=("lam",),
    client_rows=1,
    personal_models=True,
)

def _build_apfl(engine: Engine, options: Mapping[str, Any]) -> FederatedAlgorithm:
    if engine.num_clients is None:
        raise ValueError("apfl needs the number of training clients (Engine.num_clients)")
    global_algorithm = SPECS["fedavg"].build(engine, options)
    return apfl(
        global_algorithm,
        engine.task,
        engine.local,
        engine.clients_per_round,
        engine.num_clients,
        strategy=engine.strategy,
        alpha_lr=options["apfl_alpha_lr"],
    )


SPECS["apfl"] = AlgorithmSpec(
    _build_apfl,
    "APFL (Deng et al. 2020; Li 2023, App. 5.6.2): local models v_k beside FedAvg, personal model "
    "alpha v_k + (1 - alpha) w",
    hparams=("apfl_alpha",),
    options={"stragglers": 0.0, "apfl_alpha_lr": 0.0},
    client_rows=2,  # The local models, and the mixtures made at evaluation.
    personal_models=True,
)

def _build_mapper(engine: Engine, options: Mapping[str, Any]) -> FederatedAlgorithm:
    if engine.num_clients is None:
        raise ValueError("mapper needs the number of training clients (Engine.num_clients)")
    candidates = lambda_candidates(options["mapper_candidates"], "mapper_candidates")
    if not candidates:
        raise ValueError(
            "mapper_candidates needs at least one mixing weight in [0, 1], such as 0.25,0.5,0.75"
        )
    return mapper(
        engine.task,
        engine.local,
        engine.clients_per_round,
        engine.num_clients,
        candidates=candidates,
        **_shared(engine),
    )


SPECS["mapper"] = AlgorithmSpec(
    _build_mapper,
    "mapper (Mansour et al. 2020; Li 2023, App. 5.6.2): local models u_k and mixing weights lam_k "
    "chosen each round, personal model lam_k u_k + (1 - lam_k) w, w trained on the interpolated losses",
    options={"mapper_candidates": ",".join(f"{lam:g}" for lam in MAPPER_CANDIDATES)},
    client_rows=2,  # The local models, and the mixtures made at evaluation.
    personal_models=True,
)


def _build_perfedavg(engine: Engine, options: Mapping[str, Any]) -> FederatedAlgorithm:
    del options  # None.
    if engine.local.batch_size < 3:
        raise ValueError(
            f"perfedavg deals each minibatch into three parts (D, D', D''): batch_size must be >= 3, "
            f"got {engine.local.batch_size}"
        )
    return perfedavg(engine.task, engine.local, engine.clients_per_round, **_shared(engine))


SPECS["perfedavg"] = AlgorithmSpec(
    _build_perfedavg,
    "Per-FedAvg (HF) (Fallah et al. 2020; Li 2023, App. 5.6.2): MAML-trained global model, personal "
    "model one step of size alpha on each client's data",
    hparams=("perfedavg_alpha", "perfedavg_delta"),
)


def _build_scaffold(engine: Engine, options: Mapping[str, Any]) -> FederatedAlgorithm:
    if engine.num_clients is None:
        raise ValueError("scaffold needs the number of training clients (Engine.num_clients)")
    return scaffold(
        engine.task,
        engine.local,
        engine.clients_per_round,
        engine.num_clients,
        control_option=options["scaffold_option"],
        **_shared(engine),
    )


SPECS["scaffold"] = AlgorithmSpec(
    _build_scaffold,
    "SCAFFOLD (Karimireddy et al. 2020): local steps corrected by control variates c - c_i; "
    "c_i kept per client",
    options={"scaffold_option": 2},
    client_rows=1,
)
SPECS["fednova"] = AlgorithmSpec(
    lambda engine, options: fednova(
        engine.task,
        engine.local,
        engine.clients_per_round,
        stragglers=options["stragglers"],
        **_shared(engine),
    ),
    "FedNova (Wang et al. 2020): updates normalized by each client's local steps; keeps stragglers' work",
    options={"stragglers": 0.0},
)


def _build_feddyn(engine: Engine, options: Mapping[str, Any]) -> FederatedAlgorithm:
    del options  # None.
    if engine.num_clients is None:
        raise ValueError("feddyn needs the number of training clients (Engine.num_clients)")
    return feddyn(engine.task, engine.local, engine.clients_per_round, engine.num_clients, **_shared(engine))


SPECS["feddyn"] = AlgorithmSpec(
    _build_feddyn,
    "FedDyn (Acar et al. 2021): local objectives with a dynamic linear and proximal regularizer; "
    "g_k kept per client",
    hparams=("feddyn_alpha",),
    client_rows=1,
)
SPECS["feddane"] = AlgorithmSpec(
    lambda engine, options: feddane(engine.task, engine.local, engine.clients_per_round, **_shared(engine)),
    "FedDane (Li et al. 2019; Li 2023, Section 3.6): FedProx's local problems corrected by the "
    "cohort's mean gradient minus the client's",
    hparams=("mu",),
)
SPECS["qmaml"] = AlgorithmSpec(
    lambda engine, options: qmaml(engine.task, engine.clients_per_round, **_shared(engine)),
    "q-MAML (Li 2023, Appendix 4.6.2): q-FFL's weighting of first-order MAML meta-gradients",
    hparams=("q", "perfedavg_alpha"),
)

# Algorithms that keep per-client state, and how many model-sized rows per
# training client they hold at once; those whose rows are personal models.
CLIENT_STATE_ALGORITHMS = {name: spec.client_rows for name, spec in SPECS.items() if spec.client_rows}
PERSONAL_MODEL_ALGORITHMS = {
    name: spec.client_rows for name, spec in SPECS.items() if spec.personal_models
}

# name -> (builder, description): the registry's original shape, kept for
# callers that only list names and descriptions.
ALGORITHMS: dict[str, tuple[Builder, str]] = {
    name: (spec.build, spec.description) for name, spec in SPECS.items()
}


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
    declared = (*LOCAL_HPARAM_DEFAULTS, *algorithm_spec(name).hparams)
    return tuple(field for field in declared if field in algorithm.hparam_defaults)
