"""``precision_nb.inspect()``: memory by kind and dtype, and the op dtype trace, as tables.

:class:`Inspection` wraps the engine's plain rows
(:class:`~precision_nb.engine.inspect.InspectionData`) as pandas DataFrames, renders itself in a
notebook (``_repr_html_``) and draws its figures. :func:`inspection_html` is the HTML section the
reports embed; :func:`write_inspection` writes CSVs, PNGs and that section into a folder.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from precision_nb.engine.inspect import InspectionData, run_inspection
from precision_nb.views.report.figures import figure_to_png
from precision_nb.views.report.html import _fmt, _img_html
from precision_nb.views.report.inspection_figures import memory_breakdown_figure, op_dtype_figure

__all__ = ["Inspection", "inspect", "inspection_html", "write_inspection"]

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
_OPS_SHOWN = 25


def _frame(rows: list[dict[str, Any]], columns: list[str] | None = None) -> Any:
    import pandas as pd

    return pd.DataFrame(rows, columns=columns if not rows else None)


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

    @property
    def memory(self) -> Any:
        """DataFrame: kind, dtype, bytes (measured), expected_bytes (hand arithmetic), ..."""
        return _frame(self.data.memory, MEMORY_COLUMNS)

    @property
    def ops(self) -> Any:
        """DataFrame: one row per (phase, torch call, ATen op, input dtypes, output dtype)."""
        return _frame(self.data.ops, OPS_COLUMNS)

    @property
    def summary(self) -> Any:
        """DataFrame: the trace grouped by verdict (calls, FLOPs share, cast bytes, ops)."""
        return _frame(self.data.summary, ["verdict", "calls", "flops_share", "bytes", "ops"])

    @property
    def policy(self) -> Any:
        """DataFrame of autocast's policy read from torch (simulated devices; not a trace), with
        torch's documented list beside it as a cross-check."""
        return _frame(
            self.data.policy, ["op", "policy", "dtype", "evidence", "documented", "source"]
        )

    @property
    def unattributed(self) -> Any:
        return _frame(self.data.unattributed, ["what", "reason", "count"])

    def figures(self) -> dict[str, Any]:
        """``{"memory": stacked memory bar, "ops": op-dtype bar}`` (matplotlib Figures)."""
        return {"memory": memory_breakdown_figure(self), "ops": op_dtype_figure(self)}

    def to_dict(self) -> dict[str, Any]:
        return self.data.to_dict()

    def __repr__(self) -> str:
        total = _size(self.data.model_bytes())
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


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_cell(c, r.get(c)))}</td>" for c in columns) + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(column: str, value: Any) -> str:
    if value is None:
        return "—" if column in ("bytes", "expected_bytes") else ""
    if column in ("bytes", "expected_bytes", "cast_bytes") and isinstance(value, int):
        return f"{value:,}" + (f" ({value / 2**20:.2f} MiB)" if abs(value) >= 2**16 else "")
    if column == "flops_share":
        return f"{value:.1%}"
    return _fmt(value)


def inspection_html(inspections: Mapping[str, Any], *, level: int = 2, figures: bool = True) -> str:
    """An HTML section for several plans' inspections (figures embedded as PNG)."""
    h, h2 = f"h{level}", f"h{level + 1}"
    items = {k: v if isinstance(v, Inspection) else Inspection(v) for k, v in inspections.items()}
    parts = [f'<section class="inspection"><{h}>Memory by kind and dtype; op dtypes</{h}>']
    parts.append(
        "<p>Measured in one separate instrumented training step on a copy of the model (not in "
        "the timed steps). <em>bytes</em> are read from the tensors (each storage once); "
        "<em>expected_bytes</em> is hand arithmetic (numel x element size) where a formula "
        "holds. Rows not counted in the sum (allocator peak, process memory) are shown beside "
        "it.</p>"
    )
    if figures and items:
        parts.append(_img_html("inspection_memory", figure_to_png(memory_breakdown_figure(items))))
    for label, item in items.items():
        data = item.data
        parts.append(f"<{h2}>{html.escape(label)} on {html.escape(data.device)}</{h2}>")
        if data.flags:
            flags = "".join(f"<li>{html.escape(f.message)}</li>" for f in data.flags)
            parts.append(f"<ul class='flags'>{flags}</ul>")
        parts.append(_table(data.memory, MEMORY_COLUMNS))
        if data.simulated:
            parts.append(f"<p><strong>{html.escape(data.flags[0].message)}</strong></p>")
            parts.append(_table(data.policy, ["op", "policy", "dtype", "documented"]))
            continue
        if figures:
            parts.append(_img_html(f"inspection_ops_{label}", figure_to_png(op_dtype_figure(data))))
        parts.append(_table(data.summary, ["verdict", "calls", "flops_share", "bytes", "ops"]))
        shown = data.ops[:_OPS_SHOWN]
        more = len(data.ops) - len(shown)
        parts.append(_table(shown, OPS_COLUMNS))
        if more > 0:
            parts.append(f"<p>{more} more op rows in the ops table / CSV.</p>")
        if data.unattributed:
            parts.append(_table(data.unattributed, ["what", "reason", "count"]))
    parts.append("</section>")
    return "\n".join(parts)


def write_inspection(inspections: Mapping[str, Any], out: str | Path) -> dict[str, Path]:
    """Write ``inspection_memory.csv``, ``inspection_ops.csv``, PNGs and ``inspection.html``."""
    import pandas as pd

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    items = {k: v if isinstance(v, Inspection) else Inspection(v) for k, v in inspections.items()}
    files: dict[str, Path] = {}
    for name, attr in (("memory", "memory"), ("ops", "ops"), ("policy", "policy")):
        frames = [getattr(i, attr).assign(plan=label) for label, i in items.items()]
        frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        if name == "policy" and frame.empty:
            continue
        path = folder / f"inspection_{name}.csv"
        frame.to_csv(path, index=False)
        files[path.name] = path
    figs = {"inspection_memory": memory_breakdown_figure(items)}
    figs.update({f"inspection_ops_{_slug(k)}": op_dtype_figure(v) for k, v in items.items()})
    for stem, fig in figs.items():
        path = folder / f"{stem}.png"
        fig.savefig(path, dpi=100)
        files[path.name] = path
    page = folder / "inspection.html"
    page.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>precision_nb inspection</title>"
        "</head><body>" + inspection_html(items) + "</body></html>",
        encoding="utf-8",
    )
    files[page.name] = page
    return files


def _size(nbytes: int) -> str:
    """Bytes in the largest binary unit that keeps the number >= 1 (B, KiB, MiB, GiB)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} B"


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in label).strip("_") or "plan"
