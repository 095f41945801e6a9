"""The layering of ARCHITECTURE.md, enforced as an allow-list of package edges, plus no import cycles.

Why an allow-list and not an order of layers: with one package per rung, any new import passes once
the rungs are reordered, so the order drifts to fit the code. Here every edge between two packages is
written down in ALLOWED, and a new one fails until someone adds it on purpose (and LAYERS says whether
it may be added at all). bench/ is scanned too: its scripts are consumers like the CLI and must not
reach into whatever they like.

Every `import` statement counts, including those inside functions and under `TYPE_CHECKING`: a
deferred import still couples the modules (it only hides the coupling from start-up time).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "src" / "ebmrag"
BENCH = REPO / "bench"

# The package of the root module ebmrag/__init__.py (its __version__ and the re-exported errors).
PACKAGE_ROOT = "__init__"

# Bottom to top. A "package" is a directory under src/ebmrag, a top-level module (errors, protocols,
# kvcache, config, __main__), the package root, or "bench". Layers hold several packages: they say
# where an edge may point, ALLOWED says which edges exist.
LAYERS: dict[str, frozenset[str]] = {
    "foundation": frozenset({"errors", "protocols", "kvcache", PACKAGE_ROOT}),
    "rules": frozenset({"rules"}),  # the rule files (rules/<subject>/*.toml) and their one loader
    "observe": frozenset({"observe"}),  # spans and metrics: every layer above reports through it
    "text": frozenset({"text"}),  # sentence splitting, language
    "vocab": frozenset({"vocab"}),  # the drug vocabulary (names, classes, codes, Chinese names) and negation cues
    "data": frozenset({"records", "models"}),  # Fragment, PatientRecord, loaders, FHIR; embedder, tokens
    "evidence": frozenset({"evidence"}),  # tier rules, question types, entities, adverse drug reactions
    "stages": frozenset({"packing", "ingest", "llm"}),
    "index": frozenset({"index"}),  # knowledge-base storage
    "retrieve": frozenset({"retrieve", "ddx", "store", "demo"}),
    "ehr": frozenset({"ehr"}),  # charts pulled from FHIR servers (SMART, paging, _since, Bulk Data) into the store
    "cds": frozenset({"cds"}),  # CDS Hooks decisions: cards from one chart (its facts cited), fetched through ehr
    "generate": frozenset({"generate"}),
    "answer": frozenset({"answer"}),  # Engine, gate, relevance, result
    "research": frozenset({"research", "eval"}),
    # The TOML settings, composed of each component's params (config imports answer.params, index.params, ...).
    # config used to sit at the bottom: an import of it from a lower layer now points up (remove it, don't list it).
    "settings": frozenset({"config"}),
    "root": frozenset({"compose"}),  # the composition root: settings -> parts
    "edges": frozenset({"integrations", "serve", "gateway", "cli", "__main__", "bench"}),
}

# Package -> the other packages its modules may import, bottom to top. Built from the code as it stands,
# keeping only the edges that point down LAYERS; an edge missing here fails test_package_edges_are_allowed,
# an entry no import uses fails test_allowed_edges_are_used.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "rules": {"errors"},
    "protocols": set(),
    "kvcache": {"protocols"},
    PACKAGE_ROOT: {"errors"},
    "observe": {"errors"},
    "text": {"errors", "rules"},
    "vocab": {"errors", "rules"},
    "records": {"errors", "rules", "text", "vocab"},
    "models": {"errors", "kvcache", "observe", "protocols"},
    "evidence": {"errors", "kvcache", "models", "protocols", "records", "rules", "text", "vocab"},
    "packing": {"errors", "evidence", "models", "observe", "protocols", "records", "text"},
    "ingest": {"errors", "protocols", "records", "text"},
    "llm": {"errors", "kvcache", "observe", "protocols"},
    "index": {"errors", "ingest", "models", "protocols"},
    "retrieve": {"errors", "index", "llm", "models", "observe", "protocols"},
    "ddx": {"errors", "evidence", "protocols", "text", "vocab"},
    "store": {"errors", "kvcache", "records"},
    "ehr": {"errors", "protocols", "records", "rules", "store"},
    "cds": {"ehr", "errors", "evidence", "records", "rules", "vocab"},
    "demo": {"errors", "index", "records"},
    "generate": {"evidence", "index", "llm", "packing", "protocols", "records", "rules", "text"},
    # Neither "config" nor "compose": the composition root builds an Engine from settings (compose.build_engine),
    # the Engine does not build itself. Both edges existed and were removed; do not list them again.
    "answer": {
        "errors", "evidence", "generate", "index", "kvcache", "llm", "models", "observe", "packing", "protocols",
        "records", "retrieve", "rules", "text",
    },
    "research": {
        "ddx", "errors", "evidence", "generate", "index", "llm", "packing", "protocols", "records", "retrieve", "rules",
    },
    "eval": {
        "answer", "ddx", "demo", "errors", "evidence", "index", "llm", "packing", "protocols", "records", "retrieve",
        "text",
    },
    # Each component owns its params (answer.params, index.params, ...); config composes them into Settings.
    "config": {
        "answer", "cds", "ehr", "errors", "index", "llm", "observe", "packing", "records", "research", "retrieve",
    },
    "compose": {
        "answer", "config", "ddx", "demo", "evidence", "generate", "index", "kvcache", "llm", "models", "packing",
        "protocols", "records", "research", "retrieve", "rules", "text",
    },
    "integrations": {"compose", "config", "errors", "evidence", "generate", "models", "packing", "records"},
    "serve": {
        PACKAGE_ROOT, "answer", "cds", "compose", "config", "ddx", "ehr", "errors", "generate", "index", "ingest",
        "observe", "packing", "protocols", "records", "retrieve", "store", "vocab",
    },
    "gateway": {"errors", "observe", "store"},
    "cli": {
        PACKAGE_ROOT, "answer", "compose", "config", "ddx", "demo", "ehr", "errors", "eval", "gateway", "index",
        "ingest", "llm", "observe", "packing", "protocols", "records", "research", "retrieve", "serve", "store",
        "text",
    },
    "__main__": {"cli"},
    # bench measures the parts it names, so it imports more than compose and config; the list is what the
    # scripts use today, not a licence to use the rest.
    "bench": {
        "answer", "compose", "config", "demo", "ehr", "errors", "eval", "evidence", "gateway", "index", "ingest",
        "integrations", "models", "packing", "records", "research", "retrieve", "rules", "serve", "store", "text",
        "vocab",
    },
}

# Edges of ALLOWED between two packages of one layer. Each is an exception with a reason; any other
# edge inside a layer fails test_allowed_edges_point_down.
INTRA_LAYER: set[tuple[str, str]] = {
    (PACKAGE_ROOT, "errors"),  # `import ebmrag` re-exports the error types
    ("kvcache", "protocols"),  # a cache read checkpoints between batches (protocols has no imports of its own)
    ("__main__", "cli"),  # `python -m ebmrag` is the CLI
    ("cli", "serve"),  # `ebmrag serve` starts the service
    ("cli", "gateway"),  # `ebmrag gateway` runs the consumer
    ("bench", "serve"),  # bench/serve.py and bench/isolation.py measure the service
    ("bench", "gateway"),  # bench/gateway.py measures the consumer
    ("bench", "integrations"),  # bench/peer_llamaindex.py compares with LlamaIndex through the drop-in
}


def module_name(path: Path, base: Path) -> str:
    """Dotted name of a file under base (src/ for ebmrag, the repository for bench/*.py)."""
    parts = list(path.relative_to(base).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, module: str) -> set[str]:
    """Absolute ebmrag modules imported anywhere in the file (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base != "ebmrag":  # `from ebmrag import rules` imports ebmrag.rules; `__version__` resolves to the root
                found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name == "ebmrag" or name.startswith("ebmrag.")}


def graph(root: Path = ROOT, scripts: Path | None = BENCH) -> dict[str, set[str]]:
    """Module -> ebmrag modules it imports, for every module under root and every scripts/*.py.

    Scripts are named `bench.<file>`; their imports of one another (`from report import ...`) are not
    ebmrag imports and are not followed.
    """
    files = {module_name(p, root.parent): p for p in root.rglob("*.py")}
    if scripts is not None:
        files.update({f"bench.{p.stem}": p for p in scripts.glob("*.py")})
    edges: dict[str, set[str]] = {}
    for name, path in files.items():
        targets = set()
        for imported in imports_of(path, name):
            while imported not in files and "." in imported:  # `from pkg import name` names an attribute
                imported = imported.rpartition(".")[0]
            if imported in files and imported != name:
                targets.add(imported)
        edges[name] = targets
    return edges


def package_of(module: str) -> str:
    """`ebmrag.index.kb` -> `index`, `ebmrag.config` -> `config`, `ebmrag` -> `__init__`, `bench.x` -> `bench`."""
    head, _, rest = module.partition(".")
    if head == "bench":
        return "bench"
    return rest.split(".")[0] if rest else PACKAGE_ROOT


def layer_of(package: str) -> str:
    for layer, packages in LAYERS.items():
        if package in packages:
            return layer
    raise AssertionError(f"package {package} belongs to no layer of tests/test_architecture.py; add it to LAYERS")


def forbidden_edges(edges: Mapping[str, Iterable[str]], allowed: Mapping[str, set[str]]) -> list[str]:
    """`source module -> target module` for each import between packages that `allowed` does not list."""
    return sorted(
        f"{source} -> {target}"
        for source, targets in edges.items()
        for target in targets
        if package_of(source) != package_of(target)
        and package_of(target) not in allowed.get(package_of(source), set())
    )


def unused_entries(edges: Mapping[str, Iterable[str]], allowed: Mapping[str, set[str]]) -> list[str]:
    """`package -> package` for each entry of `allowed` that no import realises any more."""
    used = {(package_of(source), package_of(target)) for source, targets in edges.items() for target in targets}
    return sorted(f"{source} -> {target}" for source, targets in allowed.items() for target in targets
                  if (source, target) not in used)


def misplaced_entries(
    allowed: Mapping[str, set[str]], layers: Mapping[str, frozenset[str]], intra: set[tuple[str, str]]
) -> list[str]:
    """Entries of `allowed` that point up, or sideways without being listed in `intra`, and stale `intra` pairs."""
    rank = {package: index for index, packages in enumerate(layers.values()) for package in packages}
    named = {*allowed, *(target for targets in allowed.values() for target in targets)}
    problems = [f"{package} is in no layer" for package in sorted(named - rank.keys())]
    for source, targets in sorted(allowed.items()):
        for target in sorted(targets):
            if source not in rank or target not in rank:
                continue
            if rank[target] > rank[source]:
                problems.append(f"{source} -> {target} points up")
            elif rank[target] == rank[source] and (source, target) not in intra:
                problems.append(f"{source} -> {target} stays in one layer and is not in INTRA_LAYER")
    for source, target in sorted(intra):
        if target not in allowed.get(source, set()):
            problems.append(f"INTRA_LAYER {source} -> {target} is not in ALLOWED")
        elif rank.get(source) != rank.get(target):
            problems.append(f"INTRA_LAYER {source} -> {target} crosses layers")
    return problems


def test_every_module_has_a_package_and_a_layer() -> None:
    """A new package (or bench script) must be placed in LAYERS before its edges can be judged."""
    for module in graph():
        layer_of(package_of(module))


def test_allowed_edges_point_down() -> None:
    """The allow-list itself obeys LAYERS: an edge may be listed only if it points to a lower layer."""
    problems = misplaced_entries(ALLOWED, LAYERS, INTRA_LAYER)
    assert not problems, "ALLOWED disagrees with LAYERS:\n" + "\n".join(problems)


def test_package_edges_are_allowed() -> None:
    forbidden = forbidden_edges(graph(), ALLOWED)
    assert not forbidden, "imports between packages not in ALLOWED:\n" + "\n".join(forbidden)


def test_allowed_edges_are_used() -> None:
    """A stale entry would let the edge come back unnoticed: drop it from ALLOWED once the import is gone."""
    stale = unused_entries(graph(), ALLOWED)
    assert not stale, "entries of ALLOWED that no import uses:\n" + "\n".join(stale)


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


def test_relative_and_attribute_imports_resolve() -> None:
    """The checker must see `from ebmrag.x import name` as an import of module ebmrag.x."""
    edges = graph()
    assert "ebmrag.records.fragment" in edges["ebmrag.records.loaders"]


def test_checker_reports_an_unlisted_edge_and_passes_a_listed_one() -> None:
    edges = {"ebmrag.low.a": set(), "ebmrag.high.b": {"ebmrag.low.a"}, "bench.run": {"ebmrag.high.b"}}
    assert forbidden_edges(edges, {"high": set(), "bench": {"high"}}) == ["ebmrag.high.b -> ebmrag.low.a"]
    assert forbidden_edges(edges, {"high": {"low"}, "bench": {"high"}}) == []
    assert unused_entries(edges, {"high": {"low"}, "bench": {"high", "low"}}) == ["bench -> low"]


def test_checker_reads_a_package_tree(tmp_path: Path) -> None:
    """End to end on a fake tree: a relative import outside the allow-list is found and named by module."""
    root = tmp_path / "src" / "ebmrag"
    for package, files in {"low": {"a.py": ""}, "high": {"b.py": "from ..low import a\nfrom . import c\n",
                                                         "c.py": ""}}.items():
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
        for name, text in files.items():
            (root / package / name).write_text(text)
    (root / "__init__.py").write_text("")
    edges = graph(root, scripts=None)
    # `from ..low import a` runs ebmrag/low/__init__.py too, so the package counts as imported.
    assert edges["ebmrag.high.b"] == {"ebmrag.low", "ebmrag.low.a", "ebmrag.high", "ebmrag.high.c"}
    assert forbidden_edges(edges, {}) == ["ebmrag.high.b -> ebmrag.low", "ebmrag.high.b -> ebmrag.low.a"]
    assert forbidden_edges(edges, {"high": {"low"}}) == []


def test_layer_check_rejects_upward_and_unlisted_sideways_entries() -> None:
    layers = {"bottom": frozenset({"a", "b"}), "top": frozenset({"c"})}
    assert misplaced_entries({"c": {"a"}, "a": {"b"}}, layers, {("a", "b")}) == []
    assert misplaced_entries({"a": {"c", "b"}}, layers, set()) == [
        "a -> b stays in one layer and is not in INTRA_LAYER", "a -> c points up",
    ]
    assert misplaced_entries({"a": set(), "d": {"a"}}, layers, {("a", "b")}) == [
        "d is in no layer", "INTRA_LAYER a -> b is not in ALLOWED",
    ]
