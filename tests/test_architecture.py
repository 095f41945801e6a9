"""The layering of ARCHITECTURE.md, enforced: imports point down the layers, never up, and never in a cycle.

Every `import` statement counts, including those inside functions: a deferred import still couples
the modules (it only hides the coupling from start-up time).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "src" / "ebmrag"

# Bottom to top. A module may import its own package and any package of a lower layer; packages that
# share a layer are independent of each other.
LAYERS: list[set[str]] = [
    {"errors"},
    {"protocols", "kvcache"},
    {"config"},
    {"text"},
    {"records"},
    {"models"},
    {"evidence"},
    {"packing"},
    {"ingest"},
    {"index"},
    {"llm"},
    {"retrieve"},
    {"ddx"},
    {"demo"},
    {"generate"},
    {"answer"},
    {"research"},
    {"eval"},
    {"compose"},
    {"integrations"},
    {"store"},
    {"serve"},
    {"gateway"},
    {"cli"},
    {"__main__"},
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Absolute ebmrag modules imported anywhere in the file (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name == "ebmrag" or name.startswith("ebmrag.")}


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for imported in imports_of(path):
            while imported not in modules and "." in imported:  # `from pkg import name` names an attribute
                imported = imported.rpartition(".")[0]
            if imported in modules and imported != name:
                targets.add(imported)
        edges[name] = targets
    return edges


def layer_of(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    for index, packages in enumerate(LAYERS):
        if top in packages:
            return index
    raise AssertionError(f"{module} belongs to no layer of tests/test_architecture.py; add it to LAYERS")


def package_of(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def test_every_module_has_a_layer() -> None:
    for module in graph():
        if module != "ebmrag":
            layer_of(module)


def test_imports_point_down() -> None:
    upward = []
    for source, targets in graph().items():
        if source == "ebmrag":
            continue
        for target in targets:
            if target == "ebmrag" or package_of(source) == package_of(target):
                continue
            if layer_of(target) >= layer_of(source):
                upward.append(f"{source} -> {target}")
    assert not upward, "imports that point up or sideways:\n" + "\n".join(sorted(upward))


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A cycle as a list of modules, or None (iterative depth-first search, colours white/grey/black)."""
    state: dict[str, int] = {}
    for start in sorted(edges):
        if state.get(start):
            continue
        stack: list[tuple[str, list[str]]] = [(start, sorted(edges[start]))]
        path = [start]
        state[start] = 1
        while stack:
            node, pending = stack[-1]
            if not pending:
                state[node] = 2
                stack.pop()
                path.pop()
                continue
            nxt = pending.pop()
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append((nxt, sorted(edges.get(nxt, ()))))
    return None


def test_no_import_cycles() -> None:
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize(("edges", "cyclic"), [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, False),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, True),
    ({"a": {"b", "c"}, "b": {"c"}, "c": set()}, False),
    ({"a": {"a2"}, "a2": set(), "x": {"y"}, "y": {"x"}}, True),
])
def test_cycle_finder(edges: dict[str, set[str]], cyclic: bool) -> None:
    assert (find_cycle(edges) is not None) is cyclic


def test_relative_and_attribute_imports_resolve(tmp_path: Path) -> None:
    """The checker must see `from ebmrag.x import name` as an import of module ebmrag.x."""
    edges = graph()
    assert "ebmrag.records.fragment" in edges["ebmrag.records.loaders"]
