"""Per-client metrics and their summaries against NumPy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import client_loss_reference, tiny_population

from jaxfl.evaluation import SUMMARY_KEYS, per_client_metrics, summarize, summarize_each
from jaxfl.evaluation.summaries import loss_and_error_summaries
from jaxfl.models import make_model
from jaxfl.training import Task

POPULATION = tiny_population([7, 23, 10, 1, 31, 12], seed=9)
TASK = Task(make_model("linear", (5,), 3))


@pytest.mark.parametrize("chunk_rows", [1, 5, 4096])
def test_per_client_metrics_match_loop(chunk_rows):
    params = jax.tree.map(lambda p: p + 0.3, TASK.model.init(jax.random.key(0)))
    params["dense"]["kernel"] = jnp.asarray(np.random.default_rng(0).normal(size=(5, 3)), jnp.float32)
    metrics = jax.jit(per_client_metrics, static_argnums=0, static_argnames="chunk_rows")(
        TASK, params, POPULATION, chunk_rows=chunk_rows
    )
    for i in range(POPULATION.num_clients):
        data = POPULATION.client(i)
        loss, error = client_loss_reference(
            np.asarray(params["dense"]["kernel"], np.float64),
            np.asarray(params["dense"]["bias"], np.float64), data["x"], data["y"],
        )
        np.testing.assert_allclose(metrics.loss[i], loss, rtol=1e-5)
        np.testing.assert_allclose(metrics.error[i], error, atol=1e-6)


@pytest.mark.parametrize("chunk_rows", [5, 4096])
def test_split_over_devices_equals_one_device_and_vmaps(chunk_rows):
    # 84 rows: 17 chunks of 5 on 3 devices (one slot past the end), or one chunk and two empty slots.
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()[:3]), ("clients",))
    keys = jax.random.split(jax.random.key(1), 2)
    params = jax.vmap(TASK.model.init)(keys)  # Two models: a sweep's leading axis.
    population = jax.device_put(POPULATION, NamedSharding(mesh, PartitionSpec()))

    def metrics(params, mesh):
        return per_client_metrics(TASK, params, population, chunk_rows=chunk_rows, mesh=mesh)

    split = jax.jit(jax.vmap(lambda p: metrics(p, mesh)))(params)
    for g in range(2):
        one = jax.tree.map(lambda x, g=g: x[g], params)
        alone = jax.jit(lambda p: metrics(p, None))(one)
        for got, want in zip(split, alone):
            np.testing.assert_allclose(got[g], want, rtol=1e-6, atol=1e-7)
        for i in range(POPULATION.num_clients):
            data = POPULATION.client(i)
            loss, error = client_loss_reference(
                np.asarray(one["dense"]["kernel"], np.float64),
                np.asarray(one["dense"]["bias"], np.float64), data["x"], data["y"],
            )
            np.testing.assert_allclose(split.loss[g, i], loss, rtol=1e-5)
            np.testing.assert_allclose(split.error[g, i], error, atol=1e-6)
            assert split.targets[g, i] == POPULATION.counts[i]


def _superquantile_reference(values, theta, weights):
    # Mean of the worst theta mass, boundary client counted fractionally.
    order = np.argsort(-values, kind="stable")
    mass, total = 0.0, 0.0
    for i in order:
        if mass >= theta:
            break
        take = min(weights[i], theta - mass)
        total += take * values[i]
        mass += take
    return total / theta


def _check_against_numpy(got, values, weights):
    assert set(got) == set(SUMMARY_KEYS)
    w = np.ones(len(values)) if weights is None else np.asarray(weights, np.float64)
    w = w / w.sum()
    v = np.asarray(values, np.float64)
    np.testing.assert_allclose(got["mean"], np.sum(w * v), rtol=1e-5)
    std = np.sqrt(np.sum(w * (v - np.sum(w * v)) ** 2))
    np.testing.assert_allclose(got["std"], std, rtol=1e-4, atol=1e-7)
    for p in (10, 20, 50, 60, 80, 90, 95):
        expected = np.percentile(v[w > 0], p, method="inverted_cdf", weights=w[w > 0] / w.sum())
        np.testing.assert_allclose(got[f"p{p}"], expected, rtol=1e-6, err_msg=f"p{p}")
    np.testing.assert_allclose(got["superquantile_90"], _superquantile_reference(v, 0.1, w), rtol=1e-4)
    np.testing.assert_allclose(got["superquantile_95"], _superquantile_reference(v, 0.05, w), rtol=1e-4)
    np.testing.assert_allclose(got["best_10"], -_superquantile_reference(-v, 0.1, w), rtol=1e-4)


@pytest.mark.parametrize("weighted", [False, True])
def test_summaries_match_numpy(weighted):
    rng = np.random.default_rng(1)
    values = rng.random(37).astype(np.float32)
    weights = rng.integers(1, 50, size=37).astype(np.float32) if weighted else None
    _check_against_numpy(jax.jit(summarize)(values, weights), values, weights)


def test_summaries_of_several_vectors_at_once_are_each_ones():
    # Vectors of different lengths summarized in one vmapped program (padded with zero weights):
    # each row its own NumPy summaries, a NaN or weightless row touching no other.
    rng = np.random.default_rng(2)
    lengths = [37, 1, 5, 12, 3]
    values = [rng.random(n).astype(np.float32) * 3 - 1 for n in lengths]
    values[2][1] = np.nan
    weights = [
        None,
        None,
        np.ones(5, np.float32),
        rng.integers(0, 4, size=12).astype(np.float32),
        np.zeros(3, np.float32),
    ]
    weights[3][0] = 5.0
    got = jax.jit(summarize_each)(values, weights)
    assert len(got) == len(values)
    # The single vectors' summaries compiled (op by op, eagerly, they cost 5 s of the suite).
    single = jax.jit(summarize)
    for row in (0, 1, 3):
        _check_against_numpy(got[row], values[row], weights[row])
        for name, value in single(values[row], weights[row]).items():
            np.testing.assert_allclose(got[row][name], value, rtol=1e-6, err_msg=name)
    for row in (2, 4):  # a NaN value of positive weight; no weight at all
        assert all(np.isnan(value) for value in got[row].values()), row
    with pytest.raises(ValueError, match="2 value vectors but 1 weight"):
        summarize_each(values[:2], weights[:1])
    assert summarize_each([], []) == []


def test_a_runs_loss_and_error_summaries_are_named_ordered_and_in_range():
    loss = np.array([0.5, 2.0, 1.0], np.float32)
    error = np.array([1.0, 1.0, 1.0], np.float32)
    got = loss_and_error_summaries(
        {"train": (loss, error, np.array([1.0, 2.0, 0.0], np.float32)), "test": (loss[:2], error[:2], None)},
        prefix="personal_",
    )
    assert list(got) == [
        "personal_train_loss", "personal_train_error", "personal_test_loss", "personal_test_error"
    ]
    np.testing.assert_allclose(got["personal_train_loss"]["mean"], 1.5)
    np.testing.assert_allclose(got["personal_test_loss"]["mean"], 1.25)
    for name in ("personal_train_error", "personal_test_error"):
        assert all(float(value) == (0.0 if stat == "std" else 1.0) for stat, value in got[name].items())


def test_summaries_of_ten_values_take_exact_tails():
    values = np.arange(10, dtype=np.float32)  # worst 10% = {9}, best 10% = {0}
    got = summarize(values)
    assert float(got["superquantile_90"]) == pytest.approx(9.0)
    assert float(got["best_10"]) == pytest.approx(0.0)
    assert float(got["p50"]) == 4.0


def test_token_sequences_are_evaluated_in_fewer_rows_at_once():
    from jaxfl.data.population import pack_arrays
    from jaxfl.evaluation.per_client import CHUNK_POSITIONS, CHUNK_ROWS, default_chunk_rows

    def population(x):
        return pack_arrays({"x": x, "y": np.zeros(len(x), np.int32)}, np.array([len(x)]))

    assert default_chunk_rows(POPULATION) == CHUNK_ROWS  # Real-valued inputs.
    cases = ((80, CHUNK_POSITIONS // 80), (20, CHUNK_POSITIONS // 20), (1000, 64), (2, CHUNK_ROWS))
    for length, rows in cases:
        assert default_chunk_rows(population(np.ones((3, length), np.int32))) == rows
    assert default_chunk_rows(population(np.ones(3, np.int32))) == CHUNK_ROWS  # One token per example.
