"""Tests of jaxfl.aggregators against the NumPy references in numpy_reference.py.

Every configuration runs on eight scenarios of the same shapes (7 clients,
two leaves [3, 2] and [4]): random updates, unequal weights, ties, zero
weights with garbage in the excluded clients, a single participant, all
weights zero, non-finite updates, and an attack (5 honest clients, 2 far
away). Each configuration is compiled twice: once as `jit(vmap(aggregate))`
over the stacked scenarios, once as `jit(aggregate)` called per scenario;
both are compared with the reference. Compilation dominates the run time, so
the compiled functions are shared through `functools.cache`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from aggregators import numpy_reference as ref
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from scipy import optimize, stats

from jaxfl.aggregators import AGGREGATORS, aggregator, aggregator_options
from jaxfl.training.cohort import weighted_mean

M = 7
SHAPES = {"a": (3, 2), "b": (4,)}
SIZE = 10

# id -> (name, options, reference)
CONFIGS = {
    "mean": ("mean", {}, ref.mean),
    "median": ("median", {}, ref.median),
    "trimmed-mean": ("trimmed-mean", {"beta": 0.3}, ref.trimmed_mean(0.3)),
    "krum": ("krum", {"byzantine": 2}, ref.krum(2)),
    "multi-krum": ("multi-krum", {"byzantine": 2}, ref.multi_krum(2, 0)),
    "multi-krum-3": ("multi-krum", {"byzantine": 1, "selected": 3}, ref.multi_krum(1, 3)),
    "norm-clipping": ("norm-clipping", {}, ref.norm_clipping),
    "k-norm": ("k-norm", {"byzantine": 2}, ref.k_norm(2)),
    "k-loss": ("k-loss", {"byzantine": 1}, ref.k_loss(1)),
    "centered-clipping": (
        "centered-clipping",
        {"radius": 1.0, "iterations": 3},
        ref.centered_clipping(1.0, 3),
    ),
    "geometric-median": ("geometric-median", {}, ref.geometric_median(1e-6, 4, 1e-6)),
}


def _updates(values):
    """A flat [M, SIZE] array as the dict of leaves a: [M, 3, 2], b: [M, 4]."""
    values = np.asarray(values, np.float32)
    return {"a": values[:, :6].reshape(M, 3, 2), "b": values[:, 6:]}


def _scenarios():
    rng = np.random.default_rng(20240501)
    out = {}
    ones = np.ones(M, np.float32)

    def losses():
        return rng.normal(size=M).astype(np.float32)

    out["random"] = (rng.normal(size=(M, SIZE)), ones, losses())
    out["unequal"] = (rng.normal(size=(M, SIZE)), rng.uniform(0.2, 3.0, M).astype(np.float32), losses())

    # Integer values: many equal coordinates, two duplicated clients (0 = 3,
    # 1 = 5), client 6 = -client 1 (so 1, 5, 6 tie for the largest norm but
    # differ), equal losses; integer weights of odd total so no exact half.
    tied = rng.integers(-2, 3, size=(M, SIZE)).astype(np.float64)
    tied[1] = 2.0 * rng.choice([-1.0, 1.0], size=SIZE)
    tied[3], tied[5], tied[6] = tied[0], tied[1], -tied[1]
    tied[:, 7] = 1.0
    tied_losses = np.array([2.0, 2.0, 0.5, 1.0, 0.0, 3.0, 1.0], np.float32)
    out["ties"] = (tied, np.array([1, 2, 1, 3, 1, 2, 1], np.float32), tied_losses)

    garbage = rng.normal(size=(M, SIZE))
    garbage[1] = 1e3
    garbage[4] = -7e2
    garbage[6] = 5e2
    out["zero-weights"] = (garbage, np.array([1, 0, 2, 1, 0, 1, 0], np.float32), losses())  # n = 4

    single = np.array([0, 0, 0, 2.5, 0, 0, 0], np.float32)
    out["single"] = (rng.normal(size=(M, SIZE)), single, losses())
    out["all-zero"] = (rng.normal(size=(M, SIZE)), np.zeros(M, np.float32), losses())

    # Client 2: a NaN and an inf; client 5: -inf; client 4: finite but its
    # squared norm overflows float32; client 6 (weight 0): NaN, not counted;
    # client 0: NaN loss (k-loss drops it too).
    broken = rng.normal(size=(M, SIZE))
    broken[2, 1], broken[2, 8] = np.nan, np.inf
    broken[5, 3] = -np.inf
    broken[4, 0] = 1e20
    broken[6, 2] = np.nan
    broken_losses = losses()
    broken_losses[0] = np.nan
    out["nonfinite"] = (broken, np.array([1, 1, 1, 1, 1, 1, 0], np.float32), broken_losses)

    attack = 1.0 + 0.1 * rng.normal(size=(M, SIZE))
    attack[[2, 5]] = -10.0 + rng.normal(size=(2, SIZE))
    out["attack"] = (attack, ones, losses())
    return {
        name: (_updates(u), np.asarray(w, np.float32), np.asarray(loss, np.float32))
        for name, (u, w, loss) in out.items()
    }


SCENARIOS = _scenarios()
NAMES = tuple(SCENARIOS)


def _state(config_id, scenario):
    name, options, _ = CONFIGS[config_id]
    if name != "centered-clipping":
        return ()
    seed = NAMES.index(scenario)
    rng = np.random.default_rng(seed)
    return {k: (0.5 * rng.normal(size=s)).astype(np.float32) for k, s in SHAPES.items()}


@functools.cache
def _aggregator(config_id):
    name, options, _ = CONFIGS[config_id]
    return aggregator(name, **options)


@functools.cache
def _jitted(config_id):
    return jax.jit(_aggregator(config_id).aggregate)


@functools.cache
def _batched(config_id):
    """Outputs of jit(vmap(aggregate)) over all scenarios, as NumPy."""
    stack = lambda *xs: np.stack(xs)  # noqa: E731
    updates = jax.tree.map(stack, *[SCENARIOS[s][0] for s in NAMES])
    weights = np.stack([SCENARIOS[s][1] for s in NAMES])
    losses = np.stack([SCENARIOS[s][2] for s in NAMES])
    states = jax.tree.map(stack, *[_state(config_id, s) for s in NAMES])
    out = jax.jit(jax.vmap(_aggregator(config_id).aggregate))(updates, weights, states, losses)
    return jax.tree.map(np.asarray, out)


def _check(actual, expected, config_id, scenario):
    update, state, metrics = actual
    ref_update, ref_state, ref_metrics = expected
    tol = 2e-4 if CONFIGS[config_id][0] == "geometric-median" else 2e-5
    for k in SHAPES:
        np.testing.assert_allclose(
            np.asarray(update[k]), ref_update[k], rtol=tol, atol=tol, equal_nan=True, err_msg=k
        )
    assert set(metrics) == set(ref_metrics)
    for key, value in ref_metrics.items():
        if key == "clip_threshold":
            np.testing.assert_allclose(metrics[key], value, rtol=1e-5)
        else:
            assert int(metrics[key]) == value, key
    if CONFIGS[config_id][0] == "centered-clipping":
        for k in SHAPES:
            np.testing.assert_allclose(np.asarray(state[k]), ref_state[k], rtol=tol, atol=tol)


def _reference(config_id, scenario):
    updates, weights, losses = SCENARIOS[scenario]
    return CONFIGS[config_id][2](updates, weights, _state(config_id, scenario), losses)


@pytest.mark.parametrize("scenario", NAMES)
@pytest.mark.parametrize("config_id", CONFIGS)
def test_vmapped_matches_reference(config_id, scenario):
    batched = _batched(config_id)
    index = NAMES.index(scenario)
    actual = jax.tree.map(lambda x: x[index], batched)
    _check(actual, _reference(config_id, scenario), config_id, scenario)


@pytest.mark.parametrize("scenario", NAMES)
@pytest.mark.parametrize("config_id", CONFIGS)
def test_jitted_matches_reference(config_id, scenario):
    updates, weights, losses = SCENARIOS[scenario]
    actual = _jitted(config_id)(updates, weights, _state(config_id, scenario), losses)
    _check(actual, _reference(config_id, scenario), config_id, scenario)


@pytest.mark.parametrize("config_id", CONFIGS)
def test_no_nan_leaks_from_dropped_clients(config_id):
    update, _, metrics = _jitted(config_id)(*_call_args(config_id, "nonfinite"))
    finite = all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(update))
    assert finite == (config_id != "mean")
    expected_drops = {"mean": 0, "k-loss": 4}.get(config_id, 3)
    assert int(metrics["dropped_nonfinite"]) == expected_drops


def _call_args(config_id, scenario):
    updates, weights, losses = SCENARIOS[scenario]
    return updates, weights, _state(config_id, scenario), losses


@pytest.mark.parametrize("scenario", NAMES)
def test_mean_is_cohort_weighted_mean_bit_for_bit(scenario):
    updates, weights, losses = SCENARIOS[scenario]
    expected = jax.jit(weighted_mean)(updates, weights)
    actual, _, _ = _jitted("mean")(updates, weights, (), losses)
    for k in SHAPES:
        np.testing.assert_array_equal(np.asarray(actual[k]), np.asarray(expected[k]))
    eager, _, _ = _aggregator("mean").aggregate(updates, weights, ())
    eager_expected = weighted_mean(updates, weights)
    for k in SHAPES:
        np.testing.assert_array_equal(np.asarray(eager[k]), np.asarray(eager_expected[k]))


@pytest.mark.parametrize("weight", [1.0, 0.1, 0.3, 0.7, 1.1])
def test_equal_weight_median_and_trimmed_mean_match_numpy_and_scipy(weight):
    """Equal weights of any size: np.median and scipy.stats.trim_mean (client 6 left out: n = 6)."""
    updates, _, _ = SCENARIOS["random"]
    weights = np.full(M, weight, np.float32)
    weights[6] = 0.0
    flat = np.concatenate([updates["a"].reshape(M, -1), updates["b"]], axis=1)[:6]
    median, _, _ = _jitted("median")(updates, weights, ())
    trimmed, _, _ = _jitted("trimmed-mean")(updates, weights, ())
    got_median = np.concatenate([np.asarray(median["a"]).ravel(), np.asarray(median["b"])])
    got_trimmed = np.concatenate([np.asarray(trimmed["a"]).ravel(), np.asarray(trimmed["b"])])
    np.testing.assert_allclose(got_median, np.median(flat, axis=0), rtol=1e-6)
    np.testing.assert_allclose(got_trimmed, stats.trim_mean(flat, 0.3, axis=0), rtol=1e-5, atol=1e-6)


def test_trimmed_count_is_floor_in_float64_like_scipy():
    """beta 0.35 of n = 20 trims 7 per side (float32 arithmetic would give 6)."""
    values = np.random.default_rng(5).normal(size=(20, 3)).astype(np.float32)
    agg = aggregator("trimmed-mean", beta=0.35)
    update, _, metrics = jax.jit(agg.aggregate)({"x": values}, np.ones(20, np.float32), ())
    assert int(metrics["aggregated_clients"]) == 6
    np.testing.assert_allclose(np.asarray(update["x"]), stats.trim_mean(values, 0.35, axis=0), rtol=1e-5)


ROBUST_TO_ATTACK = (
    "median",
    "trimmed-mean",
    "krum",
    "multi-krum",
    "norm-clipping",
    "k-norm",
    "geometric-median",
)


@pytest.mark.parametrize("config_id", ROBUST_TO_ATTACK)
def test_robust_aggregators_resist_the_attack(config_id):
    """5 honest clients near 1, 2 near -10: robust rules stay near 1, the mean does not."""
    args = _call_args(config_id, "attack")
    honest = np.ones(SIZE)

    def error(update):
        flat = np.concatenate([np.asarray(update["a"]).ravel(), np.asarray(update["b"])])
        return float(np.linalg.norm(flat - honest))

    mean_error = error(_jitted("mean")(*_call_args("mean", "attack"))[0])
    assert mean_error > 9.0
    assert error(_jitted(config_id)(*args)[0]) < 0.2 * mean_error


def test_k_loss_needs_losses():
    updates, weights, _ = SCENARIOS["random"]
    agg = _aggregator("k-loss")
    assert agg.uses_losses
    assert not any(_aggregator(c).uses_losses for c in CONFIGS if c != "k-loss")
    with pytest.raises(ValueError, match="k-loss needs the clients' training losses"):
        agg.aggregate(updates, weights, ())
    with pytest.raises(ValueError, match=r"k-loss losses must be \[M\]"):
        agg.aggregate(updates, weights, (), np.zeros(M + 1, np.float32))


@pytest.mark.parametrize("config_id", CONFIGS)
def test_shapes_dtypes_and_state_are_stable(config_id):
    agg = _aggregator(config_id)
    params = {k: jnp.zeros(s, jnp.float32) for k, s in SHAPES.items()}
    state = agg.init(params)
    updates, weights, losses = SCENARIOS["random"]
    update, new_state, metrics = jax.eval_shape(agg.aggregate, updates, weights, state, losses)
    assert jax.tree.structure(update) == jax.tree.structure(params)
    for k in SHAPES:
        assert update[k].shape == SHAPES[k] and update[k].dtype == jnp.float32
    assert jax.tree.structure(new_state) == jax.tree.structure(state)
    assert [(x.shape, x.dtype) for x in jax.tree.leaves(new_state)] == [
        (x.shape, x.dtype) for x in jax.tree.leaves(state)
    ]
    for key, value in metrics.items():
        assert value.shape == (), key
    assert metrics["aggregated_clients"].dtype == jnp.int32
    assert metrics["dropped_nonfinite"].dtype == jnp.int32


def test_mismatched_client_axis_is_an_error():
    updates, _, _ = SCENARIOS["random"]
    with pytest.raises(ValueError, match=r"every update leaf must be \[M=6"):
        _aggregator("median").aggregate(updates, np.ones(6, np.float32), ())


def test_centered_clipping_starts_from_the_previous_aggregate():
    """Two rounds: the second starts from the first's output (the state), not from zeros."""
    agg = _aggregator("centered-clipping")
    reference = CONFIGS["centered-clipping"][2]
    state = agg.init({k: jnp.zeros(s, jnp.float32) for k, s in SHAPES.items()})
    first_updates, weights, losses = SCENARIOS["attack"]
    second_updates = SCENARIOS["random"][0]
    run = _jitted("centered-clipping")
    out1, state1, _ = run(first_updates, weights, state, losses)
    out2, state2, _ = run(second_updates, weights, state1, losses)
    _, ref_state1, _ = reference(first_updates, weights, jax.tree.map(np.asarray, state), losses)
    ref_out2, _, _ = reference(second_updates, weights, ref_state1, losses)
    from_zero, _, _ = reference(second_updates, weights, jax.tree.map(np.asarray, state), losses)
    for k in SHAPES:
        np.testing.assert_allclose(np.asarray(out2[k]), ref_out2[k], rtol=2e-5, atol=2e-5)
        np.testing.assert_array_equal(np.asarray(state2[k]), np.asarray(out2[k]))
    assert not np.allclose(ref_out2["b"], from_zero["b"], atol=1e-3)


