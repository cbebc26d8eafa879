"""The host-side driver: build a run from its config, loop over rounds, evaluate.

The round is jitted once for the whole run with the server state donated;
the loop only dispatches it, so nothing goes back to the host between
evaluations. Evaluation (per-client metrics of every training and test client
and their summaries) is one more compiled function.

References:
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxfl.algorithms.base import (
    FederatedAlgorithm,
    ServerState,
    local_learning_rate,
    no_personal_models,
    own_models,
    place_state,
    server_optimizer,
)
from jaxfl.algorithms.registry import (
    CLIENT_STATE_ALGORITHMS,
    PERSONAL_MODEL_ALGORITHMS,
    SPECS,
    Engine,
    algorithm_names,
    algorithm_spec,
    build_algorithm,
    hparam_fields,
)
from jaxfl.data.host import HostPopulation, Placement, choose_residency, place_population
from jaxfl.data.population import ClientPopulation, FederatedDataset
from jaxfl.data.registry import load_dataset
from jaxfl.data.splits import split_client_examples
from jaxfl.evaluation.per_client import (
    host_personal_metrics,
    host_population_metrics,
    per_client_metrics,
    personal_client_metrics,
)
from jaxfl.evaluation.summaries import loss_and_error_summaries
from jaxfl.experiment.checkpoints import RunCheckpoints
from jaxfl.experiment.checks import check_round_fits, choose_client_state, data_warnings
from jaxfl.experiment.config import ConfigError, RunConfig, held_warnings, warn
from jaxfl.experiment.health import divergence, host_health, initial_health, monitored

# The settings of a built algorithm; also imported from here.
from jaxfl.experiment.hparams import algorithm_hparams, algorithm_options, local_hparams  # noqa: F401
from jaxfl.experiment.interrupts import RunInterrupted, current_request
from jaxfl.experiment.robustness import attack_record, run_robustness
from jaxfl.models.networks import count_parameters, make_model
from jaxfl.training.client_state import HostClientState, HostPersonalModels, is_on_host
from jaxfl.training.cohort import finetune_models
from jaxfl.training.host_cohorts import CohortStream
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


@dataclasses.dataclass
class RunResult:
    """What one algorithm's run produced.

    Attributes:
      algorithm: its name.
      state: the final server state (None for a result read back from disk).
      history: one dict per evaluation (round, summaries, round metrics).
      summary: the final summaries (`train_loss`, `train_error`,
        `test_loss`, `test_error`, each a dict of statistics), the run's
        `status` ('finished' or 'diverged', with `diverged` saying where and
        what), `rounds_without_weight`, and what depends only on the config
        and the seed.
      clients: population name -> {'num_examples', 'loss', 'error', 'targets'} NumPy
        arrays of the final model (of the last evaluation of a diverged run).
      timing: wall-clock figures (compile, training, evaluation and
        checkpoint seconds, rounds per second), kept apart from the results.
    """

    algorithm: str
    state: ServerState | None
    history: list[dict[str, Any]]
    summary: dict[str, Any]
    clients: dict[str, dict[str, np.ndarray]]
    timing: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def diverged(self) -> dict[str, Any] | None:
        return self.summary.get("diverged")


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


def run_server_optimizer(config: RunConfig):
    """The run's server optimizer (`jaxfl.algorithms.base.server_optimizer`)."""
    return server_optimizer(
        config.server_optimizer,
        config.server_lr,
        momentum=config.server_momentum,
        beta1=config.server_beta1,
        beta2=config.server_beta2,
        epsilon=config.server_epsilon,
    )


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
    defaults = RunConfig()
    settings = sorted(
        {f for spec in SPECS.values() for f in (*spec.hparams, *spec.options)}
        | {f for spec in SPECS.values() if spec.privacy for f in spec.privacy.settings}
    )
    used = set()
    for name, algorithm in algorithms.items():
        spec = algorithm_spec(name)
        used.update(hparam_fields(name, algorithm), spec.options)
        if spec.privacy is not None:
            used.update(spec.privacy.settings)
    used.update(f for f, users in _SERVER_OPTIMIZER_SETTINGS.items() if config.server_optimizer in users)
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
        if field not in used and getattr(config, field) != getattr(defaults, field)
    )


SEQUENCE_MODELS = ("char-lstm", "word-lstm", "transformer")
PRETRAINED_EMBEDDING_MODELS = ("sent140-lstm", "mean-embedding-logistic")


def frozen_embeddings(config: RunConfig):
    """The GloVe vectors the Sent140 token models embed with, or None for other models.

    The same vectors the 'sent140' dataset looked its words up in
    (`jaxfl.data.formats.glove.find_glove` with the dataset's embedding_dim).
    """
    if config.model not in PRETRAINED_EMBEDDING_MODELS:
        return None
    from jaxfl.data.formats.glove import find_glove

    dim = int(config.dataset_options.get("embedding_dim", 50))
    return find_glove(config.data_dir, dim).vectors


