"""AdaDPS-FL: against a NumPy per-client loop whose local gradients are divided by A, A = 1 is
DP-FedAvg bit for bit (noise included), side information by name or from a file, and every
malformed side information refused in one line."""

import functools

import jax
import numpy as np
import pytest
from algorithms.reference_rounds import (
    LOCAL,
    TASK,
    assert_params_close,
    initial_params,
    reference_rounds,
    run_rounds,
)
from reference import TINY_LABEL_SHIFT, assert_cli_refuses

from jaxfl.algorithms.adadps import adadps, side_information_names, side_information_tree
from jaxfl.algorithms.dp_fedavg import dp_fedavg
from jaxfl.training import ClientStrategy

M = 5
LR = 0.2
KEY = jax.random.key(5)
# Side information spanning two orders of magnitude, per input feature (kernel rows) and per class.
KERNEL_A = np.geomspace(0.1, 10.0, 15).reshape(5, 3).astype(np.float32)
BIAS_A = np.array([1.0, 0.5, 2.0], np.float32)


@functools.cache
def build(side_information=None):
    given = None if side_information is None else {"dense/kernel": KERNEL_A, "dense/bias": BIAS_A}
    if side_information == "ones":
        given = {"dense/kernel": np.ones(()), "dense/bias": np.ones(())}
    return adadps(TASK, LOCAL, M, side_information=given, strategy=ClientStrategy("vmap"))


def run(algorithm, hparams, num_rounds=3):
    state = algorithm.init(initial_params(), {"lr": LR, **hparams})
    return run_rounds(algorithm, state, num_rounds, KEY)


def test_preconditioned_rounds_equal_a_numpy_loop_over_clients():
    clip_norm = 0.05  # Active for most clients.
    norms = []

    def aggregate(ids, alpha, losses, deltas, decision, memory):
        del ids, alpha, losses, decision, memory  # Unused.
        row_norms = np.array([np.sqrt(np.sum(k**2) + np.sum(b**2)) for k, b in deltas])
        norms.append(row_norms)
        return np.minimum(1.0, clip_norm / row_norms) / M

    state, _ = run(build("given"), {"clip_norm": clip_norm, "dp_noise_multiplier": 0.0})
    kernel, bias, _ = reference_rounds(
        initial_params(), KEY, 3, clients_per_round=M, lr=LR, aggregate=aggregate,
        preconditioner=lambda r, memory: (KERNEL_A, BIAS_A),
    )
    assert_params_close(state.params, kernel, bias)
    assert np.mean(np.concatenate(norms) > clip_norm) > 0.5  # Clipping is exercised.
    # The test has power: without the preconditioner the models differ.
    plain, _, _ = reference_rounds(
        initial_params(), KEY, 3, clients_per_round=M, lr=LR, aggregate=aggregate
    )
    assert np.max(np.abs(plain - kernel)) > 1e-3


def test_unit_side_information_is_dp_fedavg_noise_included():
    hparams = {"clip_norm": 0.3, "dp_noise_multiplier": 1.3}
    ones, _ = run(build("ones"), hparams)
    reference, _ = run(dp_fedavg(TASK, LOCAL, M, strategy=ClientStrategy("vmap")), hparams)
    for a, b in zip(jax.tree.leaves(ones.params), jax.tree.leaves(reference.params), strict=True):
        np.testing.assert_array_equal(a, b)  # g / 1 is g: the same bits.


def test_side_information_by_name_by_tree_and_from_a_file(tmp_path):
    params = initial_params()
    assert side_information_names(params) == ["dense/bias", "dense/kernel"]
    by_name = side_information_tree(params, {"dense/kernel": KERNEL_A, "dense/bias": 2.0})
    by_tree = side_information_tree(params, {"dense": {"kernel": KERNEL_A, "bias": np.full(3, 2.0)}})
    for a, b in zip(jax.tree.leaves(by_name), jax.tree.leaves(by_tree), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(by_name["dense"]["bias"], [2.0, 2.0, 2.0])
    path = tmp_path / "a.npz"
    np.savez(path, **{"dense/kernel": KERNEL_A, "dense/bias": BIAS_A})
    algorithm = adadps(TASK, LOCAL, M, side_information=str(path), strategy=ClientStrategy("vmap"))
    state = algorithm.init(params, {})
    np.testing.assert_array_equal(state.extra["dense"]["kernel"], KERNEL_A)


@pytest.mark.parametrize(
    "given, words",
    [
        ({"dense/kernel": KERNEL_A}, ["missing dense/bias"]),
        ({"dense/kernel": KERNEL_A, "dense/bias": 1.0, "conv/kernel": 1.0}, ["unknown conv/kernel"]),
        ({"dense/kernel": np.ones((3, 5)), "dense/bias": 1.0}, ["dense/kernel", "(3, 5)", "broadcastable"]),
        ({"dense/kernel": KERNEL_A, "dense/bias": 0.0}, ["dense/bias", "> 0"]),
        ({"dense/kernel": KERNEL_A, "dense/bias": np.nan}, ["dense/bias", "finite"]),
        ({"dense": {"kernel": KERNEL_A}}, ["not a tree like the parameters"]),
    ],
)
def test_malformed_side_information_is_refused(given, words):
    with pytest.raises(ValueError) as error:
        side_information_tree(initial_params(), given)
    assert all(word in str(error.value) for word in words), str(error.value)


def test_the_cli_refuses_a_side_information_file_that_does_not_fit(tmp_path, capsys):
    path = tmp_path / "a.npz"
    np.savez(path, **{"dense/kernel": np.ones(3)})
    out = tmp_path / "run"
    tiny = [*TINY_LABEL_SHIFT, "--rounds", "1", "--clients-per-round", "5", "--no-progress",
            "--out", str(out)]
    assert_cli_refuses(
        ["run", *tiny, "--algorithm", "adadps", "--side-information", str(path)],
        ["adadps", "missing dense/bias"], out, capsys,
    )
    assert_cli_refuses(
        ["run", *tiny, "--algorithm", "adadps", "--side-information", str(tmp_path / "absent.npz")],
        ["adadps", "cannot read side information"], out, capsys,
    )
