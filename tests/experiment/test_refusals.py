"""Every bad input is refused in one line, before anything large is allocated.

The CLI side: exit status 2, exactly one `jaxfl: error:` line naming the
setting, nothing written to --out (`reference.assert_cli_refuses`). The
library side: the same checks raise ValueError (`check_value`,
`make_config`, the memory estimators, the privacy calibration). And every
example of docs/reliability.md's table gives the message the table shows.
None of these cases trains.
"""

import json
import re
import shlex
from pathlib import Path

import jax
import numpy as np
import pytest
from reference import assert_cli_refuses, slow_after

from jaxfl.cli import main
from jaxfl.data import memory
from jaxfl.data.datasets.shakespeare import examples_nbytes
from jaxfl.data.registry import load_dataset
from jaxfl.data.synthetic import (
    fedprox_synthetic,
    fedprox_synthetic_nbytes,
    label_shift,
    label_shift_nbytes,
    many_clients_nbytes,
    peer_benchmark_nbytes,
)
from jaxfl.experiment.checks import check_round_fits, data_warnings, round_nbytes
from jaxfl.experiment.config import (
    FLOAT32_MAX,
    FLOAT32_TINY,
    INT32_MAX,
    MAX_DISCRETE_GAUSSIAN_SIGMA,
    ConfigError,
    RunConfig,
    check_value,
    make_config,
    read_config_file,
)
from jaxfl.experiment.runner import setup
from jaxfl.models.networks import count_parameters
from jaxfl.primitives.discrete_gaussian import MAX_SIGMA, discrete_gaussian
from jaxfl.privacy.accounting import Sampling, noise_multiplier_for

SMALL_POOL = {
    "num_train_clients": 40, "num_validation_clients": 0, "num_test_clients": 20, "pool_size": 20000,
}
TINY = [
    *[arg for key, value in SMALL_POOL.items() for arg in ("--dataset-option", f"{key}={value}")],
    "--rounds", "4", "--clients-per-round", "5", "--eval-every", "2", "--no-progress", "--strategy", "vmap",
]
SMALL_RUN = ["--rounds", "2", "--clients-per-round", "2", "--eval-every", "1", "--no-progress"]


def _refuses(argv, words, tmp_path, capsys):
    out = tmp_path / "out"
    assert_cli_refuses([*argv, "--out", str(out)], words, out, capsys)


# ---------------------------------------------------------------------------
# One value at a time: flags (and the same table for config keys and grid values).


@pytest.mark.parametrize(
    "args, words",
    [
        (["--lr", "1e39"], ["lr", "float32", "1e+39"]),
        (["--lr", "3.5e38"], ["lr", "float32"]),
        (["--server-lr=-1e39"], ["server_lr", "float32"]),
        (["--server-lr", "-1e39"], ["server_lr", "float32"]),  # A value, not a flag.
        (["--lr", "-2.5e-3"], ["lr", "> 0"]),
        (["--l2", "1e39"], ["l2", "float32"]),
        (["--lr", "1e-46"], ["lr", "computes as 0"]),
        (["--l2", "1e-40"], ["l2", "computes as 0"]),  # A float32 subnormal: flushed to 0.
        (["--theta", "1e-320", "--algorithm", "deltafl"], ["theta", "computes as 0"]),
        (["--tilt", "inf", "--algorithm", "term"], ["tilt", "finite", "inf"]),
        (["--mu", "nan", "--algorithm", "fedprox"], ["mu", "finite"]),
        (["--checkpoint-seconds", "1e39"], ["checkpoint_seconds", "float32"]),
        (["--rounds", "2147483648"], ["rounds", "int32", "2147483648"]),
        (["--batch-size", str(2**63)], ["batch_size", "int32"]),
        (["--eval-every", "1" + "0" * 5000], ["eval_every", "integer", "characters"]),
        (["--lr-decay-period", str(10**30)], ["lr_decay_period", "int32"]),
        (["--seed", "2147483648"], ["seed", "2147483647"]),
        (["--rounds", "1e3"], ["rounds", "integer"]),
        (["--dp-sigma", "1e7", "--algorithm", "deltafl", "--reweighting", "dp"], ["dp_sigma", "sampler"]),
        (["--dp-quantile-sigma", "2e6", "--algorithm", "dp-deltafl"], ["dp_quantile_sigma", "sampler"]),
    ],
)
def test_bad_numbers_are_refused(args, words, tmp_path, capsys):
    _refuses(["run", *TINY, *args], words, tmp_path, capsys)


