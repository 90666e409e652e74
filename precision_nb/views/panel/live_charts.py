"""Live charts for the panel as inline SVG: loss, loss scale (log2, skipped steps marked),
throughput and peak memory, one line per run in the plan's colour.

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

__all__ = ["MAX_POINTS", "chart_svg", "live_charts_html"]


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
) -> str:
    """The panel's live charts for the records so far (a comparison's runs overlaid);
    ``scale_window`` (log2 of the lowest and highest safe fp16 loss scale, from a numerics
    analysis) is shaded on the loss-scale chart."""
    runs = [str(r) for r in dict.fromkeys(rec.get("run") for rec in records) if r is not None]
    if not runs:
        return ""
    colors = dict(colors or colors_for_labels(runs))
    tokens = all(_points(records, run, "tokens_per_s") for run in runs)
    rate_key, rate_unit = ("tokens_per_s", "tokens/s") if tokens else ("samples_per_s", "samples/s")
    kinds = sorted({str(r.get("memory_kind")) for r in records if r.get("memory_kind")})
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
        chart_svg(memory, colors, title=f"peak memory MiB ({', '.join(kinds) or 'n/a'})"),
    ]
    legend = " ".join(
        f"<span style='color:{html.escape(colors[run], quote=True)}'>&#9632;</span> "
        f"{html.escape(run)}"
        for run in runs
    )
    return (
        "<div class='pnb-charts'>"
        + "".join(charts)
        + f"</div><div style='font-size:12px'>{legend}</div>"
    )