def check_model_fits_targets(model, dataset, config: RunConfig) -> None:
    """A one-line ConfigError unless the model predicts what the examples hold.

    One label per example needs logits `[C]` (or `[1]`: a binary label);
    a token sequence y `[L]` (int32 ids) needs logits `[L, V]`; multi-label
    indicators y `[T]` (any other dtype) need logits `[T]`. Checked on
    shapes and dtypes only.
    """
    params = jax.eval_shape(model.init, jax.random.key(0))
    example = jax.ShapeDtypeStruct((1, *dataset.input_shape), dataset.train.features["x"].dtype)
    logits = jax.eval_shape(model.apply, params, example).shape[1:]
    target = tuple(dataset.train.features["y"].shape[1:])
    if len(target) == 1 and dataset.train.features["y"].dtype != np.int32:
        if logits != target:
            raise ConfigError(
                f"dataset {config.dataset} has {target[0]} labels per example (multi-label) and model "
                f"{config.model} predicts {list(logits)} outputs: choose a classifier of {target[0]} "
                "outputs (e.g. bag-logistic)"
            )
        return
    if target and logits[:-1] != target:
        raise ConfigError(
            f"dataset {config.dataset} has {list(target)} targets per example (a sequence layout) and "
            f"model {config.model} predicts one label per example: choose {', '.join(SEQUENCE_MODELS)}, "
            "or a one-label layout (e.g. --dataset-option layout=next-char)"
        )
    if not target and len(logits) != 1:
        raise ConfigError(
            f"dataset {config.dataset} has one label per example and model {config.model} predicts "
            f"{list(logits[:-1])} tokens: choose a classifier, or --dataset-option layout=sequence"
        )
    if not target and logits[0] not in (1, dataset.num_classes):
        raise ConfigError(
            f"model {config.model} has {logits[0]} outputs and dataset {config.dataset} "
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
    if not (config.ditto_dynamic_lam and "ditto" in config.algorithms):
        return None
    if dataset.validation is None or not dataset.personal_splits:
        raise ConfigError(
            "ditto_dynamic_lam chooses on each client's own validation examples: give --client-split and "
            "--client-validation-split (or a dataset whose validation clients are its training clients)"
        )
    return dataset.validation


@held_warnings()
def setup(config: RunConfig) -> Setup:
    """Builds everything a run needs, checking what depends on the data.

    Warnings (settings accepted that change nothing) are printed once every
    check passed; a refused run prints only its error.

    Raises:
      ConfigError: an invalid combination (unknown algorithm or dataset
        option, more clients per round than training clients, ...).
    """
    for name in config.algorithms:
        if name not in algorithm_names():
            raise ConfigError(
                f"algorithm must be one of {', '.join(algorithm_names())}, got {name!r}"
            )
    try:
        dataset = load_dataset(config.dataset, data_dir=config.data_dir, **config.dataset_options)
    except ValueError as error:
        raise ConfigError(str(error).splitlines()[0]) from None
    if config.client_validation_split is not None and config.client_split is None:
        raise ConfigError("client_validation_split needs client_split (the clients' own test data)")
    if config.client_split is not None:
        dataset = personal_test_split(
            dataset, config.client_split, config.seed, validation_fraction=config.client_validation_split
        )
    robustness, dataset, corrupted = run_robustness(config, dataset)
    dataset, placement = place_dataset(dataset, config.residency)
    num_train = dataset.train.num_clients
    if config.clients_per_round > num_train:
        raise ConfigError(
            f"clients_per_round must be in [1, {num_train}] (the training clients "
            f"of {config.dataset}), got {config.clients_per_round}"
        )
    try:
        model = make_model(
            config.model,
            dataset.input_shape,
            dataset.num_classes,
            hidden_sizes=config.hidden_sizes,
            input_vocab_size=dataset.input_vocab_size,
            embedding_dim=config.embedding_dim,
            embedding_table=frozen_embeddings(config),
        )
    except ValueError as error:
        raise ConfigError(f"model: {error}") from None
    check_model_fits_targets(model, dataset, config)
    num_parameters = count_parameters(jax.eval_shape(model.init, jax.random.key(0)))
    strategy = choose_strategy(config.strategy, num_parameters)
    strategy = choose_client_state(config, strategy, num_train, num_parameters)
    if strategy.host_client_state and "l2sgd" in config.algorithms:
        advice = (
            "--client-state auto chose host memory, as they fit the devices neither replicated nor split: "
            "use fewer training clients" if config.client_state == "auto"
            else "use --client-state replicated or split"
        )
        raise ConfigError(
            f"l2sgd averages all N personal models every round, so they cannot live in host memory; {advice}"
        )
    engine = Engine(
        task=Task(model, excluded_target_ids=dataset.excluded_target_ids),
        local=LocalTraining(
            batch_size=config.batch_size,
            num_epochs=config.local_epochs,
            max_steps=config.max_local_steps,
            loop=choose_local_loop(config.local_loop),
        ),
        clients_per_round=config.clients_per_round,
        strategy=strategy,
        server_tx=run_server_optimizer(config),
        client_weighting=config.client_weighting,
        num_clients=num_train,
        robustness=robustness,
        personal_validation=personal_validation_examples(config, dataset),
    )
    # Before anything of the round is allocated (docs/reliability.md).
    check_round_fits(config, engine.task, dataset, engine.local, engine.strategy)
    for message in data_warnings(config, dataset, engine.local):
        warn(message)
    algorithms, hparams = {}, {}
    for name in config.algorithms:
        try:
            algorithms[name] = build_algorithm(
                name, engine, algorithm_options(config, name)
            )
        except ValueError as error:
            raise ConfigError(f"{name}: {str(error).splitlines()[0]}") from None
        hparams[name] = algorithm_hparams(config, name, algorithms[name])
        privacy = algorithm_spec(name).privacy
        if privacy is not None:
            # Noise calibrated to the privacy budget (and every privacy
            # setting checked) before anything trains.
            try:
                hparams[name].update(
                    privacy.calibrate(
                        config,
                        num_clients=num_train,
                        clients_per_round=config.clients_per_round,
                        hparams=hparams[name],
                    )
                )
            except ValueError as error:
                raise ConfigError(f"{name}: {str(error).splitlines()[0]}") from None
    ignored = ignored_settings(config, algorithms)
    for field in ignored:
        warn(f"{field} is not used by {', '.join(config.algorithms)}; ignored")
    return Setup(config, dataset, engine, algorithms, hparams, ignored, placement, corrupted)


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


def _summary_weights(name, population, client_weighting, benign):
    """alpha_i for training clients, equal weights for the others; times the benign mask if any."""
    weights = population.client_weights(client_weighting) if name == "train" else None
    if benign is None:
        return weights
    return benign if weights is None else weights * benign


def _evaluate_populations(task: Task, client_weighting: str, params, populations, benign=None):
    """Summaries and per-client metrics of `params` on each population.

    `benign` (population name -> `[N]` float32 0/1, or None) restricts the
    summaries to the benign clients of a run with an attack.
    """
    benign = benign or {}
    to_summarize, clients = {}, {}
    for name, population in populations.items():
        metrics = per_client_metrics(task, params, population)
        weights = _summary_weights(name, population, client_weighting, benign.get(name))
        to_summarize[name] = (metrics.loss, metrics.error, weights)
        clients[name] = {"loss": metrics.loss, "error": metrics.error, "targets": metrics.targets}
    return loss_and_error_summaries(to_summarize), clients


@jax.jit
def _summarize_host(loss, error, weights):
    """The loss and error summaries of one host-resident population's per-client metrics."""
    summaries = loss_and_error_summaries({"population": (loss, error, weights)})
    return summaries["population_loss"], summaries["population_error"]


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
FINETUNE_STREAM = 0x46494E45


def finetuned_models(run_setup: Setup, state: ServerState, run_key) -> Any:
    """`--finetune-epochs E`: every training client's fine-tuned global model, leaves `[N, ...]`.

    E epochs of the run's local SGD (batch size, learning rate at the final
    round) from the final global model on each client's training examples,
    with key `fold_in(fold_in(run_key, FINETUNE_STREAM), k)`, with EWC's
    Fisher-weighted penalty under `--finetune-ewc`, the symmetrized KL
    divergence to the global model's outputs under `--finetune-skl`; evaluated as personal
    models (`personal_*` summaries and columns).
    """
    config, engine = run_setup.config, run_setup.engine
    local = dataclasses.replace(engine.local, num_epochs=config.finetune_epochs, max_steps=None)
    population = place_population(run_setup.dataset.train, "device")
    lr = local_learning_rate(state.hparams, state.round)
    ewc_lam = None if config.finetune_ewc is None else jnp.float32(config.finetune_ewc)
    skl_lam = None if config.finetune_skl is None else jnp.float32(config.finetune_skl)
    return _finetune(
        engine.task, local, engine.strategy, state.params, population,
        jax.random.fold_in(run_key, FINETUNE_STREAM), lr, ewc_lam=ewc_lam, skl_lam=skl_lam,
    ).params


_finetune = jax.jit(finetune_models, static_argnums=(0, 1, 2))


def personalized_models(
    run_setup: Setup, algorithm: FederatedAlgorithm, state: ServerState, *, batched: bool = False
) -> Any:
    """An algorithm's personal models made after training (`FederatedAlgorithm.personalize`:
    Per-FedAvg's adaptation step), from the final state and the training clients' examples
    (copied to the device if they are host-resident); evaluated as personal models.
    `batched`: the state carries a leading sweep axis, and so do the models.
    """
    population = place_population(run_setup.dataset.train, "device")
    personalize = jax.vmap(algorithm.personalize, in_axes=(0, None)) if batched else algorithm.personalize
    return jax.jit(personalize)(state, run_setup.engine.strategy.replicate(population))


def personal_models(algorithm: FederatedAlgorithm, state: ServerState) -> Any:
    """`algorithm.personal_models(state)`, or for host-resident client rows the
    `HostPersonalModels` that make them block by block on the device.
    """
    if not is_on_host(state.clients) or algorithm.personal_models is no_personal_models:
        return algorithm.personal_models(state)
    if algorithm.personal_models is own_models:
        return HostPersonalModels(state.clients)
    device_part = dataclasses.replace(state, clients=())
    return HostPersonalModels(
        state.clients, functools.partial(_block_personal_models, algorithm.personal_models, device_part)
    )


@functools.partial(jax.jit, static_argnums=0)
def _block_personal_models(personal_models_fn: Callable, device_part: ServerState, rows: Any) -> Any:
    """`personal_models_fn` of a block of host rows; the state is an argument (not a constant of the
    program), so one compilation serves every evaluation and the save.
    """
    return personal_models_fn(dataclasses.replace(device_part, clients=rows))


def saved_personal_models(algorithm: FederatedAlgorithm, state: ServerState) -> Any:
    """The personal models a run saves: `personal_models`, host-resident ones brought to host arrays."""
    models = personal_models(algorithm, state)
    return models.to_host() if isinstance(models, HostPersonalModels) else models


def personal_evaluation_group(strategy: ClientStrategy) -> int:
    """Clients whose personal models are evaluated together: the run's layout's.

    One at a time where the round trains clients one at a time (large models
    on CPU): there, vmapping clients over their own weights was far slower
    than one at a time (measured: benchmarks/RESULTS.md, section
    "Ditto and the robust aggregators against FedAvg (`robustness_cost.py`, 2026-11-26)").
    """
    kind = strategy.inner if strategy.kind == "sharded" else strategy.kind
    if kind == "sequential":
        return 1
    if kind == "chunked":
        return strategy.chunk_size
    return 16


def _evaluate_personal_models(
    task: Task, client_weighting: str, group: int, personal, populations, benign=None
):
    """Summaries and per-client metrics of each client's own model v_k."""
    benign = benign or {}
    to_summarize, clients = {}, {}
    for name, population in populations.items():
        loss, error = personal_client_metrics(task, personal, population, group=group)
        weights = _summary_weights(name, population, client_weighting, benign.get(name))
        to_summarize[name] = (loss, error, weights)
        clients[name] = {"personal_loss": loss, "personal_error": error}
    return loss_and_error_summaries(to_summarize, prefix="personal_"), clients


_evaluate_personal = jax.jit(_evaluate_personal_models, static_argnums=(0, 1, 2))
_evaluate_personal_batched = jax.jit(
    jax.vmap(_evaluate_personal_models, in_axes=(None, None, None, 0, None, None)), static_argnums=(0, 1, 2)
)


# Module-level jits with the task static: every run of a setup (several
# algorithms, sweeps, the family) shares one compiled evaluation.
_evaluate = jax.jit(_evaluate_populations, static_argnums=(0, 1))
_evaluate_batched = jax.jit(
    jax.vmap(_evaluate_populations, in_axes=(None, None, 0, None, None)), static_argnums=(0, 1)
)


def make_evaluator(
    task: Task,
    dataset: FederatedDataset,
    client_weighting: str,
    *,
    batched: bool = False,
    corrupted: np.ndarray | None = None,
    personal_group: int = 16,
) -> Callable[[Any], tuple[dict, dict]]:
    """A compiled `(params, personal=()) -> (summaries, per-client metrics)`.

    Training clients' summaries are weighted by alpha_i; test and validation
    clients count equally (Pillutla et al. 2023, Appendix C.3). With `batched=True` the
    parameters carry a leading sweep axis and every output gains that axis.

    `personal`, per-client models (`ServerState.clients`, leaves `[N, ...]`,
    Ditto), adds each client's metrics under its own model: summaries
    `personal_train_loss`, `personal_train_error` and, when the dataset's test
    (validation) client k is training client k (`personal_splits`), the same
    for test (validation); per-client `personal_loss`, `personal_error`.

    `personal_group` personal models are evaluated at once
    (`personal_evaluation_group`). `corrupted` (`[N]` bool, a run with an
    attack) leaves the corrupted
    training clients (and, with `personal_splits`, their test and validation
    data) out of the summaries, and marks them `attacked` per client.
    """
    populations = {"train": dataset.train, "test": dataset.test}
    if dataset.validation is not None:
        populations["validation"] = dataset.validation
    on_host = {k: v for k, v in populations.items() if isinstance(v, HostPopulation)}
    on_device = {k: v for k, v in populations.items() if k not in on_host}
    evaluate = _evaluate_batched if batched else _evaluate

    def host_metrics(name, population, params):
        # Streamed in blocks of clients: device memory stays one block.
        metrics = host_population_metrics(task, params, population)
        benign_host = (~marked[name]).astype(np.float32) if name in marked else None
        weights = _summary_weights(name, population, client_weighting, benign_host)
        stats = jax.device_get(_summarize_host(metrics.loss, metrics.error, weights))
        return stats, {"loss": metrics.loss, "error": metrics.error, "targets": metrics.targets}

    marked = {}
    if corrupted is not None:
        marked = {
            name: np.asarray(corrupted, bool)
            for name in populations
            if name == "train" or dataset.personal_splits
        }
    benign = {name: jnp.asarray(~mask, jnp.float32) for name, mask in marked.items() if name in on_device}
    personal_benign = {name: jnp.asarray(~mask, jnp.float32) for name, mask in marked.items()}
    personal_populations = {}

    def populations_with_personal_models():
        # Personal models (device-resident, N of them) are evaluated client by client on a device
        # copy of a host-resident population, made at the first such evaluation: its streamed
        # blocks cannot carry N models. Runs without personal models never copy.
        if not personal_populations:
            personal_populations.update({
                name: population.to_device() if name in on_host else population
                for name, population in populations.items()
                if name == "train" or dataset.personal_splits
            })
        return personal_populations

    evaluate_personal = _evaluate_personal_batched if batched else _evaluate_personal
    host_copies = {}

    def host_personal(personal: HostPersonalModels):
        # Host-resident personal models (N beyond the device) are evaluated in blocks of clients
        # gathered from host copies of the populations.
        if not host_copies:
            host_copies.update({
                name: place_population(population, "host")
                for name, population in populations.items()
                if name == "train" or dataset.personal_splits
            })
        stats, values = {}, {}
        for name, population in host_copies.items():
            loss, error = host_personal_metrics(task, personal, population, group=personal_group)
            weights = _summary_weights(name, population, client_weighting, personal_benign.get(name))
            stats[f"personal_{name}_loss"], stats[f"personal_{name}_error"] = jax.device_get(
                _summarize_host(loss, error, weights)
            )
            values[name] = {"personal_loss": loss, "personal_error": error}
        return stats, values

    def run(params, personal=()):
        summaries, clients = jax.device_get(
            evaluate(task, client_weighting, params, on_device, benign)
        )
        personal_summaries, personal_clients = {}, {}
        if isinstance(personal, HostPersonalModels):
            personal_summaries, personal_clients = host_personal(personal)
        elif jax.tree.leaves(personal):
            personal_summaries, personal_clients = jax.device_get(
                evaluate_personal(
                    task, client_weighting, personal_group, personal, populations_with_personal_models(),
                    personal_benign,
                )
            )
        for name, population in on_host.items():
            if batched:
                # One sweep point after another, stacked as the batched path.
                points = [
                    host_metrics(name, population, jax.tree.map(lambda p, g=g: p[g], params))
                    for g in range(jax.tree.leaves(params)[0].shape[0])
                ]
                (loss_stats, error_stats), values = jax.tree.map(lambda *v: np.stack(v), *points)
            else:
                (loss_stats, error_stats), values = host_metrics(name, population, params)
            summaries[f"{name}_loss"], summaries[f"{name}_error"] = loss_stats, error_stats
            clients[name] = values
        summaries = {
            f"{prefix}{name}_{kind}": source[f"{prefix}{name}_{kind}"]
            for prefix, source in (("", summaries), ("personal_", personal_summaries))
            for name in populations
            for kind in ("loss", "error")
            if f"{prefix}{name}_{kind}" in source
        }
        if not batched:
            summaries = {
                group: {k: float(v) for k, v in stats.items()}
                for group, stats in summaries.items()
            }
        ordered = {}
        for name, population in populations.items():
            ordered[name] = {
                "num_examples": np.asarray(population.counts),
                **clients[name],
                **personal_clients.get(name, {}),
            }
            if name in marked:
                ordered[name]["attacked"] = marked[name]
        return summaries, ordered

    return run


@dataclasses.dataclass(frozen=True)
class LoopTiming:
    """Where a training loop's time went (seconds)."""

    compile_s: float  # The first call: compilation plus its rounds.
    train_s: float  # Every later call, evaluations and checkpoints excluded.
    evaluation_s: float
    steady_rounds: int  # The rounds train_s covers.
    checkpoint_s: float = 0.0
    checkpoints: int = 0

    @property
    def rounds_per_s(self) -> float | None:
        return self.steady_rounds / self.train_s if self.steady_rounds and self.train_s > 0 else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "compile_s": self.compile_s,
            "rounds_per_s": self.rounds_per_s,
            "train_s": self.train_s + self.compile_s,
            "evaluation_s": self.evaluation_s,
            "checkpoint_s": self.checkpoint_s,
            "checkpoints_saved": self.checkpoints,
        }


