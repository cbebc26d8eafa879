"""Per-client state split over a device mesh along the client axis.

N = 8 training clients over 3 devices: 9 rows (one of padding), 3 a device.
Every algorithm with personal models must then train the same models as under
vmap, keep its rows split after the compiled rounds, and report the same
personal evaluations (the padding row is never read).
"""

import jax
import numpy as np
import pytest
from algorithms.reference_rounds import LOCAL, POPULATION, SIZES, TASK, initial_params, run_rounds
from jax.sharding import PartitionSpec
from reference import slow_after

from jaxfl.algorithms import fedavg
from jaxfl.algorithms.apfl import apfl
from jaxfl.algorithms.ditto import ditto
from jaxfl.algorithms.l2sgd import l2sgd
from jaxfl.evaluation.per_client import personal_client_metrics
from jaxfl.training import ClientStrategy
from jaxfl.training.strategies import CLIENT_AXIS

M = 3
N = len(SIZES)
KEY = jax.random.key(17)
SPLIT = ClientStrategy("sharded", num_devices=3, split_client_state=True)
VMAP = ClientStrategy("vmap")


def build(name, strategy):
    if name == "ditto":
        return ditto(fedavg(TASK, LOCAL, M, strategy=strategy), LOCAL, N)
    if name == "apfl":
        return apfl(fedavg(TASK, LOCAL, M, strategy=strategy), LOCAL, N)
    return l2sgd(TASK, LOCAL, M, N, strategy=strategy)


def test_rows_round_up_to_the_devices():
    assert SPLIT.client_state_rows(8) == 9 and SPLIT.client_state_rows(9) == 9
    assert VMAP.client_state_rows(8) == 8
    assert ClientStrategy("sharded", num_devices=1, split_client_state=True).client_state_rows(8) == 8
    # Replicated (the default), the rows are N.
    assert ClientStrategy("sharded", num_devices=3).client_state_rows(8) == 8


def test_client_state_is_split_where_told_or_where_memory_is_short():
    from jaxfl.experiment.checks import choose_client_state
    from jaxfl.experiment.config import make_config

    sharded = ClientStrategy("sharded", num_devices=3)

    def split(client_state, available, algorithm="ditto"):
        config = make_config({"algorithm": algorithm, "client_state": client_state})
        # 8 clients x 1,000 parameters x 4 bytes x 3 CPU devices' copies = 96,000 bytes replicated.
        return choose_client_state(config, sharded, 8, 1000, available=available).shards_client_state

    assert split("split", 10**12) and not split("replicated", 1)
    assert not split("auto", 4 * 96_000) and split("auto", 4 * 96_000 - 4)
    assert not split("auto", 1, algorithm="fedavg")  # No personal models.


@pytest.mark.parametrize("name", slow_after(["ditto", "l2sgd", "apfl"]))
@pytest.mark.slow
def test_split_personal_models_equal_the_vmapped_ones(name):
    hparams = {"lr": 0.1, "lam": 0.5} if name != "apfl" else {"lr": 0.1, "apfl_alpha": 0.5}
    expected_algorithm, split_algorithm = build(name, VMAP), build(name, SPLIT)
    expected, _ = run_rounds(expected_algorithm, expected_algorithm.init(initial_params(), hparams), 3, KEY)
    split, _ = run_rounds(
        split_algorithm, split_algorithm.init(initial_params(), hparams), 3, KEY, strategy=SPLIT
    )
    for want, got in zip(jax.tree.leaves(expected.clients), jax.tree.leaves(split.clients), strict=True):
        # Still split after the compiled rounds: 3 rows a device.
        assert got.shape[0] == 9 and got.sharding.spec == PartitionSpec(CLIENT_AXIS)
        assert {shard.data.shape[0] for shard in got.addressable_shards} == {3}
        np.testing.assert_allclose(got[:N], want, rtol=1e-5, atol=1e-6)
    # L2SGD's mean leaves the padding row out; every global model is the same.
    for want, got in zip(jax.tree.leaves(expected.params), jax.tree.leaves(split.params), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # The evaluation reads rows 0..N-1 only.
    loss, error = personal_client_metrics(TASK, split_algorithm.personal_models(split), POPULATION)
    want_loss, want_error = personal_client_metrics(
        TASK, expected_algorithm.personal_models(expected), POPULATION
    )
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(error, want_error, rtol=1e-6)