@pytest.mark.parametrize(
    "name, value, words",
    [
        ("lr", 1e39, ["lr", "float32"]),
        ("lr", -FLOAT32_MAX * 1.0001, ["lr", "float32"]),
        ("lr", 1e-46, ["computes as 0"]),
        ("tilt", -1e-39, ["tilt", "computes as 0"]),
        ("lr", 10**400, ["lr", "finite"]),  # An int float() cannot convert.
        ("rounds", 2**31, ["rounds", "int32"]),
        ("rounds", float("inf"), ["rounds", "integer"]),
        ("rounds", float("nan"), ["rounds", "integer"]),
        ("rounds", 1e39, ["rounds", "int32"]),
        ("keep_checkpoints", 2**40, ["keep_checkpoints", "[1, 100]"]),
        ("hidden_sizes", [2**31], ["hidden_sizes", "2147483647"]),
        ("hidden_sizes", "64", ["hidden_sizes"]),
        ("dataset_options", 3, ["dataset_options", "table"]),
        ("dataset_options", {1: 2}, ["dataset_options", "option names"]),
        ("dp_sigma", 2e6, ["dp_sigma", "1e+06"]),
        ("dp_quantile_sigma", 2e6, ["dp_quantile_sigma"]),
    ],
)
def test_check_value_refuses(name, value, words):
    with pytest.raises(ValueError) as error:
        check_value(name, value)
    message = str(error.value)
    assert "\n" not in message and len(message) < 300
    for word in words:
        assert word in message


@pytest.mark.parametrize(
    "name, value",
    [
        ("lr", FLOAT32_MAX), ("lr", FLOAT32_TINY), ("l2", 0.0), ("tilt", -FLOAT32_MAX), ("rounds", INT32_MAX),
        ("rounds", 3.0), ("dp_sigma", MAX_DISCRETE_GAUSSIAN_SIGMA), ("hidden_sizes", [INT32_MAX]),
    ],
)
def test_check_value_accepts_the_boundaries(name, value):
    check_value(name, value)


def test_config_sampler_bound_is_the_samplers():
    assert MAX_DISCRETE_GAUSSIAN_SIGMA == MAX_SIGMA
    with pytest.raises(ValueError, match="sigma"):
        discrete_gaussian(jax.random.key(0), 2 * MAX_SIGMA, (3,))


# ---------------------------------------------------------------------------
# Config files.


