"""HTML of the panel's Memory, Ops and Numerics views (plain strings: cheap, no matplotlib).

- :func:`memory_chart_svg`: one stacked bar per plan of the memory an inspection measured, by kind
  and dtype (rows counted in the sum only), with the allocator peak marked where the device has
  one; host RSS is named as process memory, never drawn as model memory.
- :func:`ops_html`: the op trace summary of one plan (verdicts, calls, FLOP share, cast bytes)
  and its flags.
- :func:`numerics_html`: the safe fp16 loss-scale window and the gradient underflow table (one row
  per parameter tensor, one column per format, shaded by the fraction lost), then the block-scaled
  formats' section when one was asked for (``views.report.blocks``).
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from precision_nb.views.panel.results import table_html
from precision_nb.views.report.blocks import blocks_html

__all__ = ["memory_chart_svg", "numerics_html", "ops_html", "stacked_bars_svg"]

KIND_COLORS = {
    "parameters": "#1f77b4",
    "gradients": "#ff7f0e",
    "optimizer state": "#2ca02c",
    "autocast weight copies": "#9467bd",
    "activations saved for backward": "#d62728",
    "inputs saved for backward": "#8c564b",
    "grad scaler state": "#e377c2",
}
LOW_DTYPES = ("bf16", "fp16", "float16", "bfloat16")
BAR_H, LABEL_W, CHART_W = 22, 150, 420


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.2f} MiB" if nbytes >= 2**16 else f"{nbytes / 1024:,.1f} KiB"


def _segments(rows: Sequence[Mapping[str, Any]]) -> tuple[list[tuple[str, str, int]], bool]:
    """(kind, dtype, bytes) of the counted rows; True when measured (else hand arithmetic)."""
    measured = any(r.get("counted") and r.get("bytes") is not None for r in rows)
    key = "bytes" if measured else "expected_bytes"
    out = [
        (str(r["kind"]), str(r.get("dtype")), int(r[key]))
        for r in rows
        if r.get("counted") and isinstance(r.get(key), int) and r[key] > 0
    ]
    return out, measured


def _uncounted(rows: Sequence[Mapping[str, Any]], prefix: str) -> int | None:
    for r in rows:
        if not r.get("counted") and str(r.get("kind", "")).startswith(prefix):
            value = r.get("bytes")
            return int(value) if isinstance(value, (int, float)) else None
    return None


def stacked_bars_svg(
    bars: Mapping[str, Sequence[tuple[str, str, int]]],
    peaks: Mapping[str, int | None] | None = None,
    *,
    css: str = "pnb-memory-chart",
) -> str:
    """One horizontal bar per label, stacked by (kind, dtype, bytes) segments (low-precision
    dtypes lighter, bytes on hover), a ``|`` where ``peaks`` gives one; then the kinds' legend."""
    peaks = peaks or {}
    top = max(
        [sum(b for _, _, b in segs) for segs in bars.values()]
        + [p for p in peaks.values() if p]
        + [1]
    )
    height = BAR_H * len(bars) + 8  # the bars and a margin; the legend follows below
    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' class='{css}' width='"
        f"{LABEL_W + CHART_W + 90}' height='{height}' style='font-family:sans-serif;"
        "background:#fff'>"
    ]
    kinds_seen: dict[str, None] = {}
    for row, (label, segs) in enumerate(bars.items()):
        y = 4 + row * BAR_H
        parts.append(
            f"<text x='{LABEL_W - 4}' y='{y + 14}' font-size='11' text-anchor='end'>"
            f"{html.escape(label)}</text>"
        )
        x = float(LABEL_W)
        for kind, dtype, nbytes in segs:
            kinds_seen[kind] = None
            width = nbytes / top * CHART_W
            color = KIND_COLORS.get(kind, "#7f7f7f")
            opacity = "0.55" if dtype in LOW_DTYPES else "1"
            tip = f"{label}: {kind}, {dtype}: {nbytes:,} bytes ({_mib(nbytes)})"
            parts.append(
                f"<rect class='pnb-mem-seg' x='{x:.1f}' y='{y}' width='{max(width, 0.5):.1f}' "
                f"height='{BAR_H - 6}' fill='{color}' fill-opacity='{opacity}' stroke='#fff'>"
                f"<title>{html.escape(tip)}</title></rect>"
            )
            x += width
        total = sum(b for _, _, b in segs)
        parts.append(f"<text x='{x + 4:.1f}' y='{y + 14}' font-size='10'>{_mib(total)}</text>")
        peak = peaks.get(label)
        if peak:
            px = LABEL_W + peak / top * CHART_W
            parts.append(
                f"<line class='pnb-allocator-peak' x1='{px:.1f}' x2='{px:.1f}' y1='{y - 2}' "
                f"y2='{y + BAR_H - 4}' stroke='#000' stroke-width='2'><title>allocator peak "
                f"(this step): {_mib(peak)}</title></line>"
            )
    legend = " ".join(  # an item never breaks across lines
        f"<span style='white-space:nowrap;margin-right:6px'><span style='color:"
        f"{KIND_COLORS.get(k, '#7f7f7f')}'>&#9632;</span> {html.escape(k)}</span>"
        for k in kinds_seen
    )
    return "".join(parts) + f"</svg><div style='font-size:12px'>{legend}</div>"


