"""The Δ-FL model family: members equal single runs; serving picks per client."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import client_loss_reference, tiny_population

from jaxfl.cli import main
from jaxfl.experiment.config import make_config
from jaxfl.experiment.family import serve_family, split_clients
from jaxfl.experiment.runner import run_algorithm, setup
from jaxfl.experiment.sweep import SweepPoint, run_sweep
from jaxfl.models import make_model
from jaxfl.training import Task

TINY = dict(
    dataset_options=dict(
        num_train_clients=40, num_validation_clients=0, num_test_clients=20, pool_size=20000
    ),
    rounds=3, clients_per_round=6, eval_every=3, progress=False, strategy="vmap",
    algorithm="deltafl",
)


@pytest.mark.slow
def test_family_member_equals_theta_trained_alone():
    run_setup = setup(make_config(TINY))
    thetas = [1.0, 0.5, 0.2]
    results = run_sweep(run_setup, "deltafl", [SweepPoint({"theta": t}, seed=4) for t in thetas])
    alone = run_algorithm(setup(make_config({**TINY, "theta": 0.2, "seed": 4})), "deltafl")
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
        results[2].state.params, alone.state.params,
    )
    # The members differ (theta matters), though they saw the same cohorts.
    assert not np.allclose(
        results[0].state.params["dense"]["kernel"], results[2].state.params["dense"]["kernel"]
    )


def test_split_clients_partitions_each_client():
    population = tiny_population([1, 2, 9, 30], seed=1)
    selection, evaluation = split_clients(population, 0.5, seed=0)
    np.testing.assert_array_equal(selection.counts, [1, 1, 4, 15])
    np.testing.assert_array_equal(evaluation.counts, [1, 1, 5, 15])
    for i in range(2, 4):  # Disjoint parts that together are the client's data.
        both = np.concatenate([selection.client(i)["x"], evaluation.client(i)["x"]])
        original = population.client(i)["x"]
        assert sorted(map(tuple, both)) == sorted(map(tuple, original))


def test_serving_picks_the_lowest_selection_loss():
    task = Task(make_model("linear", (5,), 3))
    population = tiny_population([6, 8, 10, 12], seed=3)
    selection, evaluation = split_clients(population, 0.5, seed=1)
    rng = np.random.default_rng(0)
    kernels = rng.normal(size=(3, 5, 3)).astype(np.float32)
    params = {"dense": {"kernel": jnp.asarray(kernels), "bias": jnp.zeros((3, 3))}}
    family = serve_family(task, params, [0.9, 0.5, 0.1], selection, evaluation)
    for i in range(4):
        sel = selection.client(i)
        losses = [client_loss_reference(k.astype(np.float64), np.zeros(3), sel["x"], sel["y"])[0]
                  for k in kernels]
        assert family.chosen[i] == int(np.argmin(losses))
        ev = evaluation.client(i)
        _, error = client_loss_reference(
            kernels[family.chosen[i]].astype(np.float64), np.zeros(3), ev["x"], ev["y"]
        )
        np.testing.assert_allclose(family.served_error[i], error, atol=1e-6)


@pytest.mark.slow
def test_family_cli(tmp_path, capsys):
    flags = [
        "--dataset-option", "num_train_clients=40", "--dataset-option", "num_validation_clients=0",
        "--dataset-option", "num_test_clients=20", "--dataset-option", "pool_size=20000",
        "--rounds", "2", "--clients-per-round", "6", "--no-progress", "--strategy", "vmap",
    ]
    out = tmp_path / "family"
    assert main(["family", *flags, "--thetas", "1.0,0.5", "--out", str(out)]) == 0
    assert "served (best per client)" in capsys.readouterr().out
    assert (out / "family.json").exists() and (out / "clients.csv").exists()
    assert main(["family", *flags, "--thetas", "0.5,1.5"]) == 2
    assert "thetas" in capsys.readouterr().err