@pytest.mark.parametrize(
    "name, content, words",
    [
        ("binary.toml", bytes(range(256)), ["not UTF-8", "0x80", "offset 128"]),
        ("latin1.toml", "rounds = 3 # caf\xe9\n".encode("latin-1"), ["not UTF-8", "0xe9", "offset 16"]),
        ("utf16.toml", "rounds = 3\n".encode("utf-16"), ["not UTF-8", "offset 0"]),
        ("empty.toml", b"", ["holds no settings"]),
        ("comments.toml", b"# nothing here\n", ["holds no settings"]),
        ("empty.json", b"{}", ["holds no settings"]),
        ("twice.toml", b"clients-per-round = 3\nclients_per_round = 4\n", ["clients_per_round twice"]),
        # Flags override these keys, and the file is still refused.
        ("typed.toml", b'rounds = "4"\n', ["typed.toml", "rounds", "integer"]),
        ("nested.toml", b"[rounds]\nx = 1\n", ["[rounds] is not a section", "rounds is a setting of server"]),
        ("sections.toml", b"[local]\nrounds = 3\n", ["rounds is a setting of server, not of section local"]),
        ("empty-section.toml", b"[local]\n", ["holds no settings"]),
        ("null.json", b'{"rounds": null}', ["rounds must be set"]),
        ("nan.json", b'{"rounds": NaN}', ["rounds", "integer"]),
        ("inf.json", b'{"lr": Infinity}', ["lr", "finite"]),
        ("huge.json", b'{"lr": 1' + b"0" * 400 + b"}", ["lr", "finite"]),
        ("lr.toml", b"lr = 1e39\n", ["lr", "float32"]),
        ("tiny.toml", b"lr = 1e-46\n", ["lr", "computes as 0"]),
        ("wide.toml", b"hidden_sizes = [3000000000]\n", ["hidden_sizes", "2147483647"]),
        ("options.toml", b"dataset_options = 3\n", ["dataset_options", "table"]),
        ("algorithm.json", b'{"algorithm": ["fedavg"]}', ["algorithm", "string"]),
    ],
)
def test_bad_config_files(name, content, words, tmp_path, capsys):
    path = tmp_path / name
    path.write_bytes(content)
    argv = ["run", "--config", str(path), *TINY, "--algorithm", "fedavg"]
    _refuses(argv, [str(path), *words], tmp_path, capsys)


def test_config_file_that_is_a_directory(tmp_path, capsys):
    _refuses(["run", "--config", str(tmp_path)], ["Is a directory"], tmp_path, capsys)


def test_read_config_file_names_the_byte_offset(tmp_path):
    path = tmp_path / "c.toml"
    path.write_bytes(b"rounds = 3\nlr = 0.1 # \xff\n")
    with pytest.raises(ValueError, match=r"byte 0xff at offset 22"):
        read_config_file(path)
    path.write_bytes("\ufeffrounds = 3\n".encode())  # A UTF-8 byte order mark is UTF-8.
    assert read_config_file(path) == {"rounds": 3}


# ---------------------------------------------------------------------------
# Combinations.


@pytest.mark.parametrize(
    "args, words",
    [
        (["--algorithm", "fedavg,fedavg"], ["algorithm", "fedavg twice"]),
        (["--algorithm", "fedavg,,deltafl"], ["algorithm", "empty"]),
        (["--algorithm", "dp-fedavg", "--epsilon", "3", "--dp-noise-multiplier", "1"],
         ["epsilon=3", "dp_noise_multiplier=1", "conflict"]),
        (["--algorithm", "deltafl", "--reweighting", "dp", "--dp-bits", "8", "--dp-scale", "100"],
         ["dp_bits=8", "wraparound", "dp_bits >= 11"]),
        (["--algorithm", "deltafl", "--reweighting", "dp", "--dp-scale", str(INT32_MAX)],
         ["dp_scale=2147483647", "wraparound", "lower dp_scale"]),
        (["--strategy", "chunked:99999999999"], ["strategy", "chunk size"]),
        (["--strategy", "sharded:chunked:3000000000"], ["strategy", "chunk size"]),
        # The warning the first flag earns is not printed: one line only.
        (["--lr-decay-period", "5", "--clients-per-round", "41"], ["clients_per_round", "41"]),
    ],
)
def test_bad_combinations_are_refused(args, words, tmp_path, capsys):
    _refuses(["run", *TINY, *args], words, tmp_path, capsys)


@pytest.mark.parametrize(
    "values, words",
    [
        ({"algorithm": "fedavg,fedavg"}, ["twice"]),
        ({"algorithm": "dp-deltafl", "epsilon": 2.0, "dp_noise_multiplier": 1.0}, ["conflict"]),
        ({"algorithm": "deltafl", "reweighting": "dp", "dp_bits": 4}, ["wraparound"]),
        ({"strategy": "chunked:3000000000"}, ["chunk size"]),
    ],
)
def test_make_config_refuses(values, words):
    with pytest.raises(ValueError) as error:
        make_config(values)
    for word in words:
        assert word in str(error.value)