def test_geometric_median_minimizes_the_weighted_distance_sum():
    updates, weights, _ = SCENARIOS["unequal"]
    agg = aggregator("geometric-median", max_iterations=300, ftol=0.0, nu=1e-8)
    update, _, metrics = jax.jit(agg.aggregate)(updates, weights, ())
    # ftol = 0 stops only at an exact float32 fixed point.
    assert 4 < int(metrics["geometric_median_iterations"]) <= 300
    kept, vectors, _ = ref.participants(updates, weights)
    point = np.concatenate([np.asarray(update["a"]).ravel(), np.asarray(update["b"])]).astype(np.float64)

    def objective(z):
        return ref.weighted_objective(z, vectors, weights, kept)

    def gradient(z):
        return sum(float(weights[k]) * (z - vectors[k]) / np.linalg.norm(z - vectors[k]) for k in kept)

    start = sum(float(weights[k]) * vectors[k] for k in kept) / float(np.sum(weights))
    best = optimize.minimize(objective, start, jac=gradient, method="BFGS", options={"gtol": 1e-10})
    value = objective(point)
    assert value <= best.fun * (1 + 1e-5)
    assert value < objective(start) * (1 - 1e-3)
    for k in kept:
        assert value < objective(vectors[k])


MESH_CONFIGS = ("median", "krum", "geometric-median", "trimmed-mean")


