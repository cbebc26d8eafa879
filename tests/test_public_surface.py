"""The public surface: `jaxfl.__all__` names resolve lazily (importing jaxfl
does not import JAX), every algorithm module's factory is public, and the
API reference builds from the docstrings."""

import importlib
import inspect
import subprocess
import sys
import types
from pathlib import Path

import pytest

from reference import imported_script

import jaxfl

ROOT = Path(__file__).resolve().parents[1]


def test_every_public_name_resolves_and_is_documented():
    for name in jaxfl.__all__:
        value = getattr(jaxfl, name)
        if callable(value):
            assert inspect.getdoc(value), f"jaxfl.{name} has no docstring"


def test_importing_jaxfl_does_not_import_jax():
    # dir() lists the lazy names before any is used (tab completion sees them).
    code = (
        "import sys, jaxfl; assert 'jax' not in sys.modules and 'compose_round' in dir(jaxfl); "
        "jaxfl.fedavg; assert 'jax' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_algorithm_module_s_factory_is_public():
    # jaxfl/algorithms/NAME.py defining NAME(...) is an algorithm factory.
    factories = []
    for path in sorted((ROOT / "jaxfl" / "algorithms").glob("*.py")):
        module = importlib.import_module(f"jaxfl.algorithms.{path.stem}")
        if inspect.isfunction(getattr(module, path.stem, None)):
            factories.append(path.stem)
    assert len(factories) >= 20
    assert set(factories) <= set(jaxfl.__all__), set(factories) - set(jaxfl.__all__)


@pytest.mark.slow
def test_the_api_reference_builds(tmp_path):
    with imported_script(ROOT / "scripts" / "build_api_reference.py") as script:
        script.build(tmp_path, modules=("jaxfl", "jaxfl.algorithms.stages"))
    page = (tmp_path / "jaxfl.html").read_text()
    for name in ("compose_round", "SelectStage", "scaffold", "run_algorithm"):
        assert name in page
    stages = (tmp_path / "jaxfl" / "algorithms" / "stages.html").read_text()
    assert "per-client state" in stages


@pytest.mark.slow
def test_the_write_your_own_algorithm_page_runs(capsys, monkeypatch):
    # Its Python blocks, in order, in one namespace: the FedNova built there trains, and its
    # registry entry (made in a copy of the registry) declares its setting and builds it.
    from jaxfl.algorithms import registry

    monkeypatch.setattr(registry, "SPECS", dict(registry.SPECS))
    page = (ROOT / "docs" / "write-an-algorithm.md").read_text()
    blocks = [block.split("```", 1)[0] for block in page.split("```python\n")[1:]]
    assert len(blocks) == 3
    namespace = {}
    for block in blocks:
        exec(compile(block, "write-an-algorithm.md", "exec"), namespace)
    out = capsys.readouterr().out
    assert out.startswith("round 5: train loss ") and "tau_eff" in out
    assert registry.setting_users("my_decay") == ["my-fednova"]
    assert registry.algorithm_settings()["my_decay"].default == 0.5
    # The entry's factory, found where it says, is built from a run's shared pieces.
    module = types.ModuleType("my_package.my_fednova")
    module.my_fednova = namespace["my_fednova"]
    monkeypatch.setitem(sys.modules, "my_package", types.ModuleType("my_package"))
    monkeypatch.setitem(sys.modules, "my_package.my_fednova", module)
    jaxfl, task = namespace["jaxfl"], namespace["task"]
    engine = jaxfl.Engine(
        task, jaxfl.LocalTraining(batch_size=10), 10, jaxfl.ClientStrategy("vmap"),
        jaxfl.server_optimizer("sgd"), "num_examples",
    )
    assert registry.build_algorithm("my-fednova", engine).name == "my-fednova"
    assert len(blocks[0].strip().splitlines()) <= 32