def _warnings(values):
    messages = []
    make_config(values, on_warning=messages.append)
    return messages


@pytest.mark.parametrize(
    "values, words",
    [
        ({"lr_decay_period": 5}, ["lr_decay_period", "lr_decay is 1"]),
        ({"lr_decay": 0.5}, ["lr_decay=0.5 never applies"]),
        ({"lr_decay": 0.5, "lr_decay_period": 100, "rounds": 50}, ["never applies"]),
        ({"eval_every": 500, "rounds": 100}, ["eval_every=500", "rounds=100"]),
        ({"algorithm": "deltafl", "dp_bins": 64}, ["dp_bins", "--reweighting dp"]),
        ({"algorithm": "fedsgd", "batch_size": 5}, ["batch_size", "fedsgd"]),
        ({"algorithm": "qffl", "qffl_variant": "fedsgd", "local_epochs": 3}, ["local_epochs"]),
        ({"hidden_sizes": [32]}, ["hidden_sizes", "mlp"]),
        ({"embedding_dim": 8}, ["embedding_dim", "embedding-bag"]),
        ({"algorithm": "dp-deltafl", "dp_quantile_sigma": 3.0, "dp_quantile_ratio": 0.5},
         ["dp_quantile_ratio"]),
        ({"strategy": "chunked:500"}, ["chunked:500", "vmap"]),
    ],
)
def test_settings_that_change_nothing_warn(values, words):
    messages = _warnings(values)
    assert len(messages) == 1, messages
    for word in words:
        assert word in messages[0]


def test_defaults_and_a_written_config_do_not_warn():
    assert _warnings({}) == []
    assert _warnings({"task": "shakespeare-fedavg"}) == []
    config = make_config({"algorithm": "fedavg", "lr_decay": 0.5, "lr_decay_period": 100})
    assert _warnings(config.to_dict()) == []  # config.json, as `jaxfl run --config` reads it.
    # Explicitly the value it would have: nothing changed, nothing to say.
    assert _warnings({"eval_every": 200, "rounds": 100}) == []


# ---------------------------------------------------------------------------
# Dataset options: int32, float32 and memory, before anything is generated.


@pytest.mark.parametrize(
    "args, words",
    [
        (["--dataset-option", "pool_size=2000000000"], ["pool_size=2000000000", "memory", "lower pool_size"]),
        (["--dataset-option", "train_concentration=1e39"], ["train_concentration", "float32"]),
        (["--dataset-option", "train_concentration=NaN"], ["train_concentration", "> 0"]),
        (["--dataset-option", "partition_seed=99999999999999999999"], ["partition_seed", "int32"]),
        (["--dataset-option", "num_train_clients=1e12"], ["num_train_clients", "integer"]),
    ],
)
def test_bad_label_shift_options(args, words, tmp_path, capsys):
    _refuses(["run", *TINY, *args], ["label-shift", *words], tmp_path, capsys)