# Rounds fused into one compiled call where that was measured faster: rounds
# sharded over CPU devices, and rounds on a GPU, where dispatching one call per
# round from Python is a large part of a small model's round; on one CPU device
# it made no difference (docs/strategies.md, section "Several rounds per call";
# benchmarks/RESULTS.md, sections
# "Several rounds per compiled call (2026-11-26, `results/cpu-rounds-per-call-2026-11-26.jsonl`)"
# and "NVIDIA H100 80GB HBM3 (JAX 0.11.2, CUDA 13), 2026-11-27: where a round's time goes (issue 27)").
MAX_ROUNDS_PER_CALL = 10


def must_sync_each_round(strategy: ClientStrategy) -> bool:
    """Whether rounds must run one at a time rather than be queued.

    On XLA:CPU, a round sharded over several devices meets its devices at
    collectives; with several rounds queued, a device's thread can start the
    next round while another is still waiting in the previous one, and the
    process hangs (seen at ~400 queued rounds of the label-shift job on 2
    devices: "collective permute ... only 1 of them arrived"). Waiting for
    each round avoids it; on one device, or on GPU/TPU, rounds queue freely.
    """
    return strategy.mesh is not None and jax.default_backend() == "cpu"


def rounds_per_call(strategy: ClientStrategy, rounds: int, eval_every: int) -> int:
    """How many rounds one compiled call runs.

    More than one only where measured faster: rounds sharded over several CPU
    devices (`must_sync_each_round`), and accelerators, where a round of a
    small model is short enough that dispatching each from Python is a
    measurable part of it. Then the largest divisor of both `rounds` and
    `eval_every` up to `MAX_ROUNDS_PER_CALL`, so that every evaluation falls
    between calls and every call has the same length (one compilation).
    """
    if not (must_sync_each_round(strategy) or jax.default_backend() in ("gpu", "tpu")):
        return 1
    common = math.gcd(rounds, eval_every)
    return max(k for k in range(1, MAX_ROUNDS_PER_CALL + 1) if common % k == 0)


