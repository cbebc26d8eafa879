"""Task presets: the published protocols of the standard FL benchmarks, by name.

`jaxfl run --task NAME` starts from a preset's settings: they replace the
dataset's run defaults, and every flag or config-file key still overrides
them (`jaxfl.experiment.config.make_config`). Each preset cites where its
numbers come from, and docs/tasks.md lists what each preset reproduces and
how closely.

References:
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
  [Laguel et al. 2020] Device Heterogeneity in Federated Learning: A Superquantile Approach.
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks.
  [Reddi et al. 2021] Adaptive Federated Optimization. ICLR 2021.
  [Caldas et al. 2018] LEAF: A Benchmark for Federated Settings. arXiv preprint, 2018.
  [Hsu et al. 2019] T.-M. H. Hsu, H. Qi, M. Brown. Measuring the Effects of
    Non-Identical Data Distribution for Federated Visual Classification.
    arXiv preprint, 2019.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class TaskPreset:
    """A published protocol as run settings.

    Attributes:
      summary: one line for `jaxfl list`.
      source: the paper or code the settings come from.
      settings: settings by flat name (`RunConfig.from_settings`; dataset options as a mapping).
      published: the published figure the protocol is judged against, if any.
    """

    summary: str
    source: str
    settings: Mapping[str, Any]
    published: str = ""


# Reddi et al., "Adaptive Federated Optimization" (ICLR 2021), Table 8 / App. D:
# one client epoch, client SGD, FedAvg with server SGD; best log10 learning
# rates client/server for FedAvg: Shakespeare 0/0, EMNIST -1/0, CIFAR-100
# -1/0.5, StackOverflow NWP -0.5/0.
REDDI = "Reddi et al., Adaptive Federated Optimization, ICLR 2021 (App. D; google-research/federated)"
DELTA_FL = (
    "Delta-FL reference code, krishnap25/simplicial-fl (Laguel et al. 2020 and Pillutla et al. 2023: App. C)"
)

PRESETS: dict[str, TaskPreset] = {
    "shakespeare-fedavg": TaskPreset(
        summary="Shakespeare next character, 2x256 char LSTM, FedAvg 10 clients x batch 4, 1,200 rounds",
        source=REDDI,
        settings={
            "dataset": "shakespeare",
            "dataset_options": {"layout": "sequence", "sequence_length": 80, "vocabulary": "tff"},
            "model": "char-lstm",
            "algorithm": "fedavg",
            "rounds": 1200,
            "clients_per_round": 10,
            "batch_size": 4,
            "local_epochs": 1,
            "lr": 1.0,
            "server_optimizer": "sgd",
            "server_lr": 1.0,
        },
        published="test accuracy 56.9% (FedAvg); FedAdam 57.0%, FedYogi 57.2% (unverified)",
    ),
    "shakespeare-deltafl": TaskPreset(
        summary="Shakespeare next character from 20, GRU 128, FedAvg and Delta-FL on unseen roles",
        source=DELTA_FL,
        settings={
            "dataset": "shakespeare",
            "dataset_options": {
                "layout": "next-char",
                "sequence_length": 20,
                "vocabulary": "delta-fl",
                "split": "roles",
                "test_fraction": 0.5,
                # LEAF's -k 100: roles with at least 100 windows of 20 + 1 characters.
                "min_chars": 120,
            },
            "model": "char-gru",
            "algorithm": "fedavg,deltafl",
            "theta": 0.5,
            "rounds": 400,
            "clients_per_round": 100,
            "batch_size": 16,
            "lr": 0.1,
            "lr_decay": 0.5,
            "lr_decay_period": 200,
            # Every test role's windows are a GRU forward of minutes per algorithm on a CPU, longer than
            # a quick check's rounds: a fixed stratified sample by default, `--eval-clients all` for all.
            "eval_clients": 32,
        },
        published=(
            "per-client error distribution: Delta-FL lowers the 90th percentile "
            "(Laguel et al. 2020; Pillutla et al. 2023, Fig. 3)"
        ),
    ),
    "emnist-cr": TaskPreset(
        summary="EMNIST 62 classes by writer, the CR CNN with dropout, FedAvg 10 clients x batch 20",
        source=REDDI,
        settings={
            "dataset": "emnist",
            "model": "emnist-cr-cnn",
            "algorithm": "fedavg",
            "rounds": 1500,
            "clients_per_round": 10,
            "batch_size": 20,
            "lr": 0.1,
            "server_optimizer": "sgd",
            "server_lr": 1.0,
        },
        published="test accuracy 84.9% (FedAvg)",
    ),
    "femnist-leaf": TaskPreset(
        summary="FEMNIST (LEAF JSON), LEAF's CNN, FedAvg 3 clients x 1 epoch, lr 0.004, 2,000 rounds",
        source="LEAF, Caldas et al. 2018 (TalwalkarLab/leaf paper_experiments/femnist.sh)",
        settings={
            "dataset": "femnist",
            "model": "leaf-cnn",
            "algorithm": "fedavg",
            "rounds": 2000,
            "clients_per_round": 3,
            "local_epochs": 1,
            "batch_size": 10,
            "lr": 0.004,
        },
        published="LEAF publishes plots only",
    ),
    "stackoverflow-nwp": TaskPreset(
        summary="StackOverflow next word, LSTM 670 (projection 96), FedAvg 50 clients x batch 16",
        source=REDDI,
        settings={
            "dataset": "stackoverflow",
            "dataset_options": {
                "layout": "sequence",
                "sequence_length": 20,
                "vocab_size": 10_000,
                "max_examples_per_client": 1000,
            },
            "model": "word-lstm",
            "algorithm": "fedavg",
            "rounds": 1500,
            "clients_per_round": 50,
            "batch_size": 16,
            "lr": 10**-0.5,
            "server_optimizer": "sgd",
            "server_lr": 1.0,
        },
        published="test accuracy 19.5% (FedAvg); FedAdam/FedYogi 25.2% (unverified)",
    ),
    "stackoverflow-lr": TaskPreset(
        summary="StackOverflow tag prediction: bag of 10k words -> 500 tags, logistic regression, recall@5",
        source=(
            "Reddi et al. 2021 (google-research/federated optimization/stackoverflow_lr); learning rates "
            "are not the paper's (its table was not available offline): tune them with jaxfl sweep"
        ),
        settings={
            "dataset": "stackoverflow",
            "dataset_options": {
                "layout": "tags",
                "vocab_size": 10_000,
                "num_tags": 500,
                "max_words": 128,
                "max_examples_per_client": 1000,
            },
            "model": "bag-logistic",
            "algorithm": "fedavg",
            "rounds": 1500,
            "clients_per_round": 10,
            "batch_size": 100,
            "local_epochs": 1,
            "max_local_steps": None,
            # Reddi et al. sum the loss over the batch, jaxfl averages it: a
            # client lr of 100 here is their 1.
            "lr": 100.0,
            "server_optimizer": "sgd",
            "server_lr": 1.0,
        },
        published="the error printed is 1 - recall@5, pooled over tags as tf.keras.metrics.Recall(top_k=5)",
    ),
    "cifar100-resnet": TaskPreset(
        summary="CIFAR-100 (TFF's 500 clients), ResNet-18 with GroupNorm, random 24x24 crops",
        source=REDDI,
        settings={
            "dataset": "cifar100",
            "model": "resnet18-gn",
            "algorithm": "fedavg",
            "rounds": 4000,
            "clients_per_round": 10,
            "batch_size": 20,
            "lr": 0.1,
            "server_optimizer": "sgd",
            "server_lr": 10**0.5,
        },
        published="test accuracy 44.7% (FedAvg); FedAdam 52.5% (unverified)",
    ),
    "sent140-lstm": TaskPreset(
        summary="Sentiment140, frozen GloVe-50d + LSTM 50 over 20 words, FedAvg and Delta-FL",
        source=DELTA_FL,
        settings={
            "dataset": "sent140",
            "dataset_options": {"features": "tokens", "max_words": 20, "min_examples": 50},
            "model": "sent140-lstm",
            "algorithm": "fedavg,deltafl",
            "theta": 0.5,
            "rounds": 600,
            "clients_per_round": 50,
            "batch_size": 32,
            "lr": 2.0,
            "lr_decay": 0.5,
            "lr_decay_period": 200,
        },
    ),
    "fmnist-dirichlet": TaskPreset(
        summary="Fashion-MNIST over 100 clients by Dirichlet(0.5) labels, the ConvNet, FedAvg and Delta-FL",
        source=(
            "Dirichlet label partition of Hsu et al. 2019; ConvNet of Pillutla et al. 2023, App. C.1; "
            "batch 16, lr 0.05 as Li 2023's Fashion-MNIST runs (App. 5.7.4)"
        ),
        settings={
            "dataset": "fashion-mnist",
            "dataset_options": {"partition": "dirichlet", "alpha": 0.5, "num_clients": 100},
            "model": "convnet",
            "algorithm": "fedavg,deltafl",
            "theta": 0.5,
            "rounds": 500,
            "clients_per_round": 10,
            "batch_size": 16,
            "lr": 0.05,
        },
    ),
}


def preset_names() -> tuple[str, ...]:
    return tuple(PRESETS)


def preset_settings(name: str) -> dict[str, Any]:
    """A copy of a preset's settings; ValueError naming the presets for an unknown name."""
    if name not in PRESETS:
        raise ValueError(f"task must be one of {', '.join(PRESETS)}, got {name!r}")
    settings = dict(PRESETS[name].settings)
    if "dataset_options" in settings:
        settings["dataset_options"] = dict(settings["dataset_options"])
    return settings
