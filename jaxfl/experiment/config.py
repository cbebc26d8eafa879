"""The configuration of a run: every setting, its default, its allowed range.

`RunConfig` holds the settings in frozen sections (`config.data.dataset`,
`config.local.lr`, `config.server.rounds`, `config.options.theta`, ...;
`SECTIONS`), and each setting also has one flat name, unique over the
sections, that is its flag and config-file key. One table (the fields'
metadata) drives the command-line flags, the config-file keys and the
validation, so the three never disagree. The run-level sections are
declared here; each algorithm's own settings are declared once in its
registry entry (`jaxfl.algorithms.registry`) and make the `options` and
`privacy` sections from there. Errors are `ConfigError`s whose message is one line
naming the field and what is allowed; the CLI prints it and exits with
status 2.

References:
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
  [Laguel et al. 2020] Device Heterogeneity in Federated Learning: A Superquantile Approach.
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import sys
import tomllib
import types
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, ClassVar

from jaxfl.algorithms.registry import (
    CLIENT_STATE_ALGORITHMS,
    PRIVATE_ALGORITHMS,
    SPECS,
    algorithm_settings,
    setting_users,
)
from jaxfl.algorithms.registry import (
    full_batch_only as _registry_full_batch_only,
)
from jaxfl.settings import Items, Setting

# The registries' names (checked against them in tests/experiment/test_config.py);
# kept here so that reading a config imports no model or preset code.
MODEL_NAMES = (
    "linear", "mlp", "convnet", "embedding-bag", "bag-logistic", "emnist-cr-cnn", "leaf-cnn", "resnet18-gn",
    "deltafl-convnet", "char-lstm", "char-gru", "word-lstm", "transformer", "sent140-lstm",
    "mean-embedding-logistic",
)
AGGREGATOR_NAMES = (
    "mean", "median", "trimmed-mean", "krum", "multi-krum", "norm-clipping", "k-norm", "k-loss",
    "centered-clipping", "geometric-median",
)
DATA_ATTACK_NAMES = ("random-labels", "label-flip", "label-shift-7", "negate-inputs", "invert-inputs")
UPDATE_ATTACK_NAMES = (
    "random-updates", "model-replacement", "sign-flip", "gaussian", "omniscient", "alie", "ipm",
)
COMPRESSOR_NAMES = ("qsgd", "rand-k", "top-k")
TASK_PRESETS = (
    "shakespeare-fedavg", "shakespeare-deltafl", "emnist-cr", "femnist-leaf", "stackoverflow-nwp",
    "stackoverflow-lr", "cifar100-resnet", "sent140-lstm", "fmnist-dirichlet",
)


class ConfigError(ValueError):
    """An invalid configuration value; the message is one line for users."""


def _field(default, help, **declaration) -> dataclasses.Field:
    """A run-level field (`jaxfl.settings.Setting`)."""
    return Setting(default, help, **declaration).field()


@dataclasses.dataclass(frozen=True)
class DataSettings:
    """Where the clients and their examples come from, and the clients' own held-out splits."""

    TITLE: ClassVar[str] = "data"

    dataset: str = _field(
        "label-shift", "dataset name (`jaxfl list` shows them), or tfds:NAME for a prepared TFDS dataset"
    )
    dataset_options: Mapping[str, Any] = _field(
        {},
        "dataset options (config file: a table; flag: KEY=VALUE, repeatable)",
        flag=False,
    )
    data_dir: str | None = _field(
        None,
        "directory holding the dataset's files (TFF, FedJAX, LEAF, TFDS, IDX, CIFAR); "
        "the format is detected from what it holds",
        optional=True,
    )
    residency: str = _field(
        "auto",
        "where the training clients' examples live: device, host (memory-mapped; each "
        "round's cohort gathered and copied one call ahead), auto (device when it fits)",
        choices=("auto", "device", "host"),
    )
    client_split: float | None = _field(
        None,
        "personalization: hold out this fraction in (0, 1) of every training client's "
        "examples as its own test data (test client k = training client k; the "
        "dataset's test clients are not used)",
        low=0.0, high=1.0, low_open=True, high_open=True, optional=True,
    )
    client_validation_split: float | None = _field(
        None,
        "with client_split: also hold out this fraction in (0, 1) of every training client's examples "
        "as its own validation data (Li 2023, Appendix 5.7.4: 0.08 with client_split 0.2 gives 72/8/20)",
        low=0.0, high=1.0, low_open=True, high_open=True, optional=True,
    )


@dataclasses.dataclass(frozen=True)
class NetworkSettings:
    """The model the clients train."""

    TITLE: ClassVar[str] = "model"

    model: str = _field(
        "linear",
        "model",
        choices=MODEL_NAMES, default_text="the dataset's, see `jaxfl list`",
    )
    hidden_sizes: tuple[int, ...] = _field((64,), "hidden layer widths of the mlp", flag=False)
    embedding_dim: int = _field(32, "embedding-bag: width of the token embeddings", low=1)


@dataclasses.dataclass(frozen=True)
class LocalSettings:
    """A client's local training in each round."""

    TITLE: ClassVar[str] = "local training"

    local_epochs: int = _field(1, "local epochs per client", low=1, high=10_000)
    batch_size: int = _field(10, "local minibatch size (B)", low=1)
    max_local_steps: int | None = _field(
        None, "cap on a client's local steps", low=1, optional=True
    )
    lr: float = _field(0.1, "local learning rate lr0", low=0.0, low_open=True)
    lr_decay: float = _field(
        1.0, "step decay factor c of lr0*c**floor(t/t0) (1: constant)",
        low=0.0, high=1.0, low_open=True,
    )
    lr_decay_period: int = _field(
        1_000_000_000, "rounds t0 between learning-rate decays", low=1
    )
    l2: float = _field(0.0, "l2 regularization lambda", low=0.0)