@pytest.mark.parametrize("config_id", MESH_CONFIGS)
def test_sharded_client_axis_matches_unsharded(config_id):
    """The client axis split over the 8 CPU devices gives the unsharded result."""
    devices = jax.devices()
    assert len(devices) == 8
    # As jaxfl.training.strategies builds it: a Mesh with automatic (GSPMD) axes.
    mesh = Mesh(np.array(devices), ("clients",))
    rng = np.random.default_rng(3)
    updates = {k: rng.normal(size=(16, *s)).astype(np.float32) for k, s in SHAPES.items()}
    updates["a"][5] = updates["a"][9]
    updates["b"][5] = updates["b"][9]
    weights = rng.uniform(0.5, 2.0, 16).astype(np.float32)
    weights[[3, 12]] = 0.0
    updates["b"][7, 1] = np.nan
    clients = NamedSharding(mesh, P("clients"))
    sharded_updates = jax.device_put(updates, clients)
    sharded_weights = jax.device_put(weights, clients)
    assert sharded_updates["a"].sharding.spec == P("clients")
    aggregate = _aggregator(config_id).aggregate
    sharded = jax.jit(aggregate)(sharded_updates, sharded_weights, ())
    unsharded = jax.jit(aggregate)(
        jax.device_put(updates, devices[0]), jax.device_put(weights, devices[0]), ()
    )
    # Selections are exact; sums may be reduced in another order across devices.
    tol = 0.0 if config_id in ("median", "krum") else 1e-6
    for k in SHAPES:
        np.testing.assert_allclose(np.asarray(sharded[0][k]), np.asarray(unsharded[0][k]), rtol=tol, atol=tol)
        assert np.all(np.isfinite(np.asarray(sharded[0][k])))
    assert {k: int(v) for k, v in sharded[2].items()} == {k: int(v) for k, v in unsharded[2].items()}
    assert int(sharded[2]["dropped_nonfinite"]) == 1


