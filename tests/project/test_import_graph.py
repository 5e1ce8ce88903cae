"""The house's import graph: no circles, and each layer imports only the layers below it.

Every import counts — at module level, inside functions, and under ``TYPE_CHECKING`` — because a
lazy import hides a circle rather than removing it; and importing ``a.b.c`` runs ``a/__init__`` and
``a/b/__init__`` first, so those count too (unless the importer is inside them already). Layers, bottom to top: ``edge_sdk`` (the
device SDK), ``coordinator`` (the coordinator), ``simulation`` (a whole fleet on one machine).

Inside ``coordinator`` the same holds for its sub-layers (`COORDINATOR_LAYERS`), bottom to top:
``core`` (the vocabulary the methods and the round loop share), ``aggregate`` (folding updates),
``strategies`` (the methods), ``homeassistant`` (the bridge), ``runtime`` (fleet, round loop,
publishing, report) and ``cli``; no circle joins two of them.
"""

from __future__ import annotations

import ast
from pathlib import Path
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
LAYERS = ("edge_sdk", "coordinator", "simulation")
#: The sub-layers of ``coordinator``, bottom to top: a module may import its own and those below it.
COORDINATOR_LAYERS = ("core", "aggregate", "strategies", "homeassistant", "runtime", "cli")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for layer in LAYERS for p in sorted((ROOT / layer).rglob("*.py"))}


def import_graph() -> dict[str, set[str]]:
    """module -> the house's modules it imports (any import statement anywhere in the file)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                # `from a.b import c` imports the module a.b.c when there is one, else names of a.b
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                while target and target not in modules:  # `import a.b.c` of a name: its module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
                    graph[name].update(_parents_run_first(name, target, modules))
    return graph


def _parents_run_first(importer: str, target: str, modules: dict[str, Path]) -> set[str]:
    """The packages whose ``__init__`` importing ``target`` runs first: ``a`` and ``a.b`` for
    ``a.b.c``, except those ``importer`` is inside (they are being imported already)."""
    parts = target.split(".")
    parents = {".".join(parts[:i]) for i in range(1, len(parts))}
    inside = {importer} | {".".join(importer.split(".")[:i]) for i in range(1, importer.count(".") + 1)}
    return {p for p in parents - inside if p in modules}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_reads_lazy_and_type_checking_imports():
    graph = import_graph()
    # a function-level import (simulation/cli.py) and one under TYPE_CHECKING (runtime/report.py)
    assert "simulation.simulate" in graph["simulation.cli"]
    assert "coordinator.runtime.fleet" in graph["coordinator.runtime.report"]


def test_no_import_circles():
    assert _cycles(import_graph()) == []


def test_importing_a_module_counts_its_packages_init():
    graph = import_graph()
    # edge_sdk.models.flanc imports edge_sdk.model_names (no package between); simulation.simulate
    # imports coordinator.runtime.fleet, which runs coordinator/__init__ and coordinator/runtime/__init__
    assert {"coordinator", "coordinator.runtime"} <= graph["simulation.simulate"]
    # a module inside a package is imported while that package's __init__ runs: no edge back to it
    # (coordinator/strategies/reft.py imports coordinator.strategies.pruning, a sibling)
    assert "coordinator.strategies.pruning" in graph["coordinator.strategies.reft"]
    assert "coordinator.strategies" not in graph["coordinator.strategies.reft"]


def test_a_made_up_circle_is_found():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_each_layer_imports_only_the_layers_below_it():
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    upward = sorted(f"{src} -> {dst}" for src, targets in import_graph().items() for dst in targets
                    if rank[dst.split(".")[0]] > rank[src.split(".")[0]])
    assert upward == []


def _coordinator_layer(module: str) -> str | None:
    """The sub-layer of a ``coordinator`` module (``coordinator.runtime.fleet``: ``runtime``); None
    outside ``coordinator`` and for the package itself."""
    parts = module.split(".")
    if parts[0] != "coordinator" or len(parts) < 2:
        return None
    assert parts[1] in COORDINATOR_LAYERS, f"{module}: add its sub-package to COORDINATOR_LAYERS"
    return parts[1]


def _upward_in_coordinator(graph: dict[str, set[str]]) -> list[str]:
    rank = {layer: i for i, layer in enumerate(COORDINATOR_LAYERS)}
    upward = []
    for src, targets in graph.items():
        for dst in targets:
            low, high = _coordinator_layer(src), _coordinator_layer(dst)
            if low is not None and high is not None and rank[high] > rank[low]:
                upward.append(f"{src} -> {dst}")
    return sorted(upward)


def _coordinator_layer_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The imports between coordinator's sub-packages (a module's imports of its own left out)."""
    layers: dict[str, set[str]] = {layer: set() for layer in COORDINATOR_LAYERS}
    for src, targets in graph.items():
        low = _coordinator_layer(src)
        if low is not None:
            layers[low].update(high for dst in targets if (high := _coordinator_layer(dst)) not in (None, low))
    return layers


def test_each_coordinator_layer_imports_only_the_layers_below_it():
    """core and aggregate import nothing of the methods, the runtime, Home Assistant or the CLI; the
    methods nothing of the runtime, Home Assistant or the CLI; Home Assistant nothing of the runtime."""
    assert _upward_in_coordinator(import_graph()) == []


def test_no_circle_joins_two_coordinator_layers():
    assert _cycles(_coordinator_layer_graph(import_graph())) == []


def test_an_upward_import_in_coordinator_is_found():
    graph = {"coordinator.core.federation": set(), "coordinator.strategies.base": {"coordinator.core.federation",
                                                                                  "coordinator.runtime.fleet"},
             "coordinator.runtime.fleet": {"coordinator.core.federation"},
             "coordinator.runtime.round_loop": {"coordinator.strategies.base", "coordinator.runtime.fleet"},
             "coordinator.homeassistant.bridge": {"coordinator.runtime.report"},
             "coordinator.runtime.job": {"coordinator.homeassistant.bridge"}, "coordinator.runtime.report": set(),
             "simulation.simulate": {"coordinator.runtime.fleet"}}
    assert _upward_in_coordinator(graph) == ["coordinator.homeassistant.bridge -> coordinator.runtime.report",
                                             "coordinator.strategies.base -> coordinator.runtime.fleet"]
    assert _cycles(_coordinator_layer_graph(graph)) == [["homeassistant", "runtime", "strategies"]]
