"""Live charts for the panel as inline SVG: loss, loss scale (log2, skipped steps marked),
throughput and peak memory, one line per run in the plan's colour.

Where the only memory reading is host RSS (a CPU), the memory chart is titled as process memory
with a note that it is not precision-specific; a device allocator's peak keeps its kind.

A matplotlib frame costs 0.3-0.9 s on a small CPU, so the panel can afford one only now and then;
these charts are plain strings (a few milliseconds for thousands of records), so they follow the
run live at no measurable cost. The final figures are still matplotlib's.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from precision_nb.core.svg_chart import MAX_POINTS, Point, chart_svg
from precision_nb.views.colors import colors_for_labels
from precision_nb.views.panel.results import HOST_RSS, note_html

__all__ = ["MAX_POINTS", "PROCESS_MEMORY_NOTE", "chart_svg", "live_charts_html"]

PROCESS_MEMORY_NOTE = (
    "Process memory (host RSS) is the memory of the whole Python process (interpreter, torch, "
    "every loaded library), not precision-specific; the Memory tab shows each plan's memory by "
    "kind and dtype, counted in one instrumented training step."
)


def _points(records: Sequence[Mapping[str, Any]], run: str, key: str) -> list[Point]:
    out = []
    for record in records:
        value = record.get(key)
        if record.get("run") == run and isinstance(value, (int, float)) and value is not True:
            out.append((float(record.get("step") or 0), float(value)))
    return out


def live_charts_html(
    records: Sequence[Mapping[str, Any]],
    colors: Mapping[str, str] | None = None,
    *,
    scale_window: tuple[int, int] | None = None,
    memory_note: bool = True,
) -> str:
    """The panel's live charts for the records so far (a comparison's runs overlaid);
    ``scale_window`` (log2 of the lowest and highest safe fp16 loss scale, from a numerics
    analysis) is shaded on the loss-scale chart. Where the only memory reading is host RSS, the
    memory chart is titled as process memory, with a note (``memory_note``) that it is not
    precision-specific; a device allocator's peak (CUDA, MPS) keeps its kind in the title."""
    runs = [str(r) for r in dict.fromkeys(rec.get("run") for rec in records) if r is not None]
    if not runs:
        return ""
    colors = dict(colors or colors_for_labels(runs))
    tokens = all(_points(records, run, "tokens_per_s") for run in runs)
    rate_key, rate_unit = ("tokens_per_s", "tokens/s") if tokens else ("samples_per_s", "samples/s")
    kinds = sorted({str(r.get("memory_kind")) for r in records if r.get("memory_kind")})
    process_only = kinds == [HOST_RSS]  # no allocator: the reading is the whole process's
    memory = {
        run: [(x, y / 2**20) for x, y in _points(records, run, "memory_peak_bytes")] for run in runs
    }
    skipped = {
        run: [
            (float(r.get("step") or 0), float(r["loss_scale"]))
            for r in records
            if r.get("run") == run and r.get("skipped") and r.get("loss_scale")
        ]
        for run in runs
    }
    charts = [
        chart_svg({run: _points(records, run, "loss") for run in runs}, colors, title="loss"),
        chart_svg(
            {run: _points(records, run, "loss_scale") for run in runs},
            colors,
            title="loss scale (log2, \u00d7 skipped)",
            log2=True,
            marks=skipped,
            empty="no loss scaler (fp16 only)",
            band=scale_window,
            band_label=(
                ""
                if scale_window is None
                else f"safe fp16 window 2^{scale_window[0]}-2^{scale_window[1]} (numerics, one "
                "batch)"
            ),
        ),
        chart_svg({run: _points(records, run, rate_key) for run in runs}, colors, title=rate_unit),
        chart_svg(
            memory,
            colors,
            title=(
                "process memory MiB (host RSS)"
                if process_only
                else f"peak memory MiB ({', '.join(kinds) or 'n/a'})"
            ),
            floor=0.0,
        ),
    ]
    legend = " ".join(
        f"<span style='color:{html.escape(colors[run], quote=True)}'>&#9632;</span> "
        f"{html.escape(run)}"
        for run in runs
    )
    show_note = process_only and memory_note
    note = note_html(PROCESS_MEMORY_NOTE, "pnb-memory-note") if show_note else ""
    return (
        "<div class='pnb-charts'>"
        + "".join(charts)
        + f"</div><div style='font-size:12px'>{legend}</div>{note}"
    )
