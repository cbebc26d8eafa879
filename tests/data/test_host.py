"""Host-resident populations: gathering cohorts, streaming evaluation, and the
out-of-core equality: a run on a host-resident population equals the run on
the same population on the device, for the same seed."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import slow_after

from jaxfl.algorithms.base import server_optimizer
from jaxfl.algorithms.registry import Engine, build_algorithm
from jaxfl.data import load_dataset
from jaxfl.data.host import HostPopulation, choose_residency, client_blocks, place_population
from jaxfl.data.population import ClientPopulation, GatheredCohort
from jaxfl.evaluation.per_client import host_population_metrics, per_client_metrics
from jaxfl.experiment.config import make_config
from jaxfl.experiment.runner import compile_rounds, run_algorithm, setup
from jaxfl.experiment.sweep import SweepPoint, run_sweep
from jaxfl.models import make_model
from jaxfl.training import ClientStrategy, LocalTraining, Task
from jaxfl.training.cohort import round_keys, sample_cohort
from jaxfl.training.host_cohorts import CohortStream, sampled_cohorts


def _population(sizes, seed=0, features=3):
    rng = np.random.default_rng(seed)
    total = int(np.sum(sizes))
    return HostPopulation.from_arrays(
        {
            "x": rng.normal(size=(total, features)).astype(np.float32),
            "y": rng.integers(0, 4, total).astype(np.int32),
        },
        np.asarray(sizes),
    )


def test_gather_packs_the_clients_in_order_and_pads():
    population = _population([3, 1, 4, 2, 5])
    ids = np.array([4, 1, 2])
    rows = population.cohort_rows(3)
    assert rows == 5 + 4 + 3  # The three largest clients.
    gathered = population.gather_host(ids, rows)
    expected = np.concatenate([population.client(i)["x"] for i in ids])
    np.testing.assert_array_equal(gathered["features"]["x"][: expected.shape[0]], expected)
    np.testing.assert_array_equal(gathered["features"]["x"][expected.shape[0] :], 0.0)
    np.testing.assert_array_equal(gathered["counts"], [5, 1, 4])
    np.testing.assert_array_equal(gathered["offsets"], [0, 5, 6])
    np.testing.assert_array_equal(gathered["client_ids"], ids)
    with pytest.raises(ValueError, match="more than the 3 rows"):
        population.gather_host(ids, 3)


def test_client_blocks_cover_every_client_within_the_row_budget():
    counts = np.array([3, 1, 4, 2, 5, 1, 1, 6])
    blocks = list(client_blocks(counts, 6))
    assert [b[0] for b in blocks] == [0, *[b[1] for b in blocks[:-1]]] and blocks[-1][1] == counts.size
    for start, stop in blocks:
        assert counts[start:stop].sum() <= 6


@pytest.mark.parametrize("block_rows", slow_after([1, 7, 1 << 16], keep=2))
def test_streamed_evaluation_equals_the_device_evaluation(block_rows):
    data = load_dataset("synthetic", num_clients=12)
    task = Task(make_model("linear", data.input_shape, data.num_classes))
    params = jax.tree.map(lambda p: p + 0.1, task.model.init(jax.random.key(0)))
    params = {"dense": {**params["dense"], "kernel": jax.random.normal(jax.random.key(1), (60, 10))}}
    expected = per_client_metrics(task, params, data.train)
    got = host_population_metrics(task, params, HostPopulation.from_device(data.train), block_rows=block_rows)
    np.testing.assert_allclose(got.loss, np.asarray(expected.loss), rtol=1e-5)
    np.testing.assert_array_equal(got.error, np.asarray(expected.error))


def test_residency_choice(monkeypatch):
    import jaxfl.data.host as host

    monkeypatch.setattr(host, "device_memory_bytes", lambda: 1000)
    assert choose_residency(400).residency == "device"
    assert choose_residency(600).residency == "host"
    assert "exceeds" in choose_residency(600).reason
    assert choose_residency(600, "device").residency == "device"
    with pytest.raises(ValueError, match="residency"):
        choose_residency(1, "gpu")
    population = _population([2, 3])
    assert isinstance(place_population(population, "device"), ClientPopulation)
    assert place_population(population, "host") is population


def test_sampled_cohorts_are_the_rounds_own():
    key = jax.random.key(7)
    population = _population([1] * 50)
    device = population.to_device()
    ids = sampled_cohorts(key, first_round=jnp.int32(3), num_rounds=4, num_clients=50, clients_per_round=6)
    for k in range(4):
        expected = sample_cohort(round_keys(key, jnp.int32(3 + k)).sampling, device, 6)
        np.testing.assert_array_equal(ids[k], expected)


def _engine(task, strategy, num_clients, local=None):
    return Engine(
        task=task,
        local=local or LocalTraining(batch_size=4, num_epochs=2, loop="while"),
        clients_per_round=5,
        strategy=strategy,
        server_tx=server_optimizer("sgd"),
        client_weighting="num_examples",
        num_clients=num_clients,
    )


VMAP, SEQUENTIAL = ClientStrategy("vmap"), ClientStrategy("sequential")
SHARDED = ClientStrategy("sharded", inner="sequential")


# Every algorithm family once (AFL keeps per-client state, q-FFL and Δ-FL read
# the cohort's losses, Ditto's dynamic lambda reads validation client k of
# training client k, who sits in slot i of a gathered cohort) and every layout
# once (compile time dominates): the sharded layout with q-FFL, which reads the
# cohort's losses across the shards as Δ-FL would (a Δ-FL sharded case cost 5 s
# and checked no other path; Δ-FL's own is the sequential case, and its vmap run
# and sweep are test_a_run_and_a_sweep_on_a_host_population_equal_the_device_ones).
@pytest.mark.parametrize(
    "name, strategy",
    slow_after(
        [
            ("fedavg", VMAP),
            ("qffl", SHARDED),
            ("deltafl", SEQUENTIAL),
            ("afl", VMAP),
            ("ditto-dynamic", VMAP),
        ],
        keep=1,
    ),
    ids=lambda v: v if isinstance(v, str) else v.kind,
)
def test_round_on_gathered_cohorts_equals_the_device_round(name, strategy):
    """The out-of-core equality, round by round, for several algorithms and layouts."""
    data = load_dataset("synthetic", num_clients=20)
    task = Task(make_model("linear", data.input_shape, data.num_classes))
    engine = _engine(task, strategy, data.train.num_clients)
    train, held_out = data.train, None
    if name == "ditto-dynamic":
        # The synthetic data's test client k is training client k's held-out data.
        engine = dataclasses.replace(engine, personal_validation=data.test)
        algorithm = build_algorithm("ditto", engine, {"ditto_dynamic_lam": "0.1,1,2"})
        # All N clients' on the device; each gathered cohort carries its own clients'.
        train = dataclasses.replace(data.train, held_out=data.test)
        held_out = HostPopulation.from_device(data.test)
    else:
        algorithm = build_algorithm(name, engine, {})
    start = algorithm.init(task.model.init(jax.random.key(0)), {"lr": 0.05})
    key = jax.random.key(3)
    round_fn = jax.jit(algorithm.round)
    device_state = strategy.replicate(start)
    train = strategy.replicate(train)
    host_state = strategy.replicate(start)
    stream = CohortStream(
        HostPopulation.from_device(data.train), key, 5, place=strategy.replicate, held_out=held_out
    )
    with stream:
        for _ in range(4):
            device_state, device_metrics = round_fn(device_state, train, key)
            cohort = stream.next_call()
            host_state, host_metrics = round_fn(host_state, cohort, key)
            for metric in device_metrics:
                np.testing.assert_allclose(host_metrics[metric], device_metrics[metric], rtol=1e-6, atol=1e-7)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
        (host_state.params, host_state.clients),
        (device_state.params, device_state.clients),
    )
    # The cohort on the device is the cohort, not the population.
    assert isinstance(cohort, GatheredCohort)
    assert cohort.clients.features["x"].shape[0] == stream.num_rows < data.train.num_examples


def test_several_rounds_per_call_on_gathered_cohorts_and_one_trace():
    data = load_dataset("synthetic", num_clients=20)
    task = Task(make_model("linear", data.input_shape, data.num_classes))
    algorithm = build_algorithm("fedavg", _engine(task, ClientStrategy("vmap"), 20), {})
    start = algorithm.init(task.model.init(jax.random.key(0)), {"lr": 0.05})
    key = jax.random.key(3)
    traces = []

    def counted_round(state, population, key):
        traces.append(1)
        return algorithm.round(state, population, key)

    one = jax.jit(algorithm.round)
    state = start
    for _ in range(6):
        state, _ = one(state, data.train, key)
    fused = compile_rounds(counted_round, 3, cohort_per_round=True)
    host_state = jax.tree.map(jnp.copy, start)
    with CohortStream(HostPopulation.from_device(data.train), key, 5, rounds_per_call=3) as stream:
        for _ in range(2):
            host_state, _ = fused(host_state, stream.next_call(), key)
    assert len(traces) == 1
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), host_state.params, state.params
    )
    assert int(host_state.round) == 6


RUN = dict(
    algorithm="deltafl",
    dataset="synthetic",
    dataset_options={"num_clients": 24},
    rounds=6,
    eval_every=3,
    clients_per_round=5,
    progress=False,
    strategy="vmap",
    # The host-resident population is the training one: its (streamed) evaluation is asked for.
    eval_train=True,
)


@pytest.mark.slow
def test_a_run_and_a_sweep_on_a_host_population_equal_the_device_ones():
    results = {}
    for residency in ("device", "host"):
        run_setup = setup(make_config({**RUN, "residency": residency}))
        assert run_setup.placement.residency == residency
        expected_type = HostPopulation if residency == "host" else ClientPopulation
        assert isinstance(run_setup.dataset.train, expected_type)
        run = run_algorithm(run_setup, "deltafl")
        sweep = run_sweep(
            run_setup, "deltafl", [SweepPoint({"theta": 0.3}, 1), SweepPoint({"theta": 0.8}, 2)]
        )
        results[residency] = (run, sweep)
    (run_d, sweep_d), (run_h, sweep_h) = results["device"], results["host"]
    assert run_h.summary["residency"] == "host" and run_d.summary["residency"] == "device"
    for a, b in [(run_h, run_d), *zip(sweep_h, sweep_d, strict=True)]:
        jax.tree.map(
            lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7),
            a.state.params,
            b.state.params,
        )
        for group in ("train_loss", "test_error"):
            for stat, value in b.summary[group].items():
                assert a.summary[group][stat] == pytest.approx(value, rel=1e-5, abs=1e-7), (group, stat)
        for population in b.clients:
            np.testing.assert_allclose(
                a.clients[population]["loss"], b.clients[population]["loss"], rtol=1e-5
            )
        assert [r["round"] for r in a.history] == [r["round"] for r in b.history]


def test_gathered_cohort_of_the_wrong_size_is_refused():
    data = load_dataset("synthetic", num_clients=10)
    task = Task(make_model("linear", data.input_shape, data.num_classes))
    algorithm = build_algorithm("fedavg", _engine(task, ClientStrategy("vmap"), 10), {})
    state = algorithm.init(task.model.init(jax.random.key(0)), {})
    host = HostPopulation.from_device(data.train)
    cohort = host.gather(np.arange(3), host.cohort_rows(3))
    cohort = dataclasses.replace(cohort, num_clients=10)
    with pytest.raises(ValueError, match="gathered cohort has 3 clients"):
        algorithm.round(state, cohort, jax.random.key(0))


def test_disk_population_reads_the_same_examples_without_mapping_them():
    """`storage=disk` gives the in-memory arrays; gathering reads with pread, not the map."""
    memory = load_dataset("many-clients", num_clients=3000, num_test_clients=10)
    disk = load_dataset("many-clients", num_clients=3000, num_test_clients=10, storage="disk")
    assert isinstance(disk.train, HostPopulation) and isinstance(disk.train.features["x"], np.memmap)
    assert set(disk.train._files) == {"x", "y"}
    ids = np.random.default_rng(0).choice(3000, 50, replace=False)
    rows = disk.train.cohort_rows(50)
    from_disk = disk.train.gather_host(ids, rows)
    from_memory = HostPopulation.from_device(memory.train).gather_host(ids, rows)
    for name in ("x", "y"):
        np.testing.assert_array_equal(from_disk["features"][name], from_memory["features"][name])
    np.testing.assert_array_equal(from_disk["counts"], from_memory["counts"])
