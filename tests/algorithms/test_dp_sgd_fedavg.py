"""FedAvg with local DP-SGD: per-example clipping against a NumPy loop over clients and examples, the
noise of every step as documented (key and scale), the fused kernel stepping aside, terms that read
the batch refused, and the CLI's example-level privacy object recomputed by hand."""

import functools
import json

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
from privacy.test_independent_accounting import eps_from_rdp
from reference import TINY_LABEL_SHIFT, assert_cli_refuses, local_sgd_reference

from jaxfl.algorithms.dp_sgd_fedavg import dp_sgd_fedavg
from jaxfl.cli import main
from jaxfl.privacy.noise import gaussian_noise_like
from jaxfl.training import ClientStrategy, LocalTraining
from jaxfl.training.local import _NOISE_STREAM, ExamplePrivacy, LocalHParams, epoch_orders, local_sgd

M = 5
LR = 0.3
KEY = jax.random.key(11)


@functools.cache
def build(loop="scan"):
    local = LocalTraining(batch_size=LOCAL.batch_size, num_epochs=LOCAL.num_epochs, loop=loop)
    return dp_sgd_fedavg(TASK, local, M, strategy=ClientStrategy("vmap"))


def run(algorithm, hparams, num_rounds=3):
    state = algorithm.init(initial_params(), {"lr": LR, **hparams})
    return run_rounds(algorithm, state, num_rounds, KEY)


def test_clipped_rounds_equal_a_numpy_loop_over_clients_and_examples():
    clip = 0.3  # Below most examples' gradient norms at the start.
    state, _ = run(build(), {"example_clip_norm": clip, "dp_noise_multiplier": 0.0})
    kernel, bias, _ = reference_rounds(
        initial_params(), KEY, 3, clients_per_round=M, lr=LR, example_clip=clip
    )
    assert_params_close(state.params, kernel, bias)
    # The test has power: without clipping (or dividing short batches by their count) it differs.
    plain, _, _ = reference_rounds(initial_params(), KEY, 3, clients_per_round=M, lr=LR)
    assert np.max(np.abs(plain - kernel)) > 1e-2


def test_the_fused_kernel_steps_aside():
    hparams = {"example_clip_norm": 0.3, "dp_noise_multiplier": 0.7}
    scan, _ = run(build("scan"), hparams, num_rounds=2)
    fused, _ = run(build("fused"), hparams, num_rounds=2)
    for a, b in zip(jax.tree.leaves(scan.params), jax.tree.leaves(fused.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@jax.jit
def _one_client(params, client_key, clip, z):
    hparams = LocalHParams(lr=jnp.float32(LR), example_privacy=ExamplePrivacy(clip, z))
    return local_sgd(TASK, params, POPULATION, jnp.int32(1), client_key, hparams, LOCAL).params


def test_each_step_adds_gaussian_noise_of_std_2zc_from_the_documented_key():
    # Step s of a client with key k draws N(0, (z 2C)^2 I) from fold_in(fold_in(k, stream), s).
    clip, z = 0.4, 1.7
    client_key = jax.random.key(3)
    params = initial_params()
    trained = _one_client(params, client_key, jnp.float32(clip), jnp.float32(z))
    noise_key = jax.random.fold_in(client_key, _NOISE_STREAM)

    def step_noise(step):
        noise = gaussian_noise_like(jax.random.fold_in(noise_key, step), params, 2 * z * clip)
        dense = noise["dense"]
        return np.asarray(dense["kernel"], np.float64), np.asarray(dense["bias"], np.float64)

    data = POPULATION.client(1)
    orders = epoch_orders(client_key, POPULATION.counts[1], POPULATION.max_count, LOCAL.num_epochs)
    kernel, bias, steps = local_sgd_reference(
        params["dense"]["kernel"], params["dense"]["bias"], data["x"], data["y"], np.asarray(orders),
        batch_size=LOCAL.batch_size, num_epochs=LOCAL.num_epochs, lr=LR, example_clip=clip,
        step_noise=step_noise,
    )
    assert steps == 2 * 6  # 23 examples in batches of 4, two epochs: short batches included.
    assert_params_close(trained, kernel, bias)
    # Power: with the noise of another key the model is elsewhere.
    other = _one_client(params, jax.random.key(4), jnp.float32(clip), jnp.float32(z))
    assert np.max(np.abs(np.asarray(other["dense"]["kernel"]) - kernel)) > 1e-2


@pytest.mark.parametrize(
    "extra",
    [{"kl_mu": jnp.float32(1.0)}, {"sample_tilt": jnp.float32(1.0)}],
)
def test_terms_that_read_the_batch_are_refused(extra):
    hparams = LocalHParams(
        lr=jnp.float32(LR), example_privacy=ExamplePrivacy(jnp.float32(1.0), jnp.float32(1.0)), **extra
    )
    with pytest.raises(ValueError, match="example_privacy"):
        local_sgd(TASK, initial_params(), POPULATION, jnp.int32(0), KEY, hparams, LOCAL)


TINY = [*TINY_LABEL_SHIFT, "--rounds", "3", "--clients-per-round", "5", "--eval-every", "3", "--no-progress",
        "--strategy", "vmap", "--local-epochs", "2"]  # fmt: skip


@pytest.mark.slow
def test_the_cli_reports_example_level_privacy_recomputed_by_hand(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["run", *TINY, "--algorithm", "dp-sgd-fedavg", "--epsilon", "6", "--example-clip-norm", "0.5",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert "example-level" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    privacy = summary["privacy"]
    assert privacy["unit"] == "example" and privacy["steps_per_example_per_round"] == 2
    n_examples = privacy["num_examples"]
    assert privacy["delta"] == 1 / n_examples and privacy["clip_norm"] == 0.5
    assert privacy["noise_stddev"] == pytest.approx(2 * 0.5 * privacy["noise_multiplier"])
    # By hand: RDP of 2 Gaussian steps per round, client sampling q = 5/40 by joint convexity, 3 rounds.
    orders = np.array([1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)), np.float64)
    rho, q = 2 / (2 * privacy["noise_multiplier"] ** 2), 5 / 40
    per_round = np.logaddexp(np.log1p(-q), np.log(q) + (orders - 1) * orders * rho) / (orders - 1)
    hand = eps_from_rdp(orders, 3 * per_round, 1 / n_examples)
    assert privacy["epsilon"] == pytest.approx(hand, rel=1e-3)
    assert 5.99 <= privacy["epsilon"] <= 6.0
    server = eps_from_rdp(orders, 3 * orders * rho, 1 / n_examples)
    assert privacy["epsilon_against_server"] == pytest.approx(server, rel=1e-3)


def test_the_cli_refuses_a_budget_that_drowns_every_step(tmp_path, capsys):
    out = tmp_path / "run"
    assert_cli_refuses(
        ["run", *TINY, "--algorithm", "dp-sgd-fedavg", "--epsilon", "0.05", "--out", str(out)],
        ["dp-sgd-fedavg", "batch size / 2", "learn nothing"], out, capsys,
    )
