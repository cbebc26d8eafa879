"""The simulated clock against plain Python: online windows by brute force, and synchronous rounds with
over-selection and a deadline against a discrete-event loop over the selected clients."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from algorithms.reference_rounds import (
    LOCAL,
    SIZES,
    TASK,
    assert_params_close,
    initial_params,
    reference_rounds,
    run_rounds,
)
from reference import slow_after

from jaxfl.algorithms import fedavg, scaffold
from jaxfl.clock import (
    Availability,
    Clock,
    lognormal_profiles,
    next_online,
    online,
    online_until,
    reports,
    select_online,
)
from jaxfl.clock.availability import check_availability
from jaxfl.clock.traces import read_availability, read_profiles
from jaxfl.training import ClientStrategy

N = len(SIZES)
PERIOD = 10.0
# Windows per client (start, length) on a 10 s period; one crosses the period's end, client 3 has two.
WINDOWS = [
    [(0.0, 6.0)], [(2.0, 7.0)], [(8.0, 5.0)], [(1.0, 2.0), (5.0, 3.0)],
    [(0.0, 10.0)], [(4.0, 4.0)], [(6.5, 3.0)], [(9.0, 4.5)],
]  # fmt: skip


def _availability(windows=WINDOWS, period=PERIOD):
    width = max(len(w) for w in windows)
    start = np.zeros((len(windows), width), np.float32)
    length = np.zeros((len(windows), width), np.float32)
    for i, client in enumerate(windows):
        for k, (s, l) in enumerate(client):
            start[i, k], length[i, k] = s, l
    return Availability(jnp.asarray(start), jnp.asarray(length), jnp.float32(period))


def _absolute_windows(windows, t, period=PERIOD):
    # Each window unrolled over the periods around t.
    base = math.floor(t / period)
    return sorted((s + n * period, s + l + n * period) for s, l in windows for n in range(base - 2, base + 3))


def _online_reference(windows, t):
    containing = [(a, b) for a, b in _absolute_windows(windows, t) if a <= t < b]
    return (True, max(b for _, b in containing)) if containing else (False, t)


def _next_online_reference(all_windows, t):
    starts = [a for w in all_windows for a, _ in _absolute_windows(w, t) if a >= t]
    if any(_online_reference(w, t)[0] for w in all_windows):
        return t
    return min(starts)


def test_online_windows_equal_a_brute_force_over_unrolled_periods():
    availability = _availability()
    times = np.random.default_rng(0).uniform(0, 40, 200).astype(np.float32).tolist() + [0.0, 6.0, 9.0, 13.5]
    is_online = jax.jit(jax.vmap(online, in_axes=(None, 0)))(availability, jnp.asarray(times))
    until = jax.jit(jax.vmap(online_until, in_axes=(None, 0)))(availability, jnp.asarray(times))
    for j, t in enumerate(times):
        for i, windows in enumerate(WINDOWS):
            expected_online, expected_until = _online_reference(windows, t)
            assert bool(is_online[j, i]) == expected_online, (t, i)
            np.testing.assert_allclose(until[j, i], expected_until, rtol=1e-6, atol=1e-4)
    # Nobody online in [7.5, 8): client 2 opens at 8 (client 6 is online 6.5-9.5: take it out).
    quiet = [w for i, w in enumerate(WINDOWS) if i not in (0, 1, 4, 5, 6, 7)]
    t = 3.5
    got = float(next_online(_availability(quiet), jnp.float32(t)))
    assert got == pytest.approx(_next_online_reference(quiet, t)) and got == pytest.approx(5.0)


def _steps(client):
    return math.ceil(SIZES[client] / LOCAL.batch_size) * LOCAL.num_epochs


def _clock_round(t, gumbel, profiles, count, target, deadline, model_bytes):
    """One synchronous round by hand: (selected ids, reporting mask, round start, round end, metrics)."""
    if not any(_online_reference(w, t)[0] for w in WINDOWS):
        t = _next_online_reference(WINDOWS, t)
    is_online = np.array([_online_reference(w, t)[0] for w in WINDOWS])
    order = np.argsort(-np.where(is_online, gumbel, -np.inf), kind="stable")[:count]
    events = []  # (duration, position) of the selected clients that complete.
    waited = 0.0
    for position, client in enumerate(order):
        if not is_online[client]:
            continue
        step, down, up = (float(profiles[q][client]) for q in range(3))
        duration = model_bytes / down + _steps(client) * step + model_bytes / up
        offline_at = _online_reference(WINDOWS[client], t)[1] - t
        waited = max(waited, min(duration, offline_at))
        if duration <= offline_at and (deadline is None or duration <= deadline):
            events.append((duration, position))
    events.sort()
    reporting = np.zeros(count, bool)
    for _, position in events[:target]:
        reporting[position] = True
    dropped = int(is_online[order].sum() - reporting.sum())
    needed = min(target, int(is_online[order].sum()))  # Every selected online client trains here.
    if len(events) >= needed:
        seconds = events[needed - 1][0] if needed else 0.0
    else:  # The server waits out the deadline, or for every selected client to complete or drop.
        seconds = deadline if deadline is not None else waited
    return (
        order,
        reporting,
        t,
        t + seconds,
        {"clients_online": int(is_online.sum()), "clients_dropped": dropped},
    )


@pytest.mark.parametrize("deadline, target", slow_after([(1.2, 3), (None, 4)]))
def test_rounds_with_overselection_and_a_deadline_equal_a_discrete_event_loop(deadline, target):
    profiles = lognormal_profiles(jax.random.key(4), N, step_seconds=0.1, sigma=0.6)
    clock = Clock(profiles, _availability(), overselect=1.5, deadline=deadline)
    selected = clock.selected(target)
    assert selected == math.ceil(1.5 * target)
    algorithm = fedavg(TASK, LOCAL, target, strategy=ClientStrategy("vmap"), clock=clock)
    params, key, rounds = initial_params(), jax.random.key(8), 4
    state, history = run_rounds(algorithm, algorithm.init(params, {"lr": 0.1}), rounds, key)

    profile_arrays = [np.asarray(q, np.float64) for q in profiles]
    times, expected = [0.0], []

    def select(r, sampling_key, memory):
        gumbel = np.asarray(jax.random.gumbel(sampling_key, (N,)))
        ids, reporting, start, end, metrics = _clock_round(
            times[-1], gumbel, profile_arrays, selected, target, deadline, 18 * 4
        )
        times.append(end)
        memory["reporting"] = reporting
        expected.append({**metrics, "clients_uploading": int(reporting.sum()), "seconds": end - start})
        return ids

    def plan(r, ids, alpha, losses, key, memory):
        return {"active": memory["reporting"]}

    kernel, bias, _ = reference_rounds(
        params, key, rounds, clients_per_round=selected, lr=0.1, plan=plan, select=select
    )
    assert_params_close(state.params, kernel, bias)
    np.testing.assert_allclose(float(state.clock), times[-1], rtol=1e-5)
    for got, want in zip(history, expected, strict=True):
        seconds = want.pop("seconds")
        assert {k: int(got[k]) for k in want} == want
        assert float(got["round_seconds"]) == pytest.approx(seconds, rel=1e-4, abs=1e-5)
    # Over the rounds some client dropped and some round did not get its M reports in time.
    assert any(e["clients_dropped"] for e in expected)
    # Rounds that got their M reports and rounds that did not (waiting out the deadline, or for every client).
    assert {e["clients_uploading"] == target for e in expected} == {True, False}


def test_clock_refuses_algorithms_that_read_every_selected_client():
    clock = Clock(lognormal_profiles(jax.random.key(0), N))
    with pytest.raises(ValueError, match="scaffold has .* the clock drops clients"):
        scaffold(TASK, LOCAL, 3, N, strategy=ClientStrategy("vmap"), clock=clock)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"overselect": 0.9}, "overselect"),
        ({"deadline": 0.0}, "deadline"),
        ({"deadline": math.inf}, "deadline"),
    ],
)
def test_bad_clock_settings_are_refused(kwargs, words):
    with pytest.raises(ValueError, match=words):
        Clock(lognormal_profiles(jax.random.key(0), N), **kwargs)


def test_windows_outside_the_period_overlapping_or_never_open_are_refused():
    with pytest.raises(ValueError, match="never online"):
        check_availability(_availability([[(0.0, 1.0)], [(0.0, 0.0)]]))
    with pytest.raises(ValueError, match="outside"):
        check_availability(_availability([[(10.0, 1.0)]]))
    with pytest.raises(ValueError, match="overlap"):
        check_availability(_availability([[(0.0, 4.0), (3.0, 2.0)]]))
    with pytest.raises(ValueError, match="overlap"):  # 8 + 5 wraps to 3, past the window at 2.
        check_availability(_availability([[(2.0, 1.0), (8.0, 5.0)]]))


def test_traces_are_read_merged_and_refused_in_one_line(tmp_path):
    trace = tmp_path / "availability.csv"
    trace.write_text("client,start,end\n0,10,20\n0,20,30\n0,95,105\n1,0,100\n")
    availability = read_availability(trace, 2, period=100.0)
    # Client 0: [10, 30) merged, and [95, 105) crossing the period's end; client 1 always online.
    t = jnp.asarray([5.0, 15.0, 29.0, 31.0, 97.0, 102.0], jnp.float32)
    assert np.asarray(jax.vmap(online, in_axes=(None, 0))(availability, t))[:, 0].tolist() == [
        False, True, True, False, True, True,
    ]  # fmt: skip
    np.testing.assert_allclose(online_until(availability, jnp.float32(15.0))[0], 30.0)
    for text, words in [
        ("client,start\n0,1\n", "header"),
        ("client,start,end\n0,5\n", "line 2 has 2 fields"),
        ("client,start,end\n0,x,5\n", "line 2 holds a value that is not a number"),
        ("client,start,end\n2,0,5\n", "client must be an index"),
        ("client,start,end\n0,5,5\n1,0,5\n", "start < end"),
        ("client,start,end\n0,0,5\n", "never online"),
    ]:
        trace.write_text(text)
        with pytest.raises(ValueError, match=words) as error:
            read_availability(trace, 2, period=100.0)
        assert "\n" not in str(error.value) and str(trace) in str(error.value)
    profiles = tmp_path / "profiles.csv"
    profiles.write_text(
        "client,step_seconds,download_bytes_per_s,upload_bytes_per_s\n1,0.5,100,50\n0,1,2,3\n"
    )
    assert np.asarray(read_profiles(profiles, 2).step_seconds).tolist() == [1.0, 0.5]
    profiles.write_text("client,step_seconds,download_bytes_per_s,upload_bytes_per_s\n0,1,2,3\n")
    with pytest.raises(ValueError, match="1 training clients have no row"):
        read_profiles(profiles, 2)


def test_without_a_deadline_the_round_waits_until_the_last_client_completed_or_went_offline():
    # Client 0 needs 5 s but goes offline after 2 s; clients 1 and 2 complete in 1 and 1.5 s.
    availability = _availability([[(0.0, 2.0)], [(0.0, 10.0)], [(0.0, 10.0)]])
    profiles = lognormal_profiles(jax.random.key(0), 3, sigma=0.0)._replace(
        step_seconds=jnp.asarray([5.0, 1.0, 1.5], jnp.float32)
    )
    clock = Clock(profiles, availability)
    selection = select_online(clock, jnp.float32(0.0), jax.random.key(1), 3, 3)
    steps = jnp.ones(3, jnp.int32)
    outcome = reports(clock, selection, jnp.ones(3, bool), steps, 3, 0, 0)
    reporting = dict(zip(np.asarray(selection.client_ids).tolist(), np.asarray(outcome.reporting).tolist()))
    assert reporting == {0: False, 1: True, 2: True}
    assert float(outcome.seconds) == pytest.approx(2.0)  # Client 0 dropped at 2 s; nobody is left.
    assert int(outcome.metrics["clients_dropped"]) == 1
    # Two reports are all the round needs when only two clients train: it ends at the second, 1.5 s.
    outcome = reports(clock, selection, jnp.asarray(selection.client_ids) != 0, steps, 3, 0, 0)
    assert float(outcome.seconds) == pytest.approx(1.5)