@pytest.mark.parametrize(
    "dataset, option, words",
    [
        ("synthetic", "num_clients=1000000000000", ["num_clients", "int32"]),
        ("synthetic", "num_clients=2000000000", ["num_clients=2000000000", "memory"]),
        ("synthetic", "num_features=1000000000", ["num_features=1000000000", "memory"]),
        ("synthetic", "num_classes=100000000", ["num_classes=100000000", "memory"]),
        ("synthetic", "size_sigma=100", ["size_sigma=100", "lower size_sigma"]),
        ("synthetic", "alpha=1e39", ["alpha", "float32"]),
        ("many-clients", "num_clients=10000000000", ["num_clients", "int32"]),
        ("many-clients", "num_clients=1000000000", ["1000000000 clients", "memory", "storage=disk"]),
        ("many-clients", "num_features=1000000000", ["num_features=1000000000", "memory"]),
        ("many-clients", "label_skew=1e39", ["label_skew", "float32"]),
        ("peer-benchmark", "num_features=1000000000", ["num_features=1000000000", "memory"]),
        ("peer-benchmark", "num_classes=100000000", ["num_classes=100000000", "memory"]),
        ("fashion-mnist", "alpha=1e39", ["alpha", "float32"]),
        ("shakespeare", "sequence_length=2147483648", ["sequence_length", "int32"]),
    ],
)
def test_bad_generator_options(dataset, option, words, tmp_path, capsys):
    argv = ["run", "--dataset", dataset, *SMALL_RUN, "--algorithm", "fedavg", "--dataset-option", option]
    _refuses(argv, [f"dataset '{dataset}'", *words], tmp_path, capsys)


def test_generators_check_memory_before_drawing(monkeypatch):
    monkeypatch.setattr(memory, "available_memory", lambda: 10_000)
    with pytest.raises(ValueError, match="needs at least .* and this machine has 10.0 kB available"):
        label_shift(num_train_clients=4, num_validation_clients=0, num_test_clients=2, pool_size=1000,
                    examples_per_client=10)
    with pytest.raises(ValueError, match="num_clients=100, num_features=60"):
        fedprox_synthetic(1.0, 1.0)
    with pytest.raises(ValueError, match="needs at least"):
        load_dataset("many-clients", num_clients=1000)


def test_partition_options_the_partition_does_not_read():
    from jaxfl.data.datasets.centralized import unused_partition_options

    assert unused_partition_options({"partition": "dirichlet", "alpha": 0.3, "test_fraction": 0.1}) == [
        "dataset option test_fraction is used only with test=held-out (here test=unseen); ignored"
    ]
    (message,) = unused_partition_options({"shards_per_client": 5})
    assert "partition=shards (here partition=dirichlet)" in message
    assert unused_partition_options({"partition": "shards", "shards_per_client": 5, "test": "held-out",
                                     "test_fraction": 0.1}) == []


def test_memory_estimates():
    paper = label_shift_nbytes(2500, 500, 500, 100, 500_000)
    assert 100e6 < paper < 1e9
    assert label_shift_nbytes(2500, 500, 500, 100, 2_000_000_000) > 1e12
    assert fedprox_synthetic_nbytes(10**12, 60, 10) > 1e13
    assert fedprox_synthetic_nbytes(100, 10**9, 10) > 1e10
    assert peer_benchmark_nbytes(784, 62, 100, 20, 400, 20) < 1e9
    assert many_clients_nbytes(10**9, 1, 10, 20, 10, 1000, "memory") > 1e12
    disk = many_clients_nbytes(10**7, 1, 9, 20, 10, 1000, "disk")
    assert disk < many_clients_nbytes(10**7, 1, 9, 20, 10, 1000, "memory") and disk < 2e9


def test_check_memory_takes_the_available_bytes():
    memory.check_memory(1000, "x", available=1000)
    with pytest.raises(ValueError, match=r"^pool_size=9 needs at least 2.0 kB of memory and this machine has "
                                         r"1.0 kB available: lower it$"):
        memory.check_memory(2000, "pool_size=9", available=1000, hint="lower it")
    assert memory.available_memory() > 0


def test_shakespeare_examples_estimate():
    parts = {"train": [("a", ["x" * 100, "y" * 50]), ("b", ["z" * 10])], "test": [("a", ["w" * 30])]}
    total, largest = examples_nbytes(parts, "next-char", 20, 1, joined=True)
    # 151 - 20 and 30 - 20 windows (the client b has no full window) of 20 + 4 bytes.
    assert total == (131 + 10) * 24
    assert largest >= 131 * 24
    total, _ = examples_nbytes(parts, "sequence", 80, 1, joined=True)
    assert total == (2 + 1 + 1) * 80 * 5  # ceil(155 / 80), ceil(11 / 80), ceil(31 / 80) rows.


