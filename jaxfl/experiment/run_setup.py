"""A run built from its config: data placed, model and algorithms built, settings checked (`setup`).

Everything here happens once, before the first round: choosing the client
strategy and local loop, the server optimizer, the settings no chosen
algorithm uses, the model and its fit to the data's targets, where the
training clients' examples live, and the clients' own test splits.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from jaxfl.algorithms.base import (
    FederatedAlgorithm,
    server_optimizer,
)
from jaxfl.algorithms.registry import (
    ASYNCHRONOUS_ALGORITHMS,
    CLIENT_STATE_ALGORITHMS,
    PERSONAL_MODEL_ALGORITHMS,
    SPECS,
    Engine,
    algorithm_names,
    algorithm_spec,
    build_algorithm,
    hparam_fields,
    setting_users,
)
from jaxfl.clock import Clock, diurnal_availability, lognormal_profiles, read_availability, read_profiles
from jaxfl.clock.reporting import check_someone_can_report
from jaxfl.communication import Traffic, UpdateCompression, round_traffic
from jaxfl.communication.traffic import model_bytes, update_bytes
from jaxfl.data.host import HostPopulation, Placement, choose_residency, place_population
from jaxfl.data.population import FederatedDataset
from jaxfl.data.registry import load_dataset
from jaxfl.data.splits import split_client_examples
from jaxfl.experiment.checks import check_round_fits, choose_client_state, data_warnings
from jaxfl.experiment.config import DEFAULTS, ConfigError, RunConfig, held_warnings, warn

# The settings of a built algorithm; also imported from here.
from jaxfl.experiment.hparams import algorithm_hparams, algorithm_options
from jaxfl.experiment.robustness import run_robustness
from jaxfl.models.networks import count_parameters, make_model
from jaxfl.training.local import LocalTraining, Task
from jaxfl.training.strategies import ClientStrategy, default_strategy, parse_strategy


@dataclasses.dataclass(frozen=True)
class Setup:
    """A validated run, ready to train: data, model and algorithms built."""

    config: RunConfig
    dataset: FederatedDataset
    engine: Engine
    algorithms: dict[str, FederatedAlgorithm]
    hparams: dict[str, dict[str, float]]  # algorithm name -> its init hparams
    ignored_settings: tuple[str, ...] = ()  # set, but no chosen algorithm uses them
    placement: Placement | None = None  # where the training clients' examples live
    corrupted: np.ndarray | None = None  # [N] bool: the attack's corrupted training clients
    # algorithm name -> the bytes of its messages (None: not counted; jaxfl.communication.traffic)
    traffic: dict[str, Traffic | None] = dataclasses.field(default_factory=dict)


def asynchronous_warmup(config: RunConfig, name: str, num_clients: int) -> int:
    """The first server steps of an asynchronous algorithm that only start clients (0 for the others)."""
    options = config.options
    if name not in ASYNCHRONOUS_ALGORITHMS:
        return 0
    from jaxfl.algorithms.fedbuff import concurrency

    arrivals = algorithm_spec(name).step_arrivals(config.server.clients_per_round)
    cohort = config.server.clients_per_round
    return concurrency({"concurrency": options.concurrency}, cohort, num_clients) // arrivals


# fold_in data of the run key's clock stream (device profiles, diurnal start hours).
CLOCK_STREAM = 0x434C4F43


def choose_strategy(text: str, num_parameters: int) -> ClientStrategy:
    if text == "auto":
        return default_strategy(
            jax.default_backend(), num_parameters, jax.local_device_count()
        )
    try:
        return parse_strategy(text)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def choose_local_loop(text: str) -> str:
    """'auto' resolves from measurements (docs/strategies.md, "The measurements
    behind them"): on a GPU the fused kernel (`jaxfl.training.fused`, dense
    models; the scan for the others), each round one CUDA graph; TPUs take
    the fixed-length scan, which on GPUs beat the while loop (a loop whose
    trip count is data-dependent waits for its predicate on the host every
    iteration there); on the CPU the while loop, which skips padding steps,
    was faster in every layout.

    Raises:
      ConfigError: 'fused' off a GPU (its kernel is a Triton one; on CPU
        it runs only in the Pallas interpreter, for tests).
    """
    backend = jax.default_backend()
    if text == "fused" and backend != "gpu":
        raise ConfigError(
            f"local_loop 'fused' needs a GPU (the backend is {backend}); use scan, while or auto"
        )
    if text != "auto":
        return text
    if backend == "gpu":
        return "fused"
    return "scan" if backend == "tpu" else "while"


def run_compression(config: RunConfig, num_clients: int) -> UpdateCompression | None:
    """The run's update compression (`--compression` and its options), or None."""
    communication = config.communication
    if communication.compression is None:
        return None
    try:
        return UpdateCompression(
            communication.compression,
            bits=communication.compression_bits,
            fraction=communication.compression_fraction,
            bucket_size=communication.compression_bucket if communication.compression == "qsgd" else None,
            rotation=communication.compression_rotation,
            error_feedback=communication.error_feedback,
            num_clients=num_clients if communication.error_feedback else None,
        )
    except ValueError as error:
        raise ConfigError(f"compression: {error}") from None


