"""The package's shape, read from its source with ``ast`` (no import needs to happen):

- no import cycle among the run-time imports of any ``precision_nb`` modules: every ``import``
  counts, at module level and inside functions alike (a function-local import only delays a
  cycle, it does not remove it); imports under ``if TYPE_CHECKING:`` never run and do not count;
- no private name (``_x``) imported or read across modules: what a module shares is public;
- no module over :data:`MAX_MODULE_LINES` lines (a module that grows past it is split by what
  it does).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "precision_nb"
SCOPES = ("precision_nb",)
MAX_MODULE_LINES = 450


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


def test_the_package_has_no_import_cycle():
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


def private_uses(path: Path) -> list[str]:
    """Where ``path`` imports a private name of another precision_nb module, or reads one as an
    attribute of a module it imported (``from pkg import mod``; ``mod._x``)."""
    name = path.relative_to(PACKAGE) if path.is_relative_to(PACKAGE) else path.name
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[str] = []
    modules: dict[str, str] = {}
    for line, module, names in _imports(path):
        if not module.startswith("precision_nb"):
            continue
        found += [f"{name}:{line} imports {module}.{n}" for n in names if _private(n)]
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
            found.append(f"{name}:{node.lineno} reads {node.value.id}.{node.attr}")
    return found


def test_no_private_name_is_imported_or_read_across_modules():
    found = [use for path in sorted(PACKAGE.rglob("*.py")) for use in private_uses(path)]
    assert not found, "private names used across modules:\n" + "\n".join(found)


def test_the_private_name_check_sees_imports_and_module_attributes(tmp_path):
    path = tmp_path / "mod.py"
    path.write_text(
        "from precision_nb.views.report.markup import _secret, fmt\n"
        "from precision_nb.engine import stats as st\n"
        "x = st._helper(fmt)\n",
        encoding="utf-8",
    )
    found = private_uses(path)
    assert found == [
        "mod.py:1 imports precision_nb.views.report.markup._secret",
        "mod.py:3 reads st._helper",
    ]


# ----------------------------------------------------------------------------- result columns

#: The module where a comparison's typed result becomes the summary table: the only one that
#: may spell the summary's result columns.
EDGE = PACKAGE / "views" / "report" / "tables.py"
#: Summary columns that are also something else (record keys, TrainConfig fields, the per-rank
#: table's columns, plain words): other modules spell them for those meanings.
SHARED = frozenset(
    {
        "run", "final_loss", "samples_per_s", "tokens_per_s", "flops_per_s", "mfu",
        "mfu_peak_source", "memory_kind", "steps", "fused_adamw", "device", "loss_scale_lab",
        "rounds", "processes", "failed", "verdict", "stopped_by", "median_step_time_s",
        "step_time_iqr_s", "warmup_steps", "warmup_s", "mode", "dtype", "use_scaler",
        "autocast_enabled", "device_type",
    }
)  # fmt: skip


def result_columns(edge: Path = EDGE) -> set[str]:
    """The summary's columns as the edge module spells them (``SUMMARY_COLUMNS``, its names
    resolved through the module's string constants), less the :data:`SHARED` ones."""
    tree = ast.parse(edge.read_text(encoding="utf-8"))
    constants: dict[str, str] = {}
    columns: list[ast.expr] = []
    for node in tree.body:
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            pairs = (
                zip(target.elts, node.value.elts, strict=False)
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                else [(target, node.value)]
            )
            for name, value in pairs:
                if isinstance(name, ast.Name) and isinstance(value, ast.Constant):
                    if isinstance(value.value, str):
                        constants[name.id] = value.value
                if isinstance(name, ast.Name) and name.id == "SUMMARY_COLUMNS":
                    columns = list(getattr(value, "elts", []))
    names = {
        c.value if isinstance(c, ast.Constant) else constants.get(getattr(c, "id", ""), "")
        for c in columns
    }
    return {n for n in names if isinstance(n, str) and n} - SHARED


def column_uses(path: Path, columns: set[str]) -> list[str]:
    """Where ``path`` spells a result column in a string (a key, a list of columns, a text)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    name = path.relative_to(PACKAGE) if path.is_relative_to(PACKAGE) else path.name
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for column in sorted(columns):
                if re.search(rf"\b{re.escape(column)}\b", node.value):
                    found.append((node.lineno, f"{name}:{node.lineno} spells {column!r}"))
    return [text for _line, text in sorted(found)]


def test_result_columns_are_spelled_only_where_the_summary_is_built():
    columns = result_columns()
    assert {"speedup_vs_fp32", "speedup_ci_low", "param_rel_diff_vs_fp32"} <= columns
    found = [
        use
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != EDGE
        for use in column_uses(path, columns)
    ]
    assert not found, (
        "result columns read outside views/report/tables.py (read the typed outcome, or the "
        "edge module's constant):\n" + "\n".join(found)
    )


def test_the_column_check_sees_keys_lists_and_texts(tmp_path):
    path = tmp_path / "view.py"
    path.write_text(
        "def show(row, outcome):\n"
        "    a = row['speedup_vs_fp32']\n"
        "    b = [c for c in ('run', 'speedup_ci_low')]\n"
        "    return f'{a} over speedup_ci_high', outcome.speedup, row.get('run')\n",
        encoding="utf-8",
    )
    found = column_uses(path, result_columns())
    assert found == [
        "view.py:2 spells 'speedup_vs_fp32'",
        "view.py:3 spells 'speedup_ci_low'",
        "view.py:4 spells 'speedup_ci_high'",
    ]


def test_no_module_is_over_the_line_limit():
    sizes = {
        str(p.relative_to(PACKAGE.parent)): len(p.read_text(encoding="utf-8").splitlines())
        for p in PACKAGE.rglob("*.py")
    }
    over = {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines (split them by what they do): {over}"
    assert max(sizes.values()) > MAX_MODULE_LINES // 2  # the count reads the real modules
