"""Private optimizers against NumPy loops over examples and steps, and their accounting by hand."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import special, stats

from jaxfl.privacy import optimizers

RNG = np.random.default_rng(0)
PARAMS = {"w": np.zeros((3, 2), np.float32), "b": np.zeros(2, np.float32)}


def per_example(batch: int, scale: float = 1.0) -> dict:
    return {
        "w": (scale * RNG.normal(size=(batch, 3, 2))).astype(np.float32),
        "b": (scale * RNG.normal(size=(batch, 2))).astype(np.float32),
    }


def clipped_mean(rows: dict, clip_norm: float) -> dict:
    """NumPy: each row clipped to l2 norm C over all leaves, then the mean."""
    count = rows["w"].shape[0]
    out = {k: np.zeros(v.shape[1:], np.float64) for k, v in rows.items()}
    for j in range(count):
        norm = math.sqrt(sum(float(np.sum(np.asarray(v[j], np.float64) ** 2)) for v in rows.values()))
        factor = min(1.0, clip_norm / norm) if norm > 0 else 1.0
        for k in out:
            out[k] += factor * np.asarray(rows[k][j], np.float64) / count
    return out


def assert_tree_close(got, want, rtol=2e-5, atol=1e-6):
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k]), want[k], rtol=rtol, atol=atol, err_msg=k)


@pytest.mark.parametrize("microbatch_size", [1, 4])
def test_privatize_without_noise_is_the_clipped_mean_of_rows(microbatch_size):
    grads = per_example(16, scale=2.0)
    tx = optimizers.privatize(1.5, 0.0, jax.random.key(0), microbatch_size=microbatch_size)
    got, _ = jax.jit(tx.update)(grads, tx.init(PARAMS))
    size = microbatch_size
    rows = {k: v.reshape(16 // size, size, *v.shape[1:]).mean(axis=1) for k, v in grads.items()}
    assert_tree_close(got, clipped_mean(rows, 1.5))


def test_privatize_noise_is_gaussian_of_std_z_c_over_rows_and_fresh_each_step():
    # Zero gradients: the output is the noise over k rows; 2 * 3 + 2 = 8 coordinates per step.
    clip_norm, z, batch = 0.5, 2.0, 10
    tx = optimizers.privatize(clip_norm, z, jax.random.key(1))
    zeros = {k: np.zeros((batch, *v.shape), np.float32) for k, v in PARAMS.items()}
    step = jax.jit(tx.update)
    state, draws = tx.init(PARAMS), []
    for _ in range(500):
        out, state = step(zeros, state)
        draws.append(np.concatenate([np.ravel(out["w"]), np.ravel(out["b"])]))
    draws = np.concatenate(draws) * batch / (z * clip_norm)
    assert stats.kstest(draws, "norm").pvalue > 1e-3
    assert stats.kstest(draws / 1.15, "norm").pvalue < 1e-6  # power: a 15% error in the std is seen
    # The same key and step give the same noise; the next step other noise.
    first, state = step(zeros, tx.init(PARAMS))
    again, _ = step(zeros, tx.init(PARAMS))
    second, _ = step(zeros, state)
    np.testing.assert_array_equal(first["w"], again["w"])
    assert not np.array_equal(first["w"], second["w"])


def test_privatize_counts_a_non_finite_example_as_zeros_and_refuses_bad_arguments():
    grads = per_example(4)
    grads["w"][1, 0, 0] = np.nan
    tx = optimizers.privatize(1.0, 0.0, jax.random.key(0))
    got, _ = tx.update(grads, tx.init(PARAMS))
    assert all(np.all(np.isfinite(np.asarray(v))) for v in got.values())
    with pytest.raises(ValueError, match="clip_norm must be a finite number > 0"):
        optimizers.privatize(0.0, 1.0, jax.random.key(0))
    with pytest.raises(ValueError, match="noise_multiplier"):
        optimizers.privatize(1.0, -1.0, jax.random.key(0))
    with pytest.raises(ValueError, match="multiple of microbatch_size"):
        tx = optimizers.privatize(1.0, 0.0, jax.random.key(0), microbatch_size=3)
        tx.update(grads, tx.init(PARAMS))


def test_adadps_with_side_information_clips_the_preconditioned_examples():
    grads = per_example(8)
    side = {"w": np.full((3, 2), 0.1, np.float32), "b": np.array([1.0, 0.01], np.float32)}
    tx = optax.chain(
        optimizers.scale_by_side_information(side), optimizers.privatize(1.0, 0.0, jax.random.key(0))
    )
    got, _ = jax.jit(tx.update)(grads, tx.init(PARAMS))
    want = clipped_mean({k: v / side[k] for k, v in grads.items()}, 1.0)
    assert_tree_close(got, want)


@pytest.mark.parametrize("kind", ["rmsprop", "adagrad", "adam"])
def test_public_moments_preconditioner_step_by_step(kind):
    beta, beta2, eps = 0.8, 0.95, 1e-3
    tx = optimizers.scale_by_public_moments(kind, beta=beta, beta2=beta2, eps=eps)
    state = tx.init(PARAMS)
    m = {k: np.zeros_like(v, np.float64) for k, v in PARAMS.items()}
    v = {k: np.zeros_like(v, np.float64) for k, v in PARAMS.items()}
    for _ in range(3):
        public = {k: a[0] for k, a in per_example(1).items()}
        grads = per_example(5)
        got, state = jax.jit(tx.update)(grads, state, public_gradient=public)
        for k in PARAMS:
            g = np.asarray(public[k], np.float64)
            if kind == "adagrad":
                v[k] = v[k] + g**2
            else:
                decay = beta if kind == "rmsprop" else beta2
                v[k] = decay * v[k] + (1 - decay) * g**2
            a = np.sqrt(v[k]) + eps
            if kind == "adam":
                m[k] = beta * m[k] + (1 - beta) * g
                want = (beta * grads[k] + (1 - beta) * m[k]) / a
            else:
                want = grads[k] / a
            np.testing.assert_allclose(np.asarray(got[k]), want, rtol=2e-5, atol=1e-6)
    with pytest.raises(ValueError, match="public_gradient"):
        tx.update(per_example(2), tx.init(PARAMS))


def test_dp_adam_and_dp_rmsprop_are_the_thesis_formulas_on_the_privatized_gradient():
    lr, b1, b2, eps, clip_norm = 0.1, 0.9, 0.99, 1e-6, 1.0
    adam = optimizers.dp_adam(lr, clip_norm, 0.0, jax.random.key(0), b1=b1, b2=b2, eps=eps)
    rms = optimizers.dp_rmsprop(lr, clip_norm, 0.0, jax.random.key(0), decay=b2, eps=eps)
    states = adam.init(PARAMS), rms.init(PARAMS)
    m = {k: np.zeros(v.shape) for k, v in PARAMS.items()}
    v_adam = {k: np.zeros(v.shape) for k, v in PARAMS.items()}
    v_rms = {k: np.zeros(v.shape) for k, v in PARAMS.items()}
    for t in range(1, 4):
        grads = per_example(6, scale=3.0)
        g = clipped_mean(grads, clip_norm)
        got_adam, adam_state = jax.jit(adam.update)(grads, states[0])
        got_rms, rms_state = jax.jit(rms.update)(grads, states[1])
        states = adam_state, rms_state
        for k in PARAMS:
            m[k] = b1 * m[k] + (1 - b1) * g[k]
            v_adam[k] = b2 * v_adam[k] + (1 - b2) * g[k] ** 2
            want = -lr * (m[k] / (1 - b1**t)) / np.sqrt(v_adam[k] / (1 - b2**t) + eps)
            np.testing.assert_allclose(np.asarray(got_adam[k]), want, rtol=1e-4, atol=1e-6)
            v_rms[k] = b2 * v_rms[k] + (1 - b2) * g[k] ** 2
            np.testing.assert_allclose(
                np.asarray(got_rms[k]), -lr * g[k] / np.sqrt(v_rms[k] + eps), rtol=1e-4, atol=1e-6
            )


def dp2_reference(steps, s1, s2, beta, eps, variant, lrs, clips, noise_first):
    """Li 2023, Algorithm 11 as a NumPy loop (no noise)."""
    v = {k: np.zeros(p.shape) for k, p in PARAMS.items()}
    acc = {k: np.zeros(p.shape) for k, p in PARAMS.items()}
    out = []
    for t, grads in enumerate(steps):
        phase = t % (s1 + s2)
        if phase == 0:
            acc = {k: np.zeros(p.shape) for k, p in PARAMS.items()}
        if phase == s1:
            for k in v:
                g = acc[k] / s1
                if variant == "rmsprop":
                    v[k] = beta * v[k] + (1 - beta) * g**2
                elif variant == "adagrad":
                    v[k] = v[k] + g**2
                else:
                    v[k] = v[k] - (1 - beta) * np.sign(v[k] - g**2) * g**2
            acc = {k: np.zeros(p.shape) for k, p in PARAMS.items()}
        rms = phase >= s1
        d = {k: (np.sqrt(v[k]) + eps) if rms else np.ones(v[k].shape) for k in v}
        clip_norm, lr = (clips[1], lrs[1]) if rms else (clips[0], lrs[0])
        if noise_first:
            mean = clipped_mean(grads, clip_norm)
            noisy = {k: mean[k] / d[k] for k in mean}
        else:
            noisy = clipped_mean({k: g / d[k] for k, g in grads.items()}, clip_norm)
        acc = {k: acc[k] + noisy[k] for k in acc}
        out.append({k: -lr * noisy[k] for k in noisy})
    return out


@pytest.mark.parametrize(
    "variant,noise_first", [("rmsprop", False), ("adagrad", False), ("yogi", False), ("rmsprop", True)]
)
def test_dp2_against_a_loop_over_steps(variant, noise_first):
    s1, s2, beta, eps, lrs, clips = 2, 3, 0.7, 1e-3, (0.5, 0.05), (1.0, 3.0)
    steps = [per_example(4, scale=2.0) for _ in range(11)]
    tx = optimizers.dp2(
        lrs, clips, 0.0, jax.random.key(0), sgd_steps=s1, rmsprop_steps=s2, beta=beta, eps=eps,
        variant=variant, noise_before_preconditioning=noise_first,
    )
    step, state = jax.jit(tx.update), tx.init(PARAMS)
    for grads, want in zip(steps, dp2_reference(steps, s1, s2, beta, eps, variant, lrs, clips, noise_first)):
        got, state = step(grads, state)
        assert_tree_close(got, want, rtol=1e-4)


def test_dp2_refuses_bad_phases_and_variants():
    with pytest.raises(ValueError, match="sgd_steps"):
        optimizers.dp2((1, 1), (1, 1), 1.0, jax.random.key(0), sgd_steps=0, rmsprop_steps=1)
    with pytest.raises(ValueError, match="variant"):
        optimizers.dp2((1, 1), (1, 1), 1.0, jax.random.key(0), sgd_steps=1, rmsprop_steps=1, variant="adam")


def hand_rdp(q: float, z: float, order: int) -> float:
    """Renyi DP of the Poisson-sampled Gaussian at an integer order (Mironov et al. 2019, Section 3.3)."""
    terms = [
        math.log(special.comb(order, k, exact=True)) + (order - k) * math.log1p(-q) + k * math.log(q)
        + (k * k - k) / (2 * z * z)
        for k in range(order + 1)
    ]
    return special.logsumexp(terms) / (order - 1)


def hand_epsilon(q, z, steps, delta) -> float:
    """The epsilon of `steps` compositions, min over integer orders 2..256, by the conversion
    eps = rdp - (log delta + log a) / (a - 1) + log((a - 1) / a) (Canonne, Kamath, Steinke 2020)."""
    best = math.inf
    for order in range(2, 257):
        rdp = steps * hand_rdp(q, z, order)
        conversion = -(math.log(delta) + math.log(order)) / (order - 1) + math.log((order - 1) / order)
        best = min(best, rdp + conversion)
    return best


@pytest.mark.parametrize("q,z,steps", [(0.01, 1.1, 1000), (0.064, 1.0, 2000), (0.05, 0.8, 300)])
def test_dp_sgd_epsilon_matches_a_hand_composed_rdp(q, z, steps):
    delta = 1e-5
    library = optimizers.dp_sgd_epsilon(z, q, steps, delta)
    by_hand = hand_epsilon(q, z, steps, delta)
    # The library also tries fractional orders, so it may only be lower, and not by much.
    assert library <= by_hand * (1 + 1e-9)
    assert library >= 0.97 * by_hand
    # Calibration inverts it.
    noise = optimizers.dp_sgd_noise_multiplier(library, q, steps, delta)
    assert abs(noise - z) < 1e-3


def test_power_of_ten_delta():
    assert optimizers.power_of_ten_delta(25_000) == 1e-5  # IMDB's 25,000 reviews
    assert optimizers.power_of_ten_delta(1000) == 1e-3
    assert optimizers.power_of_ten_delta(1001) == 1e-4
    with pytest.raises(ValueError):
        optimizers.power_of_ten_delta(1)


def test_privatize_under_vmap_over_keys_equals_separate_calls():
    grads = per_example(6)
    keys = jax.random.split(jax.random.key(5), 3)

    def once(key):
        tx = optimizers.privatize(1.0, 1.0, key)
        return tx.update(grads, tx.init(PARAMS))[0]

    batched = jax.jit(jax.vmap(once))(keys)
    for i in range(3):
        np.testing.assert_array_equal(np.asarray(batched["w"][i]), np.asarray(jax.jit(once)(keys[i])["w"]))


def test_no_noise_with_an_infinite_clip_norm_and_no_rows_clipped_to_zeros():
    # z = 0 with C = inf is the plain mean (0 * inf would be NaN); a batch of no rows sums to zeros.
    grads = per_example(5)
    got = optimizers.noisy_clipped_mean(jax.random.key(0), grads, jnp.inf, jnp.asarray(0.0))
    assert_tree_close(got, {k: v.mean(axis=0) for k, v in grads.items()})
    from jaxfl.privacy.clipping import clipped_sum

    empty = {k: np.zeros((0, *v.shape), np.float32) for k, v in PARAMS.items()}
    total, norms = clipped_sum(empty, 1.0)
    assert norms.shape == (0,) and all(np.all(np.asarray(v) == 0) for v in total.values())


def test_table_6_11_methods_by_name_are_the_documented_chains():
    params = {"w": jnp.ones((3, 2))}
    rows = {"w": jax.random.normal(jax.random.key(0), (4, 3, 2))}
    key, side = jax.random.key(1), {"w": jnp.full((3, 2), 2.0)}

    def step(tx):
        updates, _ = tx.update(rows, tx.init(params), params)
        return np.asarray(updates["w"])

    mean_sgd = -0.1 * np.asarray(rows["w"]).mean(axis=0)
    plain = optimizers.table_6_11_method("sgd", 0.1, 1.0, 0.5, key)
    np.testing.assert_allclose(step(plain), mean_sgd, rtol=1e-6)
    expected = {
        "dp-sgd": optax.chain(optimizers.privatize(1.0, 0.5, key), optax.sgd(0.1)),
        "dp-rmsprop": optimizers.dp_rmsprop(0.1, 1.0, 0.5, key),
        "adadps": optax.chain(
            optimizers.scale_by_side_information(side), optimizers.privatize(1.0, 0.5, key), optax.sgd(0.1)
        ),
    }
    for name, tx in expected.items():
        built = optimizers.table_6_11_method(name, 0.1, 1.0, 0.5, key, side_information=side)
        np.testing.assert_array_equal(step(built), step(tx))
    dp2 = optimizers.table_6_11_method("dp2-rmsprop", 0.1, 1.0, 0.5, key, phase_steps=2)
    reference = optimizers.dp2(
        (0.1, 0.1), (1.0, 1.0), 0.5, key, sgd_steps=2, rmsprop_steps=2, beta=0.9, eps=1e-3
    )
    np.testing.assert_array_equal(step(dp2), step(reference))
    for name, words in [("adam", "name"), ("adadps", "side_information"), ("dp2-rmsprop", "phase_steps")]:
        with pytest.raises(ValueError, match=words):
            optimizers.table_6_11_method(name, 0.1, 1.0, 0.5, key)
