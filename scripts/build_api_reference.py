"""Builds jaxfl's API reference, HTML generated from the docstrings by pdoc.

    python scripts/build_api_reference.py --out docs/api

One page per public module: `jaxfl` (the curated surface, `jaxfl.__all__`),
the round's stages, the algorithms, aggregators, tail primitives, privacy
(clipping, noise, accounting, private optimizers), local training, data,
models and runs. Docstrings are Google style. The test suite builds it
(tests/test_public_surface.py), so a docstring pdoc cannot render fails CI
rather than the published reference.
"""

from __future__ import annotations

import argparse
from pathlib import Path

MODULES = (
    "jaxfl",
    "jaxfl.algorithms.stages",
    "jaxfl.algorithms",
    "jaxfl.aggregators",
    "jaxfl.primitives",
    "jaxfl.privacy",
    "jaxfl.training",
    "jaxfl.data",
    "jaxfl.models",
    "jaxfl.experiment.config",
    "jaxfl.experiment.runner",
)


def build(out: Path, modules=MODULES) -> None:
    """Writes the HTML reference of `modules` under `out`."""
    import warnings

    import pdoc
    import pdoc.render

    # A NamedTuple's generated constructor has no module globals to resolve postponed annotations
    # in; pdoc then shows them as written, which is what a reader needs.
    warnings.filterwarnings("ignore", message="Error parsing type annotation")
    pdoc.render.configure(docformat="google", search=True, show_source=True)
    pdoc.pdoc(*modules, output_directory=Path(out))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/api"))
    args = parser.parse_args(argv)
    build(args.out)
    print(f"API reference in {args.out}/index.html")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