def run_clock(config: RunConfig, dataset, local, model_shape, compression, placement) -> Clock | None:
    """The run's simulated clock (`--availability` and its settings), or None.

    Runs of an asynchronous algorithm (FedBuff, FedAsync) always have one,
    every client online.

    Log-normal profiles and diurnal start hours are drawn from a fixed key,
    `fold_in(key(0), CLOCK_STREAM)`, whatever the run's seed: they are the
    simulated population's, like its data.

    Raises:
      ConfigError: an unreadable or malformed trace, a setting out of range,
        a host-resident population, or a clock under which no client could
        ever report.
    """
    asynchronous = [name for name in config.algorithms if name in ASYNCHRONOUS_ALGORITHMS]
    if config.clock.availability is None and not asynchronous:
        return None
    if placement is not None and placement.residency == "host":
        raise ConfigError(
            "the simulated clock selects among the clients online in each round, on the device; the training "
            "clients are host-resident here (use --residency device, or fewer clients)"
        )
    num_clients = dataset.train.num_clients
    # The devices belong to the simulated population, like its data: the same for every seed, so that a
    # sweep's seeds (one engine) vary the training and each point is the single run of its settings.
    clock_key = jax.random.fold_in(jax.random.key(0), CLOCK_STREAM)
    profile_key, availability_key = jax.random.split(clock_key)
    try:
        if config.clock.device_profiles == "lognormal":
            profiles = lognormal_profiles(profile_key, num_clients)
        else:
            profiles = read_profiles(config.clock.device_profiles, num_clients)
        availability = None
        if config.clock.availability == "diurnal":
            availability = diurnal_availability(availability_key, num_clients, config.clock.diurnal_hours)
        elif config.clock.availability not in (None, "always"):
            availability = read_availability(
                config.clock.availability, num_clients, config.clock.availability_period
            )
        clock = Clock(profiles, availability, config.clock.overselect, config.clock.report_deadline)
        selected = clock.selected(config.server.clients_per_round)
        if selected > num_clients:
            raise ValueError(
                f"overselect={config.clock.overselect:g} selects {selected} clients a round, more than the "
                f"{num_clients} training clients"
            )
        counts = np.asarray(dataset.train.counts)
        steps = np.asarray(local.num_steps(counts))
        check_someone_can_report(
            clock, counts, steps, model_bytes(model_shape), update_bytes(model_shape, compression)
        )
    except ValueError as error:
        raise ConfigError(f"clock: {error}") from None
    return clock


def run_server_optimizer(config: RunConfig):
    """The run's server optimizer (`jaxfl.algorithms.base.server_optimizer`)."""
    return server_optimizer(config.server.server_optimizer, **server_settings(config))


def server_settings(config: RunConfig) -> dict[str, Any]:
    """The run's server-optimizer settings, for any optimizer (`Engine.server_settings`)."""
    return {
        "learning_rate": config.server.server_lr,
        "momentum": config.server.server_momentum,
        "beta1": config.server.server_beta1,
        "beta2": config.server.server_beta2,
        "epsilon": config.server.server_epsilon,
    }


_SERVER_OPTIMIZER_SETTINGS = {
    "server_momentum": ("sgd", "avgm"),
    "server_beta1": ("adam", "yogi"),
    "server_beta2": ("adam", "yogi"),
    "server_epsilon": ("adagrad", "adam", "yogi"),
}


_FINETUNE_SETTINGS = ("finetune_epochs", "finetune_ewc", "finetune_skl")