# ---------------------------------------------------------------------------
# One round's memory (batch size, cohort, model widths) against what is available.


@pytest.fixture(scope="module")
def tiny_setup():
    return setup(make_config({**{"dataset_options": SMALL_POOL}, "rounds": 4, "clients_per_round": 5,
                              "strategy": "vmap", "algorithm": "fedavg"}))


def test_round_estimate_and_its_check(tiny_setup):
    engine, dataset = tiny_setup.engine, tiny_setup.dataset
    needed = round_nbytes(engine.task, dataset, engine.local, 5, engine.strategy)
    assert 1e3 < needed < 1e8
    check_round_fits(tiny_setup.config, engine.task, dataset, engine.local, engine.strategy, available=needed)
    with pytest.raises(ConfigError, match=r"one round of batch_size=10, .*clients_per_round=5"):
        check_round_fits(
            tiny_setup.config, engine.task, dataset, engine.local, engine.strategy, available=needed - 1
        )


def test_sweep_points_and_perfedavgs_adapted_models_are_counted(tiny_setup):
    engine, dataset = tiny_setup.engine, tiny_setup.dataset
    one = round_nbytes(engine.task, dataset, engine.local, 5, engine.strategy)

    def check(available, config=tiny_setup.config, **kwargs):
        check_round_fits(
            config, engine.task, dataset, engine.local, engine.strategy, available=available, **kwargs
        )

    check(3 * one, num_points=3)
    with pytest.raises(ConfigError, match=r"^3 sweep points of one round"):
        check(3 * one - 1, num_points=3)
    # Per-FedAvg makes one adapted model per training client at the end: N x parameters x 4 bytes.
    perfedavg = tiny_setup.config.replace(algorithm="perfedavg")
    num_parameters = count_parameters(jax.eval_shape(engine.task.model.init, jax.random.key(0)))
    adapted = dataset.train.num_clients * num_parameters * 4
    check(one + adapted, config=perfedavg)
    with pytest.raises(ConfigError, match="perfedavg's 40 adapted models"):
        check(one + adapted - 1, config=perfedavg)


def test_a_sweep_whose_points_do_not_fit_together_is_refused(tmp_path, capsys):
    # One point fits; the group's 1,000 points of the same round do not.
    _refuses(
        ["sweep", *TINY, "--algorithm", "fedavg", "--batch-size", "100000", "--grid",
         "lr=" + ",".join(f"{0.001 * (i + 1):.3f}" for i in range(1000))],
        ["1000 sweep points", "memory"], tmp_path, capsys,
    )


@pytest.mark.parametrize(
    "args, words",
    [
        (["--batch-size", "1000000000"], ["batch_size=1000000000", "memory", "--strategy sequential"]),
        (["--batch-size", str(INT32_MAX), "--strategy", "sequential"], ["batch_size=2147483647", "memory"]),
        (["--clients-per-round", "40", "--batch-size", "100000000"], ["clients_per_round=40", "memory"]),
    ],
)
def test_rounds_that_do_not_fit_are_refused(args, words, tmp_path, capsys):
    _refuses(["run", *TINY, "--algorithm", "fedavg", *args], words, tmp_path, capsys)


def test_model_widths_that_do_not_fit_are_refused(tmp_path, capsys):
    path = tmp_path / "wide.toml"
    path.write_text('model = "mlp"\nhidden_sizes = [2000000000]\n')
    _refuses(["run", "--config", str(path), *TINY, "--algorithm", "fedavg"],
             ["model mlp", "parameters", "memory"], tmp_path, capsys)


