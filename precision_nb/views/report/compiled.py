"""The report's torch.compile section: what compiling cost and changed, plan by plan.

One row per compiled plan (the compile step and torch's own accounting, the cache outcome,
recompilations, the speed against its eager twin with its interval, pay-back, agreement with
eager), the sentences behind each row, the graph breaks with their reasons, and what the op
trace and the memory inspection cannot see of a compiled graph. Written as ``compile.csv`` and
``graph_breaks.csv``. Numbers come from :attr:`Comparison.compiled
<precision_nb.engine.compare.Comparison.compiled>`; nothing is measured here.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from precision_nb.core.text import confidence_text, ratio_text
from precision_nb.views.report.markup import table_html
from precision_nb.views.report.sections import Section, csv_file

__all__ = ["COLUMNS", "SHOWN", "TITLE", "compiled_rows", "compiled_section"]

TITLE = "torch.compile: what compiling cost and changed"

#: Columns of compile.csv (every figure as a number).
COLUMNS: tuple[str, ...] = (
    "plan", "eager_plan", "compile_mode", "compile_s", "torch_compile_s", "compile_cache",
    "recompiles", "graph_breaks", "speedup_vs_eager", "speedup_vs_eager_low",
    "speedup_vs_eager_high", "pays_back", "pays_back_after_steps", "pays_back_low",
    "pays_back_high", "agrees_with_eager", "compile_failed",
)  # fmt: skip
#: The table's columns and headers (the speed with its interval in one cell).
SHOWN: dict[str, str] = {
    "plan": "plan",
    "eager_plan": "against",
    "compile_mode": "mode",
    "compile_s": "compile step (s)",
    "torch_compile_s": "torch's accounting (s)",
    "compile_cache": "cache",
    "recompiles": "recompilations",
    "graph_breaks": "graph breaks",
    "speed": f"speed vs eager ({confidence_text()} CI)",
    "pays_back": "pays back after (steps; range over the CI)",
    "agrees_with_eager": "trains what eager trains",
    "compile_failed": "compile failed",
}


def compiled_rows(compiled: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One flat row per compiled plan (the columns of :data:`COLUMNS`), with its speed in words."""
    speed = ("speedup_vs_eager", "speedup_vs_eager_low", "speedup_vs_eager_high")
    rows = [report.row() for report in compiled.values()]
    return [{**r, "speed": ratio_text(*(r.get(k) for k in speed))} for r in rows]


def compiled_section(compiled: Mapping[str, Any]) -> Section:
    """The section of a comparison's compiled plans (see the module docstring)."""
    import pandas as pd

    e = html.escape
    rows = compiled_rows(compiled)
    parts = [
        '<p class="measure">Compiling happens in a compile step before the first training step '
        "(one forward and backward on a throw-away copy), so no step time holds it. Speed "
        "against the eager plan of the same precision uses the same paired interval as every "
        "other speedup; pay-back counts the steps after which the compile step is earned back "
        "at the measured step times.</p>",
        table_html(rows, list(SHOWN), headers=SHOWN),
    ]
    breaks: list[dict[str, Any]] = []
    for label, report in compiled.items():
        items = "".join(f"<li>{e(line)}</li>" for line in report.lines())
        parts.append(f"<h3>{e(label)}</h3><ul>{items}</ul>")
        if report.breaks is not None:
            breaks += report.breaks.rows()
        caveats = report.caveats()
        if caveats:
            lines = "".join(f"<li>{e(c.text())}</li>" for c in caveats)
            parts.append(f'<ul class="measure">{lines}</ul>')
    break_columns = ["plan", "region", "reason", "where", "cause"]
    if breaks:
        parts.append("<h3>Graph breaks, with torch's reasons</h3>")
        parts.append(table_html(breaks, break_columns, css_class="compact"))
    files = (
        csv_file("compile.csv", pd.DataFrame(rows, columns=list(COLUMNS))),
        csv_file("graph_breaks.csv", pd.DataFrame(breaks, columns=break_columns)),
    )
    return Section("compile", TITLE, "\n".join(parts), files)
