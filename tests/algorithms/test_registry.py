"""The registry: every entry's hyperparameters and options are run settings
with the same defaults, options are checked, and the runner passes each
algorithm exactly its hyperparameters."""

import dataclasses
import re
import subprocess
import sys

import jax
import pytest
from algorithms.reference_rounds import LOCAL, SIZES, TASK

from jaxfl.algorithms import (
    SPECS,
    Engine,
    algorithm_names,
    build_algorithm,
    hparam_fields,
    server_optimizer,
)
from jaxfl.algorithms.base import no_personal_models
from jaxfl.algorithms.registry import DITTO_GLOBALS
from jaxfl.algorithms.stages import LOCAL_HPARAM_DEFAULTS
from jaxfl.experiment.config import FIELDS, RunConfig, make_config
from jaxfl.experiment.runner import (
    algorithm_hparams,
    algorithm_options,
    ignored_settings,
)
from jaxfl.training import ClientStrategy

ENGINE = Engine(
    TASK,
    LOCAL,
    4,
    ClientStrategy("vmap"),
    server_optimizer("sgd"),
    "num_examples",
    num_clients=len(SIZES),
)
DEFAULTS = RunConfig()


def test_the_published_cli_names_stay_registered():
    # Names users' scripts rely on; new algorithms only add to them.
    assert {
        "fedavg",
        "fedavg-sub",
        "fedsgd",
        "fedprox",
        "qffl",
        "afl",
        "term",
        "deltafl",
        "afl-qffl",
        # Issue 6: end-to-end differential privacy.
        "dp-fedavg",
        "dp-deltafl",
        # Issue 12: personalization.
        "ditto",
        "l2sgd",
        "apfl",
        "perfedavg",
        "mapper",
    } <= set(algorithm_names())


@pytest.mark.parametrize("name", list(SPECS))
def test_declared_settings_are_run_settings_with_the_same_defaults(name):
    spec = SPECS[name]
    for option, default in spec.option_defaults.items():
        assert option in FIELDS and DEFAULTS.setting(option) == default, option
    # Every option of every reweighting etc.: build with each choice.
    algorithm = build_algorithm(name, ENGINE)
    assert set(algorithm.hparam_defaults) == set(hparam_fields(name, algorithm))
    for field in hparam_fields(name, algorithm):
        assert field in FIELDS
        if field in LOCAL_HPARAM_DEFAULTS or DEFAULTS.setting(field) is None:
            continue
        assert algorithm.hparam_defaults[field] == float(DEFAULTS.setting(field)), (
            field
        )


@pytest.mark.parametrize("reweighting", ["threshold", "exact", "dp", "smoothed"])
def test_deltafl_takes_the_hyperparameters_of_its_reweighting(reweighting):
    algorithm = build_algorithm("deltafl", ENGINE, {"reweighting": reweighting})
    extra = set(hparam_fields("deltafl", algorithm)) - set(LOCAL_HPARAM_DEFAULTS)
    assert (
        extra
        == {
            "threshold": {"theta", "threshold_period"},
            "exact": {"theta"},
            "dp": {
                "theta",
                "threshold_period",
                "dp_loss_bound",
                "dp_sigma",
                "dp_scale",
            },
            "smoothed": {"theta", "smoothing"},
        }[reweighting]
    )


def test_runner_passes_each_algorithm_its_hyperparameters():
    config = make_config(
        dict(
            algorithm="deltafl,qffl,afl-qffl,fedprox",
            theta=0.3,
            q=None,
            mu=0.2,
            lr=0.05,
            reweighting="smoothed",
            smoothing=0.7,
        )
    )
    got = {}
    for name in config.algorithms:
        algorithm = build_algorithm(name, ENGINE, algorithm_options(config, name))
        got[name] = algorithm_hparams(config, name, algorithm)
        algorithm.init(TASK.model.init(__import__("jax").random.key(0)), got[name])
    assert got["deltafl"]["theta"] == 0.3 and got["deltafl"]["smoothing"] == 0.7
    assert (
        "q" not in got["qffl"] and "q" not in got["afl-qffl"]
    )  # Their defaults: 1, 10.
    assert got["fedprox"] == {**got["fedprox"], "mu": 0.2, "lr": 0.05}
    assert "theta" not in got["fedprox"]
    with_q = config.replace(q=2.0)
    algorithm = build_algorithm("afl-qffl", ENGINE)
    assert algorithm_hparams(with_q, "afl-qffl", algorithm)["q"] == 2.0