def resumed_rounds_per_call(rounds_per_call: int, start_round: int) -> int:
    """Rounds per call for a run resumed at `start_round`: a divisor of both.

    A checkpoint written by a run that fused rounds differently (on another
    backend, say) may lie inside one of this run's calls; the largest common
    divisor still divides the rounds and the evaluation period.
    """
    return math.gcd(rounds_per_call, start_round) if start_round else rounds_per_call


def compile_rounds(round_fn: Callable, num_rounds: int, *, cohort_per_round: bool = False) -> Callable:
    """`num_rounds` rounds of `round_fn` as one jitted call, the old state donated.

    The returned function maps (state, population, key) to (state, metrics
    of the last round). The rounds run in a `lax.scan`, which traces
    `round_fn` once whatever `num_rounds`; each round derives its keys from
    the state's round counter, so K rounds per call give the same result as
    one (tested). With `cohort_per_round`, `population` holds the K rounds'
    gathered cohorts stacked on a leading axis (`CohortStream`), scanned
    along with the rounds.
    """
    if num_rounds == 1:
        return jax.jit(round_fn, donate_argnums=0)

    def rounds(state, population, key):
        if cohort_per_round:
            state, metrics = jax.lax.scan(
                lambda state, cohort: round_fn(state, cohort, key), state, population
            )
        else:
            state, metrics = jax.lax.scan(
                lambda state, _: round_fn(state, population, key), state, length=num_rounds
            )
        return state, jax.tree.map(lambda m: m[-1], metrics)

    return jax.jit(rounds, donate_argnums=0)


