"""The trained model as an output: saved with a run, loaded back to evaluate or train on.

A finished run writes its final global model into `DIR/model/` (for
several algorithms, `DIR/<algorithm>/model/`):

* `params/`: the parameters pytree, an orbax `StandardSave` checkpoint
  (readable with orbax alone);
* `model.json`: what rebuilds the network: the model name and the shapes
  it was built for (input shape, classes, token vocabulary, widths), and
  the run's resolved config (its dataset, data_dir for frozen embeddings);
* `personal/` (Ditto): the training clients' personal models, the same
  pytree with a leading client axis `[N, ...]` (row k is client k's v_k).

`load_model(DIR)` returns a `SavedModel` (the `jaxfl.models.networks.Model`,
its parameters, the config): evaluate it with `evaluate_model`, call
`model.apply(params, x)`, or continue training by starting an algorithm
from `params` (`algorithm.init(params, hparams)`; docs/reliability.md).
`jaxfl evaluate DIR --dataset NAME` evaluates it on another population.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxfl.experiment.config import ConfigError, RunConfig, make_config

MODEL_FOLDER = "model"
FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class SavedModel:
    """A loaded model: the network, its parameters and the run's config."""

    model: Any  # jaxfl.models.networks.Model
    params: Any
    config: RunConfig
    algorithm: str
    build: dict[str, Any]  # make_model's shape arguments
    personal: Any = None  # Ditto's personal models, leaves [N, ...], or None


def model_build_arguments(config: RunConfig, dataset) -> dict[str, Any]:
    """The shape arguments `make_model` was called with for `dataset`."""
    return {
        "input_shape": list(dataset.input_shape),
        "num_classes": int(dataset.num_classes),
        "input_vocab_size": None if dataset.input_vocab_size is None else int(dataset.input_vocab_size),
        "hidden_sizes": list(config.network.hidden_sizes),
        "embedding_dim": int(config.network.embedding_dim),
    }


def save_model(
    directory: str | os.PathLike,
    params: Any,
    config: RunConfig,
    dataset,
    algorithm: str,
    personal: Any = None,
) -> Path:
    """Writes `params` (and personal models, if any) and what rebuilds the network into `directory`.

    `personal` holds row k = training client k's model; rows past the
    dataset's training clients (padding of a state split over devices) are
    not saved.
    """
    directory = Path(directory).absolute()
    directory.mkdir(parents=True, exist_ok=True)
    to_host = lambda tree: jax.tree.map(lambda x: np.array(x, copy=True), jax.device_get(tree))  # noqa: E731
    personal = personal if personal is not None and jax.tree.leaves(personal) else None
    if personal is not None:
        num_clients = dataset.train.num_clients
        # No copy of host-resident rows (N models): a view of the first N.
        personal = jax.tree.map(lambda rows: np.asarray(rows)[:num_clients], jax.device_get(personal))
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(directory / "params", to_host(params))
        if personal is not None:
            checkpointer.save(directory / "personal", personal)
    description = {
        "format": FORMAT_VERSION,
        "model": config.network.model,
        "algorithm": algorithm,
        "build": model_build_arguments(config, dataset),
        "config": config.to_dict(),
    }
    if personal is not None:
        description["personal_clients"] = int(jax.tree.leaves(personal)[0].shape[0])
    (directory / "model.json").write_text(json.dumps(description, indent=2) + "\n")
    return directory


def find_model_folders(path: str | os.PathLike) -> dict[str, Path]:
    """The model folders (by algorithm) of a run's output folder, or of a model folder itself."""
    path = Path(path)
    if (path / "model.json").is_file():
        return {json.loads((path / "model.json").read_text()).get("algorithm", path.name): path}
    if (path / MODEL_FOLDER / "model.json").is_file():
        return find_model_folders(path / MODEL_FOLDER)
    found = {}
    for child in sorted(p for p in path.iterdir() if p.is_dir()) if path.is_dir() else []:
        if (child / MODEL_FOLDER / "model.json").is_file():
            found.update(find_model_folders(child / MODEL_FOLDER))
    return found


def load_model(path: str | os.PathLike, algorithm: str | None = None) -> SavedModel:
    """Loads a saved model from a run's output folder or its `model/` folder.

    Args:
      path: `DIR` of a finished run, `DIR/<algorithm>` or `DIR/model`.
      algorithm: which one, when `DIR` holds several algorithms' models.

    Raises:
      ValueError (ConfigError): no model there, or several and no `algorithm`.
    """
    folders = find_model_folders(path)
    if not folders:
        raise ConfigError(f"no saved model in {str(path)!r} (a finished run's output folder holds model/)")
    if algorithm is None:
        if len(folders) > 1:
            raise ConfigError(
                f"{str(path)!r} holds the models of {', '.join(folders)}; choose one (algorithm=...)"
            )
        algorithm = next(iter(folders))
    if algorithm not in folders:
        raise ConfigError(f"{str(path)!r} has no model of {algorithm!r}; it has {', '.join(folders)}")
    folder = folders[algorithm].absolute()
    description = json.loads((folder / "model.json").read_text())
    if description.get("format") != FORMAT_VERSION:
        raise ConfigError(
            f"{str(folder)!r} was saved in format {description.get('format')}; this jaxfl reads "
            f"{FORMAT_VERSION}"
        )
    config = make_config(description["config"], on_warning=None)  # The run warned already.
    model = build_saved_network(config, description["build"])
    template = jax.tree.map(
        lambda x: np.zeros(x.shape, x.dtype), jax.eval_shape(model.init, jax.random.key(0))
    )
    personal = None
    with ocp.StandardCheckpointer() as checkpointer:
        params = checkpointer.restore(folder / "params", template)
        if "personal_clients" in description:
            rows = description["personal_clients"]
            stacked = jax.tree.map(lambda x: np.zeros((rows, *x.shape), x.dtype), template)
            personal = jax.tree.map(np.asarray, checkpointer.restore(folder / "personal", stacked))
    params = jax.tree.map(np.asarray, params)
    return SavedModel(model, params, config, algorithm, description["build"], personal)


def build_saved_network(config: RunConfig, build: dict[str, Any]):
    """The network of a saved model (frozen embeddings re-read from the run's data_dir)."""
    from jaxfl.experiment.runner import frozen_embeddings
    from jaxfl.models.networks import make_model

    return make_model(
        config.network.model,
        tuple(build["input_shape"]),
        build["num_classes"],
        hidden_sizes=tuple(build["hidden_sizes"]),
        input_vocab_size=build["input_vocab_size"],
        embedding_dim=build["embedding_dim"],
        embedding_table=frozen_embeddings(config),
    )
