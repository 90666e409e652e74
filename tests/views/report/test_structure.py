"""The report's modules: no private name crosses a module boundary, and no import cycle, counting
imports inside functions too (so none can hide a cycle); ``TYPE_CHECKING`` imports aside."""

from __future__ import annotations

import ast
from pathlib import Path

import precision_nb

PACKAGE = Path(precision_nb.__file__).parent
REPORT = PACKAGE / "views" / "report"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes inside ``if TYPE_CHECKING:`` blocks."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                inside.update(id(n) for n in ast.walk(child))
    return inside


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every run-time import of ``path`` (names empty for ``import x``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_nodes(tree)
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names]
    return out


def test_no_private_name_is_imported_across_report_modules():
    found = []
    for path in sorted(REPORT.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        modules: dict[str, str] = {}
        for line, module, names in _imports(path):
            if not module.startswith("precision_nb"):
                continue
            found += [f"{path.name}:{line} imports {module}.{n}" for n in names if _private(n)]
            for n in names:  # ``from package import module``: its attributes are checked below
                modules[n] = f"{module}.{n}"
        for node in ast.walk(tree):
            if isinstance(node, ast.alias) and node.asname and node.name in modules:
                modules[node.asname] = modules[node.name]
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in modules
                and _private(node.attr)
            ):
                found.append(f"{path.name}:{node.lineno} reads {node.value.id}.{node.attr}")
    assert not found, "private names used across modules:\n" + "\n".join(found)


def _graph() -> dict[str, set[str]]:
    names = {_module_name(p): p for p in REPORT.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in names}
    for name, path in names.items():
        for _, module, imported in _imports(path):
            targets = [module, *(f"{module}.{n}" for n in imported)]
            graph[name].update(t for t in targets if t in names and t != name)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_report_modules_import_each_other_without_a_cycle():
    graph = _graph()
    assert "precision_nb.views.report.html" in graph["precision_nb.views.report.profile_result"]
    cycle = _cycle(graph)
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert _cycle(graph) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []
