"""A run's evaluation: every training and test client's loss and error, and their summaries, compiled once.

Populations on the device are evaluated in one compiled function; host-resident
ones block by block. Personal models (Ditto's, fine-tuning's, ...) are
evaluated on each client's own examples beside the global model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxfl.data.host import HostPopulation, place_population
from jaxfl.data.population import FederatedDataset
from jaxfl.evaluation.per_client import (
    host_personal_metrics,
    host_population_metrics,
    per_client_metrics,
    personal_client_metrics,
)
from jaxfl.evaluation.sampling import evaluation_sample, sampled_population
from jaxfl.evaluation.summaries import loss_and_error_summaries
from jaxfl.training.client_state import HostPersonalModels
from jaxfl.training.local import Task
from jaxfl.training.strategies import ClientStrategy


def _summary_weights(name, population, client_weighting, benign):
    """alpha_i for training clients, equal weights for the others; times the benign mask if any."""
    weights = population.client_weights(client_weighting) if name == "train" else None
    if benign is None:
        return weights
    return benign if weights is None else weights * benign


def _evaluate_populations(task: Task, client_weighting: str, mesh, params, populations, benign=None):
    """Summaries and per-client metrics of `params` on each population.

    `benign` (population name -> `[N]` float32 0/1, or None) restricts the
    summaries to the benign clients of a run with an attack. `mesh`: the
    devices the evaluation is split over (`per_client_metrics`), or None.
    """
    benign = benign or {}
    to_summarize, clients = {}, {}
    for name, population in populations.items():
        metrics = per_client_metrics(task, params, population, mesh=mesh)
        weights = _summary_weights(name, population, client_weighting, benign.get(name))
        to_summarize[name] = (metrics.loss, metrics.error, weights)
        clients[name] = {"loss": metrics.loss, "error": metrics.error, "targets": metrics.targets}
    return loss_and_error_summaries(to_summarize), clients


@jax.jit
def _summarize_host(loss, error, weights):
    """The loss and error summaries of one host-resident population's per-client metrics."""
    summaries = loss_and_error_summaries({"population": (loss, error, weights)})
    return summaries["population_loss"], summaries["population_error"]


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
_evaluate = jax.jit(_evaluate_populations, static_argnums=(0, 1, 2))
_evaluate_batched = jax.jit(
    jax.vmap(_evaluate_populations, in_axes=(None, None, None, 0, None, None)), static_argnums=(0, 1, 2)
)


def make_evaluator(
    task: Task,
    dataset: FederatedDataset,
    client_weighting: str,
    *,
    batched: bool = False,
    corrupted: np.ndarray | None = None,
    personal_group: int = 16,
    sample: Mapping[str, np.ndarray] | None = None,
    train: bool = True,
    mesh: Mesh | None = None,
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

    `sample` (population name -> ascending client ids,
    `jaxfl.evaluation.sampling.evaluation_sample`) evaluates only those
    clients of the populations it names: summaries are over them, per-client
    metrics are theirs, with their ids under `client`; `sample['train']` also
    picks the personal models (test client k is training client k's ids
    under personal splits), with `train=False` too.
    With `train=False` the training clients are not evaluated (no `train_*`
    summaries or rows): where evaluation dominates a run, they are half of it.

    `mesh` (the run's, `ClientStrategy.mesh`): the devices that the
    parameters and the device-resident populations are replicated on; each
    evaluates its share of the examples (`per_client_metrics`).
    """
    sample = dict(sample or {})
    populations = {
        name: sampled_population(population, sample[name]) if name in sample else population
        for name, population in dataset.populations.items()
        if train or name != "train"
    }
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
            name: np.asarray(corrupted, bool)[sample[name]] if name in sample else np.asarray(corrupted, bool)
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
        if "train" in sample and jax.tree.leaves(personal):
            personal = _sampled_personal_models(personal, sample["train"], batched)
        summaries, clients = jax.device_get(
            evaluate(task, client_weighting, mesh if mesh is not None and mesh.size > 1 else None,
                     params, on_device, benign)
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
            if name in sample:
                ordered[name]["client"] = sample[name]
        return summaries, ordered

    return run


def evaluation_clients(run_setup) -> dict[str, np.ndarray]:
    """Population name -> the clients sampled for evaluation (`--eval-clients`), for the populations sampled.

    `run_setup`: a `jaxfl.experiment.run_setup.Setup`. The training clients'
    sample is there without `--eval-train` too: it picks the personal models
    that go with the test clients under personal splits (`make_evaluator`).
    """
    config = run_setup.config
    if config.evaluation.eval_clients is None:
        return {}
    return evaluation_sample(run_setup.dataset, config.evaluation.eval_clients, config.runtime.seed)


def evaluated_sample(run_setup) -> dict[str, np.ndarray]:
    """`evaluation_clients` of the populations evaluated."""
    sample = evaluation_clients(run_setup)
    if not run_setup.config.evaluation.eval_train:
        sample.pop("train", None)
    return sample


def _sampled_personal_models(personal, client_ids: np.ndarray, batched: bool):
    """The personal models of the sampled training clients, rows in the sample's order."""
    if isinstance(personal, HostPersonalModels):
        return personal.block(client_ids)
    if not jax.tree.leaves(personal):
        return personal
    ids = jnp.asarray(client_ids, jnp.int32)
    return jax.tree.map(lambda rows: rows[:, ids] if batched else rows[ids], personal)