def training_input(run_setup: Setup, run_keys: Any, num_rounds_per_call: int, first_round: int = 0) -> Any:
    """What each compiled call receives as its population.

    The training clients replicated as the strategy lays them out, or, for a
    host-resident population, the `CohortStream` that gathers each call's
    cohorts (one per run key when `run_keys` is a batch, as in sweeps). The
    engine's `personal_validation` comes with them as their `held_out` (all N
    clients', or each gathered cohort's own).
    Compile the round with `cohort_per_round=isinstance(result, CohortStream)`;
    `training_loop` closes the stream.
    """
    train = run_setup.dataset.train
    strategy = run_setup.engine.strategy
    held_out = run_setup.engine.personal_validation
    if isinstance(train, HostPopulation):
        return CohortStream(
            train,
            run_keys,
            run_setup.engine.clients_per_round,
            rounds_per_call=num_rounds_per_call,
            first_round=first_round,
            place=strategy.replicate,
            held_out=None if held_out is None else place_population(held_out, "host"),
        )
    if held_out is not None:
        held_out = place_population(held_out, "device")
    return strategy.replicate(dataclasses.replace(train, held_out=held_out))


class RunDiverged(Exception):
    """A single run's health says it diverged (`jaxfl.experiment.health`).

    Attributes:
      round: the first round whose outcome failed a check.
      quantity: what failed, in words.
      detected_at: the round at which the host saw it.
      health: the run's health then (host arrays).
    """

    def __init__(self, diverged: dict[str, Any], detected_at: int, health: dict[str, np.ndarray]):
        super().__init__(f"diverged at round {diverged['round']}: {diverged['quantity']}")
        self.round = diverged["round"]
        self.quantity = diverged["quantity"]
        self.detected_at = detected_at
        self.health = health


