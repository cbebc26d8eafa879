"""Per-client state in host memory (`jaxfl.training.client_state`).

The cohort's rows gathered on the host before each round and written back
after it must give the device-resident state's models bit for bit (clients
sampled in consecutive rounds included), and the personal evaluation in
blocks the whole-population one. From the CLI, a host run stopped and
resumed is checked against a sweep point in
tests/experiment/test_cli_robustness.py.
"""

import dataclasses

import jax
import numpy as np
import pytest
from algorithms.reference_rounds import LOCAL, POPULATION, SIZES, TASK, initial_params, run_rounds
from reference import TINY_LABEL_SHIFT, assert_cli_refuses, slow_after, tiny_population

from jaxfl.algorithms import fedavg
from jaxfl.algorithms.apfl import apfl
from jaxfl.algorithms.ditto import ditto
from jaxfl.algorithms.l2sgd import l2sgd
from jaxfl.algorithms.mapper import mapper
from jaxfl.data.host import HostPopulation
from jaxfl.evaluation.per_client import host_personal_metrics, personal_client_metrics
from jaxfl.experiment import runner
from jaxfl.training import ClientStrategy
from jaxfl.training.client_state import (
    GatheredClientRows,
    HostClientState,
    HostPersonalModels,
    client_id_blocks,
    is_on_host,
)

M = 3
N = len(SIZES)
KEY = jax.random.key(5)
ROUNDS = 6
HOST = ClientStrategy("vmap", host_client_state=True)
DEVICE = ClientStrategy("vmap")


# Validation client k is training client k's (Ditto's dynamic lambda chooses on them).
WITH_VALIDATION = dataclasses.replace(POPULATION, held_out=tiny_population([6, 2, 5, 4, 9, 3, 7, 5], seed=13))


HPARAMS = {"ditto": {"lr": 0.1, "lam": 0.5}, "apfl": {"lr": 0.1, "apfl_alpha": 0.3}}


def build(name, strategy):
    inner = fedavg(TASK, LOCAL, M, strategy=strategy)
    if name.startswith("ditto"):
        dynamic = (0.1, 1.0, 3.0) if name == "ditto-dynamic" else ()
        return ditto(inner, LOCAL, N, dynamic_lam=dynamic)
    if name == "mapper":
        return mapper(TASK, LOCAL, M, N, strategy=strategy)
    alpha_lr = 2.0 if name == "apfl-adaptive" else 0.0
    return apfl(inner, LOCAL, N, alpha_lr=alpha_lr)


def run_on_host(algorithm, state, num_rounds, key, rounds_ahead=4, population=POPULATION):
    """The runner's loop for host rows: gather, one compiled round, store back."""
    mover = HostClientState(key, N, M, rounds_ahead=rounds_ahead)
    traces = []

    def counted(state, population, key):
        traces.append(1)
        return algorithm.round(state, population, key)

    round_fn = jax.jit(counted, donate_argnums=0)
    for round_index in range(num_rounds):
        host = state.clients
        state = mover.gather(state, round_index)
        assert isinstance(state.clients, GatheredClientRows)
        state, _ = round_fn(state, population, key)
        state = mover.store(state, host, round_index)
    assert len(traces) == 1
    return state, mover


