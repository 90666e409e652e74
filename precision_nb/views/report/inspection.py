"""``precision_nb.inspect()``: memory by kind and dtype, and the op dtype trace, as tables.

:class:`Inspection` wraps the engine's plain rows
(:class:`~precision_nb.engine.inspect.InspectionData`) as DataFrames, figures and HTML; the
report's section and ``precision-nb inspect``'s folder are built from them here too.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from precision_nb.engine.inspect import InspectionData, run_inspection
from precision_nb.views.report.figure_base import figure_to_png
from precision_nb.views.report.folder import write_files
from precision_nb.views.report.inspection_figures import memory_breakdown_figure, op_dtype_figure
from precision_nb.views.report.markup import fmt, img_html, page, size_text, table_html
from precision_nb.views.report.sections import (
    ReportFile,
    Section,
    csv_file,
    section_html,
)

__all__ = [
    "TITLE",
    "Inspection",
    "inspect",
    "inspection_body",
    "inspection_figures",
    "inspection_html",
    "inspection_section",
    "write_inspection",
]

MEMORY_COLUMNS = ["kind", "dtype", "bytes", "expected_bytes", "counted", "method"]
OPS_COLUMNS = [
    "phase",
    "call",
    "op",
    "inputs",
    "output",
    "kind",
    "count",
    "flops",
    "flops_share",
    "cast_bytes",
    "autocast_list",
    "verdict",
]
SUMMARY_COLUMNS = ["verdict", "calls", "flops_share", "bytes", "ops"]
_OPS_SHOWN = 25


def _table(name: str, columns: list[str], doc: str = "") -> Any:
    """A property of :class:`Inspection`: the data's ``name`` rows as a DataFrame (``columns``
    name the columns of an empty one)."""

    def frame(self: Inspection) -> Any:
        import pandas as pd

        rows = getattr(self.data, name)
        return pd.DataFrame(rows, columns=columns if not rows else None)

    return property(frame, doc=f"DataFrame: {doc}." if doc else None)


class Inspection:
    """One plan's inspection: ``.memory``, ``.ops``, ``.summary``, ``.policy``, ``.flags``."""

    def __init__(self, data: InspectionData) -> None:
        self.data = data

    label = property(lambda self: self.data.label)
    plan = property(lambda self: self.data.plan)
    device = property(lambda self: self.data.device)
    simulated = property(lambda self: self.data.simulated)
    flags = property(lambda self: list(self.data.flags))
    events = property(lambda self: list(self.data.events))

    memory = _table("memory", MEMORY_COLUMNS, "kind, dtype, measured bytes, expected bytes, method")
    ops = _table("ops", OPS_COLUMNS, "one row per (phase, call, op, input dtypes, output dtype)")
    summary = _table("summary", SUMMARY_COLUMNS, "the trace grouped by verdict")
    policy = _table(
        "policy",
        ["op", "policy", "dtype", "evidence", "documented", "source"],
        "autocast's policy read from torch (simulated devices; not a trace), with torch's "
        "documented list beside it as a cross-check",
    )
    unattributed = _table("unattributed", ["what", "reason", "count"])

    def figures(self) -> dict[str, Any]:
        """``{"memory": stacked memory bar, "ops": op-dtype bar}`` (matplotlib Figures)."""
        return {"memory": memory_breakdown_figure(self), "ops": op_dtype_figure(self)}

    def to_dict(self) -> dict[str, Any]:
        return self.data.to_dict()

    def __repr__(self) -> str:
        total = size_text(self.data.model_bytes())
        what = "expected only (simulated)" if self.simulated else f"{total} counted"
        return (
            f"Inspection({self.label!r} on {self.device}: {what}, {len(self.data.ops)} op rows, "
            f"{len(self.data.flags)} flags)"
        )

    def _repr_html_(self) -> str:
        return inspection_html({self.label: self}, level=3, figures=True)


def inspect(
    model: Any,
    batches: Any = None,
    plan_or_request: Any = "auto",
    loss_fn: Any = None,
    device: Any = "auto",
    *,
    preset: str = "tiny",
    capabilities: Any = None,
    optimizer: Any = None,
) -> Inspection:
    """Inspect one training step of ``model`` under a plan: memory by kind/dtype and op dtypes.

    ``model``: an ``nn.Module`` (with ``batches``: an iterable, DataLoader or callable, of which
    the first batch is used) or a built-in workload name (``inspect("mlp", preset="small")``).
    ``plan_or_request``: a ``PrecisionPlan``, a ``PrecisionConfig`` or a mode string.
    ``capabilities``: a preset name for simulated hardware (then autocast's policy read from torch
    is shown instead of a trace). The model, its optimizer and the RNG stream are not changed.
    """
    data = run_inspection(
        model,
        batches,
        plan_or_request,
        preset=preset,
        loss_fn=loss_fn,
        device=device,
        capabilities=capabilities,
        optimizer=optimizer,
    )
    return Inspection(data)


def _cell(column: str, value: Any) -> str:
    if value is None:
        return "—" if column in ("bytes", "expected_bytes") else ""
    if column in ("bytes", "expected_bytes", "cast_bytes") and isinstance(value, int):
        return f"{value:,}" + (f" ({value / 2**20:.2f} MiB)" if abs(value) >= 2**16 else "")
    if column == "flops_share":
        return f"{value:.1%}"
    return fmt(value)


#: The op table of the report: the verdict heads each group of rows instead of a column.
_OPS_SHOWN_COLUMNS = (
    "phase", "call", "op", "dtypes", "kind", "count", "flops_share", "cast_bytes", "autocast_list",
)  # fmt: skip
_OPS_HEADERS = {
    "dtypes": "inputs → output",
    "flops_share": "FLOPs",
    "cast_bytes": "cast bytes",
    "autocast_list": "autocast list",
}


