"""RunConfig in sections: every setting in exactly one, flat names in and out, config files by section."""

import dataclasses
import json

import pytest

from jaxfl.algorithms.registry import algorithm_settings
from jaxfl.experiment.config import (
    DEFAULTS,
    FIELDS,
    SECTION_OF,
    SECTIONS,
    ConfigError,
    RunConfig,
    make_config,
    read_config_file,
    section_fields,
)


def test_every_setting_lives_in_exactly_one_section_under_its_flat_name():
    held = {}
    for section, cls in SECTIONS.items():
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, section
        for field in dataclasses.fields(cls):
            assert field.name not in held, (field.name, held.get(field.name), section)
            held[field.name] = section
    own = [f.name for f in dataclasses.fields(RunConfig) if f.name not in SECTIONS]
    assert own == ["task", "algorithm"]
    assert {**held, **dict.fromkeys(own)} == SECTION_OF
    assert set(SECTION_OF) == set(FIELDS) and not set(SECTION_OF) & set(SECTIONS)
    # The algorithms' settings are the options and privacy sections, by their declared section.
    for name, setting in algorithm_settings().items():
        assert SECTION_OF[name] == {"algorithm": "options", "privacy": "privacy"}[setting.section], name
    # --help's groups are the sections, in order, each naming its config-file table.
    titles = [RunConfig.TITLE, *(f"{cls.TITLE} [{section}]" for section, cls in SECTIONS.items())]
    assert list(section_fields()) == titles


def test_flat_names_in_and_out():
    config = make_config({"lr": 0.25, "rounds": 7, "theta": 0.3, "epsilon": 4.0, "seed": 5, "model": "mlp"})
    assert (config.local.lr, config.server.rounds, config.options.theta) == (0.25, 7, 0.3)
    assert (config.privacy.epsilon, config.runtime.seed, config.network.model) == (4.0, 5, "mlp")
    flat = config.to_dict()
    assert set(flat) == set(FIELDS) and all(flat[name] == config.setting(name) or name == "hidden_sizes"
                                            for name in FIELDS)
    assert RunConfig.from_settings({name: config.setting(name) for name in FIELDS}) == config
    assert RunConfig.from_settings(flat) == config  # hidden_sizes a tuple again, dataset_options copied.
    assert RunConfig.from_settings(flat).data.dataset_options is not flat["dataset_options"]
    assert json.loads(json.dumps(flat)) == flat  # config.json holds flat names.
    assert make_config(flat) == config
    # replace: a copy with flat-named settings changed; the original is frozen and unchanged.
    changed = config.replace(lr=0.5, eval_every=3)
    assert (changed.local.lr, changed.evaluation.eval_every, config.local.lr) == (0.5, 3, 0.25)
    assert changed.network == config.network and changed.network.hidden_sizes == (64,)
    assert changed.replace(lr=0.25, eval_every=config.evaluation.eval_every) == config
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.local.lr = 1.0  # type: ignore[misc]
    assert config.flat().lr == 0.25 and config.flat().theta == 0.3
    with pytest.raises(ConfigError, match="unknown setting 'learning_rate'"):
        config.replace(learning_rate=0.1)
    with pytest.raises(ConfigError, match="unknown setting 'learning_rate'"):
        config.setting("learning_rate")
    assert DEFAULTS == RunConfig() and DEFAULTS.local.lr == FIELDS["lr"].default


def test_config_files_may_group_settings_by_section(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('algorithm = "fedavg"\n[local]\nlr = 0.5\nbatch-size = 4\n[server]\nrounds = 9\n'
                    '[options]\ntheta = 0.2\n')
    assert read_config_file(toml) == {"algorithm": "fedavg", "lr": 0.5, "batch_size": 4, "rounds": 9,
                                      "theta": 0.2}
    as_json = tmp_path / "run.json"
    as_json.write_text(json.dumps({"runtime": {"seed": 3}, "eval_every": 2}))
    assert read_config_file(as_json) == {"seed": 3, "eval_every": 2}
    for text, words in [
        ("[local]\nrounds = 3\n", "rounds is a setting of server, not of section local"),
        ("[server]\nalgorithm = 'fedavg'\n", "algorithm is a setting of the top level"),
        ("local = 3\n", "local is a section: it must hold a table"),
        ("[model]\nmodel = 'mlp'\n",
         r"\[model\] is not a section \(the tables are data, network, .*\): model is a setting of network"),
        ("[local]\nlearning_rate = 3\n", "unknown setting 'learning_rate'"),
        ("[local]\nlr = -1\n", "lr must be > 0.0"),
        ("lr = 0.1\n[local]\nlr = 0.2\n", r"sets lr twice \('lr' and 'local.lr'\)"),
    ]:
        toml.write_text(text)
        with pytest.raises(ConfigError, match=words):
            read_config_file(toml)
