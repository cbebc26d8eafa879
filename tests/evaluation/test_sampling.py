"""The evaluation sample: one client per size stratum, each client with probability n/N, fixed by the seed."""

import dataclasses

import jax
import numpy as np
import pytest
from reference import tiny_population

from jaxfl.data.host import HostPopulation
from jaxfl.data.population import FederatedDataset
from jaxfl.evaluation.sampling import evaluation_sample, sampled_population, stratified_client_sample
from jaxfl.experiment.evaluator import make_evaluator
from jaxfl.models import make_model
from jaxfl.training import Task
from jaxfl.training.client_state import HostPersonalModels


@pytest.mark.parametrize("num_clients,size", [(10, 3), (37, 5), (8, 7), (100, 1)])
def test_one_client_from_each_size_stratum(num_clients, size):
    rng = np.random.default_rng(num_clients)
    counts = rng.integers(1, 6, num_clients)  # Many ties: broken at random.
    for seed in range(20):
        ids = stratified_client_sample(counts, size, seed)
        assert ids.shape == (size,) and np.all(np.diff(ids) > 0)
        # The k-th sampled client by size has rank floor(u + k N/n), u in [0, N/n): between
        # floor(k N/n) and floor((k+1) N/n) of the sorted sizes.
        sizes = np.sort(counts[ids])
        ranked = np.sort(counts)
        step = num_clients / size
        for k, value in enumerate(sizes):
            low = ranked[int(np.floor(k * step))]
            high = ranked[min(int(np.floor((k + 1) * step)), num_clients - 1)]
            assert low <= value <= high


def test_each_client_is_sampled_with_probability_n_over_n():
    counts = np.array([5, 1, 9, 9, 9, 2, 7, 3, 3, 1, 8])
    size, draws = 4, 6000
    hits = np.zeros(counts.size)
    for seed in range(draws):
        hits[stratified_client_sample(counts, size, seed)] += 1
    p = size / counts.size
    # Binomial(draws, p) per client: 5 standard deviations.
    np.testing.assert_allclose(hits / draws, p, atol=5 * np.sqrt(p * (1 - p) / draws))


def test_the_seed_fixes_the_sample_and_all_means_all():
    counts = np.arange(1, 51)
    np.testing.assert_array_equal(
        stratified_client_sample(counts, 7, 3), stratified_client_sample(counts, 7, 3)
    )
    assert any(
        not np.array_equal(stratified_client_sample(counts, 7, 3), stratified_client_sample(counts, 7, s))
        for s in range(4, 8)
    )
    np.testing.assert_array_equal(stratified_client_sample(counts, 50, 0), np.arange(50))
    np.testing.assert_array_equal(stratified_client_sample(counts, 80, 0), np.arange(50))
    with pytest.raises(ValueError, match="at least one client"):
        stratified_client_sample(counts, 0, 0)


def _dataset(personal_splits):
    train = tiny_population([3, 5, 2, 7, 1, 4, 6, 2, 3, 5], seed=1)
    test = train if personal_splits else tiny_population([2, 2, 4, 1, 3, 5, 2, 2, 1, 3, 4, 2], seed=2)
    return FederatedDataset(
        "toy", train, test, num_classes=3, input_shape=(5,), personal_splits=personal_splits
    )


def test_populations_get_their_own_draws_unless_test_client_k_is_training_client_k():
    sample = evaluation_sample(_dataset(False), 4, seed=0)
    assert sorted(sample) == ["test", "train"] and sample["train"].size == sample["test"].size == 4
    assert evaluation_sample(_dataset(False), 11, seed=0).keys() == {"test"}  # 10 training clients: all.
    personal = evaluation_sample(_dataset(True), 4, seed=0)
    np.testing.assert_array_equal(personal["test"], personal["train"])


@pytest.mark.parametrize("where", ["device", "host"])
def test_a_sampled_population_holds_those_clients_examples(where):
    population = tiny_population([3, 5, 2, 7, 1], seed=4)
    source = HostPopulation.from_device(population) if where == "host" else population
    ids = np.array([1, 3, 4])
    sampled = sampled_population(source, ids)
    assert isinstance(sampled, type(source)) and sampled.num_clients == 3
    for j, i in enumerate(ids):
        for name, value in population.client(int(i)).items():
            np.testing.assert_array_equal(sampled.client(j)[name], value)