def _ops_rows(data: InspectionData, limit: int) -> list[dict[str, Any]]:
    """The first ``limit`` op rows, grouped by verdict (in the summary's order), each row with
    its input and output dtypes in one cell."""
    order = {g["verdict"]: i for i, g in enumerate(data.summary)}
    shown = sorted(data.ops[:limit], key=lambda r: order.get(r.get("verdict"), len(order)))
    return [{**r, "dtypes": f"{r.get('inputs') or '—'} → {r.get('output') or '—'}"} for r in shown]


def inspection_body(
    inspections: Mapping[str, Any], *, level: int = 2, pngs: Mapping[str, bytes] | None = None
) -> str:
    """The HTML of several plans' inspections without a title: method, figures, tables.

    ``pngs``: the figures (file stem -> PNG) to embed; None draws none.
    """
    h2 = f"h{level + 1}"
    items = _items(inspections)
    pngs = pngs or {}
    parts = [
        "<p>Measured in one separate instrumented training step on a copy of the model (not in "
        "the timed steps). <em>bytes</em> are read from the tensors (each storage once); "
        "<em>expected_bytes</em> is hand arithmetic (numel x element size) where a formula "
        "holds. Rows not counted in the sum (allocator peak, process memory) are shown beside "
        "it. The op rows (the first "
        f"{_OPS_SHOWN} of the trace; every one is in inspection_ops.csv) are grouped by what "
        "happened to their dtype.</p>"
    ]
    if "inspection_memory" in pngs:
        parts.append(img_html("inspection_memory", pngs["inspection_memory"]))
    for label, item in items.items():
        data = item.data
        parts.append(f"<{h2}>{html.escape(label)} on {html.escape(data.device)}</{h2}>")
        if data.flags:
            flags = "".join(f"<li>{html.escape(f.message)}</li>" for f in data.flags)
            parts.append(f"<ul class='flags'>{flags}</ul>")
        parts.append(table_html(data.memory, MEMORY_COLUMNS, cell=_cell))
        if data.simulated:
            parts.append(f"<p><strong>{html.escape(data.flags[0].message)}</strong></p>")
            parts.append(table_html(data.policy, ["op", "policy", "dtype", "documented"]))
            continue
        stem = f"inspection_ops_{_slug(label)}"
        if stem in pngs:
            parts.append(img_html(stem, pngs[stem]))
        parts.append(table_html(data.summary, SUMMARY_COLUMNS, cell=_cell))
        more = len(data.ops) - _OPS_SHOWN
        parts.append(
            table_html(
                _ops_rows(data, _OPS_SHOWN),
                ["verdict", *_OPS_SHOWN_COLUMNS],
                headers=_OPS_HEADERS,
                cell=_cell,
                css_class="compact",
                group_by="verdict",
            )
        )
        if more > 0:
            parts.append(f"<p>{more} more op rows in inspection_ops.csv.</p>")
        if data.unattributed:
            parts.append(table_html(data.unattributed, ["what", "reason", "count"]))
    return "\n".join(parts)


def inspection_figures(inspections: Mapping[str, Any]) -> dict[str, Any]:
    """File stem -> Figure: the memory bars of every plan, and each plan's op-dtype bars."""
    items = _items(inspections)
    figs = {"inspection_memory": memory_breakdown_figure(items)}
    figs.update({f"inspection_ops_{_slug(k)}": op_dtype_figure(v) for k, v in items.items()})
    return figs


def inspection_html(inspections: Mapping[str, Any], *, level: int = 2, figures: bool = True) -> str:
    """An HTML section for several plans' inspections (figures embedded as PNG)."""
    h = f"h{level}"
    items = _items(inspections)
    pngs = (
        {stem: figure_to_png(fig) for stem, fig in inspection_figures(items).items()}
        if figures and items
        else None
    )
    return (
        f'<section class="inspection"><{h}>{TITLE}</{h}>'
        + inspection_body(items, level=level, pngs=pngs)
        + "</section>"
    )


#: The title of the inspection section.
TITLE = "Memory by kind and dtype; op dtypes"


def inspection_section(inspections: Mapping[str, Any]) -> Section:
    """The report's inspection section: CSVs, PNGs and their HTML (nothing written)."""
    import pandas as pd

    items = _items(inspections)
    files = []
    for name in ("memory", "ops", "policy"):
        frames = [getattr(i, name).assign(plan=label) for label, i in items.items()]
        frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        if name == "policy" and frame.empty:
            continue
        files.append(csv_file(f"inspection_{name}.csv", frame))
    pngs = {stem: figure_to_png(fig) for stem, fig in inspection_figures(items).items()}
    files += [ReportFile(f"{stem}.png", png) for stem, png in pngs.items()]
    return Section("inspection", TITLE, inspection_body(items, pngs=pngs), tuple(files))


def write_inspection(inspections: Mapping[str, Any], out: str | Path) -> dict[str, Path]:
    """Write ``inspection_memory.csv``, ``inspection_ops.csv``, PNGs and ``inspection.html``
    into ``out``, atomically (:func:`~precision_nb.views.report.folder.write_files`)."""
    section = inspection_section(inspections)
    document = page("precision_nb inspection", [section_html(section)])
    files = (*section.files, ReportFile("inspection.html", document.encode("utf-8")))
    return write_files(Path(out), files)


def _items(inspections: Mapping[str, Any]) -> dict[str, Inspection]:
    return {k: v if isinstance(v, Inspection) else Inspection(v) for k, v in inspections.items()}


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in label).strip("_") or "plan"