@dataclasses.dataclass(frozen=True)
class ServerSettings:
    """The rounds, the cohort and the server's optimizer."""

    TITLE: ClassVar[str] = "rounds and the server"

    rounds: int = _field(2000, "communication rounds", low=1)
    clients_per_round: int = _field(100, "clients sampled per round (M)", low=1)
    client_weighting: str = _field(
        "num_examples", "client weights alpha_i", choices=("num_examples", "uniform")
    )
    server_optimizer: str = _field(
        "sgd",
        "server optimizer (Reddi et al. 2021): sgd, avgm (FedAvgM), adagrad, adam, yogi",
        choices=("sgd", "avgm", "adagrad", "adam", "yogi"),
    )
    server_lr: float = _field(1.0, "server learning rate", low=0.0, low_open=True)
    server_momentum: float | None = _field(
        None, "server momentum of sgd and avgm (unset: 0 for sgd, 0.9 for avgm)",
        low=0.0, high=1.0, high_open=True, optional=True,
    )
    server_beta1: float = _field(
        0.9, "adam, yogi: first-moment decay beta1 of the server optimizer", low=0.0, high=1.0, high_open=True
    )
    server_beta2: float = _field(
        0.99, "adam, yogi: second-moment decay beta2 of the server optimizer",
        low=0.0, high=1.0, high_open=True,
    )
    server_epsilon: float = _field(
        1e-3, "adagrad, adam, yogi: adaptivity epsilon (tau of Reddi et al.; its value matters)",
        low=0.0, low_open=True,
    )


@dataclasses.dataclass(frozen=True)
class PersonalizationSettings:
    """Where per-client state lives, and the fine-tuning baselines after training."""

    TITLE: ClassVar[str] = "personalization"

    client_state: str = _field(
        "auto", "where per-client state (personal models, control variates: "
        f"{', '.join(CLIENT_STATE_ALGORITHMS)}) lives: replicated on each device, split over the devices "
        "of a sharded strategy (each holding N/D), or in host memory with the cohort's moved to the device "
        "each round (host; not "
        f"{', '.join(name for name, spec in SPECS.items() if spec.client_rows and not spec.host_rows)}, not "
        "sweeps); auto: replicated, split "
        "when the replicated copies would take over a quarter of the memory, host when on an accelerator "
        "even the split ones would (docs/personalization.md)",
        choices=("auto", "split", "replicated", "host"),
    )
    finetune_epochs: int = _field(
        0, "personalization baseline: after training, each training client fine-tunes the global "
        "model for this many epochs of local SGD at --lr (Li 2023, Section 5.3.4: 50), reported as its "
        "personal model (0: off)", low=0, high=10_000,
    )
    finetune_ewc: float | None = _field(
        None, "personalization baseline EWC (Li 2023, Appendix 5.6.2): fine-tune with lambda/2 sum_i F_ii "
        "(w_i - w*_i)^2, F the diagonal Fisher of the global model w* on each client's first "
        "minibatch; needs --finetune-epochs", low=0.0, optional=True,
    )
    finetune_skl: float | None = _field(
        None, "personalization baseline SKL (Li 2023, Appendix 5.6.2): fine-tune with lambda/2 "
        "(KL(f(w) || f(w*)) + KL(f(w*) || f(w))) on each minibatch, f the softmax output, w* the global "
        "model; needs --finetune-epochs", low=0.0, optional=True,
    )


@dataclasses.dataclass(frozen=True)
class RobustnessSettings:
    """The robust aggregator (`jaxfl.aggregators`; docs/aggregators.md) and the corrupted clients' attack
    (`jaxfl.attacks`; docs/attacks.md).
    """

    TITLE: ClassVar[str] = "robust aggregation and attacks"

    aggregator: str = _field(
        "mean", "how the server combines the cohort's updates (algorithms that average "
        "weighted updates)", choices=AGGREGATOR_NAMES,
    )
    byzantine: int = _field(
        0, "krum, multi-krum, k-norm, k-loss: f, the corrupted clients expected per cohort", low=0,
    )
    krum_selected: int = _field(0, "multi-krum: m updates averaged (0: n - f)", low=0)
    trim_fraction: float = _field(
        0.1, "trimmed-mean: fraction beta in [0, 0.5) trimmed from each end", low=0.0, high=0.5,
        high_open=True,
    )
    clipping_radius: float = _field(
        10.0, "centered-clipping: radius tau > 0", low=0.0, low_open=True,
    )
    clipping_iterations: int = _field(1, "centered-clipping: iterations L >= 1", low=1, high=1000)
    weiszfeld_smoothing: float = _field(
        1e-6, "geometric-median: smoothing nu > 0 of Weiszfeld's weights", low=0.0, low_open=True,
    )
    weiszfeld_iterations: int = _field(
        4, "geometric-median: at most this many Weiszfeld iterations", low=1, high=1000,
    )
    weiszfeld_tolerance: float = _field(
        1e-6, "geometric-median: stop when the objective changes by less than this fraction",
        low=0.0,
    )
    attack: str | None = _field(
        None, "what the corrupted clients do: a data attack (once, on their training "
        "examples) or an update attack (in every round)",
        choices=(*DATA_ATTACK_NAMES, *UPDATE_ATTACK_NAMES), optional=True,
    )
    attack_data: str | None = _field(
        None, "a data attack the corrupted clients also apply with an update attack (Li 2023's "
        "A2/A3 as the authors ran them: random-labels)",
        choices=DATA_ATTACK_NAMES, optional=True,
    )
    attack_fraction: float = _field(
        0.2, "fraction in [0, 1] of the corrupted clients (or examples, --attack-unit)",
        low=0.0, high=1.0,
    )
    attack_unit: str = _field(
        "clients", "attack_fraction counts clients (Li 2023) or examples (RFA)",
        choices=("clients", "examples"),
    )
    attack_scale: float | None = _field(
        None, "model-replacement: scale (unset: clients per round); sign-flip: scale (unset: 1)",
        low=0.0, low_open=True, optional=True,
    )
    attack_std: float = _field(1.0, "gaussian attack: std > 0", low=0.0, low_open=True)
    attack_epsilon: float = _field(0.1, "ipm attack: epsilon > 0", low=0.0, low_open=True)
    alie_z: float | None = _field(
        None, "alie attack: z (unset: Baruch et al.'s z from n and f)", optional=True,
    )