def _personal_models(task, num_clients, seed):
    params = task.model.init(jax.random.key(seed))
    keys = jax.random.split(jax.random.key(seed + 1), num_clients)
    return jax.vmap(lambda k: jax.tree.map(lambda p: p + jax.random.normal(k, p.shape), params))(keys)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["device", "host"])
def test_a_sampled_evaluation_is_the_full_ones_rows_of_those_clients(where):
    # Against the full evaluation as reference: each sampled client's metrics (global and personal
    # model; host-resident populations and personal models too), the summaries recomputed from
    # those rows, and the attacked mask, all restricted to the sample.
    dataset = _dataset(True)
    task = Task(make_model("linear", (5,), 3))
    params = task.model.init(jax.random.key(0))
    personal = _personal_models(task, dataset.train.num_clients, 2)
    corrupted = np.zeros(dataset.train.num_clients, bool)
    corrupted[[1, 6]] = True
    if where == "host":
        dataset = dataclasses.replace(
            dataset,
            train=HostPopulation.from_device(dataset.train),
            test=HostPopulation.from_device(dataset.test),
        )
        personal = HostPersonalModels(jax.device_get(personal))
    sample = evaluation_sample(dataset, 4, seed=3)
    full_summaries, full = make_evaluator(task, dataset, "num_examples", corrupted=corrupted)(
        params, personal
    )
    summaries, rows = make_evaluator(task, dataset, "num_examples", corrupted=corrupted, sample=sample)(
        params, personal
    )
    for name in ("train", "test"):
        ids = sample[name]
        np.testing.assert_array_equal(rows[name]["client"], ids)
        for column in ("num_examples", "loss", "error", "personal_loss", "personal_error", "attacked"):
            np.testing.assert_allclose(rows[name][column], full[name][column][ids], rtol=1e-5, atol=1e-6)
        benign = ~corrupted[ids]
        weights = full[name]["num_examples"][ids] * benign if name == "train" else benign.astype(float)
        for column, key in (("error", f"{name}_error"), ("personal_loss", f"personal_{name}_loss")):
            want = np.sum(weights * full[name][column][ids]) / np.sum(weights)
            np.testing.assert_allclose(summaries[key]["mean"], want, rtol=1e-5)
    assert full_summaries.keys() == summaries.keys()
    if where == "device":
        # A sweep's evaluator: each point (a leading axis) as alone.
        batched = make_evaluator(
            task, dataset, "num_examples", corrupted=corrupted, sample=sample, batched=True
        )
        stack = lambda tree: jax.tree.map(lambda x: np.stack([x, 2 * x]), tree)  # noqa: E731
        batch_summaries, batch_rows = batched(stack(params), stack(personal))
        np.testing.assert_allclose(
            batch_summaries["personal_test_error"]["mean"][0], summaries["personal_test_error"]["mean"]
        )
        np.testing.assert_allclose(
            batch_rows["train"]["personal_loss"][0], rows["train"]["personal_loss"], rtol=1e-6
        )
        np.testing.assert_array_equal(batch_rows["test"]["client"], sample["test"])
        # Without the training clients: the test rows alone, personal ones included.
        summaries, rows = make_evaluator(task, dataset, "num_examples", sample=sample, train=False)(
            params, personal
        )
        assert rows.keys() == {"test"} and not any("train" in key for key in summaries)
        np.testing.assert_allclose(
            rows["test"]["personal_error"], full["test"]["personal_error"][sample["test"]]
        )


def test_without_training_clients_the_personal_models_still_follow_the_training_sample():
    # --no-eval-train under personal splits: the test sample is the training one, whose ids pick the
    # personal models; the run reports only the populations it evaluated.
    from types import SimpleNamespace

    from jaxfl.experiment.runner import evaluated_sample, evaluation_clients

    config = SimpleNamespace(
        evaluation=SimpleNamespace(eval_clients=4, eval_train=False), runtime=SimpleNamespace(seed=3)
    )
    run = SimpleNamespace(config=config, dataset=_dataset(True))
    sample = evaluation_clients(run)
    np.testing.assert_array_equal(sample["train"], sample["test"])
    assert evaluated_sample(run).keys() == {"test"}
