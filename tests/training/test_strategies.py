"""Every client-batching strategy gives the same round, sharded included."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import slow_after, tiny_population

from jaxfl.algorithms import fedavg
from jaxfl.models import make_model
from jaxfl.training import ClientStrategy, LocalTraining, Task, map_clients, parse_strategy

POPULATION = tiny_population([7, 23, 10, 1, 31, 12, 5, 18, 3, 9, 14], seed=2)
TASK = Task(make_model("linear", (5,), 3))
LOCAL = LocalTraining(batch_size=4, num_epochs=1)
STRATEGIES = [
    ClientStrategy("vmap"),
    ClientStrategy("sequential"),
    ClientStrategy("chunked", chunk_size=3),
    ClientStrategy("sharded", inner="sequential"),  # 8 devices, M=10: 6 padding clients
    ClientStrategy("sharded", inner="vmap", num_devices=2),
    ClientStrategy("sharded", inner="chunked", chunk_size=2, num_devices=4),
]


def _run(strategy, rounds=2, clients_per_round=10):
    algorithm = fedavg(TASK, LOCAL, clients_per_round, strategy=strategy)
    state = strategy.replicate(algorithm.init(TASK.model.init(jax.random.key(0)), {"lr": 0.3}))
    population = strategy.replicate(POPULATION)
    round_fn = jax.jit(algorithm.round, donate_argnums=0)
    for _ in range(rounds):
        state, metrics = round_fn(state, population, jax.random.key(5))
    return jax.device_get(state.params), jax.device_get(metrics)


def test_eight_devices_exist():
    assert jax.device_count() == 8


@pytest.mark.parametrize("strategy", slow_after(STRATEGIES[1:], keep=1), ids=lambda s: s.describe())
def test_strategies_agree_with_vmap(strategy):
    expected, expected_metrics = _run(STRATEGIES[0])
    got, metrics = _run(strategy)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6), got, expected)
    np.testing.assert_allclose(metrics["train_loss"], expected_metrics["train_loss"], rtol=1e-5)


def test_padding_clients_are_dropped_and_inactive():
    # 3 clients on 8 devices: 5 padding clients, which must not run and must
    # not appear in the outputs.
    def fn(shared, client):
        return {"id": client["id"], "ran": client["active"].astype(jnp.int32)}

    per_client = {"id": jnp.array([4, 1, 7]), "active": jnp.ones(3, bool)}
    out = jax.jit(
        lambda pc: map_clients(fn, (), pc, ClientStrategy("sharded", inner="sequential"))
    )(per_client)
    np.testing.assert_array_equal(out["id"], [4, 1, 7])
    np.testing.assert_array_equal(out["ran"], [1, 1, 1])


def test_sharded_gradients_are_not_summed_over_devices():
    # The trap of shared/notes/jax-on-this-machine.md: a replicated input's
    # gradient inside shard_map must not be multiplied by the device count.
    def fn(shared, client):
        w = shared
        return jax.grad(lambda w: jnp.sum(w * client["x"]))(w)

    per_client = {"x": jnp.arange(8.0)[:, None] * jnp.ones((8, 3)), "active": jnp.ones(8, bool)}
    out = jax.jit(
        lambda w, pc: map_clients(fn, w, pc, ClientStrategy("sharded", inner="vmap"))
    )(jnp.ones(3), per_client)
    np.testing.assert_allclose(out, per_client["x"])


@pytest.mark.parametrize(
    "text, kind",
    [
        ("vmap", "vmap"), ("sequential", "sequential"), ("chunked:4", "chunked"),
        ("sharded", "sharded"), ("sharded:vmap", "sharded"), ("sharded:chunked:2", "sharded"),
    ],
)
def test_parse_strategy(text, kind):
    assert parse_strategy(text).kind == kind


@pytest.mark.parametrize("text", ["chunked", "chunked:x", "chunked:0", "pmap", "sharded:pmap"])
def test_parse_strategy_rejects(text):
    with pytest.raises(ValueError):
        parse_strategy(text)


def test_layout_order_balances_devices_and_groups_similar_clients():
    from jaxfl.training.strategies import _layout_order

    cost = jnp.array([5, 1, 9, 3, 7, 2, 8, 4])
    sharded = np.asarray(_layout_order(cost, "sharded", "sequential", 2))
    assert sorted(sharded.tolist()) == list(range(8))
    first, second = np.asarray(cost)[sharded[:4]], np.asarray(cost)[sharded[4:]]
    assert abs(first.sum() - second.sum()) <= 1  # snake: 9+5+4+1 vs 8+7+3+2
    chunked = np.asarray(_layout_order(cost, "chunked", "sequential", 1))
    np.testing.assert_array_equal(np.asarray(cost)[chunked], [9, 8, 7, 5, 4, 3, 2, 1])


def test_reordered_layouts_return_outputs_in_client_order():
    def fn(shared, client):
        return client["id"] * 10

    per_client = {"id": jnp.arange(7), "active": jnp.ones(7, bool)}
    cost = jnp.array([3, 9, 1, 4, 4, 8, 2])
    strategies = [
        ClientStrategy("chunked", chunk_size=3), ClientStrategy("sharded", inner="vmap", num_devices=4)
    ]
    for strategy in strategies:
        out = jax.jit(lambda pc, c, s=strategy: map_clients(fn, (), pc, s, cost=c))(per_client, cost)
        np.testing.assert_array_equal(out, np.arange(7) * 10)


def test_split_rows_are_gathered_by_an_all_reduce_of_the_cohort_and_scattered_in_place():
    """What `ClientStrategy.shard_rows` relies on: XLA gathers M rows of a split [R, ...] array without
    copying all R rows to every device, and scatters them back into the devices' own rows."""
    strategy = ClientStrategy("sharded", num_devices=4, split_client_state=True)
    rows = strategy.shard_rows(jnp.arange(8 * 3, dtype=jnp.float32).reshape(8, 3))
    ids = jnp.array([6, 1, 4], jnp.int32)

    def round_trip(rows, ids):
        return rows.at[ids].set(rows[ids] * 10.0, unique_indices=True)

    compiled = jax.jit(round_trip, donate_argnums=0).lower(rows, ids).compile()
    hlo = compiled.as_text()
    assert "all-gather" not in hlo and "all-reduce" in hlo
    expected = np.arange(24, dtype=np.float32).reshape(8, 3)
    expected[[6, 1, 4]] *= 10.0
    out = compiled(rows, ids)
    np.testing.assert_array_equal(out, expected)
    assert out.sharding.spec == rows.sharding.spec
    assert {shard.data.shape[0] for shard in out.addressable_shards} == {2}