@dataclasses.dataclass(frozen=True)
class CommunicationSettings:
    """How clients compress their updates (`jaxfl.communication`; docs/communication.md)."""

    TITLE: ClassVar[str] = "compressed updates"

    compression: str | None = _field(
        None, "how clients compress their updates: qsgd (stochastic quantization), rand-k or top-k "
        "sparsification (unset: float32 updates); every run counts its bytes up and down",
        choices=COMPRESSOR_NAMES, optional=True,
    )
    compression_bits: int = _field(4, "qsgd: bits per quantization level (2^bits - 1 levels)", low=1, high=16)
    compression_fraction: float = _field(
        0.01, "rand-k, top-k: share of the update's coordinates sent, in (0, 1]",
        low=0.0, high=1.0, low_open=True,
    )
    compression_bucket: int | None = _field(
        None, "qsgd: quantize buckets of this many coordinates, each with its own norm (unset: one bucket)",
        low=1, optional=True,
    )
    compression_rotation: bool = _field(
        False, "apply a randomized Hadamard rotation before compressing (the server undoes it)",
    )
    error_feedback: bool = _field(
        False, "each client keeps what compression dropped and adds it to its next update (one residual "
        "row per training client)",
    )


@dataclasses.dataclass(frozen=True)
class ClockSettings:
    """The simulated clock: availability, devices, over-selection, deadline (`jaxfl.clock`; docs/clock.md)."""

    TITLE: ClassVar[str] = "simulated clock"

    availability: str | None = _field(
        None, "run rounds on a simulated clock, clients online 'always', 'diurnal' (--diurnal-hours a day "
        "from a start hour drawn per client) or as a CSV trace FILE (client,start,end seconds; unset: no "
        "clock, every sampled client reports and rounds take no time; fedbuff and fedasync run on it always)",
        optional=True, default_text="no clock",
    )
    availability_period: float = _field(
        604800.0, "an availability trace repeats with this period in seconds (default one week)",
        low=0.0, low_open=True,
    )
    diurnal_hours: float = _field(
        8.0, "diurnal availability: hours online a day", low=0.0, high=24.0, low_open=True
    )
    device_profiles: str = _field(
        "lognormal", "the clients' devices: 'lognormal' (docs/clock.md gives the medians) or a CSV FILE "
        "(client,step_seconds,download_bytes_per_s,upload_bytes_per_s)",
    )
    overselect: float = _field(
        1.0, "select this many times clients_per_round online clients and keep the first clients_per_round "
        "reports (Bonawitz et al. 2019 use 1.3)", low=1.0,
    )
    report_deadline: float | None = _field(
        None,
        "seconds the server waits for reports (unset: until every selected client has reported or dropped)",
        low=0.0, low_open=True, optional=True,
    )


@dataclasses.dataclass(frozen=True)
class EvaluationSettings:
    """When and on which clients the model is evaluated."""

    TITLE: ClassVar[str] = "evaluation"

    eval_every: int = _field(200, "evaluate every this many rounds", low=1)
    eval_clients: int | None = _field(
        None,
        "evaluate on a fixed sample of this many clients of each population (one client from each stratum "
        "by size, drawn from --seed; the same for every algorithm and round) instead of all of them; "
        "all: every client (undoes a preset's sample); `jaxfl evaluate` evaluates every client of a saved "
        "model",
        low=1, optional=True, unset_word="all", default_text="all",
    )
    eval_train: bool = _field(
        False,
        "evaluate the training clients too (the train_* summaries, the training clients' rows of "
        "clients.csv and the table's train loss); off by default: they double the evaluation where it "
        "dominates a run",
    )


@dataclasses.dataclass(frozen=True)
class RuntimeSettings:
    """How the rounds are laid out and run, the seed, the output folder and its checkpoints."""

    TITLE: ClassVar[str] = "execution, seed, output and checkpoints"

    strategy: str = _field(
        "auto",
        "client batching: auto, vmap, sequential, chunked:K, sharded[:inner]",
    )
    local_loop: str = _field(
        "auto",
        "local steps as a scan of fixed length, a while loop of the client's own "
        "length, or one fused kernel per round for linear and MLP models on a GPU "
        "(same result; auto: fused on GPU, scan on TPU, while on CPU)",
        choices=("auto", "scan", "while", "fused"),
    )
    seed: int = _field(
        0, "random seed (unset with a DP algorithm on the command line: drawn from the OS, so that the "
        "cohort sampling the observer's epsilon assumes secret is; it is written to config.json)",
        low=0, high=2**31 - 1,
    )
    seed_drawn: bool = _field(
        False, "whether the seed was drawn from the OS (set by jaxfl, not a flag): the privacy line says the "
        "sampling is secret only then", flag=False,
    )
    out: str | None = _field(None, "output directory", optional=True)
    overwrite: bool = _field(False, "replace an existing output directory")
    checkpoint_every: int | None = _field(
        None,
        "save a checkpoint in --out every this many rounds (unset: every --checkpoint-seconds of "
        "training); also saved on SIGINT/SIGTERM",
        low=1, optional=True,
    )
    checkpoint_seconds: float = _field(
        120.0,
        "with --checkpoint-every unset: seconds of training between checkpoints (0: only on "
        "SIGINT/SIGTERM; docs/reliability.md says how the default was chosen)",
        low=0.0,
    )
    keep_checkpoints: int = _field(2, "checkpoints kept in --out while the run goes on", low=1, high=100)
    progress: bool = _field(True, "show a progress bar")


