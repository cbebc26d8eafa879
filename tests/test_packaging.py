"""The package layout: every package directory ships, kernels included."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_directory_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {
        ".".join(path.parent.relative_to(ROOT).parts)
        for path in (ROOT / "jaxfl").rglob("__init__.py")
    }
    assert found <= listed, f"add to pyproject packages: {sorted(found - listed)}"
    assert "jaxfl.kernels" in listed
    assert config["package-dir"]["jaxfl.kernels"] == "kernels"


def test_kernels_import_as_a_subpackage():
    import jaxfl.kernels

    assert Path(jaxfl.kernels.__file__).resolve().parent == ROOT / "kernels"