# APFL once, adaptive: its rows ({'local': v_k, 'alpha': alpha_k}) hold the fixed-alpha APFL's
# (v_k, rows that are models, as Ditto's are) and more; the fixed-alpha case checked no other path.
# Host-resident rows against device ones: the end-to-end tier (the host round itself: tests/data/test_host.py).
@pytest.mark.parametrize("name", slow_after(["ditto", "ditto-dynamic", "apfl-adaptive", "mapper"], keep=0))
def test_host_rows_give_the_device_models_bit_for_bit(name):
    hparams = HPARAMS.get(name.split("-")[0], {"lr": 0.1})
    on_device = build(name, DEVICE)
    start = on_device.init(initial_params(), hparams)
    expected, _ = run_rounds(on_device, start, ROUNDS, KEY, population=WITH_VALIDATION)
    on_host = build(name, HOST)
    start = on_host.init(initial_params(), hparams)
    assert is_on_host(start.clients) and not is_on_host(expected.clients)
    # rounds_ahead=4: the cohorts come from two blocks of the sampler.
    state, mover = run_on_host(on_host, start, ROUNDS, KEY, population=WITH_VALIDATION)
    cohorts = [set(mover.cohort_ids(r).tolist()) for r in range(ROUNDS)]
    # Some client trains in consecutive rounds: its second round must start from its first's rows.
    assert any(a & b for a, b in zip(cohorts, cohorts[1:], strict=False))
    for want, got in zip(jax.tree.leaves(expected.clients), jax.tree.leaves(state.clients), strict=True):
        assert isinstance(got, np.ndarray)
        np.testing.assert_array_equal(got, np.asarray(want))
    for want, got in zip(jax.tree.leaves(expected.params), jax.tree.leaves(state.params), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_rows_gathered_for_another_cohort_are_refused_before_the_write_back():
    class OtherCohort(HostClientState):
        """Gathers (and would store) the rows of the cohort's clients in the wrong order."""

        def cohort_ids(self, round_index):
            return np.roll(super().cohort_ids(round_index), 1)

    algorithm = build("ditto", HOST)
    state = algorithm.init(initial_params(), HPARAMS["ditto"])
    host = state.clients
    before = jax.tree.map(np.copy, host)
    mover = OtherCohort(KEY, N, M)
    state, _ = jax.jit(algorithm.round)(mover.gather(state, 0), POPULATION, KEY)
    with pytest.raises(RuntimeError, match=r"round 0 trained clients \[.*\] on the host rows of clients"):
        mover.store(state, host, 0)
    for want, got in zip(jax.tree.leaves(before), jax.tree.leaves(host), strict=True):
        np.testing.assert_array_equal(got, want)


def test_client_id_blocks_cover_every_client_with_one_shape():
    for num_clients, size in ((8, 3), (8, 8), (3, 8), (9, 3)):
        blocks = list(client_id_blocks(num_clients, size))
        assert {len(b) for b in blocks} == {min(size, num_clients)}
        assert set(np.concatenate(blocks).tolist()) == set(range(num_clients))
        assert all(b.min() >= 0 and b.max() < num_clients for b in blocks)


@pytest.mark.parametrize("name", slow_after(["ditto", "apfl", "apfl-adaptive", "mapper"]))
def test_block_evaluation_equals_the_whole_populations(name):
    hparams = HPARAMS.get(name.split("-")[0], {"lr": 0.1})
    algorithm = build(name, DEVICE)
    state, _ = run_rounds(algorithm, algorithm.init(initial_params(), hparams), 2, KEY)
    want_models = algorithm.personal_models(state)
    want_loss, want_error = personal_client_metrics(TASK, want_models, POPULATION)
    host_state = jax.tree.map(np.asarray, state)
    personal = runner.personal_models(algorithm, host_state)
    assert isinstance(personal, HostPersonalModels)
    assert (personal.to_models is None) == (name == "ditto")
    # Blocks of 3 of 8 clients: the last block starts early.
    loss, error = host_personal_metrics(
        TASK, personal, HostPopulation.from_device(POPULATION), group=2, block_clients=3
    )
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    np.testing.assert_allclose(error, want_error, rtol=1e-6)
    for want, got in zip(
        jax.tree.leaves(want_models), jax.tree.leaves(personal.to_host(block_size=3)), strict=True
    ):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_l2sgd_refuses_host_rows():
    algorithm = l2sgd(TASK, LOCAL, M, N, strategy=HOST)
    state = algorithm.init(initial_params(), {"lr": 0.1})
    state = HostClientState(KEY, N, M).gather(state, 0)
    with pytest.raises(ValueError, match="l2sgd averages all N personal models"):
        algorithm.round(state, POPULATION, KEY)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "--algorithm", "l2sgd", "--client-state", "host"], "cannot live in host memory"),
        (["sweep", "--algorithm", "ditto", "--client-state", "host", "--grid", "lam=0.1,1"],
         "run the settings one at a time"),
    ],
)  # fmt: skip
def test_host_client_state_refusals(argv, message, tmp_path, capsys):
    out = tmp_path / "out"
    argv = [*argv[:1], *TINY_LABEL_SHIFT, "--clients-per-round", "5", *argv[1:], "--out", str(out)]
    assert_cli_refuses(argv, [message], out, capsys)


def test_auto_keeps_personal_models_on_the_host_only_where_even_split_they_are_short(monkeypatch):
    from jaxfl.experiment.checks import choose_client_state, client_state_nbytes
    from jaxfl.experiment.config import make_config

    sharded = ClientStrategy("sharded", num_devices=2)
    config = make_config({"algorithm": "ditto", "client_state": "auto"})
    host = dataclasses.replace(sharded, host_client_state=True)
    # One host copy of N = 8 models of 1,000 parameters: 32,000 bytes.
    assert client_state_nbytes(host, 8, 1000, "ditto") == 32_000
    assert client_state_nbytes(host, 8, 1000, "apfl") == 64_000  # Two models a client.

    def chosen(available):
        strategy = choose_client_state(config, sharded, 8, 1000, available=available)
        if strategy.host_client_state:
            return "host"
        return "split" if strategy.split_client_state else "replicated"

    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    # Off CPU one copy a device: 32,000 bytes replicated, 16,000 split; a quarter of the memory each.
    choices = [chosen(4 * nbytes) for nbytes in (32_000, 31_999, 16_000, 15_999)]
    assert choices == ["replicated", "split", "split", "host"]
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    assert chosen(1) == "split"  # On CPU the host's memory is the devices': never 'host'.
    named = make_config({"algorithm": "ditto", "client_state": "host"})
    assert choose_client_state(named, sharded, 8, 1000).host_client_state


@pytest.mark.parametrize("strategy", [DEVICE, HOST], ids=["device", "host"])
def test_a_restored_carry_goes_where_the_strategy_keeps_client_rows(strategy):
    # A checkpoint restores host arrays whatever the layout: only `host_client_state` keeps them there.
    from types import SimpleNamespace

    from jaxfl.experiment.health import initial_health

    algorithm = build("ditto", DEVICE)
    restored = jax.device_get((algorithm.init(initial_params(), {"lr": 0.1}), initial_health()))
    assert is_on_host(restored[0].clients)
    state, _ = runner.place_carry(SimpleNamespace(engine=SimpleNamespace(strategy=strategy)), restored)
    assert is_on_host(state.clients) == strategy.host_client_state
    assert all(isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(state.params))