def _algorithm_section(name: str, section: str, doc: str, title: str) -> type:
    """The section of the algorithms' settings declared with `section` ('algorithm' or 'privacy'), in
    registration order, each setting's help prefixed with the algorithms that read it.
    """
    cls = dataclasses.make_dataclass(
        name,
        [
            (setting_name, setting.annotation,
             setting.field(help=f"{', '.join(setting_users(setting_name))}: {setting.help}"))
            for setting_name, setting in algorithm_settings().items()
            if setting.section == section
        ],
        namespace={"TITLE": title},
        frozen=True,
    )
    cls.__module__ = __name__
    cls.__doc__ = doc
    return cls


AlgorithmOptions = _algorithm_section(
    "AlgorithmOptions", "algorithm",
    "The algorithms' own settings, declared in their registry entries (`jaxfl.algorithms.registry`).",
    "algorithm settings (each says which algorithms read it)",
)
PrivacySettings = _algorithm_section(
    "PrivacySettings", "privacy",
    "The differentially private algorithms' budget, clipping and noise, declared in their registry entries.",
    "differential privacy",
)

# RunConfig's sections in `--help` order: attribute -> section class.
SECTIONS: dict[str, type] = {
    "data": DataSettings,
    "network": NetworkSettings,
    "local": LocalSettings,
    "server": ServerSettings,
    "options": AlgorithmOptions,
    "personalization": PersonalizationSettings,
    "robustness": RobustnessSettings,
    "communication": CommunicationSettings,
    "clock": ClockSettings,
    "privacy": PrivacySettings,
    "evaluation": EvaluationSettings,
    "runtime": RuntimeSettings,
}