def memory_chart_svg(inspections: Mapping[str, Any]) -> str:
    """Stacked bars (kind, dtype) per plan; the allocator peak marked ``|`` where measured."""
    if not inspections:
        return ""
    bars, peaks = {}, {}
    for label, data in inspections.items():
        segs, measured = _segments(data.memory)
        name = label + ("" if measured else " (expected)")
        bars[name] = segs
        peaks[name] = _uncounted(data.memory, "allocator peak")
    rss = {label: _uncounted(d.memory, "process memory") for label, d in inspections.items()}
    notes = [
        "One instrumented training step per plan on a copy of the model (outside the timed "
        "steps). Low-precision dtypes are drawn lighter; hover a segment for its bytes."
    ]
    if any(peaks.values()):
        notes.append("The black line marks the allocator's peak during the step.")
    if any(rss.values()):
        shown = ", ".join(f"{k} {_mib(v)}" for k, v in rss.items() if v)
        notes.append(f"Process memory (host RSS; the whole process, not model memory): {shown}.")
    note = " ".join(html.escape(n) for n in notes)
    return stacked_bars_svg(bars, peaks) + f"<div style='font-size:12px'><i>{note}</i></div>"


def ops_html(label: str, data: Any) -> str:
    """The op trace summary of one plan and its flags; for a simulated device, autocast's policy
    read from torch, grouped by what it does (labelled so: nothing ran)."""
    if data.simulated:
        groups: dict[tuple[str, str], list[str]] = {}
        for r in data.policy:
            groups.setdefault((str(r.get("policy")), str(r.get("dtype"))), []).append(
                str(r.get("op"))
            )
        head = f"<b>Ops of {html.escape(label)}</b>: autocast's policy in this torch, not a trace"
        rows = [(policy, dtype, ", ".join(ops)) for (policy, dtype), ops in groups.items()]
        columns: Sequence[str] = ("policy", "dtype", "ops")
    else:
        head = f"<b>Ops of {html.escape(label)}</b> (one forward + backward, every ATen op)"
        rows = [
            (
                str(r.get("verdict", "")),
                str(r.get("calls", "")),
                "" if r.get("flops_share") is None else f"{r['flops_share']:.1%}",
                f"{r['bytes']:,}" if r.get("bytes") else "",
                str(r.get("ops", "")),
            )
            for r in data.summary
        ]
        columns = ("verdict", "calls", "FLOP share", "cast bytes", "ops")
    # the last column (a list of ops) wraps
    table = table_html(columns, rows, wrap=(len(columns) - 1,), css="pnb-ops-table")
    flags = "".join(f"<li>{html.escape(f.message)}</li>" for f in data.flags)
    return head + table + (f"<b>Worth a look</b><ul>{flags}</ul>" if flags else "")


def _shade(fraction: float | None) -> str:
    if fraction is None:
        return "background:#ddd"
    alpha = min(1.0, fraction**0.5)  # a power scale, as the heat map, so small fractions show
    return f"background:rgba(214,39,40,{alpha:.2f})"


def numerics_html(numerics: Any, max_rows: int = 40) -> str:
    """The window sentence, findings and the gradient underflow table of a Numerics."""
    parts = [f"<p class='pnb-window'><b>{html.escape(numerics.window_text())}</b></p>"]
    findings = "".join(f"<li>{html.escape(e.message)}</li>" for e in numerics.findings)
    if findings:
        parts.append(f"<ul>{findings}</ul>")
    rows = numerics.result.gradients
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    layers = list(dict.fromkeys(r["layer"] for r in rows))
    value = {(r["layer"], r["variant"]): r for r in rows}
    body = []
    for layer in layers[:max_rows]:
        tds = []
        for variant in variants:
            r = value.get((layer, variant), {})
            frac = r.get("underflow_fraction") if r.get("status") == "ok" else None
            text = f"{frac:.2%}" if frac is not None else html.escape(str(r.get("status", "")))
            tds.append(f"<td style='{_shade(frac)}'>{text}</td>")
        body.append(f"<tr><td>{html.escape(str(layer))}</td>{''.join(tds)}</tr>")
    more = len(layers) - max_rows
    head = "".join(f"<th>{html.escape(v)}</th>" for v in variants)
    parts.append(
        "<div><b>Gradient underflow</b>: of the non-zero fp32 gradient elements, the fraction a "
        "cast turns into 0 (structural zeros not counted)</div>"
        "<div class='pnb-table-wrap'><table class='pnb-table pnb-underflow'><thead><tr>"
        f"<th>parameter</th>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"
        + (f"<i>{more} more rows: see numerics.gradients</i>" if more > 0 else "")
        + "<div style='font-size:12px'><i>Exact counts for one batch and one step; other "
        "batches give other fractions.</i></div>"
    )
    parts.append(blocks_html(numerics.result, heading="b"))  # "" without a block format
    return "".join(parts)
