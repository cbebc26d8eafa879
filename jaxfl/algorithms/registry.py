"""Algorithms by name, with what each takes from a run's configuration.

Each entry (`AlgorithmSpec`) is the one place that says, of its algorithm,

* how to build it from the shared pieces of a run (`Engine`: task,
  local-training shape, cohort size, client strategy, server optimizer,
  client weighting, number of training clients) and its static options: a
  `from_engine` function in the algorithm's own module, named by its path and
  imported only when the algorithm is built;
* the run settings it reads, each declared here once with its default,
  range and help (`jaxfl.settings.Setting`; `RunConfig`, the command line's
  flags and `--help` are built from them): its numeric hyperparameters, put
  into `ServerState.hparams` as traced scalars (a sweep vmaps the round over
  them), beyond the local ones every algorithm takes ('lr', 'lr_decay',
  'lr_decay_period', 'l2'); its static options (they change the compiled
  round); what its privacy budget reads;
* what it keeps and supports: per-client rows, personal models, differential
  privacy (its budget), full-batch local training, serving as Ditto's global
  solver.

This module imports no JAX (nor any algorithm): the configuration, the
command line's help and its refusals read it before anything is compiled.

Setting names are the settings' flat names (`jaxfl.experiment.config`: the
fields of `RunConfig.options` and `RunConfig.privacy`), and the
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
  [Abadi et al. 2016] Deep Learning with Differential Privacy. CCS 2016.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from jaxfl.settings import Items, Setting

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
      server_settings: the run's server-optimizer settings (`learning_rate`,
        `momentum`, `beta1`, `beta2`, `epsilon` of `jaxfl.algorithms.base.
        server_optimizer`), with which an entry that names its own server
        optimizer (DP-FedAdam's adam) builds it in place of `server_tx`; none
        given: that optimizer's defaults.
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
    server_settings: Mapping[str, Any] | None = None

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


# What `AlgorithmSpec.build` passes a factory by parameter name.
_ENGINE_PIECES = ("task", "local", "clients_per_round")


def _resolve(path: str) -> Any:
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
    """A registry entry.

    Attributes:
      factory: 'module:function' of its public factory (`jaxfl.fedavg`,
        ...). Unless `builder` is given, `build` calls it with what its
        signature names of the run's shared pieces (task, local,
        clients_per_round, num_clients, the `RoundOptions` it names, all of
        them when it takes `**options`) and with the entry's options under
        their own names (an entry building it for another passes more).
      description: one line for `jaxfl list`.
      hparams: run settings that are numeric hyperparameters of the
        algorithm (beyond the local ones), in `state.hparams` under the same
        names: name -> `Setting`.
      options: static options: name -> `Setting`.
      privacy_budget: for differentially private algorithms, 'module:name'
        of its `jaxfl.privacy.budget.DpBudget` (`privacy`); None otherwise.
      privacy_settings: the further run settings that budget reads (name ->
        `Setting`).
      A setting several entries read is the same `Setting` in each.
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
      builder: 'module:function' of an `(engine, options) ->
        FederatedAlgorithm` for a build the factory's signature does not
        say (an inner algorithm, options parsed or renamed), or None.
      step_arrivals: for an asynchronous algorithm (its rounds are server
        steps of clients on the simulated clock), `clients_per_round -> the
        arrivals each server step takes`; None for a synchronous one.
      server_optimizer: the server optimizer the algorithm is defined with
        (DP-FedAdam's adam), built by `build` with the engine's
        `server_settings` in place of its `server_tx`; None: the engine's.
    """

    factory: str
    description: str
    hparams: Mapping[str, Setting] = dataclasses.field(default_factory=dict)
    options: Mapping[str, Setting] = dataclasses.field(default_factory=dict)
    privacy_budget: str | None = None
    privacy_settings: Mapping[str, Setting] = dataclasses.field(default_factory=dict)
    client_rows: int = 0
    personal_models: bool = False
    full_batch: Callable[[Mapping[str, Any]], bool] = _never
    ditto_global: bool = False
    inherited: tuple[str, ...] = ()
    host_rows: bool = True
    adapts_after_training: bool = False
    builder: str | None = None
    step_arrivals: Callable[[int], int] | None = None
    server_optimizer: str | None = None

    @property
    def option_defaults(self) -> dict[str, Any]:
        """Static option -> its default."""
        return {name: setting.default for name, setting in self.options.items()}

    @property
    def settings(self) -> dict[str, Setting]:
        """Every run setting it declares: hyperparameters, options and privacy settings."""
        return {**self.hparams, **self.options, **self.privacy_settings}

    def build(self, engine: Engine, options: Mapping[str, Any]) -> FederatedAlgorithm:
        """The algorithm, from `builder` or `factory` (its module imported now)."""
        if self.server_optimizer is not None:
            from jaxfl.algorithms.base import server_optimizer

            own = server_optimizer(self.server_optimizer, **(engine.server_settings or {}))
            engine = dataclasses.replace(engine, server_tx=own)
        if self.builder is not None:
            return _resolve(self.builder)(engine, options)
        factory = _resolve(self.factory)
        parameters = inspect.signature(factory).parameters
        arguments = {name: getattr(engine, name) for name in _ENGINE_PIECES if name in parameters}
        if "num_clients" in parameters:
            arguments["num_clients"] = engine.training_clients(self.factory.rpartition(":")[2])
        takes_all = any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters.values())
        arguments.update(
            {name: value for name, value in engine.round_options().items() if takes_all or name in parameters}
        )
        return factory(**arguments, **{name: options[name] for name in self.options})

    @property
    def privacy(self) -> DpBudget | None:
        """How the run's privacy settings become noise and what a run spent; None without DP."""
        return None if self.privacy_budget is None else _resolve(self.privacy_budget)


# Settings that several entries read (each entry's own are declared in it).
_STRAGGLERS = {
    "stragglers": Setting(
        0.0, "fraction in [0, 1) of each cohort that straggles (runs 1 to local_epochs - 1 epochs; needs "
        "local_epochs >= 2 where their work is kept); fedavg drops them (as apfl's and ditto's fedavg do), "
        "fedprox and fednova keep their work",
        low=0.0, high=1.0, high_open=True,
    )
}
_THETA = {
    "theta": Setting(
        0.5, "tail fraction theta in (0, 1] of the superquantile of Delta-FL (1: FedAvg); for fedavg-sub the "
        "fraction of each cohort that trains", low=0.0, high=1.0, low_open=True,
    )
}
_MU = {"mu": Setting(0.01, "proximal weight mu >= 0 (fedasync: its rho)", low=0.0)}
_Q = {
    "q": Setting(
        None, "q >= 0 of q-FFL, 0: FedAvg (unset: 1 for qffl and qmaml, 10 for afl-qffl)",
        type="float | None", low=0.0, optional=True,
    )
}
_QFFL_VARIANT = {
    "qffl_variant": Setting(
        "fedavg", "q-FedAvg or q-FedSGD (one full-batch step)", choices=("fedavg", "fedsgd")
    )
}
_LAM = {
    "lam": Setting(
        1.0, "lambda >= 0 of the personal objective F_k(v) + lambda/2 ||v - w||^2 (0: local models only; "
        "l2sgd: w the mean of the personal models)", low=0.0,
    )
}
_PERFEDAVG_ALPHA = {
    "perfedavg_alpha": Setting(
        0.01, "alpha > 0, the step of the adaptation w - alpha grad F_k(w) the MAML objective trains "
        "for (for perfedavg, also what makes each client's personal model after training)",
        low=0.0, low_open=True,
    )
}
_STALENESS_WEIGHTS = {
    "staleness_exponent": Setting(0.5, "a of the polynomial and hinge staleness weights", low=0.0),
    "staleness_hinge": Setting(4.0, "b, the staleness the hinge weight starts after", low=0.0),
}
_ASYNCHRONOUS = {
    "concurrency": Setting(
        None, "clients training at once, at least clients_per_round, the arrivals each server step takes "
        "(unset: 4 clients_per_round, at most the training clients)", type="int | None", low=1, optional=True,
    ),
    "staleness": Setting(
        "polynomial", "weight s of an update by its staleness (Xie et al. 2019): constant 1, polynomial "
        "(1 + s)^-a (a = 1/2: FedBuff's), hinge", choices=("constant", "polynomial", "hinge"),
    ),
}
_DP_HISTOGRAM = {
    "dp_bins": Setting(
        32, "histogram bins b, a power of two in [2, 65536] (deltafl: with --reweighting dp)",
        low=2, high=2**16, section="privacy",
    ),
    "dp_bits": Setting(
        32, "the secure sum is modulo 2^bits, bits in [2, 32] (deltafl: with --reweighting dp)",
        low=2, high=32, section="privacy",
    ),
}
_DP_LOSS_BOUND = {
    "dp_loss_bound": Setting(
        3.0, "loss bound B > 0 of the DP quantile (losses clipped to [0, B]; deltafl: with --reweighting dp)",
        low=0.0, low_open=True, section="privacy",
    )
}
_DP_SCALE = {
    "dp_scale": Setting(
        10, "integer scaling c >= 1 of the histograms (deltafl: with --reweighting dp)",
        low=1, section="privacy",
    )
}
_DP_UPDATES = {
    "clip_norm": Setting(1.0, "l2 norm bound C > 0 of each client's update", low=0.0, low_open=True,
                         section="privacy"),
    "dp_noise_multiplier": Setting(
        None, "noise std over the sensitivity 2C of what is noised: the cohort's update sum (dp-sgd-fedavg: "
        "each local step's gradient sum) (unset: calibrated to --epsilon; set: epsilon is only reported)",
        type="float | None", low=0.0, low_open=True, optional=True, section="privacy",
    ),
}
# What the DP algorithms' budgets read (`DpBudget.calibrate`): the guarantee is
# client-level (epsilon, delta)-DP for the whole run.
_DP_BUDGET = {
    "epsilon": Setting(
        5.0, "target epsilon > 0 of the whole run's (epsilon, delta) DP, client-level (dp-sgd-fedavg: "
        "example-level)",
        low=0.0, low_open=True, section="privacy",
    ),
    "delta": Setting(
        None, "delta in (0, 1) (unset: 1/n, n the training clients; dp-sgd-fedavg: the training examples)",
        type="float | None",
        low=0.0, high=1.0, low_open=True, high_open=True, optional=True, section="privacy",
    ),
    "dp_trust_model": Setting(
        "observer", "whom --epsilon's target protects against: observer (sees the released models, not the "
        "secret sampling: amplified) or server (samples the cohort: no amplification); both epsilons are "
        "always reported (docs/privacy.md)", choices=("observer", "server"), section="privacy",
    ),
}


def _qfedsgd(options: Mapping[str, Any]) -> bool:
    return options["qffl_variant"] == "fedsgd"


SPECS: dict[str, AlgorithmSpec] = {
    "fedavg": AlgorithmSpec(
        "jaxfl.algorithms.fedavg:fedavg",
        "FedAvg (McMahan et al. 2017): average of local SGD updates; drops stragglers",
        options=_STRAGGLERS,
        ditto_global=True,
    ),
    "fedavg-sub": AlgorithmSpec(
        "jaxfl.algorithms.fedavg_sub:fedavg_sub",
        "FedAvg on a random fraction theta of each cohort (Pillutla et al. 2023, Section 7.2)",
        hparams=_THETA,
        ditto_global=True,
    ),
    "fedsgd": AlgorithmSpec(
        "jaxfl.algorithms.fedsgd:fedsgd",
        "FedSGD: one full-batch gradient per client, averaged, one server step",
        full_batch=_always,
    ),
    "fedprox": AlgorithmSpec(
        "jaxfl.algorithms.fedprox:fedprox",
        "FedProx (Li 2023, ch. 3): proximal term mu; keeps stragglers' partial work",
        hparams=_MU,
        options=_STRAGGLERS,
        ditto_global=True,
    ),
    "qffl": AlgorithmSpec(
        "jaxfl.algorithms.qffl:qffl",
        "q-FFL (Li 2023, ch. 4) by q-FedAvg or q-FedSGD: losses raised to q + 1",
        builder="jaxfl.algorithms.qffl:from_engine",
        hparams=_Q,
        options=_QFFL_VARIANT,
        full_batch=_qfedsgd,
        ditto_global=True,
    ),
    "afl": AlgorithmSpec(
        "jaxfl.algorithms.afl:afl",
        "AFL (Mohri et al. 2019): minimax over client mixture weights lambda",
        builder="jaxfl.algorithms.afl:from_engine",
        hparams={
            "afl_lambda_lr": Setting(
                0.01, "step size gamma_lambda > 0 of the ascent on the mixture weights",
                low=0.0, low_open=True,
            )
        },
        ditto_global=True,
    ),
    "afl-qffl": AlgorithmSpec(
        "jaxfl.algorithms.qffl:qffl",
        "AFL as q-FFL with large q (q = 10; Pillutla et al. 2023, Section 7.2, Appendix C.2)",
        builder="jaxfl.algorithms.qffl:afl_from_engine",
        hparams=_Q,
        options=_QFFL_VARIANT,
        full_batch=_qfedsgd,
    ),
    "term": AlgorithmSpec(
        "jaxfl.algorithms.term:term",
        "Tilted ERM at the client level (Li 2023, ch. 7): weights softmax(t F_i); with --sample-tilt, "
        "hierarchical (each client's examples tilted by tau)",
        hparams={
            "tilt": Setting(
                1.0, "tilt t (any real) of the client-level tilted risk; t > 0 favours clients of high loss, "
                "t -> 0 is FedAvg"
            ),
        },
        options={
            "sample_tilt": Setting(
                None, "tau (any real) of hierarchical tilting: each client's loss, in its local steps and in "
                "the server's weights, is the tau-tilted risk of its examples (Li 2023, eq. 7.83); tau < 0 "
                "discounts a client's outlying examples; set, it is a sweepable hyperparameter; unset: each "
                "client's mean loss", type="float | None", optional=True,
            ),
        },
        ditto_global=True,
    ),
    "deltafl": AlgorithmSpec(
        "jaxfl.algorithms.deltafl:deltafl",
        "Delta-FL (Pillutla et al. 2023; Laguel et al. 2020): superquantile of client losses, "
        "tail fraction theta",
        hparams={
            **_THETA,
            "threshold_period": Setting(
                1, "with --reweighting threshold|dp: recompute the threshold every T_eta >= 1 rounds "
                "(Laguel et al. 2020, Algorithm 1), reuse it in between", low=1,
            ),
            "smoothing": Setting(
                0.1, "with --reweighting smoothed: KL smoothing nu > 0", low=0.0, low_open=True
            ),
            **_DP_LOSS_BOUND,
            "dp_sigma": Setting(
                1.0, "with --reweighting dp: discrete Gaussian noise sigma in [0, 1e6] per client (the "
                "sampler's range)", low=0.0, section="privacy",
            ),
            **_DP_SCALE,
        },
        options={
            "reweighting": Setting(
                "exact", "client weights from the losses: threshold (Pillutla et al. 2023, Alg. 1), exact "
                "(Alg. 3), dp (Alg. 1 with the DP quantile of Alg. 2), smoothed (eq. 15)",
                choices=("threshold", "exact", "dp", "smoothed"),
            ),
            "filtering": Setting(
                "server", "with --reweighting threshold|dp: the server filters clients, or clients filter "
                "themselves on the broadcast threshold (Laguel et al. 2020, Alg. 3)",
                choices=("server", "client"),
            ),
            **_DP_HISTOGRAM,
        },
        ditto_global=True,
    ),
    "dp-fedavg": AlgorithmSpec(
        "jaxfl.algorithms.dp_fedavg:dp_fedavg",
        "DP-FedAvg (McMahan et al. 2018): clipped updates, Gaussian noise, "
        "(epsilon, delta) client-level DP",
        builder="jaxfl.algorithms.dp_fedavg:from_engine",
        hparams=_DP_UPDATES,
        privacy_budget="jaxfl.privacy.budget:DP_FEDAVG_BUDGET",
        privacy_settings=_DP_BUDGET,
    ),
    "dp-deltafl": AlgorithmSpec(
        "jaxfl.algorithms.dp_deltafl:dp_deltafl",
        "DP Delta-FL (Pillutla et al. 2023, Algorithm 4): DP quantile filter, clipped noisy "
        "updates, (epsilon, delta) client-level DP",
        builder="jaxfl.algorithms.dp_deltafl:from_engine",
        hparams={
            **_THETA,
            **_DP_LOSS_BOUND,
            **_DP_UPDATES,
            "dp_quantile_sigma": Setting(
                None, "discrete Gaussian sigma in [0.5, 1e6] of the quantile per client (unset: calibrated "
                "from the noise multiplier and --dp-quantile-ratio)",
                type="float | None", low=0.5, optional=True, section="privacy",
            ),
        },
        options={
            **_DP_HISTOGRAM,
            **_DP_SCALE,
            "dp_count": Setting(
                "fixed", "the update's divisor: fixed (theta*m, public before the round: sound) or exact "
                "(m_t, the clients that passed: the assumption of Pillutla et al. 2023, App. D, m_t released "
                "and not accounted)", choices=("fixed", "exact"), section="privacy",
            ),
        },
        privacy_budget="jaxfl.privacy.budget:DP_DELTAFL_BUDGET",
        privacy_settings={
            **_DP_BUDGET,
            "dp_quantile_ratio": Setting(
                0.25, "r > 0, the quantile's per-round zCDP budget over the update's (Pillutla et al. 2023, "
                "App. D.2)", low=0.0, low_open=True, section="privacy",
            ),
        },
    ),
}

# The global solvers Ditto takes, in registration order.
DITTO_GLOBALS = tuple(name for name, spec in SPECS.items() if spec.ditto_global)

SPECS["fedbuff"] = AlgorithmSpec(
    "jaxfl.algorithms.fedbuff:fedbuff",
    "FedBuff (Nguyen et al. 2022): asynchronous clients on the simulated clock, a server step per K = "
    "clients-per-round staleness-weighted updates",
    builder="jaxfl.algorithms.fedbuff:from_engine",
    hparams=_STALENESS_WEIGHTS,
    options=_ASYNCHRONOUS,
    step_arrivals=lambda clients_per_round: clients_per_round,
)
SPECS["fedasync"] = AlgorithmSpec(
    "jaxfl.algorithms.fedasync:fedasync",
    "FedAsync (Xie et al. 2019): asynchronous clients on the simulated clock, each arrival mixed in with "
    "weight alpha s(staleness)",
    builder="jaxfl.algorithms.fedasync:from_engine",
    hparams={
        "async_mixing": Setting(
            0.6, "alpha in (0, 1], the mixing weight of a fresh update", low=0.0, high=1.0, low_open=True
        ),
        **_MU,
        **_STALENESS_WEIGHTS,
    },
    options=_ASYNCHRONOUS,
    step_arrivals=lambda clients_per_round: 1,
)
SPECS["ditto"] = AlgorithmSpec(
    "jaxfl.algorithms.ditto:ditto",
    "Ditto (Li 2023, ch. 5): personal models v_k, lambda/2 ||v_k - w||^2 to the global "
    "model of --ditto-global",
    builder="jaxfl.algorithms.ditto:from_engine",
    hparams={**_LAM, **{h: s for g in DITTO_GLOBALS for h, s in SPECS[g].hparams.items()}},
    client_rows=1,
    personal_models=True,
    options={
        "ditto_global": Setting(
            "fedavg", "the global algorithm G whose model the personal models are pulled to",
            choices=DITTO_GLOBALS,
        ),
        "ditto_dynamic_lam": Setting(
            "", "dynamic lambda (Li 2023, Appendix 5.7.2), candidates such as 0.1,1,2 tried at every "
            "personal step, each client keeping the one of least loss on its own validation examples (needs "
            "--client-validation-split); clients with fewer than 4 use --lam ('': off)",
            items=Items(twin="lam", empty="off"),
        ),
        **{k: s for g in DITTO_GLOBALS for k, s in SPECS[g].options.items()},
    },
    inherited=tuple(
        dict.fromkeys(setting for g in DITTO_GLOBALS for setting in (*SPECS[g].hparams, *SPECS[g].options))
    ),
)
SPECS["l2sgd"] = AlgorithmSpec(
    "jaxfl.algorithms.l2sgd:l2sgd",
    "L2SGD (Li 2023, App. 5.6.2): personal models w_k, lambda/2 ||w_k - mean of all w||^2; "
    "no server optimizer",
    builder="jaxfl.algorithms.l2sgd:from_engine",
    hparams=_LAM,
    client_rows=1,
    personal_models=True,
    host_rows=False,  # Every round averages all N personal models.
)
SPECS["apfl"] = AlgorithmSpec(
    "jaxfl.algorithms.apfl:apfl",
    "APFL (Deng et al. 2020; Li 2023, App. 5.6.2): local models v_k beside FedAvg, personal model "
    "alpha v_k + (1 - alpha) w",
    builder="jaxfl.algorithms.apfl:from_engine",
    hparams={
        "apfl_alpha": Setting(
            0.5, "alpha in [0, 1] of the personal model alpha v_k + (1 - alpha) w (0: the global model; 1: "
            "local models)", low=0.0, high=1.0,
        )
    },
    options={
        **_STRAGGLERS,
        "apfl_alpha_lr": Setting(
            0.0, "> 0 adapts each client's own alpha_k by SGD with this step size (APFL's adaptive alpha, "
            "starting at --apfl-alpha); 0: one fixed alpha, as Li 2023 compares it", low=0.0,
        ),
    },
    client_rows=2,  # The local models, and the mixtures made at evaluation.
    personal_models=True,
)
SPECS["mapper"] = AlgorithmSpec(
    "jaxfl.algorithms.mapper:mapper",
    "mapper (Mansour et al. 2020; Li 2023, App. 5.6.2): local models u_k and mixing weights lam_k "
    "chosen each round, personal model lam_k u_k + (1 - lam_k) w, w trained on the interpolated losses",
    builder="jaxfl.algorithms.mapper:from_engine",
    options={
        "mapper_candidates": Setting(
            "0.25,0.5,0.75", "the mixing weights lam in [0, 1] each sampled client tries every round, "
            "keeping the one whose personal model lam u_k + (1 - lam) w has the least training loss",
            items=Items(low=0.0, high=1.0),
        )
    },
    client_rows=2,  # The local models, and the mixtures made at evaluation.
    personal_models=True,
)
SPECS["perfedavg"] = AlgorithmSpec(
    "jaxfl.algorithms.perfedavg:perfedavg",
    "Per-FedAvg (HF) (Fallah et al. 2020; Li 2023, App. 5.6.2): MAML-trained global model, personal "
    "model one step of size alpha on each client's data",
    builder="jaxfl.algorithms.perfedavg:from_engine",
    hparams={
        **_PERFEDAVG_ALPHA,
        "perfedavg_delta": Setting(
            1e-3, "delta > 0 of the finite-difference Hessian-vector product (the HF variant)",
            low=0.0, low_open=True,
        ),
    },
    adapts_after_training=True,
)
SPECS["scaffold"] = AlgorithmSpec(
    "jaxfl.algorithms.scaffold:scaffold",
    "SCAFFOLD (Karimireddy et al. 2020): local steps corrected by control variates c - c_i; "
    "c_i kept per client",
    builder="jaxfl.algorithms.scaffold:from_engine",
    options={
        "scaffold_option": Setting(
            2, "the control-variate update c_i+ of Karimireddy et al. 2020, Algorithm 1: 1 = the client's "
            "full-data gradient at the server model (Option I), 2 = c_i - c + (x - y_i)/(K lr) (Option II)",
            choices=(1, 2),
        )
    },
    client_rows=1,
)
SPECS["fednova"] = AlgorithmSpec(
    "jaxfl.algorithms.fednova:fednova",
    "FedNova (Wang et al. 2020): updates normalized by each client's local steps; keeps stragglers' work",
    options=_STRAGGLERS,
)
SPECS["feddyn"] = AlgorithmSpec(
    "jaxfl.algorithms.feddyn:feddyn",
    "FedDyn (Acar et al. 2021): local objectives with a dynamic linear and proximal regularizer; "
    "g_k kept per client",
    hparams={
        "feddyn_alpha": Setting(
            0.01, "alpha > 0 of the dynamic regularizer -<g_k, w> + alpha/2 ||w - w_t||^2 (Acar et al. 2021 "
            "tune it in {0.1, 0.01, 0.001})", low=0.0, low_open=True,
        )
    },
    client_rows=1,
)
SPECS["feddane"] = AlgorithmSpec(
    "jaxfl.algorithms.feddane:feddane",
    "FedDane (Li et al. 2019; Li 2023, Section 3.6): FedProx's local problems corrected by the "
    "cohort's mean gradient minus the client's",
    hparams=_MU,
)
SPECS["qmaml"] = AlgorithmSpec(
    "jaxfl.algorithms.qmaml:qmaml",
    "q-MAML (Li 2023, Appendix 4.6.2): q-FFL's weighting of first-order MAML meta-gradients",
    hparams={**_Q, **_PERFEDAVG_ALPHA},
    full_batch=_always,
)

SPECS["adadps"] = AlgorithmSpec(
    "jaxfl.algorithms.adadps:adadps",
    "AdaDPS-FL (Li 2023, Alg. 10): DP-FedAvg whose local gradients are divided by public side "
    "information A; DP-FedAvg's privacy",
    builder="jaxfl.algorithms.adadps:from_engine",
    hparams=_DP_UPDATES,
    options={
        "side_information": Setting(
            None, "an .npz file of the side information A: one array per parameter, named by its path "
            "('dense/kernel'), broadcastable to its shape, finite and > 0; public knowledge only, never "
            "the training clients' data (unset: A = 1, DP-FedAvg)", type="str | None", optional=True,
            section="privacy",
        )
    },
    privacy_budget="jaxfl.privacy.budget:DP_FEDAVG_BUDGET",
    privacy_settings=_DP_BUDGET,
)
SPECS["dp-fedadam"] = AlgorithmSpec(
    "jaxfl.algorithms.dp_fedavg:dp_fedavg",
    "DP-FedAdam (Li 2023, Section 6.4.2): DP-FedAvg with the adam server optimizer on its noisy mean",
    builder="jaxfl.algorithms.dp_fedavg:dp_fedadam_from_engine",
    hparams=_DP_UPDATES,
    privacy_budget="jaxfl.privacy.budget:DP_FEDAVG_BUDGET",
    privacy_settings=_DP_BUDGET,
    server_optimizer="adam",
)
SPECS["dp2"] = AlgorithmSpec(
    "jaxfl.algorithms.dp2:dp2",
    "DP^2-FL (Li et al. 2023; Li 2023, Alg. 11): DP-FedAvg rounds alternating SGD and RMSProp phases, "
    "local gradients divided by a delayed second moment of the released updates; DP-FedAvg's privacy",
    builder="jaxfl.algorithms.dp2:from_engine",
    hparams={
        **_DP_UPDATES,
        "dp2_sgd_rounds": Setting(10, "s1: rounds of each private SGD phase", low=1),
        "dp2_rmsprop_rounds": Setting(10, "s2: rounds of each private RMSProp (preconditioned) phase", low=1),
        "dp2_beta": Setting(0.9, "beta in [0, 1) of the second moment's refresh (rmsprop, yogi)",
                            low=0.0, high=1.0, high_open=True),
        "dp2_eps": Setting(1e-3, "eps > 0 of the preconditioner sqrt(v) + eps", low=0.0, low_open=True),
        "dp2_lr": Setting(0.01, "local learning rate of the RMSProp phase (--lr is the SGD phase's)",
                          low=0.0, low_open=True),
        "dp2_clip_norm": Setting(1.0, "update clip C2 > 0 of the RMSProp phase (--clip-norm is the SGD "
                                 "phase's)", low=0.0, low_open=True, section="privacy"),
    },
    options={
        "dp2_variant": Setting(
            "rmsprop", "how the delayed second moment v is refreshed from the last SGD phase's mean "
            "pseudo-gradient g: rmsprop (beta v + (1 - beta) g^2), adagrad (v + g^2), yogi",
            choices=("rmsprop", "adagrad", "yogi"),
        )
    },
    privacy_budget="jaxfl.privacy.budget:DP_FEDAVG_BUDGET",
    privacy_settings=_DP_BUDGET,
)
SPECS["dp-sgd-fedavg"] = AlgorithmSpec(
    "jaxfl.algorithms.dp_sgd_fedavg:dp_sgd_fedavg",
    "FedAvg whose clients train by DP-SGD (Abadi et al. 2016): example-level DP, per-example clipping and "
    "Gaussian noise in every local step",
    hparams={
        "example_clip_norm": Setting(
            1.0, "l2 norm bound C > 0 of each example's gradient in a local DP-SGD step", low=0.0,
            low_open=True, section="privacy",
        ),
        "dp_noise_multiplier": _DP_UPDATES["dp_noise_multiplier"],
    },
    privacy_budget="jaxfl.privacy.budget:EXAMPLE_DP_BUDGET",
    privacy_settings=_DP_BUDGET,
)

# Algorithms that keep per-client state, and how many model-sized rows per
# training client they hold at once; those whose rows are personal models.
CLIENT_STATE_ALGORITHMS = {name: spec.client_rows for name, spec in SPECS.items() if spec.client_rows}
PERSONAL_MODEL_ALGORITHMS = {
    name: spec.client_rows for name, spec in SPECS.items() if spec.personal_models
}
# The asynchronous algorithms: always on the simulated clock.
ASYNCHRONOUS_ALGORITHMS = tuple(name for name, spec in SPECS.items() if spec.step_arrivals is not None)
# The differentially private algorithms, whose privacy settings the run calibrates and reports.
PRIVATE_ALGORITHMS = tuple(name for name, spec in SPECS.items() if spec.privacy_budget is not None)


def algorithm_factories() -> dict[str, str]:
    """Each entry's factory by its public name -> its module (a factory shares its module's name)."""
    modules = dict.fromkeys(spec.factory.partition(":")[0] for spec in SPECS.values())
    return {module.rpartition(".")[2]: module for module in modules}


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


def algorithm_settings() -> dict[str, Setting]:
    """Every setting the entries declare, in registration order; ValueError where two differ on one."""
    declared: dict[str, Setting] = {}
    for name, spec in SPECS.items():
        for setting, declaration in spec.settings.items():
            if declared.setdefault(setting, declaration) != declaration:
                raise ValueError(f"{name} declares {setting} unlike the entries before it")
    return declared


def setting_users(setting: str) -> list[str]:
    """The entries that declare `setting` as a setting of their own (not inherited), in order."""
    return [
        name for name, spec in SPECS.items() if setting in spec.settings and setting not in spec.inherited
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
    return spec.build(engine, {**spec.option_defaults, **options})


def hparam_fields(name: str, algorithm: FederatedAlgorithm) -> tuple[str, ...]:
    """The run settings that go into this built algorithm's `state.hparams`."""
    from jaxfl.algorithms.stages import LOCAL_HPARAM_DEFAULTS

    declared = (*LOCAL_HPARAM_DEFAULTS, *algorithm_spec(name).hparams)
    return tuple(field for field in declared if field in algorithm.hparam_defaults)