def _section(cls: type) -> dataclasses.Field:
    return dataclasses.field(default_factory=cls)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything that defines a run, in sections (`SECTIONS`): `config.local.lr`, `config.server.rounds`.

    Each setting has one flat name, unique over the sections: its config-file
    key and, with dashes, its flag (`clients_per_round` ->
    `--clients-per-round`). Code that handles settings by name (files,
    flags, sweep grids) goes through `from_settings`, `setting`, `replace`
    and `to_dict`, which speak flat names; config files and config.json hold
    flat names too.
    """

    TITLE: ClassVar[str] = "what runs"

    task: str | None = _field(
        None,
        "a published protocol (`jaxfl list` shows them): sets dataset, model, optimizers, rounds, "
        "cohort, batch and learning rates; other settings override it",
        optional=True,
        choices=TASK_PRESETS,
    )
    algorithm: str = _field(
        "fedavg,deltafl",
        "algorithm(s) to run, comma-separated to compare several",
    )
    data: DataSettings = _section(DataSettings)
    network: NetworkSettings = _section(NetworkSettings)
    local: LocalSettings = _section(LocalSettings)
    server: ServerSettings = _section(ServerSettings)
    options: AlgorithmOptions = _section(AlgorithmOptions)  # type: ignore[valid-type]
    personalization: PersonalizationSettings = _section(PersonalizationSettings)
    robustness: RobustnessSettings = _section(RobustnessSettings)
    communication: CommunicationSettings = _section(CommunicationSettings)
    clock: ClockSettings = _section(ClockSettings)
    privacy: PrivacySettings = _section(PrivacySettings)  # type: ignore[valid-type]
    evaluation: EvaluationSettings = _section(EvaluationSettings)
    runtime: RuntimeSettings = _section(RuntimeSettings)

    @classmethod
    def from_settings(cls, values: Mapping[str, Any]) -> RunConfig:
        """The config of these settings by flat name (unchecked; `make_config` checks), defaults elsewhere.

        `hidden_sizes` is held as a tuple and `dataset_options` as a copy, so
        that `from_settings(config.to_dict()) == config`.
        """
        for name in values:
            _known(name)
        values = dict(values)
        if "hidden_sizes" in values:
            values["hidden_sizes"] = tuple(values["hidden_sizes"])
        if "dataset_options" in values:
            values["dataset_options"] = dict(values["dataset_options"])
        own = {name: value for name, value in values.items() if SECTION_OF[name] is None}
        sections = {
            section: section_class(**{
                name: value for name, value in values.items() if SECTION_OF[name] == section
            })
            for section, section_class in SECTIONS.items()
        }
        return cls(**own, **sections)

    def setting(self, name: str) -> Any:
        """The value of the setting named `name` (flat name)."""
        section = SECTION_OF[_known(name)]
        return getattr(self if section is None else getattr(self, section), name)

    def replace(self, **values: Any) -> RunConfig:
        """A copy with these settings (flat names) replaced."""
        return RunConfig.from_settings({**{name: self.setting(name) for name in SECTION_OF}, **values})

    @property
    def algorithms(self) -> list[str]:
        """The names of `algorithm`, in order."""
        return [name.strip() for name in self.algorithm.split(",") if name.strip()]

    def flat(self) -> types.SimpleNamespace:
        """The settings as attributes by flat name (`config.flat().lr`), for code that reads settings by
        name without knowing the sections (`jaxfl.privacy`'s budgets); a copy.
        """
        return types.SimpleNamespace(**self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        """Flat name -> value, as config files and config.json hold them."""
        out = {name: self.setting(name) for name in SECTION_OF}
        out["dataset_options"] = dict(out["dataset_options"])
        out["hidden_sizes"] = list(out["hidden_sizes"])
        return out


def _known(name: str) -> str:
    if name not in SECTION_OF:
        raise ConfigError(f"unknown setting {_shown(name)}; valid settings: {', '.join(sorted(FIELDS))}")
    return name


def _section_fields(cls: type) -> tuple[dataclasses.Field, ...]:
    return tuple(f for f in dataclasses.fields(cls) if f.name not in SECTIONS)


# Flat name -> the section holding it (None: RunConfig's own fields), and -> its field.
SECTION_OF: dict[str, str | None] = {
    **{f.name: None for f in _section_fields(RunConfig)},
    **{f.name: section for section, cls in SECTIONS.items() for f in _section_fields(cls)},
}
FIELDS = {
    f.name: f for cls in (RunConfig, *SECTIONS.values()) for f in _section_fields(cls)
}
DEFAULTS = RunConfig()


def section_title(section: str | None) -> str:
    """`--help`'s title of a section (None: `RunConfig`'s own settings), with its config-file table."""
    if section is None:
        return RunConfig.TITLE
    return f"{SECTIONS[section].TITLE} [{section}]"


def section_fields() -> dict[str, list[str]]:
    """Section title (`--help`'s groups, `section_title`) -> its settings' flat names, in order."""
    return {
        section_title(section): [f.name for f in _section_fields(RunConfig if section is None else cls)]
        for section, cls in {None: RunConfig, **SECTIONS}.items()
    }


# Every integer setting is an int32 in the compiled round or a host-side
# count; every float setting becomes a float32 (hyperparameters live in the
# state). Values outside what those types hold are refused, not wrapped,
# rounded to infinity or flushed to zero.
INT32_MAX = 2**31 - 1
FLOAT32_MAX = 3.4028234663852886e38  # np.finfo(np.float32).max
FLOAT32_TINY = 1.1754943508222875e-38  # np.finfo(np.float32).tiny: smaller magnitudes compute as 0
# The largest sigma whose proposals the discrete Gaussian sampler keeps exact
# (`jaxfl.primitives.discrete_gaussian.MAX_SIGMA`; not imported: reading a
# config imports no JAX code).
MAX_DISCRETE_GAUSSIAN_SIGMA = 1e6




def _shown(value: Any) -> str:
    """`repr(value)`, shortened so that an error stays one readable line."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}...{text[-12:]} ({len(text)} characters)"


def _ranged(meta) -> str:
    """' ' + the range text, or '' for a field without a range."""
    text = _range_text(meta)
    return f" {text}" if text else ""


def _range_text(meta) -> str:
    low, high = meta["low"], meta["high"]
    if low is not None and high is not None:
        left = "(" if meta["low_open"] else "["
        right = ")" if meta["high_open"] else "]"
        return f"in {left}{low}, {high}{right}"
    if low is not None:
        return f"{'>' if meta['low_open'] else '>='} {low}"
    if high is not None:
        return f"{'<' if meta['high_open'] else '<='} {high}"
    return ""


def _expected_type(field: dataclasses.Field) -> str:
    t = str(field.type)
    for name in ("bool", "int", "float", "str"):
        if t.startswith(name):
            return name
    return t


def check_value(name: str, value: Any) -> Any:
    """Validates (and lightly coerces) one field; raises ConfigError.

    Beyond each field's range: integers must fit int32 and floats float32
    (magnitude at most 3.4028235e38, and a nonzero value at least
    1.1754944e-38, below which float32 arithmetic flushes it to 0), because
    that is what the compiled round computes with.
    """
    if name not in FIELDS:
        raise ConfigError(
            f"unknown setting {_shown(name)}; valid settings: {', '.join(sorted(FIELDS))}"
        )
    field = FIELDS[name]
    meta = field.metadata
    kind = _expected_type(field)
    if value is None or (meta["unset_word"] is not None and value == meta["unset_word"]):
        if meta["optional"]:
            return None
        raise ConfigError(f"{name} must be set")
    if name in ("dataset_options", "hidden_sizes"):
        return _collection(name, value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be true or false, got {_shown(value)}")
        return value
    if kind == "int":
        # Floats are tested before int(): int(inf) and int(nan) raise.
        if isinstance(value, bool) or not (
            isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        ):
            unset = f" or {meta['unset_word']}" if meta["unset_word"] else ""
            raise ConfigError(
                f"{name} must be an integer{_ranged(meta)}{unset}, got {_shown(value)}"
            )
        value = int(value)
    elif kind == "float":
        value = _float32_number(name, value, meta)
    elif kind == "str" and not isinstance(value, str):
        raise ConfigError(f"{name} must be a string, got {_shown(value)}")
    if meta["items"] is not None:
        _check_items(name, value, meta["items"])
    if meta["choices"] is not None and value not in meta["choices"]:
        raise ConfigError(
            f"{name} must be one of {', '.join(meta['choices'])}, got {_shown(value)}"
        )
    low, high = meta["low"], meta["high"]
    if low is not None and (value < low or (meta["low_open"] and value == low)):
        raise ConfigError(f"{name} must be{_ranged(meta)}, got {_shown(value)}")
    if high is not None and (value > high or (meta["high_open"] and value == high)):
        raise ConfigError(f"{name} must be{_ranged(meta)}, got {_shown(value)}")
    if name in ("dp_sigma", "dp_quantile_sigma") and value > MAX_DISCRETE_GAUSSIAN_SIGMA:
        raise ConfigError(
            f"{name} must be <= {MAX_DISCRETE_GAUSSIAN_SIGMA:g} (the largest sigma whose proposals the "
            f"discrete Gaussian sampler keeps exact), got {value!r}"
        )
    if kind == "int" and not -INT32_MAX - 1 <= value <= INT32_MAX:
        raise ConfigError(
            f"{name} must be an integer{_ranged(meta)} that int32 holds (magnitude <= "
            f"{INT32_MAX}), got {_shown(value)}"
        )
    if name == "dp_bins" and value & (value - 1):
        raise ConfigError(
            f"dp_bins must be a power of two{_ranged(meta)}, got {value!r}"
        )
    return value


def _check_items(name: str, text: str, items: Items) -> None:
    """A list-valued setting's elements, each checked as its scalar twin (`Items`)."""
    if text == "" and items.empty is not None:
        return
    what = "comma-separated numbers" + (f" ('' : {items.empty})" if items.empty is not None else "")
    parts = text.split(",")
    if len(parts) > items.max_count:
        raise ConfigError(
            f"{name} takes at most {items.max_count} values (every sampled client tries each one in every "
            f"round), got {len(parts)}"
        )
    seen = set()
    for part in parts:
        try:
            number = float(part)
        except ValueError:
            raise ConfigError(
                f"{name} must be {what}, got {_shown(part.strip())} in {_shown(text)}"
            ) from None
        if items.twin is not None:
            try:
                check_value(items.twin, number)
            except ConfigError as error:
                flag = "--" + items.twin.replace("_", "-")
                raise ConfigError(f"{name}: {error} (each value is checked as {flag} is)") from None
        elif not (math.isfinite(number) and items.low <= number <= items.high):
            raise ConfigError(
                f"{name} values must be in [{items.low:g}, {items.high:g}], got {_shown(part.strip())}"
            )
        if number in seen:
            raise ConfigError(f"{name}: {number:g} is given twice in {_shown(text)}")
        seen.add(number)


def _collection(name: str, value: Any) -> Any:
    """`dataset_options` (a table of option names) or `hidden_sizes` (positive int32 widths), checked."""
    if name == "dataset_options":
        if not isinstance(value, Mapping):
            raise ConfigError(f"dataset_options must be a table of option = value, got {_shown(value)}")
        for key in value:
            if not isinstance(key, str) or not key:
                raise ConfigError(f"dataset_options keys must be option names, got {_shown(key)}")
        return dict(value)
    if isinstance(value, (str, Mapping)) or not isinstance(value, (list, tuple)) or not value or not all(
        isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= INT32_MAX for v in value
    ):
        raise ConfigError(
            f"hidden_sizes must be a non-empty list of integers in [1, {INT32_MAX}], got {_shown(value)}"
        )
    return tuple(value)


def _float32_number(name: str, value: Any, meta: Mapping[str, Any]) -> float:
    """`value` as a float that float32 represents as itself (finite, not flushed to 0); else ConfigError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name} must be a number{_ranged(meta)}, got {_shown(value)}")
    try:
        value = float(value)
    except OverflowError:  # An integer beyond float64.
        value = math.inf if value > 0 else -math.inf
    if not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number{_ranged(meta)}, got {_shown(value)}")
    if abs(value) > FLOAT32_MAX:
        raise ConfigError(
            f"{name} must be a number{_ranged(meta)} that float32 holds (magnitude <= "
            f"{FLOAT32_MAX:.8g}), got {value!r}"
        )
    if value != 0 and abs(value) < FLOAT32_TINY:
        raise ConfigError(
            f"{name} must be a number{_ranged(meta)}, got {value!r}, which float32 computes as 0 "
            f"(nonzero magnitudes must be >= {FLOAT32_TINY:.8g})"
        )
    return value


# Warnings wait here while a run is still being checked (`held_warnings`): a
# refused run prints its one error line and nothing else.
_PENDING: list[str] = []
_HOLDS = [0]


def defer_warning(message: str) -> None:
    """Keeps a warning for the end of the next checks (`held_warnings`); each message once."""
    if message not in _PENDING:
        _PENDING.append(message)


def discard_warnings() -> None:
    """Drops the warnings kept so far (a new command starts)."""
    _PENDING.clear()


def warn(message: str) -> None:
    """A one-line `jaxfl: warning:` for a setting that is accepted but changes nothing.

    Printed on stderr now, or, inside `held_warnings`, once every check passed.
    """
    defer_warning(message)
    if not _HOLDS[0]:
        _flush_warnings()


def _flush_warnings() -> None:
    for message in _PENDING:
        print(f"jaxfl: warning: {message}", file=sys.stderr)
    _PENDING.clear()


@contextlib.contextmanager
def held_warnings():
    """Holds warnings until the outermost block ends, and drops them on an error.

    So that a refused run prints exactly one line (its error). Usable as a
    decorator.
    """
    _HOLDS[0] += 1
    try:
        yield
    except BaseException:
        _PENDING.clear()
        raise
    finally:
        _HOLDS[0] -= 1
    if not _HOLDS[0]:
        _flush_warnings()


def make_config(
    values: Mapping[str, Any], *, on_warning: Callable[[str], None] | None = warn
) -> RunConfig:
    """Builds a validated RunConfig from field values.

    With a `task`, the preset's settings come first
    (`jaxfl.experiment.presets`; dataset options merged key by key, given
    ones winning) and the rest are RunConfig's defaults. Otherwise unset
    fields take the dataset's run defaults (its default model, rounds,
    clients per round, local step cap, ...:
    `jaxfl.data.registry.dataset_run_defaults`), then RunConfig's own
    defaults.

    Every value is checked (`check_value`), then the combination
    (`check_settings`); a given setting that the others make ineffective is
    reported through `on_warning` (`setting_warnings`; None: not reported).

    Raises:
      ConfigError: a refused value or combination, one line.
    """
    values = dict(values)
    if "dataset_options" in values:
        values["dataset_options"] = check_value("dataset_options", values["dataset_options"]) or {}
    given = dict(values)
    implied: dict[str, Any] = {}  # What each setting would be if it were not given.
    if values.get("task") is not None:
        from jaxfl.experiment.presets import preset_settings

        task = check_value("task", values["task"])
        preset = preset_settings(task)
        options = {**preset.pop("dataset_options", {}), **dict(values.get("dataset_options") or {})}
        if "dataset" in values and values["dataset"] != preset["dataset"]:
            options = dict(values.get("dataset_options") or {})  # Another dataset: its own options.
        implied.update(preset)
        values = {**preset, **values, "dataset_options": options}
    dataset = values.get("dataset", DEFAULTS.data.dataset)
    # A preset is a whole protocol: the dataset's quick-run defaults (e.g. a
    # local step cap) apply only when the command names another dataset.
    preset_dataset = values.get("task") is not None and dataset == preset["dataset"]
    if isinstance(dataset, str) and not preset_dataset:
        from jaxfl.data.registry import dataset_run_defaults

        try:
            defaults = dataset_run_defaults(dataset)
        except ValueError as error:
            raise ConfigError(str(error).splitlines()[0]) from None
        implied = {**defaults, **implied}
        values = {**defaults, **values}
    checked = {name: check_value(name, value) for name, value in values.items()}
    config = RunConfig.from_settings(checked)
    changed = {
        name
        for name in given
        if name != "dataset_options"
        and checked[name] != implied.get(name, DEFAULTS.setting(name))
    }
    check_settings(config)
    if on_warning is not None:
        for message in setting_warnings(config, changed):
            on_warning(message)
    return config


def implied_setting(config: RunConfig, name: str) -> Any:
    """The value setting `name` takes when not given: the task preset's, else
    the dataset's run default, else RunConfig's default (as `make_config`).
    """
    if config.task is not None:
        from jaxfl.experiment.presets import preset_settings

        preset = preset_settings(config.task)
        if name in preset:
            return preset[name]
        if config.data.dataset == preset["dataset"]:
            return DEFAULTS.setting(name)
    from jaxfl.data.registry import dataset_run_defaults

    try:
        defaults = dataset_run_defaults(config.data.dataset)
    except ValueError:
        defaults = {}
    return defaults.get(name, DEFAULTS.setting(name))


# What algorithms whose local training is one full-batch step do not use
# (`AlgorithmSpec.full_batch`).
_FULL_BATCH_SETTINGS = ("batch_size", "local_epochs", "max_local_steps", "local_loop")
# The failure probability of the no-wraparound bound (Pillutla et al. 2023, Claim 16) that
# `deltafl --reweighting dp` (no privacy accounting, hence no delta) needs of
# its secure sum: the ring must exceed every noisy histogram count but with
# probability 1e-6 / 4 per round.
_DELTAFL_DP_WRAP_DELTA = 1e-6


def full_batch_only(config: RunConfig) -> bool:
    """Whether every algorithm of the run takes one full-batch step per client (no batch size, no epochs)."""
    names = config.algorithms
    return all(name in SPECS for name in names) and _registry_full_batch_only(names, config.to_dict())


def _strategy_chunk(strategy: str) -> str | None:
    """The K of 'chunked:K' or 'sharded:chunked:K' (as written), else None."""
    parts = strategy.split(":")
    chunked = parts[0] == "chunked" and len(parts) == 2
    if chunked or (parts[:2] == ["sharded", "chunked"] and len(parts) == 3):
        return parts[-1].strip()
    return None


def check_settings(config: RunConfig) -> None:
    """Refuses combinations of valid values that cannot run as asked.

    Data-independent (those that depend on the data are checked in
    `jaxfl.experiment.runner.setup`); each refusal is one line.

    Raises:
      ConfigError: the first refused combination.
    """
    settings = config.flat()  # Its messages name settings by their flat names.
    names = [name.strip() for name in config.algorithm.split(",")]
    if any(not name for name in names):
        raise ConfigError(
            f"algorithm must be comma-separated names without empty entries, got {_shown(config.algorithm)}"
        )
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConfigError(f"algorithm names {repeated[0]} twice in {_shown(config.algorithm)}")
    chunk = _strategy_chunk(settings.strategy)
    if chunk is not None and not (chunk.isdigit() and 1 <= int(chunk) <= INT32_MAX):
        raise ConfigError(
            f"strategy {_shown(settings.strategy)}: the chunk size K must be an integer in [1, {INT32_MAX}]"
        )
    if settings.finetune_ewc is not None and not settings.finetune_epochs:
        raise ConfigError("finetune_ewc fine-tunes with EWC's penalty: it needs finetune_epochs >= 1")
    if settings.finetune_skl is not None and not settings.finetune_epochs:
        raise ConfigError("finetune_skl fine-tunes with the symmetrized KL: it needs finetune_epochs >= 1")
    if settings.finetune_skl is not None and settings.finetune_ewc is not None:
        raise ConfigError("finetune_ewc and finetune_skl are two fine-tuning penalties: choose one")
    dp_algorithms = [name for name in names if name in PRIVATE_ALGORITHMS]
    noise_given = settings.dp_noise_multiplier is not None
    if dp_algorithms and noise_given and settings.epsilon != DEFAULTS.privacy.epsilon:
        raise ConfigError(
            f"epsilon={settings.epsilon:g} and dp_noise_multiplier={settings.dp_noise_multiplier:g} "
            "conflict: "
            f"a given noise multiplier fixes {', '.join(dp_algorithms)}'s noise and epsilon is then only "
            "reported, not met; give one of them"
        )
    if "deltafl" in names and settings.reweighting == "dp":
        from jaxfl.primitives.dp_quantile import MAX_MODULUS, dp_quantile_modulus

        scale = settings.dp_scale
        needed = dp_quantile_modulus(
            settings.dp_bins, settings.clients_per_round, settings.dp_sigma, scale, _DELTAFL_DP_WRAP_DELTA
        )
        if needed > min(2**settings.dp_bits, MAX_MODULUS):
            bits = math.ceil(math.log2(needed))
            advice = (
                f"use dp_bits >= {bits}" if bits <= 32 else "lower dp_scale, dp_sigma or clients_per_round"
            )
            raise ConfigError(
                f"deltafl --reweighting dp: dp_bits={settings.dp_bits} gives a ring of 2^{settings.dp_bits}, "
                f"smaller than the {needed} that the secure sum of {settings.clients_per_round} clients' "
                f"histograms (dp_scale={scale}, dp_sigma={settings.dp_sigma:g}) needs to avoid wraparound "
                "(the modulus of Pillutla et al. 2023, Theorem 6, "
                f"at delta={_DELTAFL_DP_WRAP_DELTA:g}): {advice}"
            )


def setting_warnings(config: RunConfig, changed: Collection[str]) -> list[str]:
    """One line per setting in `changed` (given, and not the value it would have
    had) that the other settings make ineffective.

    Settings that no chosen algorithm uses at all are reported by
    `jaxfl.experiment.runner.setup`; these are the ones that depend on other
    settings.
    """
    settings = config.flat()  # Its messages name settings by their flat names.
    messages = []
    names = config.algorithms
    if "lr_decay_period" in changed and settings.lr_decay == 1.0:
        messages.append(
            f"lr_decay_period={settings.lr_decay_period} is not used: lr_decay is 1 (a constant "
            "learning rate); ignored"
        )
    elif settings.lr_decay != 1.0 and settings.lr_decay_period >= settings.rounds and (
        {"lr_decay", "lr_decay_period", "rounds"} & set(changed)
    ):
        messages.append(
            f"lr_decay={settings.lr_decay:g} never applies: the first decay is at round "
            f"lr_decay_period={settings.lr_decay_period}, and the run has rounds={settings.rounds}; ignored"
        )
    if settings.compression is None:
        for name in ("compression_bits", "compression_fraction", "compression_bucket",
                     "compression_rotation", "error_feedback"):
            if name in changed:
                messages.append(f"{name} is an option of --compression, which is unset; ignored")
    elif settings.compression == "qsgd" and "compression_fraction" in changed:
        messages.append("compression_fraction is rand-k's and top-k's; qsgd sends every coordinate; ignored")
    elif settings.compression != "qsgd":
        for name in ("compression_bits", "compression_bucket"):
            if name in changed:
                messages.append(f"{name} is qsgd's; {settings.compression} does not quantize; ignored")
    if settings.availability is None:
        clock_settings = (
            "availability_period", "diurnal_hours", "device_profiles", "overselect", "report_deadline",
        )  # fmt: skip
        for name in clock_settings:
            if name in changed:
                messages.append(
                    f"{name} is a setting of the simulated clock, which --availability turns on; ignored"
                )
    if "eval_every" in changed and settings.eval_every > settings.rounds:
        messages.append(
            f"eval_every={settings.eval_every} is more than rounds={settings.rounds}: the run is evaluated "
            "only after its last round"
        )
    if "deltafl" in names and "dp-deltafl" not in names and settings.reweighting != "dp":
        for name in ("dp_bins", "dp_bits"):
            if name in changed:
                messages.append(
                    f"{name} is used by deltafl only with --reweighting dp (reweighting is "
                    f"{settings.reweighting}); ignored"
                )
    if full_batch_only(config):
        for name in _FULL_BATCH_SETTINGS:
            if name in changed:
                messages.append(
                    f"{name} is not used by {', '.join(names)} (one full-batch gradient step per "
                    "client); ignored"
                )
    chunk = _strategy_chunk(settings.strategy)
    whole_cohort = chunk is not None and int(chunk) >= settings.clients_per_round
    if settings.strategy.startswith("chunked") and whole_cohort:
        messages.append(
            f"strategy {settings.strategy} trains all clients_per_round={settings.clients_per_round} clients "
            "at once, as vmap does"
        )
    if "hidden_sizes" in changed and settings.model != "mlp":
        messages.append(f"hidden_sizes is used by model mlp only, not {settings.model}; ignored")
    if "embedding_dim" in changed and settings.model != "embedding-bag":
        messages.append(f"embedding_dim is used by model embedding-bag only, not {settings.model}; ignored")
    if "dp-fedadam" in names and settings.server_lr > 0.1:
        messages.append(
            f"dp-fedadam runs adam with server_lr={settings.server_lr:g} (shared by the run's algorithms): "
            "adam moves every coordinate by about that much per round, far above the 0.003-0.03 that "
            "trained in docs/private-optimizers.md; give --server-lr"
        )
    if (
        "dp-deltafl" in names
        and "dp_quantile_ratio" in changed
        and settings.dp_quantile_sigma is not None
    ):
        messages.append(
            "dp_quantile_ratio is not used: dp_quantile_sigma sets the quantile's noise; ignored"
        )
    return messages


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Reads a JSON (.json) or TOML (any other suffix) config file.

    Keys are settings' flat names (dashes are accepted for underscores), at
    the top level or inside a table named after their section of `RunConfig`
    (`[local]`, `[server]`, ...: `SECTIONS`). Every value
    is checked on its own (`check_value`), so that a bad value in the file
    is reported even where a flag overrides it.

    Raises:
      ConfigError: an unreadable, non-UTF-8, malformed or empty file, a key
        given twice (`a-b` and `a_b`), an unknown key or a bad value; one
        line naming the file.
    """
    path = Path(path)
    where = f"config file {str(path)!r}"
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise ConfigError(f"{where}: {error.strerror}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        bad = raw[error.start : error.start + 1].hex()
        raise ConfigError(
            f"{where} is not UTF-8 text: byte 0x{bad} at offset {error.start} "
            "(save it as UTF-8)"
        ) from None
    try:
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            data = tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError, RecursionError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ConfigError(f"{where} is malformed: {reason}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must hold a table of settings")
    if not data:
        raise ConfigError(f"{where} holds no settings")
    settings: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value, section in _file_entries(data, where):
        name = key.replace("-", "_")
        if section is not None:
            key = f"{section}.{key}"
        if name in settings:
            raise ConfigError(f"{where} sets {name} twice ({spelled[name]!r} and {key!r})")
        if section is not None and name in SECTION_OF and SECTION_OF[name] != section:
            home = SECTION_OF[name] or "the top level"
            raise ConfigError(f"{where}: {name} is a setting of {home}, not of section {section}")
        try:
            check_value(name, value)
        except ConfigError as error:
            raise ConfigError(f"{where}: {error}") from None
        settings[name] = value
        spelled[name] = key
    if not settings:
        raise ConfigError(f"{where} holds no settings")  # Empty section tables only.
    return settings


def _file_entries(data: Mapping[str, Any], where: str):
    """(key, value, section or None) of a config file's table: a key naming a section
    (`[local]` in TOML) holds that section's settings.
    """
    for key, value in data.items():
        section = key.replace("-", "_")
        if section not in SECTIONS:
            if isinstance(value, dict) and section in SECTION_OF and section != "dataset_options":
                home = SECTION_OF[section] or "the top level"
                raise ConfigError(
                    f"{where}: [{key}] is not a section (the tables are {', '.join(SECTIONS)}): "
                    f"{section} is a setting of {home}"
                )
            yield key, value, None
            continue
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: {key} is a section: it must hold a table of its settings")
        for name, inner in value.items():
            yield name, inner, section
