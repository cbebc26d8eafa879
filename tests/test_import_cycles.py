"""No two modules of jaxfl import each other, directly or around a loop, imports inside functions included.

A cycle hidden by an import inside a function works until someone moves the
import; the shared piece belongs in a module both can import (a leaf).
`from package import name` counts as importing `package.name` where that is
a module, else the package itself.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules() -> dict[str, Path]:
    modules = {}
    for top, prefix in (("jaxfl", ()), ("kernels", ("jaxfl",))):
        for path in (ROOT / top).rglob("*.py"):
            parts = (*prefix, *path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the jaxfl modules it imports anywhere in its file."""
    graph = {}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package[: len(package) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                submodules = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules]
                targets.update(submodules)
                if len(submodules) < len(node.names):
                    targets.add(base)
        graph[name] = {target for target in targets if target in modules and target != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in graph[node]:
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles():
    assert cycles(import_graph(_modules())) == []


def test_the_detector_sees_a_cycle_through_an_import_inside_a_function(tmp_path):
    package = tmp_path / "jaxfl"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from jaxfl.b import f\n")
    (package / "b.py").write_text("def f():\n    from jaxfl import a\n    return a\n")
    (package / "c.py").write_text("from . import a\n")
    modules = {"jaxfl": package / "__init__.py", **{f"jaxfl.{m}": package / f"{m}.py" for m in "abc"}}
    graph = import_graph(modules)
    assert graph["jaxfl.c"] == {"jaxfl.a"}
    assert cycles(graph) == [["jaxfl.a", "jaxfl.b"]]