def test_settings_the_data_makes_moot_warn(tiny_setup):
    from jaxfl.training.local import LocalTraining

    config = tiny_setup.config.replace(max_local_steps=1000, batch_size=1000)
    local = LocalTraining(batch_size=1000, max_steps=1000)
    messages = data_warnings(config, tiny_setup.dataset, local)
    assert len(messages) == 2
    assert "max_local_steps=1000" in messages[0] and "at most 1" in messages[0]
    assert "batch_size=1000" in messages[1] and "100 examples" in messages[1]
    assert data_warnings(tiny_setup.config, tiny_setup.dataset, tiny_setup.engine.local) == []


# ---------------------------------------------------------------------------
# Privacy: noise the sampler cannot draw, budgets the accountant cannot calibrate.


@pytest.mark.parametrize(
    "args, words",
    [
        (["--algorithm", "dp-fedavg", "--epsilon", "1e30"], ["epsilon=1e+30", "protects nothing"]),
        (["--algorithm", "dp-deltafl", "--epsilon", "1e6"], ["epsilon=1e+06", "protects nothing"]),
        (["--algorithm", "dp-deltafl", "--dp-quantile-ratio", "1e30"],
         ["no noise multiplier", "quantile ratio"]),
        (["--algorithm", "dp-deltafl", "--dp-scale", "2147483647"], ["sigma", "sampler"]),
        (["--algorithm", "dp-deltafl", "--dp-quantile-ratio", "1e-30"], ["sigma", "sampler"]),
        (["--algorithm", "dp-fedavg", "--dp-noise-multiplier", "1e30"], ["noise multiplier"]),
    ],
)
def test_privacy_settings_the_noise_cannot_meet(args, words, tmp_path, capsys):
    _refuses(["run", *TINY, *args], words, tmp_path, capsys)


def test_noise_multiplier_for_says_which_end():
    with pytest.raises(ValueError, match="protects nothing"):
        noise_multiplier_for(1e30, 0.01, 4, Sampling(40, 5))


# ---------------------------------------------------------------------------
# Sweeps and the family.


@pytest.mark.parametrize(
    "args, words",
    [
        (["--grid", "out=a,b"], ["--grid cannot vary out"]),
        (["--grid", "algorithm=fedavg,deltafl"], ["--grid cannot vary algorithm"]),
        (["--grid", "task=shakespeare-fedavg"], ["--grid cannot vary task"]),
        (["--grid", "progress=true,false"], ["--grid cannot vary progress"]),
        (["--grid", "hidden_sizes=1,2"], ["--grid cannot vary hidden_sizes"]),
        (["--grid", "dataset_options=a"], ["--grid cannot vary dataset_options"]),
        (["--grid", "model=linear,resnet"], ["model", "resnet"]),
        (["--grid", "lr=0.1,0.1"], ["lr lists 0.1 twice"]),
        (["--grid", "seed=0,1,0"], ["seed lists 0 twice"]),
        (["--grid", "lr=1e39"], ["lr", "float32"]),
        (["--grid", "lr=1e-46"], ["lr", "computes as 0"]),
        (["--grid", "rounds=2,2147483648"], ["rounds", "int32"]),
        (["--grid", "batch_size=1000000000"], ["batch_size=1000000000", "memory"]),
        (["--grid", "strategy=vmap,chunked:99999999999"], ["--grid point", "chunk size"]),
        # The --grid lr warning is not printed: one line only.
        (["--lr", "0.3", "--grid", "lr=0.1,0.2", "--grid", "clients_per_round=5,41"], ["clients_per_round"]),
    ],
)
def test_bad_grids_are_refused(args, words, tmp_path, capsys):
    _refuses(["sweep", *TINY, "--algorithm", "fedavg", *args], words, tmp_path, capsys)