def ignored_settings(
    config: RunConfig, algorithms: dict[str, FederatedAlgorithm]
) -> tuple[str, ...]:
    """Algorithm settings changed from their default that no chosen algorithm uses.

    Such a setting is accepted and ignored (a comparison of several
    algorithms shares one configuration); `setup` prints a warning for each.
    """
    server = config.server
    settings = sorted({f for spec in SPECS.values() for f in spec.settings})
    used = set()
    for name, algorithm in algorithms.items():
        spec = algorithm_spec(name)
        used.update(hparam_fields(name, algorithm), spec.options, spec.privacy_settings)
    optimizers = {algorithm_spec(name).server_optimizer or server.server_optimizer for name in algorithms}
    used.update(f for f, users in _SERVER_OPTIMIZER_SETTINGS.items() if optimizers & set(users))
    # Fine-tuning serves the algorithms without personal models of their own; the
    # client-state layout, those with per-client state.
    if any(n not in PERSONAL_MODEL_ALGORITHMS and a.personalize is None for n, a in algorithms.items()):
        used.update(_FINETUNE_SETTINGS)
    if any(name in CLIENT_STATE_ALGORITHMS for name in algorithms):
        used.add("client_state")
    settings = sorted({*settings, *_SERVER_OPTIMIZER_SETTINGS, *_FINETUNE_SETTINGS, "client_state"})
    return tuple(
        field
        for field in settings
        if field not in used and config.setting(field) != DEFAULTS.setting(field)
    )


SEQUENCE_MODELS = ("char-lstm", "word-lstm", "transformer")
PRETRAINED_EMBEDDING_MODELS = ("sent140-lstm", "mean-embedding-logistic")


def frozen_embeddings(config: RunConfig):
    """The GloVe vectors the Sent140 token models embed with, or None for other models.

    The same vectors the 'sent140' dataset looked its words up in
    (`jaxfl.data.formats.glove.find_glove` with the dataset's embedding_dim).
    """
    if config.network.model not in PRETRAINED_EMBEDDING_MODELS:
        return None
    from jaxfl.data.formats.glove import find_glove

    dim = int(config.data.dataset_options.get("embedding_dim", 50))
    return find_glove(config.data.data_dir, dim).vectors


def check_model_fits_targets(model, dataset, config: RunConfig) -> None:
    """A one-line ConfigError unless the model predicts what the examples hold.

    One label per example needs logits `[C]` (or `[1]`: a binary label);
    a token sequence y `[L]` (int32 ids) needs logits `[L, V]`; multi-label
    indicators y `[T]` (any other dtype) need logits `[T]`. Checked on
    shapes and dtypes only.
    """
    data, network = config.data, config.network
    params = jax.eval_shape(model.init, jax.random.key(0))
    example = jax.ShapeDtypeStruct((1, *dataset.input_shape), dataset.train.features["x"].dtype)
    logits = jax.eval_shape(model.apply, params, example).shape[1:]
    target = tuple(dataset.train.features["y"].shape[1:])
    if len(target) == 1 and dataset.train.features["y"].dtype != np.int32:
        if logits != target:
            raise ConfigError(
                f"dataset {data.dataset} has {target[0]} labels per example (multi-label) and model "
                f"{network.model} predicts {list(logits)} outputs: choose a classifier of {target[0]} "
                "outputs (e.g. bag-logistic)"
            )
        return
    if target and logits[:-1] != target:
        raise ConfigError(
            f"dataset {data.dataset} has {list(target)} targets per example (a sequence layout) and "
            f"model {network.model} predicts one label per example: choose {', '.join(SEQUENCE_MODELS)}, "
            "or a one-label layout (e.g. --dataset-option layout=next-char)"
        )
    if not target and len(logits) != 1:
        raise ConfigError(
            f"dataset {data.dataset} has one label per example and model {network.model} predicts "
            f"{list(logits[:-1])} tokens: choose a classifier, or --dataset-option layout=sequence"
        )
    if not target and logits[0] not in (1, dataset.num_classes):
        raise ConfigError(
            f"model {network.model} has {logits[0]} outputs and dataset {data.dataset} "
            f"{dataset.num_classes} classes"
        )


def personal_validation_examples(config: RunConfig, dataset: FederatedDataset):
    """The training clients' own validation examples, where an algorithm chooses on them.

    Ditto's dynamic lambda (`--ditto-dynamic-lam`) reads them inside the
    compiled round, given with the training examples (`training_input`);
    None where no algorithm of the run does.

    Raises:
      ConfigError: dynamic lambda without validation client k = training client k.
    """
    options = config.options
    if not (options.ditto_dynamic_lam and set(setting_users("ditto_dynamic_lam")) & set(config.algorithms)):
        return None
    if dataset.validation is None or not dataset.personal_splits:
        raise ConfigError(
            "ditto_dynamic_lam chooses on each client's own validation examples: give --client-split and "
            "--client-validation-split (or a dataset whose validation clients are its training clients)"
        )
    return dataset.validation