def test_settings_no_chosen_algorithm_uses_are_reported():
    config = make_config(dict(algorithm="fedavg,term", theta=0.3, tilt=2.0, mu=0.5))
    algorithms = {
        name: build_algorithm(name, ENGINE, algorithm_options(config, name))
        for name in config.algorithms
    }
    assert ignored_settings(config, algorithms) == ("mu", "theta")


def test_unknown_options_and_missing_population_size_raise():
    with pytest.raises(ValueError, match="deltafl has no option colour"):
        build_algorithm("deltafl", ENGINE, {"colour": "red"})
    with pytest.raises(ValueError, match="unknown algorithm 'fedfoo'"):
        build_algorithm("fedfoo", ENGINE)
    with pytest.raises(ValueError, match="num_clients"):
        build_algorithm("afl", dataclasses.replace(ENGINE, num_clients=None))


def test_the_configuration_reads_the_registry_without_jax():
    # The command line refuses bad settings and prints its help before JAX is imported.
    code = (
        "import sys, jaxfl.experiment.config as c, jaxfl.algorithms.registry as r; "
        "assert 'jax' not in sys.modules, sorted(m for m in sys.modules if m.startswith('jax'))"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("name", list(SPECS))
def test_what_an_entry_declares_is_what_its_algorithm_does(name):
    spec = SPECS[name]
    engine = dataclasses.replace(ENGINE, local=dataclasses.replace(LOCAL, batch_size=3))
    algorithm = build_algorithm(name, engine)
    state = jax.eval_shape(algorithm.init, TASK.model.init(jax.random.key(0)), {})
    model_size = sum(leaf.size for leaf in jax.tree.leaves(TASK.model.init(jax.random.key(0))))
    kept = sum(leaf.size for leaf in jax.tree.leaves(state.clients)) // (len(SIZES) * model_size)
    # Rows kept in the state; the declared count may add rows made at evaluation (APFL's mixtures).
    assert (kept > 0) == (spec.client_rows > 0) and kept <= spec.client_rows
    assert spec.personal_models == (algorithm.personal_models is not no_personal_models)
    assert spec.adapts_after_training == (algorithm.personalize is not None)
    assert spec.host_rows or spec.client_rows
    if spec.personal_models:
        assert spec.client_rows
    # The help of every setting it declares names it (or derives the names from here).
    unnamed = [
        setting
        for setting in (*spec.hparams, *spec.options)
        if setting not in spec.inherited
        and not re.search(rf"(^|[ ,(;]){re.escape(name)}[:, ]", FIELDS[setting].metadata["help"])
    ]
    assert not unnamed, f"the help of {unnamed} does not name {name}"


def test_ditto_takes_exactly_the_declared_global_solvers():
    for name in SPECS:
        engine = dataclasses.replace(ENGINE, num_clients=len(SIZES))
        if name in DITTO_GLOBALS:
            build_algorithm("ditto", engine, {"ditto_global": name})
        else:
            with pytest.raises(ValueError, match="ditto_global must be one of"):
                build_algorithm("ditto", engine, {"ditto_global": name})



def test_a_setting_is_declared_once_and_its_field_derived_from_the_declaration(monkeypatch):
    from jaxfl.algorithms import registry
    from jaxfl.settings import Setting

    # Every declared setting is a RunConfig setting with the declared default, help and range.
    for name, setting in registry.algorithm_settings().items():
        meta = FIELDS[name].metadata
        assert DEFAULTS.setting(name) == setting.default, name
        assert meta["help"] == f"{', '.join(registry.setting_users(name))}: {setting.help}"
        assert (meta["low"], meta["high"], meta["choices"]) == (setting.low, setting.high, setting.choices)
    # Two entries that declare one setting differently are refused.
    monkeypatch.setattr(registry, "SPECS", dict(registry.SPECS))
    registry.SPECS["other"] = registry.AlgorithmSpec(
        "jaxfl.algorithms.fedavg:from_engine", "x", hparams={"theta": Setting(0.7, "another theta")}
    )
    with pytest.raises(ValueError, match="other declares theta unlike the entries before it"):
        registry.algorithm_settings()