@dataclasses.dataclass
class Checkpointing:
    """When and where a training loop saves checkpoints.

    Attributes:
      checkpoints: where they go.
      every_rounds: save every this many rounds; None: by wall time.
      every_seconds: with `every_rounds` None, seconds between saves (0: never
        but on a signal).
      meta: round -> the JSON record saved with the arrays (history, ...).
      on_saved: called with the round after each save (e.g. to update the
        output folder's marker).
    """

    checkpoints: RunCheckpoints
    every_rounds: int | None
    every_seconds: float
    meta: Callable[[int], dict[str, Any]]
    on_saved: Callable[[int], None] | None = None

    @classmethod
    def from_config(cls, checkpoints: RunCheckpoints, config: RunConfig, meta, on_saved=None):
        return cls(checkpoints, config.checkpoint_every, config.checkpoint_seconds, meta, on_saved)

    def due(self, round_index: int, rounds_per_call: int, seconds_since_last: float) -> bool:
        if self.every_rounds is not None:
            # A multiple of every_rounds within this call's rounds.
            return round_index // self.every_rounds > (round_index - rounds_per_call) // self.every_rounds
        return self.every_seconds > 0 and seconds_since_last >= self.every_seconds

    def save(self, round_index: int, carry: Any) -> None:
        self.checkpoints.save(round_index, carry, self.meta(round_index))
        if self.on_saved is not None:
            self.on_saved(round_index)


def training_loop(
    round_fn: Callable,
    carry: Any,
    train: ClientPopulation,
    keys: Any,
    config: RunConfig,
    strategy: ClientStrategy,
    on_evaluate: Callable[[int, Any, Any], None],
    progress: Any = None,
    rounds_per_call: int = 1,
    *,
    start_round: int = 0,
    checkpointing: Checkpointing | None = None,
    stop_on_divergence: bool = True,
    client_state: HostClientState | None = None,
) -> tuple[Any, LoopTiming]:
    """Runs rounds `start_round + 1 .. config.rounds`, evaluating every `config.eval_every`.

    `round_fn` is a compiled call running `rounds_per_call` rounds of a
    `monitored` round (`compile_rounds`) over the carry `(state, RunHealth)`;
    `train` is the training population, or the `CohortStream` of a
    host-resident one (each call then gets its rounds' gathered cohorts).
    Calls are dispatched without waiting for each other (nothing goes back
    to the host between evaluations and checkpoints) except where
    `must_sync_each_round`. `on_evaluate(round_index, state, metrics)` runs
    after the evaluation rounds and the last one; its time is counted apart.

    Between calls the loop saves a checkpoint when `checkpointing` says it is
    due, and stops on SIGINT/SIGTERM (`jaxfl.experiment.interrupts`) after
    saving one, raising `RunInterrupted`. Whenever it waits for the device
    anyway (evaluations, checkpoints, the end) it reads the run's health; a
    diverged single run raises `RunDiverged` before evaluating or saving
    the diverged state (`stop_on_divergence`; a sweep's points go on).

    With `client_state`, the state's per-client rows live in host memory:
    each call (one round) receives its cohort's rows and the loop writes
    them back after it (`jaxfl.training.client_state`).
    """
    if config.rounds % rounds_per_call or config.eval_every % rounds_per_call:
        raise ValueError(f"rounds_per_call {rounds_per_call} must divide rounds and eval_every")
    if start_round % rounds_per_call:
        raise ValueError(f"start_round {start_round} must be a multiple of rounds_per_call {rounds_per_call}")
    if client_state is not None and rounds_per_call != 1:
        raise ValueError("host-resident client state runs one round per call")
    try:
        return _training_loop(
            round_fn, carry, train, keys, config, strategy, on_evaluate, progress, rounds_per_call,
            start_round, checkpointing, stop_on_divergence, client_state,
        )
    finally:
        if isinstance(train, CohortStream):
            train.close()


