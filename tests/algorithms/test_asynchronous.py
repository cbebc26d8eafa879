"""FedBuff and FedAsync against a plain Python event loop that applies arrivals in order with the model
versions their clients downloaded; and the settings that cannot work refused in one line."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from algorithms.reference_rounds import LOCAL, POPULATION, SIZES, TASK, initial_params, run_rounds
from clock.test_clock import WINDOWS, _availability, _next_online_reference, _online_reference
from reference import local_sgd_reference, slow_after

from jaxfl.algorithms.asynchronous import Fleet
from jaxfl.algorithms.fedasync import fedasync
from jaxfl.algorithms.fedbuff import fedbuff
from jaxfl.clock import lognormal_profiles
from jaxfl.training import ClientStrategy
from jaxfl.training.cohort import round_keys
from jaxfl.training.local import epoch_orders

N = len(SIZES)
LR = 0.1
PROFILES = lognormal_profiles(jax.random.key(6), N, sigma=1.0)
MODEL_BYTES = 18 * 4
_epoch_orders = jax.jit(epoch_orders, static_argnums=(2, 3))


def _train(kernel, bias, client, keys, mu):
    data = POPULATION.client(client)
    orders = _epoch_orders(
        jax.random.fold_in(keys.clients, client),
        POPULATION.counts[client],
        POPULATION.max_count,
        LOCAL.num_epochs,
    )
    return local_sgd_reference(
        kernel, bias, data["x"], data["y"], np.asarray(orders),
        batch_size=LOCAL.batch_size, num_epochs=LOCAL.num_epochs, lr=LR, mu=mu,
    )  # fmt: skip


def _duration(client, steps, profiles=PROFILES):
    step, down, up = (float(np.asarray(q)[client]) for q in profiles)
    return MODEL_BYTES / down + steps * step + MODEL_BYTES / up


def _event_loop(params, key, steps, *, arrivals, concurrency, apply, mu=0.0, windows=None, profiles=PROFILES):
    """Server steps one at a time: (kernel, bias, time, per-step staleness of the arrivals with results).

    `apply(kernel, bias, arrived)` is the server's update from the arrived slots (dicts with 'delta',
    'model', 'alpha', 'staleness'). With `windows` (clients' online windows, as in tests/clock), each freed
    slot, in the order it freed, starts when some client is online, with one online then, not in flight
    and not drawn for an earlier slot, and a client that goes offline first sends nothing.
    """
    kernel = np.array(params["dense"]["kernel"], np.float64)
    bias = np.array(params["dense"]["bias"], np.float64)
    slots = [{"id": None, "version": 0, "finish": 0.0, "holds": False} for _ in range(concurrency)]
    now, version, history = 0.0, 0, []
    for r in range(steps):
        keys = round_keys(key, jnp.int32(r))
        order = sorted(range(concurrency), key=lambda j: (slots[j]["finish"], j))[:arrivals]
        now = max(now, max(slots[j]["finish"] for j in order))
        arrived = [dict(slots[j], staleness=version - slots[j]["version"]) for j in order]
        # New clients, drawn among those not in flight, start in the freed slots on the current model.
        busy = {slots[j]["id"] for j in range(concurrency) if j not in order} - {None}
        if windows is None:
            gumbel = np.asarray(jax.random.gumbel(keys.sampling, (N,)))
            free = sorted((i for i in range(N) if i not in busy), key=lambda i: -gumbel[i])[:arrivals]
            starts = [slots[j]["finish"] for j in order]
        else:
            gumbel = np.asarray(jax.random.gumbel(keys.sampling, (arrivals, N)))
            free, starts = [], []
            for position, j in enumerate(order):
                start = _next_online_reference(windows, slots[j]["finish"])
                eligible = [i for i in range(N) if _online_reference(windows[i], start)[0] and i not in busy]
                client = max(eligible, key=lambda i: gumbel[position, i]) if eligible else None
                free.append(client)
                starts.append(start)
                busy.add(client)
        for j, client, start in zip(order, free, starts, strict=True):
            if client is None:  # No client to start: the slot tries again at the next step.
                slots[j] = {"id": None, "version": version, "finish": now, "holds": False}
                continue
            k, b, done = _train(kernel, bias, client, keys, mu)
            duration = _duration(client, done, profiles)
            offline_in = math.inf if windows is None else _online_reference(windows[client], start)[1] - start
            slots[j] = {
                "id": client, "version": version, "finish": start + min(duration, offline_in),
                "holds": duration <= offline_in,
                "delta": (k - kernel, b - bias), "model": (k, b), "alpha": float(SIZES[client]),
            }  # fmt: skip
        with_results = [a for a in arrived if a["holds"]]
        if with_results:
            kernel, bias = apply(kernel, bias, with_results)
            version += 1
        history.append(sorted(a["staleness"] for a in with_results))
    return kernel, bias, now, history


def _buffered_mean(weight):
    """FedBuff's server update by hand: w + sum_j alpha_j weight(s_j) Delta_j / sum_j alpha_j."""

    def apply(kernel, bias, arrived):
        total = sum(a["alpha"] for a in arrived)
        for a in arrived:
            scale = a["alpha"] * weight(a["staleness"]) / total
            kernel, bias = kernel + scale * a["delta"][0], bias + scale * a["delta"][1]
        return kernel, bias

    return apply


@pytest.mark.parametrize("staleness", slow_after(["polynomial", "hinge"]))
def test_fedbuff_equals_an_event_loop_with_stale_versions(staleness):
    algorithm = fedbuff(
        TASK, LOCAL, 2, Fleet(5, N, PROFILES), strategy=ClientStrategy("vmap"), staleness=staleness
    )
    hparams = {"lr": LR, "staleness_exponent": 0.7, "staleness_hinge": 1.0}
    params, key = initial_params(), jax.random.key(11)
    state, metrics = run_rounds(algorithm, algorithm.init(params, hparams), 9, key)

    def weight(s):
        if staleness == "polynomial":
            return (1 + s) ** -0.7
        return 1.0 if s <= 1 else 1 / (0.7 * (s - 1) + 1)

    kernel, bias, now, history = _event_loop(
        params, key, 9, arrivals=2, concurrency=5, apply=_buffered_mean(weight)
    )
    np.testing.assert_allclose(state.params["dense"]["kernel"], kernel, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state.params["dense"]["bias"], bias, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(float(state.clock), now, rtol=1e-5)
    assert [int(m["max_staleness"]) for m in metrics] == [max(h, default=0) for h in history]
    # The first floor(5 / 2) = 2 steps only start clients, the third fills the last slot beside one arrival;
    # then some updates arrive stale.
    assert [int(m["clients_uploading"]) for m in metrics][:4] == [0, 0, 1, 2]
    assert max(max(h, default=0) for h in history) >= 2


def test_fedasync_mixes_each_arrival_with_its_staleness_weight():
    algorithm = fedasync(TASK, LOCAL, Fleet(3, N, PROFILES), strategy=ClientStrategy("vmap"))
    hparams = {"lr": LR, "async_mixing": 0.5, "mu": 0.1}
    params, key = initial_params(), jax.random.key(12)
    state, metrics = run_rounds(algorithm, algorithm.init(params, hparams), 10, key)

    def apply(kernel, bias, arrived):
        (a,) = arrived
        mix = 0.5 * (1 + a["staleness"]) ** -0.5
        return (1 - mix) * kernel + mix * a["model"][0], (1 - mix) * bias + mix * a["model"][1]

    kernel, bias, now, history = _event_loop(params, key, 10, arrivals=1, concurrency=3, apply=apply, mu=0.1)
    np.testing.assert_allclose(state.params["dense"]["kernel"], kernel, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state.params["dense"]["bias"], bias, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(float(state.clock), now, rtol=1e-5)
    assert [float(m["mixing"]) for m in metrics][3:] == pytest.approx(
        [0.5 * (1 + h[0]) ** -0.5 for h in history[3:]], rel=1e-5
    )
    assert math.isclose(float(metrics[0]["mixing"]), 0.0)  # Filling the slots: nothing to mix.


def test_fedbuff_with_online_windows_equals_the_event_loop_with_dropouts():
    # The clients of tests/clock (10 s period): slots wait for an online client, and clients drop.
    availability = _availability()
    slow = lognormal_profiles(jax.random.key(6), N, step_seconds=0.4, sigma=1.0)
    algorithm = fedbuff(TASK, LOCAL, 2, Fleet(4, N, slow, availability), strategy=ClientStrategy("vmap"))
    params, key = initial_params(), jax.random.key(13)
    state, metrics = run_rounds(algorithm, algorithm.init(params, {"lr": LR}), 10, key)

    kernel, bias, now, history = _event_loop(
        params, key, 10, arrivals=2, concurrency=4, apply=_buffered_mean(lambda s: (1 + s) ** -0.5),
        windows=WINDOWS, profiles=slow,
    )
    np.testing.assert_allclose(state.params["dense"]["kernel"], kernel, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state.params["dense"]["bias"], bias, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(float(state.clock), now, rtol=1e-5)
    uploads = [int(m["clients_uploading"]) for m in metrics]
    assert uploads == [len(h) for h in history]
    assert 0 < sum(uploads) < 2 * (10 - 2)  # Some arrivals came back without a result: dropped.


@pytest.mark.parametrize(
    "arrivals, concurrency, words",
    [(4, 3, "larger than the concurrency"), (1, 9, "exceeds the 8 training clients"), (0, 3, ">= 1")],
)
def test_a_buffer_larger_than_the_concurrency_and_other_bad_shapes_are_refused(arrivals, concurrency, words):
    with pytest.raises(ValueError, match=words) as error:
        fedbuff(TASK, LOCAL, arrivals, Fleet(concurrency, N, PROFILES), strategy=ClientStrategy("vmap"))
    assert "\n" not in str(error.value)
