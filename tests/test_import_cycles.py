"""The package has no import cycles: every `import` of a torchforge module, at module level, inside a
function or under TYPE_CHECKING, is an edge, and the graph of those edges must be acyclic. (A cycle that
works today because one side imports lazily still makes the two modules one unit that cannot be read,
tested or changed alone.)"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "torchforge"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py") if "_templates" not in p.parts}


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The torchforge module `name` refers to: itself, or its longest known prefix (`a.b.C` -> `a.b`)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


@dataclass(frozen=True)
class ImportEdge:
    """One import of a torchforge module by another: `name` is what `from target import name` binds when it
    is not a module of its own (None for `import target` and for a submodule); `alias` is the local name bound
    to the target module itself (`from pkg import sub`, `import a.b as c`), else None."""

    importer: str
    target: str
    name: str | None
    alias: str | None
    line: int


def import_edges() -> list[ImportEdge]:
    known = _modules()
    edges: list[ImportEdge] = []
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[tuple[str, str | None, str | None]] = []
            if isinstance(node, ast.Import):
                targets = [(alias.name, None, alias.asname) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                # `from pkg import sub` imports the submodule `pkg.sub` when there is one.
                targets = [(f"{base}.{alias.name}", alias.name, alias.asname or alias.name) for alias in node.names]
            for target, imported, bound in targets:
                resolved = _resolve(target, known)
                if resolved is not None and resolved != name:
                    whole = resolved == target  # the module itself, not a name from it
                    edges.append(ImportEdge(name, resolved, None if whole else imported, bound if whole else None,
                                            node.lineno))
    return edges


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in _modules()}
    for edge in import_edges():
        graph[edge.importer].add(edge.target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_graph_sees_lazy_and_type_checking_imports() -> None:
    # Guard against a parser that finds nothing and so can never fail: these edges exist in the code.
    graph = import_graph()
    assert "torchforge.uploaders.base" in graph["torchforge.uploaders.directory"]
    assert "torchforge.uploaders.directory" in graph["torchforge.upload"]  # a lazy, in-function import
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_torchforge_has_no_import_cycles() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
