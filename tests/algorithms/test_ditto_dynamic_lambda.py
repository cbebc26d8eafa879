"""Ditto's dynamic lambda (thesis section 5.3) against a NumPy per-client loop.

At every personal step the reference tries each candidate lambda for one
step, v_j = v - lr (grad F_k(v; batch) + lambda_j (v - w_t)), computes each
v_j's mean loss on client k's validation examples, keeps the least; a client
with fewer than 4 validation examples steps with the fixed lambda.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from algorithms.reference_rounds import (
    LOCAL,
    POPULATION,
    SIZES,
    TASK,
    _sample_cohort,
    client_orders,
    initial_params,
    run_rounds,
)
from reference import (
    TINY_LABEL_SHIFT,
    assert_cli_refuses,
    client_loss_reference,
    softmax_regression_grad,
    tiny_population,
)

from jaxfl.algorithms import fedavg
from jaxfl.algorithms.ditto import ditto, lambda_candidates
from jaxfl.training import ClientStrategy
from jaxfl.training.cohort import round_keys

M = 4
LR = 0.2
KEY = jax.random.key(21)
N = len(SIZES)
CANDIDATES = (0.1, 1.0, 3.0)
FALLBACK = 0.5
# Validation client k belongs to training client k; clients 1 and 5 have too few examples to choose.
VALIDATION = tiny_population([6, 2, 5, 4, 9, 3, 7, 5], seed=13)


@functools.cache
def build(strategy="vmap"):
    layout = ClientStrategy(strategy)
    inner = fedavg(TASK, LOCAL, M, strategy=layout)
    return ditto(inner, LOCAL, N, dynamic_lam=CANDIDATES, validation=VALIDATION)


def dynamic_reference(num_rounds):
    """(personal kernels [N], biases [N], the lambdas chosen, clients that fell back)."""
    w0 = initial_params()["dense"]
    kernel, bias = np.array(w0["kernel"], np.float64), np.array(w0["bias"], np.float64)
    v_kernel, v_bias = np.repeat(kernel[None], N, axis=0), np.repeat(bias[None], N, axis=0)
    counts = np.asarray(POPULATION.counts)
    chosen, fell_back = [], set()
    for r in range(num_rounds):
        keys = round_keys(KEY, jnp.int32(r))
        ids = np.asarray(_sample_cohort(keys.sampling, POPULATION, M))
        updates = []
        for i in ids:
            data, validation = POPULATION.client(int(i)), VALIDATION.client(int(i))
            orders, count = client_orders(keys, i), len(data["y"])
            vk, vb = v_kernel[i], v_bias[i]
            wk, wb = kernel.copy(), bias.copy()  # FedAvg's local model, for the global update.
            for epoch in range(LOCAL.num_epochs):
                for start in range(0, count, LOCAL.batch_size):
                    rows = orders[epoch][:count][start : start + LOCAL.batch_size]
                    x, y = data["x"][rows], data["y"][rows]
                    gk, gb, _ = softmax_regression_grad(vk, vb, x, y)
                    steps = {
                        lam: (vk - LR * (gk + lam * (vk - kernel)), vb - LR * (gb + lam * (vb - bias)))
                        for lam in CANDIDATES
                    }
                    if len(validation["y"]) >= 4:
                        losses = [
                            client_loss_reference(*steps[lam], validation["x"], validation["y"])[0]
                            for lam in CANDIDATES
                        ]
                        lam = CANDIDATES[int(np.argmin(losses))]
                        chosen.append(lam)
                        vk, vb = steps[lam]
                    else:
                        fell_back.add(int(i))
                        vk, vb = (
                            vk - LR * (gk + FALLBACK * (vk - kernel)),
                            vb - LR * (gb + FALLBACK * (vb - bias)),
                        )
                    gwk, gwb, _ = softmax_regression_grad(wk, wb, x, y)
                    wk, wb = wk - LR * gwk, wb - LR * gwb
            v_kernel[i], v_bias[i] = vk, vb
            updates.append((wk - kernel, wb - bias))
        weights = counts[ids] / counts[ids].sum()
        kernel = kernel + sum(w * u[0] for w, u in zip(weights, updates, strict=True))
        bias = bias + sum(w * u[1] for w, u in zip(weights, updates, strict=True))
    return v_kernel, v_bias, chosen, fell_back


def test_dynamic_lambda_matches_numpy_loop():
    algorithm = build()
    state = algorithm.init(initial_params(), {"lr": LR, "lam": FALLBACK})
    state, _ = run_rounds(algorithm, state, 3, KEY)
    v_kernel, v_bias, chosen, fell_back = dynamic_reference(3)
    np.testing.assert_allclose(state.clients["dense"]["kernel"], v_kernel, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state.clients["dense"]["bias"], v_bias, rtol=1e-4, atol=1e-5)
    # The test exercises both paths: steps chose different candidates, and a small client fell back.
    assert len(set(chosen)) >= 2 and fell_back


@pytest.mark.slow
def test_sharded_layout_matches_vmap():
    vmapped, sharded = build(), build(strategy="sharded")
    start = {"lr": LR, "lam": FALLBACK}
    expected, _ = run_rounds(vmapped, vmapped.init(initial_params(), start), 2, KEY)
    got, _ = run_rounds(
        sharded, sharded.init(initial_params(), start), 2, KEY, strategy=ClientStrategy("sharded")
    )
    for left, right in zip(jax.tree.leaves(got.clients), jax.tree.leaves(expected.clients), strict=True):
        np.testing.assert_allclose(left, right, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_validation_given_with_the_population_is_an_argument_of_the_round():
    layout = ClientStrategy("vmap")

    def from_population():
        inner = fedavg(TASK, LOCAL, M, strategy=layout)
        return ditto(inner, LOCAL, N, dynamic_lam=CANDIDATES)

    algorithm = from_population()
    start = {"lr": LR, "lam": FALLBACK}
    with_held_out = dataclasses.replace(POPULATION, held_out=VALIDATION)
    got, _ = run_rounds(algorithm, algorithm.init(initial_params(), start), 3, KEY, population=with_held_out)
    expected, _ = run_rounds(build(), build().init(initial_params(), start), 3, KEY)
    for left, right in zip(jax.tree.leaves(got.clients), jax.tree.leaves(expected.clients), strict=True):
        np.testing.assert_array_equal(left, right)

    # The program does not hold the examples: other values of the same shapes lower to the same text,
    # where the constructor's examples are compiled in (their values change the text).
    other = dataclasses.replace(
        VALIDATION, features={k: v + 1 for k, v in VALIDATION.features.items()}
    )
    state = algorithm.init(initial_params(), start)

    def lowered(algorithm, population):
        return jax.jit(algorithm.round).lower(state, population, KEY).as_text()

    assert lowered(algorithm, with_held_out) == lowered(
        algorithm, dataclasses.replace(POPULATION, held_out=other)
    )
    inner = fedavg(TASK, LOCAL, M, strategy=layout)
    constant = ditto(inner, LOCAL, N, dynamic_lam=CANDIDATES, validation=other)
    assert lowered(build(), POPULATION) != lowered(constant, POPULATION)
    with pytest.raises(ValueError, match="held_out"):
        jax.eval_shape(from_population().round, state, POPULATION, KEY)


def test_lambda_candidates_parse_and_refuse():
    assert lambda_candidates("0.1, 1,2") == (0.1, 1.0, 2.0)
    assert lambda_candidates("") == ()
    for text, words in (("0.1,x", "numbers"), ("1,-1", ">= 0"), ("1,nan", "finite"), ("1,2,1", "twice")):
        with pytest.raises(ValueError, match=words):
            lambda_candidates(text)
    with pytest.raises(ValueError, match="validation population"):
        ditto(
            fedavg(TASK, LOCAL, M, strategy=ClientStrategy("vmap")),
            LOCAL,
            N,
            dynamic_lam=CANDIDATES,
            validation=tiny_population([5, 5], seed=1),  # 2 clients for N = 8.
        )


def test_cli_refuses_dynamic_lambda_without_validation_data(tmp_path, capsys):
    out = tmp_path / "run"
    argv = [
        "run",
        *TINY_LABEL_SHIFT,
        "--clients-per-round",
        "5",
        "--algorithm",
        "ditto",
        "--ditto-dynamic-lam",
        "0.1,1,2",
        "--client-split",
        "0.2",
        "--out",
        str(out),
    ]
    assert_cli_refuses(argv, ["ditto_dynamic_lam", "--client-validation-split"], out, capsys)


@pytest.mark.slow
def test_dynamic_lambda_from_the_cli(tmp_path, capsys):
    """Host-resident, so the validation examples are copied to the device for the round (the rounds
    themselves equal the device-resident ones: tests/data/test_host.py)."""
    import csv
    import json

    from jaxfl.cli import main

    out = tmp_path / "run"
    argv = [
        "run", *TINY_LABEL_SHIFT, "--rounds", "2", "--clients-per-round", "8", "--eval-every", "2",
        "--no-progress", "--algorithm", "ditto", "--ditto-dynamic-lam", "0.1,1,2", "--lam", "0",
        "--client-split", "0.2", "--client-validation-split", "0.1", "--residency", "host", "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    assert "ditto (personal)" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["residency"] == "host"
    # The personal models trained: they are not the global model.
    assert summary["personal_test_error"]["mean"] != summary["test_error"]["mean"]
    with (out / "clients.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["population"] == "test"]
    assert len(rows) == 40