@pytest.mark.parametrize(
    "algorithm, args, words",
    # The DP budget's case calibrates noise first: the end-to-end tier's.
    slow_after([
        ("deltafl", ["--reweighting", "dp", "--dp-scale", "100", "--grid", "dp_bits=8,32"],
         ["--grid point dp_bits=8", "wraparound"]),
        ("deltafl", ["--reweighting", "dp", "--grid", "dp_sigma=1,1e7"], ["dp_sigma", "sampler"]),
        ("dp-fedavg", ["--grid", "dp_noise_multiplier=1000,2"], ["--grid point dp_noise_multiplier=1000.0"]),
    ], keep=2),
)
def test_grid_points_are_checked_as_runs(algorithm, args, words, tmp_path, capsys):
    _refuses(["sweep", *TINY, "--algorithm", algorithm, *args], words, tmp_path, capsys)


@pytest.mark.parametrize(
    "thetas, words",
    [("0.5,0.5", ["distinct"]), ("1e-46", ["computes as 0"]), ("nan", ["thetas"]), ("0.5,2", ["(0, 1]"])],
)
def test_bad_family_thetas(thetas, words, tmp_path, capsys):
    _refuses(["family", *TINY, "--thetas", thetas], words, tmp_path, capsys)


# ---------------------------------------------------------------------------
# docs/reliability.md: each example gives the message its row shows.

DOCS = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"
# The files the table's config-file examples name.
DOC_FILES = {
    "latin1.toml": "rounds = 3 # caf\xe9\n".encode("latin-1"),
    "empty.toml": b"",
    "twice.toml": b"clients-per-round = 3\nclients_per_round = 4\n",
    "typed.toml": b'rounds = "3"\n',
    "wide.toml": b"hidden_sizes = [3000000000]\n",
    "sections.toml": b"[local]\nrounds = 3\n",
}


def _documented_refusals():
    text = DOCS.read_text()
    section = text.split("## Refused settings", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[2].startswith("`jaxfl "):
            continue
        command = re.match(r"`jaxfl ([^`]*)`", cells[2]).group(1)
        message = re.fullmatch(r"`(.*)`", cells[3]).group(1)
        rows.append(pytest.param(command, message, id=command[:60]))
    return rows


def test_the_table_has_every_kind_of_refusal():
    assert len(_documented_refusals()) >= 30


@pytest.mark.parametrize("command, message", _documented_refusals())
def test_documented_refusals(command, message, tmp_path, monkeypatch, capsys):
    for name, content in DOC_FILES.items():
        (tmp_path / name).write_bytes(content)
    monkeypatch.chdir(tmp_path)
    status = main(shlex.split(command))
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1, err
    line = err.removeprefix("jaxfl: error: ").rstrip("\n")
    assert err.startswith("jaxfl: error: ")
    position = 0
    for part in message.split("…"):  # `…` stands for what depends on the machine.
        found = line.find(part, position)
        assert found >= 0, (part, line)
        position = found + len(part)
    if not message.endswith("…"):
        assert line.endswith(message.split("…")[-1])
    assert not any(p.name not in DOC_FILES for p in tmp_path.iterdir()), "something was written"


def test_written_configs_rerun_without_refusal(tmp_path):
    # A config.json of a DP run (epsilon at its default with a given noise
    # multiplier) reads back.
    config = make_config({"algorithm": "dp-fedavg", "dp_noise_multiplier": 1.0})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config.to_dict()))
    assert make_config(read_config_file(path)) == config


def test_float32_bounds_are_numpys():
    assert FLOAT32_MAX == float(np.finfo(np.float32).max)
    assert FLOAT32_TINY == float(np.finfo(np.float32).tiny)
    assert RunConfig().local.lr > FLOAT32_TINY


def test_a_run_refused_after_a_data_warning_prints_only_its_error(tmp_path, capsys):
    # The cap's warning comes from the data (setup), the refusal later (perfedavg's builder): the
    # warning is held until every check passed, so the refused run prints one line.
    _refuses(
        ["run", *TINY, "--algorithm", "perfedavg", "--batch-size", "2", "--max-local-steps", "100000"],
        ["perfedavg", "batch_size must be >= 3"], tmp_path, capsys,
    )
