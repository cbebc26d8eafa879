"""Per-client metrics and their summaries against NumPy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import client_loss_reference, tiny_population

from jaxfl.evaluation import SUMMARY_KEYS, per_client_metrics, summarize
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


def _superquantile_reference(values, theta, weights):
    # Mean of the worst theta mass, boundary client counted fractionally.
    order = np.argsort(-values, kind="stable")
    mass, total = 0.0, 0.0
    for i in order:
        take = min(weights[i], theta - mass)
        if take <= 0:
            break
        total += take * values[i]
        mass += take
    return total / theta


@pytest.mark.parametrize("weighted", [False, True])
def test_summaries_match_numpy(weighted):
    rng = np.random.default_rng(1)
    values = rng.random(37).astype(np.float32)
    weights = rng.integers(1, 50, size=37).astype(np.float32) if weighted else None
    got = jax.jit(summarize)(values, weights)
    assert set(got) == set(SUMMARY_KEYS)
    w = np.ones(37) if weights is None else weights.astype(np.float64)
    w = w / w.sum()
    v = values.astype(np.float64)
    np.testing.assert_allclose(got["mean"], np.sum(w * v), rtol=1e-5)
    np.testing.assert_allclose(got["std"], np.sqrt(np.sum(w * (v - np.sum(w * v)) ** 2)), rtol=1e-4)
    for p in (10, 20, 50, 60, 80, 90, 95):
        expected = np.percentile(v, p, method="inverted_cdf", weights=None if weights is None else w)
        np.testing.assert_allclose(got[f"p{p}"], expected, rtol=1e-6, err_msg=f"p{p}")
    np.testing.assert_allclose(got["superquantile_90"], _superquantile_reference(v, 0.1, w), rtol=1e-4)
    np.testing.assert_allclose(got["superquantile_95"], _superquantile_reference(v, 0.05, w), rtol=1e-4)
    np.testing.assert_allclose(got["best_10"], -_superquantile_reference(-v, 0.1, w), rtol=1e-4)


def test_summaries_of_ten_values_take_exact_tails():
    values = np.arange(10, dtype=np.float32)  # worst 10% = {9}, best 10% = {0}
    got = summarize(values)
    assert float(got["superquantile_90"]) == pytest.approx(9.0)
    assert float(got["best_10"]) == pytest.approx(0.0)
    assert float(got["p50"]) == 4.0
