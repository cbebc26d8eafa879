"""jaxfl.attacks against the loop references of numpy_reference.py, under jit and vmap."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attacks import numpy_reference as ref
from scipy import stats

from jaxfl.attacks import (
    ATTACKS,
    DATA_ATTACKS,
    THESIS_PRESETS,
    UPDATE_ATTACKS,
    alie_z,
    attack_options,
    attack_updates,
    corrupted_clients,
    poison_features,
)
from jaxfl.attacks.corruption import _client_order

# --------------------------------------------------------------------------- updates

M = 6
# Client 0, 4: attacked participants; 2: attacked with weight 0; 1, 3: benign
# participants; 5: benign with weight 0.
ATTACKED = np.array([True, False, True, False, True, False])
WEIGHTS = np.array([1.5, 2.0, 0.0, 1.0, 3.0, 0.0], np.float32)
UNTOUCHED = [1, 2, 3, 5]
FORGED = [0, 4]
READS_BENIGN = ("omniscient", "alie", "ipm")


def small_updates(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "w": rng.normal(0.3, 1.0, (M, 3, 4)).astype(np.float32),
        "b": rng.normal(-0.2, 2.0, (M, 5)).astype(np.float32),
    }


@functools.cache
def jitted(attack, options=()):
    opts = dict(options)
    return jax.jit(lambda u, a, w, k: attack_updates(attack, u, a, w, k, options=opts))


def run(attack, updates, attacked=ATTACKED, weights=WEIGHTS, key=0, options=()):
    out = jitted(attack, tuple(sorted(options.items())) if isinstance(options, dict) else options)(
        updates, jnp.asarray(attacked), jnp.asarray(weights), jax.random.key(key)
    )
    return {name: np.asarray(leaf) for name, leaf in out.items()}


def bits(x):
    return np.asarray(x).view(np.uint32)


def assert_rows_bit_identical(out, updates, rows):
    for name in updates:
        np.testing.assert_array_equal(bits(out[name][rows]), bits(updates[name][rows]))


def reference(attack, updates, attacked, weights, options):
    w = [float(v) for v in weights]
    if attack == "model-replacement":
        return ref.scaled(updates, attacked, w, options.get("scale", len(attacked)))
    if attack == "sign-flip":
        return ref.scaled(updates, attacked, w, -options.get("scale", 1.0))
    if attack == "omniscient":
        return ref.omniscient(updates, attacked, w, options.get("reference", "benign"))
    if attack == "alie":
        return ref.alie(updates, attacked, w, options.get("z"))
    if attack == "ipm":
        return ref.ipm(updates, attacked, w, options.get("epsilon", 0.1))
    raise AssertionError(attack)


DETERMINISTIC_CASES = [
    ("model-replacement", {}),
    ("model-replacement", {"scale": 2.5}),
    ("sign-flip", {}),
    ("sign-flip", {"scale": 3.0}),
    ("omniscient", {}),
    ("omniscient", {"reference": "all"}),
    ("alie", {}),
    ("alie", {"z": 1.5}),
    ("ipm", {}),
    ("ipm", {"epsilon": 2.0}),
]


@pytest.mark.parametrize("attack,options", DETERMINISTIC_CASES)
def test_deterministic_attacks_match_the_loop_reference(attack, options):
    updates = small_updates()
    out = run(attack, updates, options=options)
    expected = reference(attack, updates, ATTACKED, WEIGHTS, options)
    for name in updates:
        np.testing.assert_allclose(out[name], expected[name], rtol=2e-5, atol=2e-6)
        assert out[name].dtype == np.float32
    assert_rows_bit_identical(out, updates, UNTOUCHED)
    # The forged rows did change.
    assert not np.allclose(out["b"][FORGED], updates["b"][FORGED])


@pytest.mark.parametrize(
    "attack,scale", [("model-replacement", M), ("model-replacement", 2.5), ("sign-flip", 3.0)]
)
def test_scaling_attacks_are_exactly_the_float32_product(attack, scale):
    updates = small_updates()
    options = {} if scale == M else {"scale": scale}
    out = run(attack, updates, options=options)
    factor = np.float32(scale)
    for name, leaf in updates.items():
        expected = leaf[FORGED] * factor
        expected = -expected if attack == "sign-flip" else expected
        np.testing.assert_array_equal(bits(out[name][FORGED]), bits(expected))


def weighted_mean(tree, weights, rows):
    total = sum(float(weights[i]) for i in rows)
    return {
        name: sum(float(weights[i]) * leaf[i].astype(np.float64) for i in rows) / total
        for name, leaf in tree.items()
    }


def test_omniscient_makes_the_weighted_mean_the_negated_reference_mean():
    updates = small_updates(1)
    participants = [i for i in range(M) if WEIGHTS[i] > 0]
    benign = [i for i in participants if not ATTACKED[i]]
    out = run("omniscient", updates)
    sent, target = weighted_mean(out, WEIGHTS, participants), weighted_mean(updates, WEIGHTS, benign)
    out_all = run("omniscient", updates, options={"reference": "all"})
    sent_all = weighted_mean(out_all, WEIGHTS, participants)
    target_all = weighted_mean(updates, WEIGHTS, participants)
    for name in updates:
        np.testing.assert_allclose(sent[name], -target[name], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(sent_all[name], -target_all[name], rtol=1e-5, atol=1e-5)
        # Every attacker sends the same vector.
        np.testing.assert_array_equal(out[name][0], out[name][4])


def test_alie_sends_mu_minus_z_sigma_of_the_benign_participants():
    updates = small_updates(2)
    out = run("alie", updates)
    benign = [1, 3]
    n, f = 4, 2  # participants 0, 1, 3, 4; attacked 0, 4: s = 3 - 2 = 1, z = Phi^-1(3/4).
    z = stats.norm.ppf((n - (math.floor(n / 2 + 1) - f)) / n)
    for name, leaf in updates.items():
        rows = leaf[benign].astype(np.float64)
        expected = rows.mean(axis=0) - z * rows.std(axis=0)
        np.testing.assert_allclose(out[name][0], expected, rtol=1e-5, atol=1e-6)


def test_alie_z_matches_the_paper_formula_and_the_documented_clamps():
    grid = [(n, f) for n in range(0, 13) for f in range(0, n + 1)]
    ns, fs = (jnp.array(v, jnp.int32) for v in zip(*grid, strict=True))
    z = np.asarray(jax.jit(jax.vmap(alie_z))(ns, fs))
    assert np.all(np.isfinite(z)) and np.all(z >= 0)
    for (n, f), value in zip(grid, z, strict=True):
        np.testing.assert_allclose(value, ref.alie_z(n, f), rtol=1e-5, atol=1e-6)
        if 1 <= f <= n // 2:  # The paper's range: no clamp.
            s = math.floor(n / 2 + 1) - f
            np.testing.assert_allclose(value, stats.norm.ppf((n - s) / n), rtol=1e-5, atol=1e-6)


def test_ipm_is_minus_epsilon_times_the_weighted_benign_mean():
    updates = small_updates(3)
    out = run("ipm", updates, options={"epsilon": 2.0})
    mean = weighted_mean(updates, WEIGHTS, [1, 3])
    for name in updates:
        np.testing.assert_allclose(out[name][4], -2.0 * mean[name], rtol=1e-5, atol=1e-6)


# Statistics of the random attacks: D entries per client, two leaves whose
# spreads differ (so a per-leaf std would be caught), clients of different scale.
BIG_ATTACKED = np.array([True, True, False, True])
BIG_WEIGHTS = np.ones(4, np.float32)


def big_updates():
    rng = np.random.default_rng(7)
    scale = np.array([0.5, 1.0, 2.0, 4.0], np.float32)
    # Leaf means 3 and -1 (so a std that forgot the mean, an rms, is caught), stds 1 and 3.
    a = rng.normal(3.0, 1.0, (4, 3000)) * scale[:, None]
    b = rng.normal(-1.0, 3.0, (4, 20, 50)) * scale[:, None, None]
    return {"a": a.astype(np.float32), "b": b.astype(np.float32)}


def check_gaussian_rows(out, rows, stds):
    """Each leaf row of each attacked client is N(0, std^2): mean, std, KS; independent rows and leaves."""
    for i, std in zip(rows, stds, strict=True):
        for name in out:
            sample = out[name][i].astype(np.float64).ravel()
            d = sample.size
            # The sample std of d normals has sd std / sqrt(2 d); its mean sd std / sqrt(d). 5 sigma.
            assert abs(sample.std() - std) < 5 * std / math.sqrt(2 * d), (i, name, sample.std(), std)
            assert abs(sample.mean()) < 5 * std / math.sqrt(d), (i, name, sample.mean())
            assert stats.kstest(sample / std, "norm").pvalue > 1e-6
        corr = np.corrcoef(out["a"][i][:1000], out["b"][i].ravel())[0, 1]
        assert abs(corr) < 5 / math.sqrt(1000)
    corr = np.corrcoef(out["a"][rows[0]], out["a"][rows[1]])[0, 1]
    assert abs(corr) < 5 / math.sqrt(3000)


def test_random_updates_have_each_clients_own_population_std():
    updates = big_updates()
    out = run("random-updates", updates, BIG_ATTACKED, BIG_WEIGHTS)
    stds = [ref.client_std(updates, i) for i in (0, 1, 3)]
    assert stds[2] > 7 * stds[0]
    check_gaussian_rows(out, [0, 1, 3], stds)
    assert_rows_bit_identical(out, updates, [2])


def test_gaussian_has_the_std_option():
    updates = big_updates()
    out = run("gaussian", updates, BIG_ATTACKED, BIG_WEIGHTS, options={"std": 0.7})
    check_gaussian_rows(out, [0, 1, 3], [0.7, 0.7, 0.7])
    zero = run("gaussian", updates, BIG_ATTACKED, BIG_WEIGHTS, options={"std": 0.0})
    assert np.all(zero["a"][[0, 1, 3]] == 0) and np.all(zero["b"][[0, 1, 3]] == 0)


@pytest.mark.parametrize("attack", ["random-updates", "gaussian"])
def test_random_attacks_are_deterministic_in_the_key_and_per_client(attack):
    updates = small_updates()
    first, again, other = (run(attack, updates, key=k) for k in (0, 0, 1))
    fewer = run(attack, updates, attacked=np.array([True, False, False, False, True, False]))
    for name in updates:
        np.testing.assert_array_equal(bits(first[name]), bits(again[name]))
        assert not np.any(first[name][FORGED] == other[name][FORGED])
        # A client's noise does not depend on which other clients are attacked.
        np.testing.assert_array_equal(bits(first[name][[0, 4]]), bits(fewer[name][[0, 4]]))


def test_gaussian_noise_of_client_i_comes_from_fold_in_key_i():
    updates = small_updates()
    out = run("gaussian", updates, key=5)
    for i in FORGED:
        leaf_keys = jax.random.split(jax.random.fold_in(jax.random.key(5), i), 2)
        # Leaves are flattened in sorted key order: "b", then "w".
        for j, name in enumerate(["b", "w"]):
            expected = np.asarray(jax.random.normal(leaf_keys[j], updates[name].shape[1:]))
            np.testing.assert_allclose(out[name][i], expected, rtol=1e-6)


@pytest.mark.parametrize("attack", UPDATE_ATTACKS)
def test_non_participants_never_propagate_and_are_bit_identical(attack):
    updates = small_updates()
    for leaf in updates.values():
        leaf[5] = np.nan  # A benign client with weight 0.
        leaf[2] = np.inf  # An attacked client with weight 0.
        leaf[5].flat[0] = -np.inf
    out = run(attack, updates)
    assert_rows_bit_identical(out, updates, UNTOUCHED)
    for name in updates:
        assert np.all(np.isfinite(out[name][FORGED]))


@pytest.mark.parametrize("attack", UPDATE_ATTACKS)
def test_a_non_finite_benign_participant_propagates_only_into_attacks_that_read_it(attack):
    updates = small_updates()
    updates["b"][1, 2] = np.nan
    out = run(attack, updates)
    assert_rows_bit_identical(out, updates, UNTOUCHED)
    forged = out["b"][FORGED]
    if attack in READS_BENIGN:
        # Documented: the NaN reaches the coordinates computed from it, and only those.
        assert np.all(np.isnan(forged[:, 2]))
        assert np.all(np.isfinite(np.delete(forged, 2, axis=1))) and np.all(np.isfinite(out["w"][FORGED]))
    else:
        assert np.all(np.isfinite(forged))


DEGENERATE = {
    # No benign participant: the statistics fall back to the attackers' own updates.
    "no benign participant": (np.array([True, False, True, False, True, False]), [1.0, 0, 2.0, 0, 3.0, 0]),
    "one participant, attacked": (np.array([True] * M), [0, 0, 0, 2.0, 0, 0]),
    "attacked majority": (np.array([True, True, True, True, True, False]), [1.0] * M),
    "no attacked participant": (np.array([True, False, False, False, False, False]), [0, 1.0, 1, 1, 1, 1]),
    "no participant": (np.array([True] * M), [0.0] * M),
}


@pytest.mark.parametrize("case", sorted(DEGENERATE))
@pytest.mark.parametrize("attack", UPDATE_ATTACKS)
def test_degenerate_cohorts_and_zero_updates_give_finite_forgeries(attack, case):
    attacked, weights = DEGENERATE[case]
    weights = np.array(weights, np.float32)
    forged = [i for i in range(M) if attacked[i] and weights[i] > 0]
    kept = [i for i in range(M) if i not in forged]
    for updates in (small_updates(4), {name: np.zeros_like(v) for name, v in small_updates().items()}):
        out = run(attack, updates, attacked, weights)
        assert_rows_bit_identical(out, updates, kept)
        for name in updates:
            assert np.all(np.isfinite(out[name]))
            if not np.any(updates[name]) and attack != "gaussian":
                assert np.all(out[name] == 0)  # Zero-std / zero-mean updates forge zeros, not NaN.
        if attack in ("omniscient", "alie", "ipm", "model-replacement", "sign-flip") and forged:
            expected = reference(attack, updates, attacked, weights, {})
            for name in updates:
                np.testing.assert_allclose(out[name], expected[name], rtol=2e-5, atol=2e-6)


def test_omniscient_without_benign_participants_sends_the_negated_attackers_mean():
    updates = small_updates(5)
    attacked, weights = DEGENERATE["no benign participant"]
    weights = np.array(weights, np.float32)
    out = run("omniscient", updates, attacked, weights)
    mean = weighted_mean(updates, weights, [0, 2, 4])
    for name in updates:
        for i in (0, 2, 4):
            np.testing.assert_allclose(out[name][i], -mean[name], rtol=1e-5, atol=1e-6)


VMAP_ATTACKS = ("alie", "omniscient", "gaussian", "random-updates", "ipm")


@pytest.mark.slow
def test_attacks_vmap_over_a_sweep_axis():
    g = 3
    rng = np.random.default_rng(11)
    updates = {name: np.stack([small_updates(s)[name] for s in range(g)]) for name in ("w", "b")}
    attacked = rng.random((g, M)) < 0.5
    attacked[:, 0] = True
    weights = rng.uniform(0.0, 2.0, (g, M)).astype(np.float32)
    weights[:, 0] = 1.0
    keys = jax.random.split(jax.random.key(3), g)
    for attack in VMAP_ATTACKS:
        swept = jax.jit(jax.vmap(lambda u, a, w, k, attack=attack: attack_updates(attack, u, a, w, k)))(
            updates, attacked, weights, keys
        )
        for s in range(g):
            one = jitted(attack, ())({n: v[s] for n, v in updates.items()}, attacked[s], weights[s], keys[s])
            for name in updates:
                np.testing.assert_allclose(swept[name][s], one[name], rtol=1e-6, atol=1e-6)
    # A traced option: a sweep over the model-replacement scale.
    scales = jnp.array([1.0, 2.0, 10.0])
    swept = jax.jit(
        jax.vmap(
            lambda u, a, w, k, s: attack_updates("model-replacement", u, a, w, k, options={"scale": s}),
            in_axes=(None, None, None, None, 0),
        )
    )(small_updates(), ATTACKED, WEIGHTS, jax.random.key(0), scales)
    for s, scale in enumerate([1.0, 2.0, 10.0]):
        expected = ref.scaled(small_updates(), ATTACKED, list(map(float, WEIGHTS)), scale)
        for name in expected:
            np.testing.assert_allclose(swept[name][s], expected[name], rtol=1e-6)


BAD_OPTIONS = [
    ("sign-flip", {"scale": 0.0}),
    ("sign-flip", {"scale": -1.0}),
    ("model-replacement", {"scale": float("nan")}),
    ("model-replacement", {"scale": "big"}),
    ("gaussian", {"std": -0.1}),
    ("gaussian", {"std": float("inf")}),
    ("ipm", {"epsilon": 0.0}),
    ("alie", {"z": float("inf")}),
    ("alie", {"z": True}),
    ("alie", {"z": np.ones(2)}),
    ("omniscient", {"reference": "attacked"}),
    ("gaussian", {"scale": 1.0}),
    ("random-updates", {"std": 1.0}),
]


@pytest.mark.parametrize("attack,options", BAD_OPTIONS)
def test_bad_options_raise_one_line(attack, options):
    with pytest.raises(ValueError) as error:
        attack_updates(attack, small_updates(), ATTACKED, WEIGHTS, jax.random.key(0), options=options)
    assert "\n" not in str(error.value)


def test_bad_names_and_shapes_raise():
    updates, key = small_updates(), jax.random.key(0)
    cases = [
        lambda: attack_updates("boost", updates, ATTACKED, WEIGHTS, key),
        lambda: attack_updates("random-labels", updates, ATTACKED, WEIGHTS, key),
        lambda: attack_updates("alie", updates, ATTACKED[:5], WEIGHTS, key),
        lambda: attack_updates("alie", updates, ATTACKED.astype(np.int32), WEIGHTS, key),
        lambda: attack_updates("alie", updates, ATTACKED, WEIGHTS[:5], key),
        lambda: attack_updates("alie", {"w": updates["w"], "b": updates["b"][:5]}, ATTACKED, WEIGHTS, key),
        lambda: attack_updates("alie", {"i": np.ones((M, 2), np.int32)}, ATTACKED, WEIGHTS, key),
        lambda: attack_updates("alie", updates, ATTACKED, WEIGHTS, key, options=[("z", 1.0)]),
        lambda: attack_options("boost"),
    ]
    for case in cases:
        with pytest.raises(ValueError) as error:
            case()
        assert "\n" not in str(error.value)


def test_names_and_options():
    assert set(ATTACKS) == set(DATA_ATTACKS) | set(UPDATE_ATTACKS)
    assert not set(DATA_ATTACKS) & set(UPDATE_ATTACKS)
    assert THESIS_PRESETS == {"A1": "random-labels", "A2": "random-updates", "A3": "model-replacement"}
    assert attack_options("model-replacement") == {"scale": None}
    assert attack_options("sign-flip") == {"scale": 1.0}
    assert attack_options("gaussian") == {"std": 1.0}
    assert attack_options("ipm") == {"epsilon": 0.1}
    assert attack_options("alie") == {"z": None}
    assert attack_options("omniscient") == {"reference": "benign"}
    assert attack_options("random-labels") == {}
    attack_options("ipm")["epsilon"] = 5.0
    assert attack_options("ipm") == {"epsilon": 0.1}
    # Every update attack accepts its own defaults, spelled out.
    updates = small_updates()
    for attack in UPDATE_ATTACKS:
        explicit = jitted(attack, tuple(sorted(attack_options(attack).items())))(
            updates, ATTACKED, WEIGHTS, jax.random.key(0)
        )
        default = run(attack, updates)
        for name in updates:
            np.testing.assert_array_equal(bits(explicit[name]), bits(default[name]))


# --------------------------------------------------------------------------- corrupted clients


@pytest.mark.parametrize(
    "num_clients,fraction,expected",
    [(0, 0.5, 0), (1, 0.5, 1), (1, 0.4, 0), (7, 0.0, 0), (7, 1.0, 7), (10, 0.25, 3), (10, 0.2, 2),
     (10, 0.5, 5), (100, 0.1, 10), (100, 0.8, 80), (8, 0.3125, 3)],
)
def test_unit_clients_corrupts_exactly_round_fraction_n(num_clients, fraction, expected):
    corrupted = corrupted_clients(jax.random.key(1), np.ones(num_clients, np.int32), fraction)
    assert corrupted.dtype == bool and corrupted.shape == (num_clients,)
    assert corrupted.sum() == expected


@pytest.mark.parametrize("fraction", [0.0, 0.01, 0.1, 0.25, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_unit_examples_is_rfas_prefix_rule(fraction, seed):
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 50, 40)
    key = jax.random.key(seed)
    corrupted = corrupted_clients(key, counts, fraction, unit="examples")
    order = _client_order(key, len(counts))
    np.testing.assert_array_equal(corrupted, ref.prefix_until_fraction(order, counts, fraction))
    # The same rule, stated without the order: at least the fraction, and minimal.
    target, held = fraction * counts.sum(), counts[corrupted].sum()
    assert held >= target
    if target > 0:
        assert any(held - counts[c] < target for c in np.flatnonzero(corrupted))
    else:
        assert not corrupted.any()
    # unit="clients" takes a prefix of the same order.
    by_clients = corrupted_clients(key, counts, fraction)
    assert set(np.flatnonzero(by_clients)) == set(order[: round(fraction * 40)])


@pytest.mark.parametrize(
    "counts,fraction,expected",
    [([4] * 8, 0.25, 2), ([4] * 8, 0.5, 4), ([2, 0, 2, 0, 2, 0, 2], 0.5, None), ([0, 0, 3], 1.0, None)],
)
def test_unit_examples_stops_when_the_target_is_reached_exactly(counts, fraction, expected):
    counts = np.array(counts)
    key = jax.random.key(4)
    corrupted = corrupted_clients(key, counts, fraction, unit="examples")
    assert counts[corrupted].sum() == fraction * counts.sum()
    if expected is not None:
        assert corrupted.sum() == expected
    reference = ref.prefix_until_fraction(_client_order(key, len(counts)), counts, fraction)
    np.testing.assert_array_equal(corrupted, reference)


def test_corrupted_clients_is_deterministic_nested_and_uniform():
    counts = np.arange(1, 101)
    key = jax.random.key(9)
    for unit in ("clients", "examples"):
        first = corrupted_clients(key, counts, 0.3, unit=unit)
        np.testing.assert_array_equal(first, corrupted_clients(key, counts, 0.3, unit=unit))
        raw = corrupted_clients(jax.random.key_data(key), counts, 0.3, unit=unit)
        np.testing.assert_array_equal(first, raw)
        assert not np.array_equal(first, corrupted_clients(jax.random.key(10), counts, 0.3, unit=unit))
        previous = np.zeros(100, bool)
        for fraction in (0.1, 0.2, 0.5, 0.8, 1.0):
            current = corrupted_clients(key, counts, fraction, unit=unit)
            assert np.all(current[previous])
            previous = current
    # Uniform without replacement: each of 10 clients is in a 3-subset with probability 0.3.
    draws = 3000
    keys = jax.random.split(jax.random.key(0), draws)
    hits = sum(corrupted_clients(keys[i], np.ones(10, np.int32), 0.3).astype(int) for i in range(draws))
    sd = math.sqrt(draws * 0.3 * 0.7)
    assert np.all(np.abs(hits - 0.3 * draws) < 5 * sd), hits


@pytest.mark.parametrize(
    "kwargs",
    [dict(fraction=-0.1), dict(fraction=1.1), dict(fraction=float("nan")), dict(fraction="0.5"),
     dict(fraction=True), dict(fraction=0.5, unit="devices"), dict(fraction=0.5, counts=np.ones((2, 2), int)),
     dict(fraction=0.5, counts=np.array([1, -1])), dict(fraction=0.5, counts=np.ones(3)),
     dict(fraction=0.5, key=jax.random.split(jax.random.key(0), 2))],
)
def test_corrupted_clients_refuses_bad_arguments(kwargs):
    kwargs = {"key": jax.random.key(0), "counts": np.ones(5, int), **kwargs}
    with pytest.raises(ValueError) as error:
        corrupted_clients(kwargs.pop("key"), kwargs.pop("counts"), kwargs.pop("fraction"), **kwargs)
    assert "\n" not in str(error.value)


# --------------------------------------------------------------------------- data attacks


@functools.cache
def poison_jitted(attack, num_classes, pad_id=None):
    return jax.jit(
        lambda k, f, m: poison_features(k, f, m, attack, num_classes=num_classes, pad_id=pad_id)
    )


def example_features(num_examples, seed=0, sequence=None, num_classes=10):
    rng = np.random.default_rng(seed)
    shape = (num_examples,) if sequence is None else (num_examples, sequence)
    return {
        "x": rng.normal(size=(num_examples, 3, 2)).astype(np.float32),
        "y": rng.integers(0, num_classes, shape).astype(np.int32),
        "weight": rng.random(num_examples).astype(np.float32),
    }


def corrupted_mask(num_examples, seed=1):
    return np.random.default_rng(seed).random(num_examples) < 0.5


@pytest.mark.parametrize(
    "attack,num_classes,pad_id,sequence",
    [("label-flip", 10, None, None), ("label-flip", 2, None, None), ("label-shift-7", 10, None, None),
     ("label-flip", 7, 0, 5), ("label-shift-7", 9, 0, 5), ("label-shift-7", 62, None, None)],
)
def test_deterministic_label_attacks_match_the_loop_reference(attack, num_classes, pad_id, sequence):
    features = example_features(300, sequence=sequence, num_classes=num_classes)
    mask = corrupted_mask(300)
    out = poison_jitted(attack, num_classes, pad_id)(jax.random.key(0), features, mask)
    expected = features["y"].copy()
    expected[mask] = ref.relabel(features["y"][mask], attack, num_classes, pad_id)
    np.testing.assert_array_equal(np.asarray(out["y"]), expected)
    if num_classes == 2:
        np.testing.assert_array_equal(np.asarray(out["y"])[mask], 1 - features["y"][mask])
    for name in ("x", "weight"):
        np.testing.assert_array_equal(bits(out[name]), bits(features[name]))


def test_random_labels_are_uniform_on_corrupted_examples_only():
    num_examples, num_classes = 20000, 10
    features = example_features(num_examples)
    mask = corrupted_mask(num_examples)
    poison = poison_jitted("random-labels", num_classes)
    out = np.asarray(poison(jax.random.key(0), features, mask)["y"])
    np.testing.assert_array_equal(out[~mask], features["y"][~mask])
    labels = out[mask]
    observed = np.bincount(labels, minlength=num_classes)
    assert observed.size == num_classes
    chi2 = ((observed - labels.size / num_classes) ** 2 / (labels.size / num_classes)).sum()
    assert chi2 < stats.chi2.ppf(1 - 1e-6, num_classes - 1)
    # Independent of the original label: it is kept with probability 1/C.
    kept = np.mean(labels == features["y"][mask])
    assert abs(kept - 1 / num_classes) < 5 * math.sqrt(0.1 * 0.9 / labels.size)
    np.testing.assert_array_equal(out, np.asarray(poison(jax.random.key(0), features, mask)["y"]))
    assert not np.array_equal(out, np.asarray(poison(jax.random.key(1), features, mask)["y"]))


def test_random_labels_on_sequences_draw_per_position_and_keep_padding():
    num_examples, length, num_classes, pad = 4000, 6, 8, 0
    features = example_features(num_examples, sequence=length, num_classes=num_classes)
    features["y"][:, -2:] = pad  # Padded tails.
    mask = corrupted_mask(num_examples)
    out = np.asarray(poison_jitted("random-labels", num_classes, pad)(jax.random.key(2), features, mask)["y"])
    np.testing.assert_array_equal(out[~mask], features["y"][~mask])
    np.testing.assert_array_equal(out[:, -2:], pad)
    real = out[mask][features["y"][mask] != pad]
    assert np.all(real != pad) and np.all((real >= 1) & (real < num_classes))
    observed = np.bincount(real, minlength=num_classes)[1:]
    chi2 = ((observed - real.size / 7) ** 2 / (real.size / 7)).sum()
    assert chi2 < stats.chi2.ppf(1 - 1e-6, 6)
    # One draw per position, not one per example.
    heads = out[mask][:, :4]
    assert np.mean(np.all(heads == heads[:, :1], axis=1)) < 0.01


def test_input_attacks_touch_only_corrupted_inputs():
    features = example_features(50)
    mask = corrupted_mask(50)
    for attack, expected in (("negate-inputs", -features["x"]), ("invert-inputs", 1 - features["x"])):
        out = poison_jitted(attack, None)(jax.random.key(0), features, mask)
        np.testing.assert_array_equal(np.asarray(out["x"])[mask], expected[mask])
        np.testing.assert_array_equal(bits(np.asarray(out["x"])[~mask]), bits(features["x"][~mask]))
        np.testing.assert_array_equal(np.asarray(out["y"]), features["y"])
        np.testing.assert_array_equal(bits(out["weight"]), bits(features["weight"]))


def test_other_features_are_passed_through_as_they_are():
    features = example_features(8)
    for attack in DATA_ATTACKS:
        out = poison_features(jax.random.key(0), features, corrupted_mask(8), attack, num_classes=10)
        assert set(out) == set(features)
        untouched = ["weight", "x" if attack.startswith(("random", "label")) else "y"]
        assert all(out[name] is features[name] for name in untouched)


def test_data_attacks_refuse_bad_arguments():
    features, mask, key = example_features(10), corrupted_mask(10), jax.random.key(0)
    float_y = {**features, "y": np.ones(10, np.float32)}
    indicator_y = {**features, "y": np.ones((10, 4), np.uint8)}
    cases = [
        lambda: poison_features(key, features, mask, "label-swap", num_classes=10),
        lambda: poison_features(key, features, mask, "sign-flip", num_classes=10),
        lambda: poison_features(key, {"x": features["x"]}, mask, "random-labels", num_classes=10),
        lambda: poison_features(key, features, mask, "random-labels"),
        lambda: poison_features(key, features, mask, "random-labels", num_classes=1),
        lambda: poison_features(key, features, mask, "label-shift-7", num_classes=14),
        lambda: poison_features(key, features, mask, "random-labels", num_classes=10, pad_id=10),
        lambda: poison_features(key, features, mask[:9], "random-labels", num_classes=10),
        lambda: poison_features(key, features, mask.astype(np.int32), "random-labels", num_classes=10),
        lambda: poison_features(key, float_y, mask, "label-flip", num_classes=2),
        lambda: poison_features(key, indicator_y, mask, "label-flip", num_classes=2),
        lambda: poison_features(key, {**features, "x": np.ones((10, 4), np.int32)}, mask, "negate-inputs"),
    ]
    for case in cases:
        with pytest.raises(ValueError) as error:
            case()
        assert "\n" not in str(error.value)