def test_registry_names_and_options():
    assert AGGREGATORS == (
        "mean",
        "median",
        "trimmed-mean",
        "krum",
        "multi-krum",
        "norm-clipping",
        "k-norm",
        "k-loss",
        "centered-clipping",
        "geometric-median",
    )
    assert aggregator_options("mean") == {}
    assert aggregator_options("trimmed-mean") == {"beta": 0.1}
    assert aggregator_options("multi-krum") == {"byzantine": 0, "selected": 0}
    assert aggregator_options("centered-clipping") == {"radius": 10.0, "iterations": 1}
    assert aggregator_options("geometric-median") == {"nu": 1e-6, "max_iterations": 4, "ftol": 1e-6}
    for name in AGGREGATORS:
        agg = aggregator(name, **aggregator_options(name))
        assert agg.name == name


@pytest.mark.parametrize(
    "name, options, message",
    [
        ("average", {}, r"unknown aggregator 'average'; choose one of mean, median, trimmed-mean, "),
        ("krum", {"beta": 0.1}, r"aggregator 'krum' has no option beta; its options are byzantine$"),
        ("median", {"byzantine": 1}, r"aggregator 'median' has no option byzantine; it takes no options"),
        ("trimmed-mean", {"beta": 0.5}, r"trimmed-mean option beta must be a finite number in \[0, 0.5\), got 0.5"),
        ("trimmed-mean", {"beta": -0.1}, r"trimmed-mean option beta must be a finite number in \[0, 0.5\), got -0.1"),
        ("trimmed-mean", {"beta": "0.1"}, r"trimmed-mean option beta must be a finite number in \[0, 0.5\), got \'0.1\'"),
        ("krum", {"byzantine": -1}, r"krum option byzantine must be an integer >= 0, got -1"),
        ("krum", {"byzantine": 1.0}, r"krum option byzantine must be an integer >= 0, got 1.0"),
        ("k-norm", {"byzantine": True}, r"k-norm option byzantine must be an integer >= 0, got True"),
        ("multi-krum", {"selected": -2}, r"multi-krum option selected must be an integer >= 0"),
        ("centered-clipping", {"radius": 0.0}, r"centered-clipping option radius must be a finite number > 0, got 0.0"),
        (
            "centered-clipping",
            {"iterations": 0},
            r"centered-clipping option iterations must be an integer >= 1",
        ),
        ("geometric-median", {"nu": float("inf")}, r"geometric-median option nu must be a finite number > 0, got inf"),
        ("geometric-median", {"max_iterations": 0}, r"option max_iterations must be an integer >= 1"),
        ("geometric-median", {"ftol": float("nan")}, r"geometric-median option ftol must be a finite number >= 0, got nan"),
    ],
)
def test_bad_names_and_options_are_precise_errors(name, options, message):
    with pytest.raises(ValueError, match=message):
        aggregator(name, **options)
    with pytest.raises(ValueError, match="choose one of"):
        aggregator_options("nope")
