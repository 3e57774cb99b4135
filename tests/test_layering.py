"""The package's modules import from below and never from above: every import follows the order of the layers
table in docs/architecture.md, and no two modules reach each other through their imports. Imports inside functions
count too (a deferred import is still a dependency)."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pickaxe

PACKAGE = Path(pickaxe.__file__).parent
ARCHITECTURE = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Each pickaxe module -> the pickaxe modules it imports anywhere in its source."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                candidates = [target, *(f"{target}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                candidates = [a.name for a in node.names]
            else:
                continue
            graph[name].update(c for c in candidates if c in modules and c != name)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_the_cycle_finder_finds_a_cycle_through_three_modules() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"]]


def test_no_two_pickaxe_modules_import_each_other() -> None:
    graph = import_graph()
    assert "pickaxe.train.build" in graph and "pickaxe.runs.model" in graph["pickaxe.train.build"]  # it reads imports
    assert import_cycles(graph) == []


def documented_layers() -> dict[str, int]:
    """Each top-level module or folder of the package -> its row in docs/architecture.md's layers table (0 first)."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| `")]
    return {name.rstrip("/"): i for i, row in enumerate(rows) for name in re.findall(r"`([^`]+)`", row.split("|")[1])}


def _layer_key(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None  # None: the package itself (the public API re-exports every layer)


def test_every_import_goes_to_the_same_layer_or_one_above_it() -> None:
    layers = documented_layers()
    assert layers["errors"] == 0 and layers["dist"] < layers["train"] < layers["exp"] < layers["cli"]
    graph = import_graph()
    unplaced = sorted({k for m in graph for k in [_layer_key(m)] if k is not None and k not in layers})
    assert not unplaced, f"modules missing from the layers table of docs/architecture.md: {unplaced}"
    upward = [
        f"{a} -> {b}"
        for a, targets in graph.items()
        for b in targets
        if _layer_key(a) is not None and _layer_key(b) is not None and layers[_layer_key(b)] > layers[_layer_key(a)]
    ]
    assert upward == [], "imports from a lower layer (docs/architecture.md orders them):\n" + "\n".join(sorted(upward))
