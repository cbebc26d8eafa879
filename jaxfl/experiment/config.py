"""The configuration of a run: every field, its default, its allowed range.

One table (`RunConfig`'s field metadata) drives the command-line flags, the
config-file keys and the validation, so the three never disagree. Errors are
`ConfigError`s whose message is one line naming the field and what is
allowed; the CLI prints it and exits with status 2.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# The registries' names (checked against them in tests/experiment/test_config.py);
# kept here so that reading a config imports no model or preset code.
MODEL_NAMES = (
    "linear", "mlp", "convnet", "embedding-bag", "bag-logistic", "emnist-cr-cnn", "leaf-cnn", "resnet18-gn",
    "deltafl-convnet", "char-lstm", "char-gru", "word-lstm", "transformer", "sent140-lstm",
    "mean-embedding-logistic",
)
TASK_PRESETS = (
    "shakespeare-fedavg", "shakespeare-deltafl", "emnist-cr", "femnist-leaf", "stackoverflow-nwp",
    "stackoverflow-lr", "cifar100-resnet", "sent140-lstm", "fmnist-dirichlet",
)


class ConfigError(ValueError):
    """An invalid configuration value; the message is one line for users."""


def _field(default, help, *, low=None, high=None, low_open=False, high_open=False,
           choices=None, optional=False, flag=True):
    if isinstance(default, dict):
        default_kwargs = dict(default_factory=lambda: dict(default))
    else:
        default_kwargs = dict(default=default)
    return dataclasses.field(
        **default_kwargs,
        metadata=dict(
            help=help, low=low, high=high, low_open=low_open, high_open=high_open,
            choices=choices, optional=optional, flag=flag,
        ),
    )


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything that defines a run. Field names are the config-file keys;
    flags are the same names with dashes (`clients_per_round` ->
    `--clients-per-round`).
    """

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
    model: str = _field(
        "linear",
        "model (unset: the dataset's default, see `jaxfl list`)",
        choices=MODEL_NAMES,
    )
    hidden_sizes: tuple[int, ...] = _field((64,), "hidden layer widths of the mlp", flag=False)
    embedding_dim: int = _field(32, "embedding-bag: width of the token embeddings", low=1)
    rounds: int = _field(2000, "communication rounds", low=1)
    clients_per_round: int = _field(100, "clients sampled per round (M)", low=1)
    local_epochs: int = _field(1, "local epochs per client (E)", low=1, high=10_000)
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
    client_weighting: str = _field(
        "num_examples", "client weights alpha_i", choices=("num_examples", "uniform")
    )
    # Algorithm settings (jaxfl.algorithms.registry says which algorithm
    # takes which; the numeric ones become state.hparams of the same name).
    theta: float = _field(
        0.5,
        "deltafl: tail fraction theta in (0, 1] of the superquantile (1: "
        "FedAvg); fedavg-sub: fraction of each cohort that trains",
        low=0.0, high=1.0, low_open=True,
    )
    mu: float = _field(0.01, "fedprox: proximal weight mu >= 0", low=0.0)
    q: float | None = _field(
        None,
        "qffl, afl-qffl: q >= 0 of q-FFL, 0: FedAvg (unset: 1 for qffl, 10 "
        "for afl-qffl)",
        low=0.0, optional=True,
    )
    tilt: float = _field(
        1.0, "term: tilt t (any real) of the client-level tilted risk; t > 0 "
        "favours clients of high loss, t -> 0 is FedAvg"
    )
    reweighting: str = _field(
        "exact",
        "deltafl: client weights from the losses: threshold (004 Alg. 1), exact "
        "(Alg. 3), dp (Alg. 1 with the DP quantile of Alg. 2), smoothed (eq. 15)",
        choices=("threshold", "exact", "dp", "smoothed"),
    )
    smoothing: float = _field(
        0.1, "deltafl --reweighting smoothed: KL smoothing nu > 0",
        low=0.0, low_open=True,
    )
    threshold_period: int = _field(
        1, "deltafl --reweighting threshold|dp: recompute the threshold every "
        "T_eta >= 1 rounds (000 Algorithm 1), reuse it in between", low=1,
    )
    filtering: str = _field(
        "server",
        "deltafl --reweighting threshold|dp: the server filters clients, or "
        "clients filter themselves on the broadcast threshold (000 Alg. 3)",
        choices=("server", "client"),
    )
    stragglers: float = _field(
        0.0,
        "fedprox, fedavg: fraction in [0, 1) of each cohort that straggles "
        "(runs 1..E-1 epochs; needs E >= 2 for fedprox); fedprox keeps their "
        "work, fedavg drops them",
        low=0.0, high=1.0, high_open=True,
    )
    qffl_variant: str = _field(
        "fedavg", "qffl, afl-qffl: q-FedAvg or q-FedSGD (one full-batch step)",
        choices=("fedavg", "fedsgd"),
    )
    afl_lambda_lr: float = _field(
        0.01, "afl: step size gamma_lambda > 0 of the ascent on the mixture weights",
        low=0.0, low_open=True,
    )
    dp_bins: int = _field(
        32,
        "deltafl --reweighting dp, dp-deltafl: histogram bins b, a power of two "
        "in [2, 65536]",
        low=2, high=2**16,
    )
    dp_loss_bound: float = _field(
        3.0,
        "deltafl --reweighting dp, dp-deltafl: loss bound B > 0 (losses clipped "
        "to [0, B])",
        low=0.0, low_open=True,
    )
    dp_sigma: float = _field(
        1.0, "deltafl --reweighting dp: discrete Gaussian noise sigma >= 0 per client",
        low=0.0,
    )
    dp_scale: int = _field(
        10,
        "deltafl --reweighting dp, dp-deltafl: integer scaling c >= 1 of the "
        "histograms",
        low=1,
    )
    dp_bits: int = _field(
        32,
        "deltafl --reweighting dp, dp-deltafl: the secure sum is modulo 2^bits, "
        "bits in [2, 32]",
        low=2, high=32,
    )
    # Differential privacy (dp-fedavg, dp-deltafl; jaxfl.privacy). The
    # guarantee is client-level (epsilon, delta)-DP for the whole run.
    epsilon: float = _field(
        5.0,
        "dp-fedavg, dp-deltafl: target epsilon > 0 of the whole run's "
        "(epsilon, delta) client-level DP",
        low=0.0, low_open=True,
    )
    delta: float | None = _field(
        None,
        "dp-fedavg, dp-deltafl: delta in (0, 1) (unset: 1/n, n the training "
        "clients)",
        low=0.0, high=1.0, low_open=True, high_open=True, optional=True,
    )
    clip_norm: float = _field(
        1.0,
        "dp-fedavg, dp-deltafl: l2 norm bound C > 0 of each client's update",
        low=0.0, low_open=True,
    )
    dp_quantile_ratio: float = _field(
        0.25,
        "dp-deltafl: r > 0, the quantile's per-round zCDP budget over the "
        "update's (004 App. D.2)",
        low=0.0, low_open=True,
    )
    dp_noise_multiplier: float | None = _field(
        None,
        "dp-fedavg, dp-deltafl: update noise std over its sensitivity 2C "
        "(unset: calibrated to --epsilon; set: epsilon is only reported)",
        low=0.0, low_open=True, optional=True,
    )
    dp_quantile_sigma: float | None = _field(
        None,
        "dp-deltafl: discrete Gaussian sigma >= 0.5 of the quantile per client "
        "(unset: calibrated from the noise multiplier and --dp-quantile-ratio)",
        low=0.5, optional=True,
    )
    strategy: str = _field(
        "auto",
        "client batching: auto, vmap, sequential, chunked:K, sharded[:inner]",
    )
    local_loop: str = _field(
        "auto",
        "local steps as a scan of fixed length or a while loop of the client's "
        "own length (same result; auto: scan on GPU/TPU, while on CPU)",
        choices=("auto", "scan", "while"),
    )
    eval_every: int = _field(200, "evaluate every this many rounds", low=1)
    seed: int = _field(0, "random seed", low=0, high=2**31 - 1)
    out: str | None = _field(None, "output directory", optional=True)
    overwrite: bool = _field(False, "replace an existing output directory")
    progress: bool = _field(True, "show a progress bar")

    @property
    def algorithms(self) -> list[str]:
        return [name.strip() for name in self.algorithm.split(",") if name.strip()]

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["dataset_options"] = dict(self.dataset_options)
        out["hidden_sizes"] = list(self.hidden_sizes)
        return out


FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)}


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
    """Validates (and lightly coerces) one field; raises ConfigError."""
    if name not in FIELDS:
        raise ConfigError(
            f"unknown setting {name!r}; valid settings: {', '.join(sorted(FIELDS))}"
        )
    field = FIELDS[name]
    meta = field.metadata
    kind = _expected_type(field)
    if value is None:
        if meta["optional"]:
            return None
        raise ConfigError(f"{name} must be set")
    if name == "dataset_options":
        if not isinstance(value, Mapping):
            raise ConfigError("dataset_options must be a table of option = value")
        return dict(value)
    if name == "hidden_sizes":
        if isinstance(value, int) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value
        ) or not value:
            raise ConfigError("hidden_sizes must be a non-empty list of integers >= 1")
        return tuple(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be true or false, got {value!r}")
        return value
    if kind == "int":
        if isinstance(value, bool) or not (
            isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        ):
            raise ConfigError(
                f"{name} must be an integer {_range_text(meta)}, got {value!r}".replace("  ", " ")
            )
        value = int(value)
    elif kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{name} must be a number {_range_text(meta)}, got {value!r}")
        value = float(value)
        if not math.isfinite(value):
            raise ConfigError(f"{name} must be a finite number {_range_text(meta)}, got {value!r}")
    elif kind == "str" and not isinstance(value, str):
        raise ConfigError(f"{name} must be a string, got {value!r}")
    if meta["choices"] is not None and value not in meta["choices"]:
        raise ConfigError(
            f"{name} must be one of {', '.join(meta['choices'])}, got {value!r}"
        )
    low, high = meta["low"], meta["high"]
    if low is not None and (value < low or (meta["low_open"] and value == low)):
        raise ConfigError(f"{name} must be {_range_text(meta)}, got {value!r}")
    if high is not None and (value > high or (meta["high_open"] and value == high)):
        raise ConfigError(f"{name} must be {_range_text(meta)}, got {value!r}")
    if name == "dp_bins" and value & (value - 1):
        raise ConfigError(
            f"dp_bins must be a power of two {_range_text(meta)}, got {value!r}"
        )
    return value


def make_config(values: Mapping[str, Any]) -> RunConfig:
    """Builds a validated RunConfig from field values.

    With a `task`, the preset's settings come first
    (`jaxfl.experiment.presets`; dataset options merged key by key, given
    ones winning) and the rest are RunConfig's defaults. Otherwise unset
    fields take the dataset's run defaults (its default model, rounds,
    clients per round, local step cap, ...:
    `jaxfl.data.registry.dataset_run_defaults`), then RunConfig's own
    defaults.
    """
    values = dict(values)
    if values.get("task") is not None:
        from jaxfl.experiment.presets import preset_settings

        task = check_value("task", values["task"])
        preset = preset_settings(task)
        options = {**preset.pop("dataset_options", {}), **dict(values.get("dataset_options") or {})}
        if "dataset" in values and values["dataset"] != preset["dataset"]:
            options = dict(values.get("dataset_options") or {})  # Another dataset: its own options.
        values = {**preset, **values, "dataset_options": options}
    dataset = values.get("dataset", RunConfig.dataset)
    # A preset is a whole protocol: the dataset's quick-run defaults (e.g. a
    # local step cap) apply only when the command names another dataset.
    preset_dataset = values.get("task") is not None and dataset == preset["dataset"]
    if isinstance(dataset, str) and not preset_dataset:
        from jaxfl.data.registry import dataset_run_defaults

        try:
            defaults = dataset_run_defaults(dataset)
        except ValueError as error:
            raise ConfigError(str(error).splitlines()[0]) from None
        values = {**defaults, **values}
    checked = {name: check_value(name, value) for name, value in values.items()}
    config = RunConfig(**checked)
    if not config.algorithms:
        raise ConfigError("algorithm must name at least one algorithm")
    return config


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Reads a JSON (.json) or TOML (any other suffix) config file.

    Keys are field names; dashes are accepted for underscores. Raises
    ConfigError on unreadable or malformed files, with a one-line reason.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(f"config file {str(path)!r}: {error.strerror}") from None
    try:
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            data = tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as error:
        reason = str(error).splitlines()[0]
        raise ConfigError(f"config file {str(path)!r} is malformed: {reason}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a table of settings")
    return {key.replace("-", "_"): value for key, value in data.items()}
