"""The fused local-training kernel against today's path and a pure-jnp reference.

On CPU the kernel runs in the Pallas interpreter; the tests marked `gpu`
compile it natively (Triton) and compare at the benchmark's sizes.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxfl.kernels.local_training import (
    DenseLayout,
    fused_local_sgd,
    fused_local_sgd_reference,
    supports,
)
from reference import slow_after, tiny_population

from jaxfl.algorithms.base import server_optimizer
from jaxfl.algorithms.registry import Engine, build_algorithm
from jaxfl.models import make_model
from jaxfl.training import ClientStrategy, LocalHParams, LocalTraining, Task, train_cohort
from jaxfl.training.cohort import train_personal_models
from jaxfl.training.fused import SCHEDULE, fused_layout, why_not_fused
from jaxfl.training.local import minibatch_rows

INTERPRET = jax.default_backend() == "cpu"
pytestmark = pytest.mark.filterwarnings(
    "ignore:The Pallas Triton backend is deprecated:DeprecationWarning"
)

SIZES = [7, 23, 10, 1, 31, 12]
POPULATION = tiny_population(SIZES, num_features=9, num_classes=4, seed=3)
VMAP = ClientStrategy("vmap")


def _random_layers(widths, seed=0, per_client=None):
    rng = np.random.default_rng(seed)
    lead = () if per_client is None else (per_client,)
    return [
        (
            jnp.asarray(rng.normal(size=(*lead, a, b)) * 0.4, jnp.float32),
            jnp.asarray(rng.normal(size=(*lead, b)) * 0.1, jnp.float32),
        )
        for a, b in zip(widths[:-1], widths[1:], strict=True)
    ]


def _kernel_inputs(widths, batch, num_clients=4, steps=6, num_examples=120, seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(num_examples, widths[0])), jnp.float32)
    y = jnp.asarray(rng.integers(0, max(widths[-1], 2), size=num_examples), jnp.int32)
    rows = rng.integers(0, num_examples, size=(num_clients, steps, batch))
    rows[rng.random(rows.shape) < 0.25] = -1
    rows[1, 2] = -1  # a step without a real example (client 1 runs it)
    num_steps = rng.integers(0, steps + 1, size=num_clients)
    num_steps[:2] = steps
    num_steps[-1] = 0  # a client that runs no step
    return x, y, jnp.asarray(rows, jnp.int32), jnp.asarray(num_steps, jnp.int32)


def _assert_trees_close(a, b, rtol=2e-5, atol=2e-6):
    for left, right in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(left), np.asarray(right), rtol=rtol, atol=atol)


@pytest.mark.parametrize(
    "widths, batch, loss, lr, l2, mu",
    slow_after([
        ((9, 4), 5, "softmax", 0.3, 0.0, 0.0),  # linear, batch padded to 16
        ((150, 62), 10, "softmax", 0.1, 0.01, 0.0),  # two feature tiles, the last masked
        ((9, 20, 7, 4), 3, "softmax", 0.2, 0.0, 0.5),  # MLP, proximal term
        ((9, 1), 17, "logistic", 0.5, 0.1, 0.2),  # binary label, batch padded to 32
        ((9, 24, 1), 4, "logistic", 0.5, 0.0, 0.0),
    ], keep=1),
)
def test_kernel_matches_reference(widths, batch, loss, lr, l2, mu):
    layout = DenseLayout(widths, batch, loss)
    x, y, rows, num_steps = _kernel_inputs(widths, batch)
    layers = _random_layers(widths)
    anchors = _random_layers(widths, seed=5)
    args = (layers, anchors, x, y, rows, num_steps, lr, l2, mu)
    got, got_loss = fused_local_sgd(*args, layout=layout, interpret=INTERPRET)
    want, want_loss = fused_local_sgd_reference(*args, layout=layout)
    _assert_trees_close(got, want)
    np.testing.assert_allclose(got_loss, want_loss, rtol=2e-5, atol=1e-6)
    # The client of zero steps keeps the start and reports loss 0; the update moved the others.
    _assert_trees_close([(k[-1], b[-1]) for k, b in got], layers, rtol=0, atol=0)
    assert float(got_loss[-1]) == 0.0
    assert not np.allclose(got[0][0][0], layers[0][0])


@pytest.mark.slow
def test_kernel_per_client_start_and_vmap_over_settings():
    widths, batch = (9, 12, 4), 4
    layout = DenseLayout(widths, batch)
    x, y, rows, num_steps = _kernel_inputs(widths, batch, num_clients=3)
    start = _random_layers(widths, per_client=3)
    anchors = _random_layers(widths, seed=2)
    lrs = jnp.asarray([0.05, 0.4])

    def run(fn, lr):
        return fn(start, anchors, x, y, rows, num_steps, lr, 0.0, 0.3, layout=layout, interpret=INTERPRET)

    got = jax.vmap(lambda lr: run(fused_local_sgd, lr))(lrs)
    want = jax.vmap(lambda lr: run(fused_local_sgd_reference, lr))(lrs)
    _assert_trees_close(got, want)
    # Each client started from its own model: the last runs no step and keeps it.
    np.testing.assert_array_equal(got[0][0][0][:, -1], np.broadcast_to(start[0][0][-1], (2, 9, 12)))


@pytest.mark.slow
def test_kernel_propagates_nan_as_reference():
    widths, batch = (9, 4), 4
    layout = DenseLayout(widths, batch)
    x, y, rows, num_steps = _kernel_inputs(widths, batch)
    x = x.at[int(rows[0, 0, 0]) if int(rows[0, 0, 0]) >= 0 else 0].set(jnp.nan)
    rows = rows.at[0, 0, 0].set(jnp.maximum(rows[0, 0, 0], 0))
    layers = _random_layers(widths)
    args = (layers, layers, x, y, rows, num_steps, 0.1)
    got, got_loss = fused_local_sgd(*args, layout=layout, interpret=INTERPRET)
    want, want_loss = fused_local_sgd_reference(*args, layout=layout)
    assert np.isnan(np.asarray(got[0][0][0])).any() and np.isnan(float(got_loss[0]))
    np.testing.assert_array_equal(np.isnan(np.asarray(got[0][0])), np.isnan(np.asarray(want[0][0])))


def test_layout_limits():
    assert supports((784, 62), 10, "softmax") is None
    assert "above 256" in supports((784, 300, 62), 10, "softmax")
    assert "batch" in supports((784, 62), 512, "softmax")
    assert "one output" in supports((10, 3), 4, "logistic")
    layout = DenseLayout((784, 62), 10)
    assert (layout.tile, layout.num_tiles, layout.padded_in, layout.padded_out) == (128, 7, (896,), (64,))
    assert layout.padded_batch == 16


@pytest.mark.parametrize("epochs, max_steps", [(1, None), (3, 4)])
def test_minibatch_rows_are_each_epochs_permutation(epochs, max_steps):
    local = LocalTraining(batch_size=4, num_epochs=epochs, max_steps=max_steps)
    client = 4  # 31 examples
    count = SIZES[client]
    offset = int(POPULATION.offsets[client])
    num_steps = local.num_steps(jnp.int32(count))
    # Compiled, as training runs it (op by op, eagerly, it cost 3 s a case).
    rows = jax.jit(minibatch_rows, static_argnums=4)(
        POPULATION, jnp.int32(client), jax.random.key(7), num_steps, local
    )
    rows = np.asarray(rows)
    steps_per_epoch = -(-count // 4)
    assert rows.shape == (local.scan_length(POPULATION.max_count), 4)
    assert (rows[int(num_steps):] == -1).all()
    for epoch in range(epochs):
        seen = rows[epoch * steps_per_epoch : (epoch + 1) * steps_per_epoch].ravel()
        seen = seen[seen >= 0]
        if (epoch + 1) * steps_per_epoch <= int(num_steps):
            assert sorted(seen.tolist()) == list(range(offset, offset + count))
        else:
            assert len(set(seen.tolist())) == len(seen)  # Cut by max_steps: no repeats.


def _engine(model, local, strategy=VMAP):
    return Engine(
        task=Task(model),
        local=local,
        clients_per_round=4,
        strategy=strategy,
        server_tx=server_optimizer("sgd"),
        client_weighting="num_examples",
        num_clients=len(SIZES),
    )


def _start(model, seed=0):
    params = model.init(jax.random.key(seed))
    return jax.tree.map(lambda leaf: leaf + 0.1 * jax.random.normal(jax.random.key(9), leaf.shape), params)


@pytest.mark.parametrize(
    "model_name, hidden, epochs, max_steps, l2, mu, stragglers",
    slow_after([
        ("linear", (), 2, None, 0.01, None, False),
        ("mlp", (8, 16), 1, 5, None, 0.3, True),
    ]),
)
def test_train_cohort_fused_equals_scan(model_name, hidden, epochs, max_steps, l2, mu, stragglers):
    model = make_model(model_name, (9,), 4, hidden_sizes=hidden)
    task = Task(model)
    params = _start(model)
    scan = LocalTraining(batch_size=3, num_epochs=epochs, max_steps=max_steps, loop="scan")
    fused = dataclasses.replace(scan, loop="fused")
    assert fused_layout(task, fused, VMAP, params, POPULATION) is not None
    client_ids = jnp.asarray([4, 0, 3, 2], jnp.int32)
    hparams = LocalHParams(lr=jnp.float32(0.2), l2=l2, prox_mu=mu)
    options = dict(with_initial_loss=True)
    if stragglers:
        options.update(num_epochs=jnp.asarray([1, 0, 1, 1]), active=jnp.asarray([True, True, False, True]))
    run = jax.jit(
        lambda local: train_cohort(task, local, VMAP, params, POPULATION, client_ids, jax.random.key(3),
                                   hparams, **options),
        static_argnums=0,
    )
    got, want = run(fused), run(scan)
    _assert_trees_close(got.deltas, want.deltas)
    np.testing.assert_array_equal(got.num_steps, want.num_steps)
    np.testing.assert_allclose(got.mean_batch_loss, want.mean_batch_loss, rtol=2e-5, atol=1e-6)
    np.testing.assert_array_equal(got.initial_loss, want.initial_loss)
    assert max(float(jnp.abs(leaf).max()) for leaf in jax.tree.leaves(got.deltas)) > 0


@pytest.mark.slow
def test_personal_models_fused_equal_scan():
    # Linear: the kernel's per-client starts through an MLP are tested above.
    model = make_model("linear", (9,), 4)
    task = Task(model)
    anchor = _start(model)
    personal = jax.tree.map(lambda leaf: jnp.stack([leaf, 2 * leaf, -leaf]), anchor)
    client_ids = jnp.asarray([5, 1, 4], jnp.int32)
    hparams = LocalHParams(lr=jnp.float32(0.1), prox_mu=jnp.float32(0.5))
    scan = LocalTraining(batch_size=4, num_epochs=1, loop="scan")
    train = jax.jit(
        lambda local: train_personal_models(task, local, VMAP, anchor, personal, POPULATION, client_ids,
                                            jax.random.key(1), hparams),
        static_argnums=0,
    )
    results = [train(local) for local in (dataclasses.replace(scan, loop="fused"), scan)]
    _assert_trees_close(results[0].params, results[1].params)
    np.testing.assert_array_equal(results[0].num_steps, results[1].num_steps)


@pytest.mark.slow
def test_models_that_are_not_fused_fall_back_to_scan():
    fused = LocalTraining(batch_size=4, loop="fused")
    linear = make_model("linear", (9,), 4)
    params = linear.init(jax.random.key(0))
    assert "convnet" in why_not_fused(
        Task(make_model("convnet", (16,), 4)), fused, VMAP, {}, POPULATION
    )
    sharded = ClientStrategy("sharded", inner="vmap", num_devices=2)
    assert "spreads clients" in why_not_fused(Task(linear), fused, sharded, params, POPULATION)
    wide = make_model("mlp", (9,), 4, hidden_sizes=(300,))
    wide_params = wide.init(jax.random.key(0))
    assert "above 256" in why_not_fused(Task(wide), fused, VMAP, wide_params, POPULATION)
    scan = dataclasses.replace(fused, loop="scan")
    assert fused_layout(Task(linear), scan, VMAP, params, POPULATION) is None
    extra = {**params, "temperature": jnp.ones((1,))}
    assert "more than the dense layers" in why_not_fused(Task(linear), fused, VMAP, extra, POPULATION)
    # The fallback is today's path, exactly: for a model the kernel does not take, and for a
    # per-coordinate proximal term (EWC's), which the kernel would drop.
    hparams = LocalHParams(lr=jnp.float32(0.1))
    weighted = hparams._replace(prox_mu=jnp.float32(1.0), prox_weights=jax.tree.map(jnp.ones_like, params))
    for model, start, settings in ((wide, wide_params, hparams), (linear, params, weighted)):
        train = jax.jit(
            lambda local, model=model, start=start, settings=settings: train_cohort(
                Task(model), local, VMAP, start, POPULATION, jnp.asarray([0, 2]), jax.random.key(0), settings
            ),
            static_argnums=0,
        )
        results = [train(local) for local in (fused, scan)]
        for left, right in zip(jax.tree.leaves(results[0]), jax.tree.leaves(results[1]), strict=True):
            np.testing.assert_array_equal(left, right)


@pytest.mark.slow
def test_fedavg_rounds_fused_equal_scan_and_trace_once():
    # FedAvg only: Δ-FL's loss pass beside the kernel (with_initial_loss) is in the train_cohort test.
    model = make_model("linear", (9,), 4)
    params = _start(model)
    states, histories = [], []
    for loop in ("fused", "scan"):
        engine = _engine(model, LocalTraining(batch_size=4, num_epochs=1, loop=loop))
        built = build_algorithm("fedavg", engine, {})
        state = jax.tree.map(jnp.copy, built.init(params, {"lr": 0.2}))  # donated below
        traces = []

        def counted(state, population, key, built=built, traces=traces):
            traces.append(1)
            return built.round(state, population, key)

        round_fn = jax.jit(counted, donate_argnums=0)
        history = []
        for _ in range(3):
            state, metrics = round_fn(state, POPULATION, jax.random.key(11))
            history.append(metrics)
        assert len(traces) == 1
        states.append(state)
        histories.append([float(m["train_loss"]) for m in history])
    _assert_trees_close(states[0].params, states[1].params, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(histories[0], histories[1], rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("widths, batch", [((784, 62), 10), ((60, 10), 10), ((784, 200, 62), 16)])
def test_native_kernel_matches_reference(widths, batch):
    """Compiled by Triton on the GPU, at the benchmark's widths, f32 products on both sides.

    Linear models match elementwise. An MLP's ReLU is discontinuous in its
    derivative: a pre-activation within rounding of 0 can take the other
    branch in one implementation and move the runs apart by O(lr) in a few
    entries, so MLPs are checked by the relative error of each leaf and the
    loss. Two launches must give the same bits (no race between a program's
    threads on its weights).
    """
    layout = DenseLayout(widths, batch)
    x, y, rows, num_steps = _kernel_inputs(widths, batch, num_clients=32, steps=20, num_examples=2000)
    layers = _random_layers(widths)
    args = (layers, layers, x, y, rows, num_steps, 0.05, 0.001, 0.1)
    with jax.default_matmul_precision("highest"):
        got = fused_local_sgd(*args, layout=layout, schedule=SCHEDULE)
        again = fused_local_sgd(*args, layout=layout, schedule=SCHEDULE)
        want = fused_local_sgd_reference(layers, layers, x, y, rows, num_steps, 0.05, 0.001, 0.1,
                                         layout=layout)
    for left, right in zip(jax.tree.leaves(got), jax.tree.leaves(again), strict=True):
        np.testing.assert_array_equal(left, right)
    if len(widths) == 2:
        _assert_trees_close(got, want, rtol=1e-4, atol=1e-5)
        return
    for left, right in zip(jax.tree.leaves(got[0]), jax.tree.leaves(want[0]), strict=True):
        left, right = np.asarray(left, np.float64), np.asarray(right, np.float64)
        assert np.linalg.norm(left - right) <= 1e-3 * np.linalg.norm(right)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-3)


def test_cli_refuses_the_fused_loop_off_a_gpu(tmp_path, capsys):
    from reference import TINY_LABEL_SHIFT, assert_cli_refuses

    out = tmp_path / "run"
    argv = ["run", *TINY_LABEL_SHIFT, "--clients-per-round", "5", "--rounds", "1", "--local-loop", "fused",
            "--out", str(out)]
    assert_cli_refuses(argv, ["local_loop", "fused", "needs a GPU"], out, capsys)


@pytest.mark.parametrize(
    "backend, loop", [("gpu", "fused"), ("tpu", "scan"), ("cpu", "while")]
)
def test_auto_local_loop_per_backend(backend, loop, monkeypatch):
    from jaxfl.experiment import runner
    from jaxfl.experiment.config import ConfigError

    monkeypatch.setattr(runner.jax, "default_backend", lambda: backend)
    assert runner.choose_local_loop("auto") == loop
    assert runner.choose_local_loop("scan") == "scan"
    if backend != "gpu":
        with pytest.raises(ConfigError, match="needs a GPU"):
            runner.choose_local_loop("fused")
    if backend == "tpu":  # The Python API's 'fused' falls back to the scan there.
        linear = make_model("linear", (9,), 4)
        fused = LocalTraining(batch_size=4, loop="fused")
        reason = why_not_fused(Task(linear), fused, VMAP, linear.init(jax.random.key(0)), POPULATION)
        assert "Triton" in reason