def _check_health(carry: Any, round_index: int, stop_on_divergence: bool) -> None:
    if not stop_on_divergence:
        return
    health = host_health(carry[1])
    diverged = divergence(health)
    if diverged is not None:
        raise RunDiverged(diverged, round_index, health)


def _training_loop(
    round_fn, carry, train, keys, config, strategy, on_evaluate, progress, rounds_per_call,
    start_round, checkpointing, stop_on_divergence, client_state,
):
    sync = must_sync_each_round(strategy)
    stop = current_request()
    evaluation_s = compile_s = checkpoint_s = 0.0
    saved = 0
    loop_start = last_save = time.perf_counter()
    first_call = start_round + rounds_per_call
    for round_index in range(first_call, config.rounds + 1, rounds_per_call):
        population = train.next_call() if isinstance(train, CohortStream) else train
        if client_state is not None:
            host_rows = carry[0].clients
            carry = (client_state.gather(carry[0], round_index - 1), carry[1])
        carry, metrics = round_fn(carry, population, keys)
        if client_state is not None:
            carry = (client_state.store(carry[0], host_rows, round_index - 1), carry[1])
        if round_index == first_call:
            jax.block_until_ready(carry)
            compile_s = time.perf_counter() - loop_start
        elif sync:
            jax.block_until_ready(carry)
        if progress is not None:
            progress.update(rounds_per_call)
        last = round_index == config.rounds
        evaluating = round_index % config.eval_every == 0 or last
        stopping = stop is not None and stop.signal is not None and not last
        saving = checkpointing is not None and not last and (
            stopping or checkpointing.due(round_index, rounds_per_call, time.perf_counter() - last_save)
        )
        if evaluating or saving or stopping:
            jax.block_until_ready(carry)
            _check_health(carry, round_index, stop_on_divergence)
        if evaluating:
            evaluation_start = time.perf_counter()
            on_evaluate(round_index, carry[0], metrics)
            evaluation_s += time.perf_counter() - evaluation_start
        if saving:
            save_start = time.perf_counter()
            checkpointing.save(round_index, carry)
            last_save = time.perf_counter()
            checkpoint_s += last_save - save_start
            saved += 1
        if stopping:
            if checkpointing is not None:
                checkpointing.checkpoints.wait()
            raise RunInterrupted(stop.signal, round_index, saving)
    if checkpointing is not None:
        checkpointing.checkpoints.wait()
    train_s = time.perf_counter() - loop_start - compile_s - evaluation_s - checkpoint_s
    steady_rounds = config.rounds - start_round - rounds_per_call
    return carry, LoopTiming(compile_s, train_s, evaluation_s, steady_rounds, checkpoint_s, saved)


def privacy_spent(run_setup: Setup, name: str, hparams: dict[str, float], rounds_done: int):
    """What a DP algorithm has spent after `rounds_done` rounds, or None for others."""
    privacy = algorithm_spec(name).privacy
    if privacy is None:
        return None
    return privacy.report(
        run_setup.config,
        num_clients=run_setup.dataset.train.num_clients,
        clients_per_round=run_setup.config.clients_per_round,
        hparams=hparams,
        rounds_done=rounds_done,
    )


def initial_carry(run_setup: Setup, name: str) -> tuple[Any, Any]:
    """The (state, health) carry a run of `name` starts from, placed, and its run key."""
    config = run_setup.config
    init_key, run_key = jax.random.split(jax.random.key(config.seed))
    params = run_setup.engine.task.model.init(init_key)
    state = run_setup.algorithms[name].init(params, run_setup.hparams[name])
    return place_carry(run_setup, (state, initial_health())), run_key


def restore_carry(
    run_setup: Setup, carry: Any, checkpoints: RunCheckpoints | None
) -> tuple[int, Any, dict[str, Any] | None]:
    """(round, carry, meta) of the latest checkpoint, placed; (0, carry, None) if there is none."""
    restored = checkpoints.restore(jax.device_get(carry)) if checkpoints is not None else None
    if restored is None:
        return 0, carry, None
    start_round, saved_carry, meta = restored
    return start_round, place_carry(run_setup, saved_carry), meta


def place_carry(run_setup: Setup, carry: Any) -> Any:
    """Puts a carry (fresh or restored from host arrays) where the round expects it (`place_state`)."""
    state, health = carry
    strategy = run_setup.engine.strategy
    # Host-resident rows stay NumPy (`shard_rows` keeps them there); restored rows are host arrays either way.
    clients = state.clients if strategy.host_client_state else jax.device_put(state.clients)
    state = dataclasses.replace(jax.device_put(dataclasses.replace(state, clients=())), clients=clients)
    return place_state(state, strategy), strategy.replicate(jax.device_put(health))


