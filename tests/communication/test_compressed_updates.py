"""Compressed updates in the round against NumPy: top-k with error feedback over rounds, the cohort's
compression against a loop over clients, bucketed and rotated quantization, code sizes, bad settings."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from algorithms.reference_rounds import (
    LOCAL,
    POPULATION,
    TASK,
    assert_params_close,
    initial_params,
    reference_rounds,
    run_rounds,
)
from reference import slow_after

from jaxfl.algorithms import fedavg
from jaxfl.algorithms.fedavg import random_subset_mask
from jaxfl.communication import UpdateCompression, compress_updates
from jaxfl.communication.traffic import round_traffic
from jaxfl.training import ClientStrategy

N = len(POPULATION.counts)
LR = 0.3


def _flat(delta):
    # ravel_pytree's order: the leaves sorted by key, bias before kernel.
    kernel, bias = delta
    return np.concatenate([bias.ravel(), kernel.ravel()])


def _unflat(vector, like):
    kernel, bias = like
    return vector[bias.size :].reshape(kernel.shape), vector[: bias.size].reshape(bias.shape)


def _top_k_numpy(x, k):
    # Largest magnitudes, ties to the lower index (a stable sort of -|x|).
    kept = np.argsort(-np.abs(x), kind="stable")[:k]
    out = np.zeros_like(x)
    out[kept] = x[kept]
    return out


@pytest.mark.parametrize("stragglers", slow_after([0.0, 0.5]))
def test_top_k_with_error_feedback_equals_a_numpy_loop_over_rounds(stragglers):
    compression = UpdateCompression("top-k", fraction=0.25, error_feedback=True, num_clients=N)
    d = 5 * 3 + 3
    k = compression.kept(d)
    assert k == 5
    algorithm = fedavg(
        TASK, LOCAL, 4, strategy=ClientStrategy("vmap"), stragglers=stragglers, compression=compression
    )
    params = initial_params()
    key = jax.random.key(3)
    state, history = run_rounds(algorithm, algorithm.init(params, {"lr": LR}), 3, key)

    def plan(r, ids, alpha, losses, key, memory):
        if not stragglers:
            return {}
        choice_key, _ = jax.random.split(key)
        return {"active": ~np.asarray(random_subset_mask(choice_key, jnp.asarray(ids), 2))}

    residuals = np.zeros((N, d))

    def compress(ids, deltas, active, memory):
        sent = []
        for i, delta, uploads in zip(ids, deltas, active, strict=True):
            if not uploads:  # Sends nothing: its residual waits.
                sent.append(delta)
                continue
            corrected = _flat(delta) + residuals[i]
            code = _top_k_numpy(corrected, k)
            residuals[i] = corrected - code
            sent.append(_unflat(code, delta))
        return sent

    kernel, bias, reference = reference_rounds(
        params, key, 3, clients_per_round=4, lr=LR, plan=plan, compress=compress
    )
    assert_params_close(state.params, kernel, bias)
    np.testing.assert_allclose(state.error_feedback, residuals, rtol=1e-4, atol=1e-5)
    # Each round's uploads: the clients that were not dropped.
    assert [m["clients_uploading"] for m in history] == [int(r["active"].sum()) for r in reference]


def test_top_k_keeping_everything_leaves_the_round_unchanged_bit_for_bit():
    plain = fedavg(TASK, LOCAL, 4, strategy=ClientStrategy("vmap"))
    everything = fedavg(
        TASK, LOCAL, 4, strategy=ClientStrategy("vmap"),
        compression=UpdateCompression("top-k", fraction=1.0, error_feedback=True, num_clients=N),
    )  # fmt: skip
    params, key = initial_params(), jax.random.key(1)
    a, _ = run_rounds(plain, plain.init(params, {"lr": LR}), 2, key)
    b, _ = run_rounds(everything, everything.init(params, {"lr": LR}), 2, key)
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.any(np.asarray(b.error_feedback))


@pytest.mark.parametrize(
    "compression",
    slow_after([
        UpdateCompression("qsgd", bits=2, bucket_size=4, rotation=True, error_feedback=True, num_clients=6),
        UpdateCompression("rand-k", fraction=0.3),
    ]),
    ids=["qsgd-bucketed-rotated-ef", "rand-k"],
)
def test_cohort_compression_equals_a_loop_over_clients(compression):
    rng = np.random.default_rng(0)
    deltas = {"b": jnp.asarray(rng.normal(size=(3, 2)), jnp.float32),
              "w": jnp.asarray(rng.normal(size=(3, 3, 3)), jnp.float32)}  # fmt: skip
    ids = jnp.asarray([4, 0, 2])
    uploading = jnp.asarray([True, False, True])
    residuals = jnp.asarray(rng.normal(size=(3, 11)), jnp.float32) if compression.error_feedback else None
    key = jax.random.key(9)
    decoded, new_residuals = jax.jit(compress_updates, static_argnums=0)(
        compression, deltas, ids, key, uploading, residuals
    )
    compress_one = jax.jit(compression.compress)  # one compile, not one per eager op
    for m in range(3):
        x = np.concatenate([np.asarray(deltas["b"][m]), np.asarray(deltas["w"][m]).ravel()])
        if not uploading[m]:
            expected, residual = x, None if residuals is None else np.asarray(residuals[m])
        else:
            corrected = x + (0.0 if residuals is None else np.asarray(residuals[m]))
            code = np.asarray(compress_one(jnp.asarray(corrected), jax.random.fold_in(key, ids[m])))
            expected, residual = code, corrected - code
        got = np.concatenate([np.asarray(decoded["b"][m]), np.asarray(decoded["w"][m]).ravel()])
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        if residuals is not None:
            np.testing.assert_allclose(new_residuals[m], residual, rtol=1e-5, atol=1e-6)
    assert (new_residuals is None) == (residuals is None)


def test_bucketed_quantization_uses_each_buckets_norm_and_with_rotation_stays_unbiased():
    x = np.random.default_rng(1).normal(size=10).astype(np.float32)
    draws = 3000
    keys = jax.random.split(jax.random.key(2), draws)
    bucketed = UpdateCompression("qsgd", bits=1, bucket_size=4)
    values = np.asarray(jax.jit(jax.vmap(bucketed.compress, in_axes=(None, 0)))(jnp.asarray(x), keys))
    for start in range(0, 10, 4):  # Buckets [0:4], [4:8], [8:10], each on {0, +-||bucket||}.
        part = slice(start, start + 4)
        norm = np.linalg.norm(x[part])
        magnitude = np.abs(values[:, part])
        assert np.all(np.isclose(magnitude, 0.0) | np.isclose(magnitude, norm, rtol=1e-5))
    rotated = UpdateCompression("qsgd", bits=2, bucket_size=4, rotation=True)
    values = np.asarray(
        jax.jit(jax.vmap(rotated.compress, in_axes=(None, 0)))(jnp.asarray(x), keys), np.float64
    )
    # 1 bit per level over 4 coordinates: the error's variance is at most ||bucket||^2 each (loose bound).
    stderr = np.linalg.norm(x) / np.sqrt(draws)
    np.testing.assert_array_less(np.abs(values.mean(axis=0) - x), 5 * stderr)


@pytest.mark.parametrize(
    "compression",
    [
        UpdateCompression("rand-k", fraction=0.2, error_feedback=True, num_clients=1),
        UpdateCompression("qsgd", bits=1, bucket_size=4, error_feedback=True, num_clients=1),
    ],
    ids=["rand-k", "qsgd"],
)
def test_with_error_feedback_unbiased_compressors_become_contractions(compression):
    # E ||C(x) - x||^2 <= (1 - delta) ||x||^2, delta = k / d unscaled rand-k, 1 / (1 + omega) scaled qsgd.
    x = np.random.default_rng(3).normal(size=20).astype(np.float32)
    keys = jax.random.split(jax.random.key(4), 3000)
    values = np.asarray(
        jax.jit(jax.vmap(compression.compress, in_axes=(None, 0)))(jnp.asarray(x), keys), np.float64
    )
    delta = 0.2 if compression.name == "rand-k" else 1 / (1 + compression.variance_factor(20))
    error = np.mean(np.sum((values - x) ** 2, axis=1))
    assert error <= (1 - delta) * np.sum(x.astype(np.float64) ** 2) * 1.02
    if compression.name == "rand-k":  # Exactly the dropped coordinates' mass, unscaled.
        np.testing.assert_allclose(
            values[values != 0], np.broadcast_to(x, values.shape)[values != 0], rtol=1e-6
        )
    assert not compression.unbiased


def test_code_sizes_count_what_each_compressor_sends():
    d = 1000
    assert UpdateCompression("qsgd", bits=3).encoded_bits(d) == 32 + d * 4
    # 1000 coordinates in buckets of 64: 16 norms.
    assert UpdateCompression("qsgd", bits=3, bucket_size=64).encoded_bits(d) == 16 * 32 + d * 4
    # Rotation pads to 1024 coordinates, all sent.
    assert UpdateCompression("qsgd", bits=3, rotation=True).encoded_bits(d) == 32 + 1024 * 4
    # rand-k: k values (the server knows the indices from the key); top-k: values and 10-bit indices.
    assert UpdateCompression("rand-k", fraction=0.01).encoded_bits(d) == 10 * 32
    assert UpdateCompression("top-k", fraction=0.0101).encoded_bits(d) == 11 * (32 + 10)
    traffic = round_traffic(
        fedavg(
            TASK, LOCAL, 4, strategy=ClientStrategy("vmap"), compression=UpdateCompression("qsgd", bits=1)
        ),
        initial_params(),
    )
    assert (traffic.model_bytes, traffic.update_bytes) == (18 * 4, -(-(32 + 18 * 2) // 8))
    assert traffic.bytes_up(7) == 7 * 9 and traffic.bytes_down(3, 7) == 3 * 4 * 72


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"name": "signsgd"}, "must be one of"),
        ({"name": "qsgd", "bits": 0}, "bits"),
        ({"name": "qsgd", "bits": 17}, "bits"),
        ({"name": "top-k", "fraction": 0.0}, "fraction"),
        ({"name": "top-k", "fraction": 1.5}, "fraction"),
        ({"name": "rand-k", "bucket_size": 8}, "qsgd's option"),
        ({"name": "qsgd", "bucket_size": 0}, "bucket_size"),
        ({"name": "top-k", "error_feedback": True}, "num_clients"),
    ],
)
def test_bad_settings_are_refused_in_one_line(kwargs, words):
    with pytest.raises(ValueError, match=words) as error:
        UpdateCompression(**kwargs)
    assert "\n" not in str(error.value)


def test_error_feedback_refuses_host_resident_client_state():
    compression = UpdateCompression("top-k", error_feedback=True, num_clients=N)
    with pytest.raises(ValueError, match="host-resident"):
        fedavg(
            TASK, LOCAL, 4, strategy=ClientStrategy("vmap", host_client_state=True), compression=compression
        )