def run_model(config: RunConfig, dataset: FederatedDataset):
    """The run's model for the dataset's inputs and classes; ConfigError where it does not fit them."""
    try:
        model = make_model(
            config.network.model,
            dataset.input_shape,
            dataset.num_classes,
            hidden_sizes=config.network.hidden_sizes,
            input_vocab_size=dataset.input_vocab_size,
            embedding_dim=config.network.embedding_dim,
            embedding_table=frozen_embeddings(config),
        )
    except ValueError as error:
        raise ConfigError(f"model: {error}") from None
    check_model_fits_targets(model, dataset, config)
    return model


@held_warnings()
def setup(config: RunConfig) -> Setup:
    """Builds everything a run needs, checking what depends on the data.

    Warnings (settings accepted that change nothing) are printed once every
    check passed; a refused run prints only its error.

    Raises:
      ConfigError: an invalid combination (unknown algorithm or dataset
        option, more clients per round than training clients, ...).
    """
    runtime = config.runtime
    for name in config.algorithms:
        if name not in algorithm_names():
            raise ConfigError(
                f"algorithm must be one of {', '.join(algorithm_names())}, got {name!r}"
            )
    try:
        data = config.data
        dataset = load_dataset(data.dataset, data_dir=data.data_dir, **data.dataset_options)
    except ValueError as error:
        raise ConfigError(str(error).splitlines()[0]) from None
    if config.data.client_validation_split is not None and config.data.client_split is None:
        raise ConfigError("client_validation_split needs client_split (the clients' own test data)")
    if config.data.client_split is not None:
        dataset = personal_test_split(
            dataset, data.client_split, runtime.seed, validation_fraction=data.client_validation_split
        )
    robustness, dataset, corrupted = run_robustness(config, dataset)
    dataset, placement = place_dataset(dataset, config.data.residency)
    num_train = dataset.train.num_clients
    if config.server.clients_per_round > num_train:
        raise ConfigError(
            f"clients_per_round must be in [1, {num_train}] (the training clients "
            f"of {config.data.dataset}), got {config.server.clients_per_round}"
        )
    model = run_model(config, dataset)
    model_shape = jax.eval_shape(model.init, jax.random.key(0))
    num_parameters = count_parameters(model_shape)
    strategy = choose_strategy(runtime.strategy, num_parameters)
    strategy = choose_client_state(config, strategy, num_train, num_parameters)
    device_rows = [name for name in config.algorithms if not algorithm_spec(name).host_rows]
    if strategy.host_client_state and device_rows:
        advice = (
            "--client-state auto chose host memory, as they fit the devices neither replicated nor split: "
            "use fewer training clients" if config.personalization.client_state == "auto"
            else "use --client-state replicated or split"
        )
        raise ConfigError(
            f"{device_rows[0]} reads all N clients' rows every round, so they cannot live in host memory; "
            f"{advice}"
        )
    local = LocalTraining(
        batch_size=config.local.batch_size,
        num_epochs=config.local.local_epochs,
        max_steps=config.local.max_local_steps,
        loop=choose_local_loop(runtime.local_loop),
    )
    compression = run_compression(config, num_train)
    clock = run_clock(config, dataset, local, model_shape, compression, placement)
    engine = Engine(
        task=Task(model, excluded_target_ids=dataset.excluded_target_ids),
        local=local,
        clients_per_round=config.server.clients_per_round,
        strategy=strategy,
        server_tx=run_server_optimizer(config),
        server_settings=server_settings(config),
        client_weighting=config.server.client_weighting,
        num_clients=num_train,
        robustness=robustness,
        compression=compression,
        clock=clock,
        personal_validation=personal_validation_examples(config, dataset),
    )
    # Before anything of the round is allocated (docs/reliability.md).
    check_round_fits(config, engine.task, dataset, engine.local, engine.strategy)
    for message in data_warnings(config, dataset, engine.local):
        warn(message)
    algorithms, hparams = build_algorithms(config, engine, num_train, dataset.train.num_examples)
    ignored = ignored_settings(config, algorithms)
    for field in ignored:
        warn(f"{field} is not used by {', '.join(config.algorithms)}; ignored")
    traffic = {name: round_traffic(algorithm, model_shape) for name, algorithm in algorithms.items()}
    return Setup(config, dataset, engine, algorithms, hparams, ignored, placement, corrupted, traffic)


