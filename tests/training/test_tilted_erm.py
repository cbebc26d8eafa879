"""TERM's solvers (Li 2023, Algorithms 13-16) against NumPy loops of their pseudo-code (least squares)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy.special import logsumexp

from jaxfl.training.tilted_erm import per_example_losses_and_grads, sample_group, tilted_erm

RNG = np.random.default_rng(0)
X = RNG.normal(size=(24, 3)).astype(np.float32)
Y = (X @ np.array([1.0, -2.0, 0.5]) + RNG.normal(size=24) * np.where(np.arange(24) < 4, 8.0, 0.3)).astype(
    np.float32
)
GROUPS = (np.arange(24) % 4).astype(np.int32)
LR, STEPS = 0.05, 6


def _loss(params, example):
    x, y = example
    return 0.5 * (x @ params - y) ** 2


def _numpy_losses_grads(theta, idx):
    residual = X[idx].astype(np.float64) @ theta - Y[idx]
    return 0.5 * residual**2, residual[:, None] * X[idx]


def _tilted(values, t):
    return values.mean() if t == 0 else (logsumexp(t * values) - np.log(len(values))) / t


def _run(transform, batches, **per_step):
    """Our solver: per-example gradients -> tilted_erm -> SGD, over the given batches of indices."""
    optimizer = optax.chain(transform, optax.sgd(LR))
    params = jnp.zeros(3)
    state = optimizer.init(params)

    @jax.jit
    def step(params, state, idx, extra):
        losses, grads = per_example_losses_and_grads(
            _loss, params, (jnp.asarray(X)[idx], jnp.asarray(Y)[idx])
        )
        updates, state = optimizer.update(grads, state, params, losses=losses, **extra)
        return optax.apply_updates(params, updates), state

    for k, idx in enumerate(batches):
        extra = {name: values[k] for name, values in per_step.items()}
        params, state = step(params, state, jnp.asarray(idx), extra)
    return np.asarray(params)


@pytest.mark.parametrize("t", [-2.0, 0.0, 1.5])
def test_algorithm_13_batch(t):
    theta = np.zeros(3)
    for _ in range(STEPS):
        f, g = _numpy_losses_grads(theta, np.arange(24))
        risk = _tilted(f, t)
        w = np.exp(t * (f - risk))  # Not divided by N: the step is alpha / N sum_i w_i grad f_i.
        theta = theta - LR / 24 * (w[:, None] * g).sum(0)
    got = _run(tilted_erm(t), [np.arange(24)] * STEPS)
    np.testing.assert_allclose(got, theta, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("t, lam", [(-2.0, 0.2), (1.0, 0.5)])
def test_algorithm_14_stochastic_with_the_running_normalizer(t, lam):
    batches = [RNG.choice(24, 6, replace=False) for _ in range(STEPS)]
    theta = np.zeros(3)
    risk = _tilted(_numpy_losses_grads(theta, np.arange(24))[0], t)  # The full-data start of the thesis.
    initial = risk
    for idx in batches:
        f, g = _numpy_losses_grads(theta, idx)
        risk = logsumexp([t * risk, t * _tilted(f, t)], b=[1 - lam, lam]) / t
        w = np.exp(t * (f - risk))
        theta = theta - LR / len(idx) * (w[:, None] * g).sum(0)
    got = _run(tilted_erm(t, normalizer_decay=lam, initial_risk=initial), batches)
    np.testing.assert_allclose(got, theta, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("t, tau", [(2.0, 0.0), (1.0, -2.0), (-1.0, 1.0)])
def test_algorithm_15_batch_hierarchical(t, tau):
    theta = np.zeros(3)
    for _ in range(STEPS):
        f, g = _numpy_losses_grads(theta, np.arange(24))
        sizes = np.array([np.sum(GROUPS == k) for k in range(4)])
        risks = np.array([_tilted(f[GROUPS == k], tau) for k in range(4)])
        joint = (logsumexp(t * risks, b=sizes) - np.log(24)) / t
        group_grads = []
        for k in range(4):
            member = GROUPS == k
            inner = np.exp(tau * (f[member] - risks[k]))
            group_grads.append((inner[:, None] * g[member]).sum(0) / member.sum())
        w_group = sizes * np.exp(t * (risks - joint))
        theta = theta - LR / 24 * (w_group[:, None] * np.array(group_grads)).sum(0)
    got = _run(tilted_erm(t, tau=tau, num_groups=4), [np.arange(24)] * STEPS, groups=[GROUPS] * STEPS)
    np.testing.assert_allclose(got, theta, rtol=1e-4, atol=1e-5)


def test_algorithm_16_stochastic_hierarchical():
    t, tau, lam = 1.0, -1.0, 0.3
    plan = [(k % 4, RNG.choice(np.flatnonzero(GROUPS == k % 4), 3, replace=False)) for k in range(STEPS)]
    theta, risks = np.zeros(3), np.zeros(4)  # The thesis starts every group's risk at 0.
    for group, idx in plan:
        f, g = _numpy_losses_grads(theta, idx)
        risks[group] = logsumexp([tau * risks[group], tau * _tilted(f, tau)], b=[1 - lam, lam]) / tau
        w = np.exp(tau * (f - risks[group]))
        theta = theta - LR / len(idx) * (w[:, None] * g).sum(0)
    transform = tilted_erm(t, tau=tau, normalizer_decay=lam, num_groups=4)
    got = _run(transform, [idx for _, idx in plan], group=[group for group, _ in plan])
    np.testing.assert_allclose(got, theta, rtol=1e-4, atol=1e-5)


def test_group_draws_follow_size_times_tilted_risk():
    transform = tilted_erm(2.0, tau=0.0, normalizer_decay=0.5, num_groups=4)
    state = transform.init(None)._replace(risk=jnp.asarray([0.0, 0.5, -0.5, 1.0]))
    sizes = jnp.asarray([10, 5, 0, 20])
    draws = jax.vmap(lambda key: sample_group(key, state, sizes, 2.0))(
        jax.random.split(jax.random.key(0), 20_000)
    )
    expected = np.asarray(sizes) * np.exp(2.0 * np.asarray(state.risk))
    expected = expected / expected.sum()
    counts = np.bincount(np.asarray(draws), minlength=4)
    assert counts[2] == 0
    stat = sum((counts[k] - 20_000 * expected[k]) ** 2 / (20_000 * expected[k]) for k in (0, 1, 3))
    assert stat < 13.8  # chi-square, 2 degrees of freedom, p = 0.001.


def test_a_tilt_schedule_and_bad_settings():
    # A schedule from 0: the first step is plain averaging.
    transform = tilted_erm(optax.linear_schedule(0.0, -2.0, 10))
    grads = {"w": jnp.asarray([[1.0], [3.0]])}
    update, state = transform.update(grads, transform.init(None), losses=jnp.asarray([0.0, 5.0]))
    assert float(update["w"][0]) == pytest.approx(2.0) and int(state.count) == 1
    update, _ = transform.update(grads, state, losses=jnp.asarray([0.0, 5.0]))
    assert float(update["w"][0]) < 2.0  # t < 0 from the second step: the high loss counts less.
    with pytest.raises(ValueError, match="normalizer_decay"):
        tilted_erm(1.0, normalizer_decay=1.0)
    with pytest.raises(ValueError, match="num_groups"):
        tilted_erm(1.0, tau=0.0)


def test_the_docs_example_resists_the_outliers_that_least_squares_does_not(capsys):
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs" / "tilted-risk.md").read_text()
    (block,) = [part.split("```", 1)[0] for part in page.split("```python\n")[1:]]
    tilted, plain = {}, {}
    exec(compile(block, "tilted-risk.md", "exec"), tilted)
    least_squares = block.replace("linear_schedule(0.0, -2.0, 100)", "constant_schedule(0.0)")
    exec(compile(least_squares, "t0", "exec"), plain)
    truth = np.array([1.0, -2.0, 0.5])
    assert np.abs(np.asarray(tilted["params"]) - truth).max() < 0.05
    assert np.abs(np.asarray(plain["params"]) - truth).max() > 0.5
    assert "[" in capsys.readouterr().out
