"""`jaxfl evaluate DIR`: a saved model's per-client metrics on a population.

    jaxfl evaluate runs/fedavg                                  # its own dataset again
    jaxfl evaluate runs/fedavg --dataset label-shift --dataset-option seed=7

The population defaults to the run's own dataset (with its options and
data_dir); `--dataset` names another (its options then start empty). Each
saved model of DIR (one per algorithm) is evaluated on every population of
the dataset (train, test, validation): the same summaries as a run's
(`jaxfl.evaluation.summaries`), printed as a table, and with `--out`
written as `summary.json` and `clients.csv` (one folder per algorithm when
there are several).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax

from jaxfl.data.registry import load_dataset
from jaxfl.experiment.config import ConfigError, RunConfig, make_config
from jaxfl.experiment.outputs import format_table, write_clients_csv, write_json
from jaxfl.experiment.run_directory import OutputDirectory
from jaxfl.experiment.runner import check_model_fits_targets, make_evaluator, place_dataset
from jaxfl.experiment.saved_model import SavedModel, find_model_folders, load_model
from jaxfl.training.local import Task


def evaluation_config(saved: SavedModel, dataset: str | None, data_dir: str | None,
                      dataset_options: dict[str, Any] | None) -> RunConfig:
    """The saved run's config with the population to evaluate on swapped in."""
    values = saved.config.to_dict()
    if dataset is not None and dataset != saved.config.data.dataset:
        values["dataset"] = dataset
        values["dataset_options"] = {}
    if dataset_options is not None:
        values["dataset_options"] = {**values["dataset_options"], **dataset_options}
    if data_dir is not None:
        values["data_dir"] = data_dir
    values.update(out=None, overwrite=False, task=None)
    return make_config(values, on_warning=None)  # Training settings change nothing here.


def evaluate_model(saved: SavedModel, config: RunConfig) -> tuple[dict, dict]:
    """(summaries, per-client metrics) of a saved model on `config`'s dataset.

    Raises:
      ConfigError: the dataset's examples do not fit the model (input shape,
        classes or targets).
    """
    data = config.data
    try:
        dataset = load_dataset(data.dataset, data_dir=data.data_dir, **data.dataset_options)
    except ValueError as error:
        raise ConfigError(str(error).splitlines()[0]) from None
    if tuple(dataset.input_shape) != tuple(saved.build["input_shape"]):
        raise ConfigError(
            f"dataset {data.dataset} has inputs of shape {list(dataset.input_shape)} and the model was "
            f"trained on {saved.build['input_shape']}"
        )
    check_model_fits_targets(saved.model, dataset, config)
    dataset, _ = place_dataset(dataset, data.residency)
    task = Task(saved.model, excluded_target_ids=dataset.excluded_target_ids)
    evaluate = make_evaluator(task, dataset, config.server.client_weighting)
    return evaluate(jax.device_put(saved.params))


def evaluate_main(
    directory: str, *, dataset: str | None = None, data_dir: str | None = None,
    dataset_options: dict[str, Any] | None = None, algorithm: str | None = None,
    out: str | None = None, overwrite: bool = False,
) -> int:
    """Evaluates the saved model(s) of `directory`; returns the exit status."""
    if not Path(directory).exists():
        raise ConfigError(f"{directory!r} does not exist")
    folders = find_model_folders(directory)
    if not folders:
        raise ConfigError(f"no saved model in {directory!r} (a finished run's output folder holds model/)")
    names = [algorithm] if algorithm is not None else list(folders)
    output = OutputDirectory(out, overwrite=overwrite, command="evaluate") if out else None
    models = {name: load_model(directory, name) for name in names}
    configs = {name: evaluation_config(saved, dataset, data_dir, dataset_options) for name, saved in
               models.items()}
    results = {name: evaluate_model(models[name], configs[name]) for name in names}
    if output is not None:
        staging = output.open()
        try:
            for name, (summaries, clients) in results.items():
                target = staging if len(names) == 1 else staging / name
                target.mkdir(parents=True, exist_ok=True)
                write_json(target / "config.json", configs[name].to_dict())
                summary = {**summaries, "algorithm": name, "model": str(folders[name])}
                write_json(target / "summary.json", summary)
                write_clients_csv(target / "clients.csv", clients)
            output.commit()
        except BaseException:
            output.abandon()
            raise
    first = configs[names[0]]
    options = f" {dict(first.data.dataset_options)}" if first.data.dataset_options else ""
    print(f"saved model(s) of {directory} evaluated on {first.data.dataset}{options}")
    print(format_table({name: summaries for name, (summaries, _) in results.items()}))
    if output is not None:
        print(f"results in {output.path}")
    return 0