def build_algorithms(
    config: RunConfig, engine: Engine, num_train: int, num_train_examples: int
) -> tuple[dict[str, FederatedAlgorithm], dict[str, dict[str, float]]]:
    """The run's algorithms and their initial hyperparameters, DP noise calibrated to the budget.

    Raises:
      ConfigError: an algorithm refuses its options, or a setting it cannot run with.
    """
    algorithms, hparams = {}, {}
    for name in config.algorithms:
        try:
            algorithms[name] = build_algorithm(
                name, engine, algorithm_options(config, name)
            )
        except ValueError as error:
            raise ConfigError(f"{name}: {str(error).splitlines()[0]}") from None
        if engine.compression is not None and algorithms[name].composition is None:
            raise ConfigError(
                f"{name} writes its own round, which sends its updates uncompressed: --compression applies "
                "to the composed rounds of the other algorithms"
            )
        own_round = algorithms[name].composition is None and name not in ASYNCHRONOUS_ALGORITHMS
        if engine.clock is not None and own_round:
            raise ConfigError(f"{name} writes its own round, which does not run on the simulated clock")
        hparams[name] = algorithm_hparams(config, name, algorithms[name])
        privacy = algorithm_spec(name).privacy
        if privacy is not None:
            # Noise calibrated to the privacy budget (and every privacy
            # setting checked) before anything trains.
            try:
                hparams[name].update(
                    privacy.calibrate(
                        config.flat(),
                        num_clients=num_train,
                        clients_per_round=config.server.clients_per_round,
                        hparams=hparams[name],
                        num_examples=num_train_examples,
                    )
                )
            except ValueError as error:
                raise ConfigError(f"{name}: {str(error).splitlines()[0]}") from None
    return algorithms, hparams


def placement_line(run_setup: Setup) -> str:
    """One line saying where the training clients live and why (printed by the CLI)."""
    placement = run_setup.placement
    if placement is None or placement.residency == "device":
        reason = placement.reason if placement else "generated in memory"
        return f"training clients: device-resident ({reason})"
    rows = run_setup.dataset.train.cohort_rows(run_setup.engine.clients_per_round)
    return (
        f"training clients: host-resident, memory-mapped ({placement.reason}); each round's cohort "
        f"({rows} rows at most) is gathered on the host one call ahead"
    )


def place_dataset(dataset: FederatedDataset, residency: str) -> tuple[FederatedDataset, Placement]:
    """Puts the training clients on the device or keeps them in host memory.

    `residency` 'auto' chooses the device when the training population fits
    (`jaxfl.data.host.choose_residency`). Test and validation clients go to
    the device when they fit, whatever the training clients do: evaluation
    streams host-resident ones in blocks.
    """
    placement = choose_residency(dataset.train.nbytes, residency)
    placed = {"train": place_population(dataset.train, placement.residency)}
    for name in ("test", "validation"):
        population = getattr(dataset, name)
        if population is not None:
            requested = "device" if placement.residency == "device" else "auto"
            where = choose_residency(population.nbytes, requested)
            placed[name] = place_population(population, where.residency)
    return dataclasses.replace(dataset, **placed), placement


def personal_test_split(
    dataset: FederatedDataset, fraction: float, seed: int, *, validation_fraction: float | None = None
) -> FederatedDataset:
    """`--client-split`: every training client's examples split into train and its own test.

    Client k keeps a `1 - fraction` share of its examples for training and
    the rest becomes test client k (`jaxfl.data.splits.split_client_examples`,
    seeded by the run's seed); the dataset's own test and validation clients are
    not used. With `validation_fraction`, that share of each client's
    examples becomes validation client k (its own validation data, e.g. for
    choosing Ditto's lambda per client). The split is made in memory (a
    cached dataset is read whole).
    Personalization is evaluated this way (Li 2023, Appendix 5.7.4: each
    device's 72/8/20 split).
    """
    train, test = split_client_examples(dataset.train, 1.0 - fraction, seed)
    validation = None
    if validation_fraction is not None:
        if validation_fraction + fraction >= 1.0:
            raise ConfigError(
                f"client_split={fraction:g} and client_validation_split={validation_fraction:g} leave "
                "no training examples: their sum must be below 1"
            )
        kept = 1.0 - validation_fraction / (1.0 - fraction)
        train, validation = split_client_examples(train, kept, seed + 1)
    if isinstance(dataset.train, HostPopulation):
        # A cached dataset stays a host population (placed on the device by
        # `place_dataset` when it fits), now held in memory rather than mapped.
        train, test = HostPopulation.from_device(train), HostPopulation.from_device(test)
        validation = None if validation is None else HostPopulation.from_device(validation)
    return dataclasses.replace(dataset, train=train, test=test, validation=validation, personal_splits=True)


# fold_in data of the run key's fine-tuning stream (apart from the rounds').