def run_algorithm(
    run_setup: Setup,
    name: str,
    *,
    on_evaluation: Callable[[dict[str, Any]], None] | None = None,
    progress: Any = None,
    checkpoints: RunCheckpoints | None = None,
    on_checkpoint: Callable[[int], None] | None = None,
    resume: bool = False,
) -> RunResult:
    """Trains one algorithm for `config.rounds` rounds.

    Args:
      run_setup: from `setup`.
      name: which of its algorithms.
      on_evaluation: called with each evaluation record (e.g. to append it to
        metrics.jsonl as it happens).
      progress: an object with `update(n)` and `set_postfix_str(s)` (a tqdm
        bar), or None.
      checkpoints: where to save checkpoints (when `config.checkpoint_every`
        or `checkpoint_seconds` says, and on SIGINT/SIGTERM), or None.
      on_checkpoint: called with the round after each checkpoint.
      resume: continue from the latest checkpoint in `checkpoints` (if any):
        the result is bit for bit that of the uninterrupted run.

    Returns:
      The `RunResult`; a diverged run's has `summary['status'] == 'diverged'`.

    Raises:
      RunInterrupted: on SIGINT/SIGTERM, after saving a checkpoint.
    """
    config = run_setup.config
    engine = run_setup.engine
    algorithm = run_setup.algorithms[name]
    strategy = engine.strategy
    carry, run_key = initial_carry(run_setup, name)
    start_round, carry, meta = restore_carry(run_setup, carry, checkpoints if resume else None)
    history: list[dict[str, Any]] = list(meta["history"]) if meta else []
    client_state = None
    if strategy.host_client_state and jax.tree.leaves(carry[0].clients):
        # Device arrays either way (`replicate` passes NumPy through off a mesh).
        place = strategy.replicate if strategy.mesh is not None else jax.device_put
        client_state = HostClientState(
            run_key, run_setup.dataset.train.num_clients, engine.clients_per_round, place=place
        )
    fused = 1 if client_state else rounds_per_call(strategy, config.rounds, config.eval_every)
    fused = resumed_rounds_per_call(fused, start_round)
    train = training_input(run_setup, run_key, fused, first_round=start_round)
    round_fn = compile_rounds(
        monitored(algorithm.round), fused, cohort_per_round=isinstance(train, CohortStream)
    )
    evaluate = make_evaluator(
        engine.task,
        run_setup.dataset,
        engine.client_weighting,
        corrupted=run_setup.corrupted,
        personal_group=personal_evaluation_group(strategy),
    )
    latest: dict[str, Any] = {"summaries": {}, "clients": {}}
    if progress is not None and start_round:
        progress.update(start_round)

    def on_evaluate(round_index, state, metrics):
        summaries, clients = evaluate(state.params, personal_models(algorithm, state))
        latest.update(summaries=summaries, clients=clients)
        record = {
            "algorithm": name,
            "round": round_index,
            "round_metrics": {k: float(v) for k, v in jax.device_get(metrics).items()},
            **summaries,
        }
        history.append(record)
        if on_evaluation is not None:
            on_evaluation(record)
        if progress is not None:
            progress.set_postfix_str(f"test error {100 * summaries['test_error']['mean']:.1f}%")

    def checkpoint_meta(round_index):
        hparams = {k: float(v) for k, v in jax.device_get(run_setup.hparams[name]).items()}
        return {
            "algorithm": name,
            "history": history,
            "config": config.to_dict(),
            "privacy_spent": privacy_spent(run_setup, name, hparams, round_index),
        }

    checkpointing = (
        Checkpointing.from_config(checkpoints, config, checkpoint_meta, on_checkpoint)
        if checkpoints is not None else None
    )
    diverged = None
    try:
        carry, timing = training_loop(
            round_fn, carry, train, run_key, config, strategy, on_evaluate, progress, fused,
            start_round=start_round, checkpointing=checkpointing, client_state=client_state,
        )
        state, health = carry[0], host_health(carry[1])
        after_training = None
        if algorithm.personalize is not None:
            after_training = lambda: personalized_models(run_setup, algorithm, state)  # noqa: E731
        elif config.finetune_epochs and not jax.tree.leaves(state.clients):
            # Algorithms with personal models of their own (ditto) report those.
            after_training = lambda: finetuned_models(run_setup, state, run_key)  # noqa: E731
        if after_training is not None:
            started = time.perf_counter()
            summaries, clients = evaluate(state.params, after_training())
            latest.update(summaries=summaries, clients=clients)
            spent = time.perf_counter() - started
            timing = dataclasses.replace(timing, evaluation_s=timing.evaluation_s + spent)
    except RunDiverged as error:
        # The carry was donated to the rounds after the last good one: only the host copy is left.
        state, health = None, error.health
        diverged = {"round": error.round, "quantity": error.quantity, "detected_at_round": error.detected_at}
        diverged["last_checkpoint_round"] = checkpoints.latest_round() if checkpoints is not None else None
        timing = LoopTiming(0.0, 0.0, 0.0, 0)
    summary = {
        **latest["summaries"],
        "algorithm": name,
        "status": "diverged" if diverged else "finished",
        "rounds": config.rounds,
        "rounds_without_weight": int(health["rounds_without_weight"]),
        "strategy": engine.strategy.describe(),
        "residency": run_setup.placement.residency if run_setup.placement else "device",
    }
    if name in CLIENT_STATE_ALGORITHMS:
        summary["client_state"] = (
            "host" if strategy.host_client_state
            else "split" if strategy.shards_client_state else "replicated"
        )
    attack = attack_record(config, run_setup.corrupted)
    if attack is not None:
        summary["attack"] = attack
    if diverged:
        summary["diverged"] = diverged
        summary["evaluated_round"] = history[-1]["round"] if history else None
    rounds_done = diverged["detected_at_round"] if diverged else config.rounds
    hparams = run_setup.hparams[name] if state is None else jax.device_get(state.hparams)
    privacy = privacy_spent(run_setup, name, {k: float(v) for k, v in hparams.items()}, rounds_done)
    if privacy is not None:
        summary["privacy"] = privacy
    timing_record = {
        **timing.as_dict(),
        "rounds_per_call": fused,
        "backend": jax.default_backend(),
        "resumed_from_round": start_round or None,
    }
    return RunResult(name, state, history, summary, latest["clients"], timing_record)
