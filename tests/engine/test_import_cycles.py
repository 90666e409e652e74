"""No import cycles among the run-time imports of ``precision_nb.core`` and ``precision_nb.engine``.

Every ``import`` counts, at module level and inside functions alike (a function-local import only
delays a cycle, it does not remove it); imports under ``if TYPE_CHECKING:`` never run and do not
count. The graph is read from the source with ``ast``, so the test needs no import to happen.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "precision_nb"
SCOPES = ("precision_nb.core", "precision_nb.engine")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _run_time_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _absolute(module: str | None, level: int, importer: str, is_package: bool) -> str:
    if level == 0:
        return module or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The precision_nb modules that running ``path`` can import (TYPE_CHECKING aside), with the
    packages whose ``__init__`` runs on the way."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in _run_time_nodes(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, name, is_package)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    # importing a.b.c runs a/__init__ and a/b/__init__ first (the importer's own packages are
    # already running, so they add no edge)
    for module in list(found):
        parts = module.split(".")
        found.update(".".join(parts[:i]) for i in range(1, len(parts)))
    own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)}
    return {m for m in found if m in known and m not in own}


def cycles(scopes: tuple[str, ...] = SCOPES) -> list[list[str]]:
    """Strongly connected components of more than one module (or a module importing itself)."""
    modules = all_modules()
    inside = {m for m in modules if m.startswith(scopes)}
    known = set(modules)
    graph = {m: imports_of(m, modules[m], known) & inside for m in sorted(inside)}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm; the graph has a few hundred nodes
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
            if len(component) > 1 or v in graph[v]:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_core_and_engine_have_no_import_cycle():
    assert cycles() == []


def test_the_check_sees_function_local_imports_and_skips_type_checking(tmp_path):
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from precision_nb.engine import trainer\n"
        "def f():\n"
        "    from precision_nb.engine.session import FitSession\n"
        "    return FitSession\n"
    )
    path = tmp_path / "mod.py"
    path.write_text(source, encoding="utf-8")
    known = {"precision_nb.engine.session", "precision_nb.engine.trainer", "precision_nb.engine"}
    found = imports_of("precision_nb.engine.mod", path, known)
    assert found == {"precision_nb.engine.session"}  # precision_nb.engine is its own package
