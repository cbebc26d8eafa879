"""The hand-written loop baseline computes jaxfl's FedAvg round (so their rounds/s compare one computation).

Tiny synthetic workloads: a one-label MLP task, and a token-sequence task
with padded targets; sampled cohorts, uneven clients, a remainder batch,
two epochs and a step cap. Speed is never asserted.
"""

from pathlib import Path

import jax
import numpy as np
import pytest
from reference import imported_script

from jaxfl.algorithms.fedavg import fedavg
from jaxfl.data.population import pack_clients
from jaxfl.models.networks import make_model
from jaxfl.models.sequence import build_recurrent_lm
from jaxfl.training.local import LocalTraining, Task
from jaxfl.training.strategies import ClientStrategy

# The scripts' and benchmarks' harnesses run in the end-to-end tier (`pytest -m slow`).
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "loop_baseline.py"
SIZES = [3, 17, 8, 25, 1, 12, 6]


@pytest.fixture(scope="module")
def baseline():
    with imported_script(SCRIPT) as module:
        yield module


def labels_task(rng):
    population = pack_clients([
        {"x": rng.normal(size=(n, 5)).astype(np.float32), "y": rng.integers(0, 3, n).astype(np.int32)}
        for n in SIZES
    ])
    return Task(make_model("mlp", (5,), 3, hidden_sizes=(4,))), population


def sequence_task(rng):
    clients = []
    for n in SIZES:
        x = rng.integers(1, 7, (n, 6)).astype(np.uint8)
        y = rng.integers(1, 7, (n, 6)).astype(np.int32)
        y[-1, rng.integers(1, 6):] = 0  # The client's last sequence ends in padding.
        clients.append({"x": x, "y": y})
    model = build_recurrent_lm((6,), 7, input_vocab_size=7, embedding_dim=3, hidden_size=4, num_layers=1)
    return Task(model, excluded_target_ids=(0, 1)), pack_clients(clients)


@pytest.mark.slow
@pytest.mark.parametrize(
    "make, num_epochs, max_steps",
    [(labels_task, 2, 5), (sequence_task, 1, None)],
    ids=["labels-two-epochs-capped", "sequences-one-epoch"],
)
def test_loop_round_is_jaxfls_round(baseline, make, num_epochs, max_steps):
    task, population = make(np.random.default_rng(0))
    batch_size, clients_per_round, lr, rounds = 4, 5, 0.3, 2
    key = jax.random.key(5)
    local = LocalTraining(batch_size=batch_size, num_epochs=num_epochs, max_steps=max_steps)
    algorithm = fedavg(task, local, clients_per_round, strategy=ClientStrategy("sequential"))
    state = algorithm.init(task.model.init(jax.random.key(0)), {"lr": lr})
    round_fn = jax.jit(algorithm.round)
    for _ in range(rounds):
        state, _ = round_fn(state, population, key)

    loop = baseline.LoopFedAvg(
        task, population, batch_size=batch_size, clients_per_round=clients_per_round,
        num_epochs=num_epochs, max_steps=max_steps,
    )
    params = task.model.init(jax.random.key(0))
    initial = jax.device_get(params)
    sampled = set()
    for r in range(rounds):
        sampled |= set(np.asarray(loop.plan(key, r)[0]).tolist())
        params = loop.round(params, key, r, lr)
    # The last client's remainder batch reaches past the population's last row (masked).
    assert len(SIZES) - 1 in sampled
    got, want = jax.device_get(params), jax.device_get(state.params)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w, w0 in zip(jax.tree.leaves(got), jax.tree.leaves(want), jax.tree.leaves(initial), strict=True):
        assert not np.allclose(w, w0)  # The round moved the weights...
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)  # ...and both moved them alike.
