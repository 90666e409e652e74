"""The profile report: CSVs, PNG figures and a self-contained ``report.html``.

:func:`render_html` turns a ``Comparison`` into one HTML page with the figures embedded as base64
PNG, the plans with their explanations, the summary table, the hints and the events.
:func:`write_report` writes every output file into a folder; :func:`profile` validates its
arguments, runs the engine's comparison and writes the folder atomically (``precision-nb profile``,
in :mod:`precision_nb.views.report.profile`).
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from precision_nb.core.events import of_kind
from precision_nb.views.report import figures as F
from precision_nb.views.report.hints import Hint, hints, hints_by_run
from precision_nb.views.report.tables import results_of, scale_histories, summary, to_frame

__all__ = [
    "FIGURES",
    "OUTPUT_FILES",
    "make_figures",
    "render_html",
    "write_report",
]

log = logging.getLogger(__name__)

#: Figure file stem -> figure function; every one is written as ``<stem>.png``.
FIGURES: dict[str, Callable[..., Figure]] = {
    "dashboard": F.dashboard_figure,
    "loss": F.loss_figure,
    "loss_scale": F.loss_scale_figure,
    "throughput": F.throughput_figure,
    "memory": F.memory_figure,
}

#: Every file :func:`write_report` writes.
OUTPUT_FILES = ("metrics.csv", "summary.csv", *(f"{s}.png" for s in FIGURES), "report.html")

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;
max-width:1100px;padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}
th,td{border:1px solid #ddd;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
img{max-width:100%;height:auto}.swatch{display:inline-block;width:.9em;height:.9em;
border-radius:2px;margin-right:.35em;vertical-align:-.1em}
.hint{margin:.3em 0}.measure{color:#666;font-size:.88em}.merged{background:#fff8e1;
padding:.5em .8em;border-left:4px solid #f0ad4e}.scroll{overflow-x:auto}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:.5em}
details{margin:.5em 0}summary{cursor:pointer;color:#245}
pre{background:#f7f7f7;padding:.6em;white-space:pre-wrap;font-size:.85em}
"""


def make_figures(comparison: Any, *, colors: Mapping[str, str] | None = None) -> dict[str, Figure]:
    """Every report figure for ``comparison`` (stem -> Figure), one colour map for all."""
    frame = to_frame(comparison)
    colors = colors or F.plan_colors(list(dict.fromkeys(frame["run"].tolist())))
    histories = scale_histories(comparison)
    out: dict[str, Figure] = {}
    for stem, make in FIGURES.items():
        if make in (F.loss_scale_figure, F.dashboard_figure):
            out[stem] = make(frame, colors=colors, histories=histories)
        else:
            out[stem] = make(frame, colors=colors)
    return out


def write_report(
    comparison: Any,
    out_dir: str | Path,
    *,
    settings: Mapping[str, Any] | None = None,
    title: str = "precision_nb profile",
    inspections: Mapping[str, Any] | None = None,
    numerics: Any = None,
    distributed: Mapping[str, Any] | None = None,
) -> dict[str, Path]:
    """Write metrics.csv, summary.csv, one PNG per figure and report.html into ``out_dir``.

    With ``inspections`` (label -> ``InspectionData``), ``numerics`` (a ``Numerics``) and
    ``distributed`` (label -> ``DistributedResult``), their CSVs and figures are written too and
    report.html gets their sections (:mod:`precision_nb.views.report.profile_sections`).

    summary.csv is :func:`~precision_nb.views.report.tables.summary` plus a ``hints`` column (the
    messages of the hints about that plan, `` | ``-separated). ``out_dir`` is created when
    missing. A write that fails raises ``OSError`` whose ``filename`` is the file it was writing.
    Returns file name -> path for every file written.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    frame = to_frame(comparison)
    table = summary(comparison)
    written: dict[str, Path] = {}

    def _write(name: str, data: bytes | str | Callable[[Path], Any]) -> None:
        path = out_dir / name
        try:
            if callable(data):
                data(path)
            elif isinstance(data, bytes):
                path.write_bytes(data)
            else:
                path.write_text(data, encoding="utf-8")
        except OSError as err:
            raise OSError(err.errno, err.strerror or str(err), str(path)) from err
        written[name] = path

    hint_list = hints(comparison)
    _write("metrics.csv", lambda path: frame.to_csv(path, index=False))
    per_run = hints_by_run(hint_list, [str(label) for label in table["run"]])
    with_hints = table.assign(
        hints=[" | ".join(h.message for h in per_run[str(label)]) for label in table["run"]]
    )
    _write("summary.csv", lambda path: with_hints.to_csv(path, index=False))
    pngs = {stem: F.figure_to_png(fig) for stem, fig in make_figures(comparison).items()}
    for stem, png in pngs.items():
        _write(f"{stem}.png", png)
    sections: list[str] = []
    if inspections or numerics is not None or distributed:
        from precision_nb.views.report.profile_sections import write_sections

        try:
            extra, sections = write_sections(out_dir, inspections, numerics, distributed)
        except OSError as err:
            raise OSError(err.errno, err.strerror or str(err), err.filename) from err
        written.update(extra)
    _write(
        "report.html",
        render_html(
            comparison,
            settings=settings,
            title=title,
            pngs=pngs,
            table=table,
            hint_list=hint_list,
            sections=sections,
        ),
    )
    log.info("wrote %d files into %s", len(written), out_dir)
    return written


# ----------------------------------------------------------------------------- HTML


def render_html(
    comparison: Any,
    *,
    settings: Mapping[str, Any] | None = None,
    title: str = "precision_nb profile",
    pngs: Mapping[str, bytes] | None = None,
    table: Any = None,
    hint_list: Sequence[Hint] | None = None,
    sections: Sequence[str] = (),
) -> str:
    """A self-contained HTML page (no external files or scripts) for ``comparison``.

    ``sections``: extra HTML sections (inspection, numerics, distributed), after the summary.
    """
    e = html.escape
    results = results_of(comparison)
    if pngs is None:
        pngs = {stem: F.figure_to_png(fig) for stem, fig in make_figures(comparison).items()}
    if table is None:
        table = summary(comparison)
    if hint_list is None:
        hint_list = hints(comparison)
    colors = F.plan_colors(list(results) or table["run"].tolist())
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{e(title)}</h1>",
        f'<p class="measure">Generated {e(stamp)} by precision_nb.</p>',
        _settings_html(comparison, settings),
        _merged_html(comparison),
        "<h2>Hints</h2>",
        _hints_html(hint_list),
        "<h2>Figures</h2>",
    ]
    for stem, png in pngs.items():
        if stem == "dashboard":
            parts.append(_img_html(stem, png))
    singles = [_img_html(stem, png) for stem, png in pngs.items() if stem != "dashboard"]
    if singles:
        parts.append(
            "<details><summary>Each figure on its own (also written as PNG files)</summary>"
            f'<div class="grid">{"".join(singles)}</div></details>'
        )
    parts += ["<h2>Summary</h2>", _table_html(table, colors)]
    parts += list(sections)
    parts += ["<h2>Plans and why they resolved that way</h2>", _plans_html(results, colors)]
    parts += ["<h2>Events</h2>", _events_html(comparison, results)]
    parts.append("</body></html>")
    return "\n".join(p for p in parts if p)


def _img_html(stem: str, png: bytes) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (
        f'<figure><img alt="{html.escape(stem)} figure" data-figure="{html.escape(stem)}" '
        f'src="data:image/png;base64,{data}"></figure>'
    )


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.3g}"
        return f"{value:.4g}"
    return str(value)


def _settings_html(comparison: Any, settings: Mapping[str, Any] | None) -> str:
    e = html.escape
    rows: dict[str, Any] = dict(settings or {})
    for result in results_of(comparison).values():
        info = getattr(result, "workload", None) or {}
        for key in ("name", "preset", "batch_size", "params", "flops_per_step"):
            if key in info and f"workload {key}" not in rows:
                rows[f"workload {key}"] = info[key]
        if "dims" in info and "workload dims" not in rows:
            dims = info["dims"]
            rows["workload dims"] = ", ".join(f"{k}={v}" for k, v in dims.items())
        break
    if not rows:
        return ""
    body = "".join(f"<tr><th>{e(str(k))}</th><td>{e(_fmt(v))}</td></tr>" for k, v in rows.items())
    return f"<h2>Settings</h2><table>{body}</table>"


def _merged_html(comparison: Any) -> str:
    e = html.escape
    merged = getattr(comparison, "merged", None) or {}
    moved = {req: run for req, run in merged.items() if req != run}
    if not moved:
        return ""
    results = results_of(comparison)
    items = []
    for request, run in moved.items():
        result = results.get(run)
        plan = getattr(getattr(result, "explanation", None), "summary", None)
        plan_text = f" ({plan()})" if callable(plan) else ""
        reasons = _merge_reasons(comparison, request)
        items.append(
            f"<li><b>{e(request)}</b> resolved to the same plan as <b>{e(run)}</b>"
            f"{e(plan_text)}, so it was run once.{reasons}</li>"
        )
    return (
        '<div class="merged"><b>Requests merged</b> (same resolved plan, same seed: running '
        f"them twice would only measure noise)<ul>{''.join(items)}</ul></div>"
    )


def _merge_reasons(comparison: Any, request: str) -> str:
    """The comparison's own event that explains why ``request`` was merged, when present."""
    for event in of_kind(getattr(comparison, "events", None), "merged"):
        if event.data.get("label") == request and event.data.get("why"):
            return " Why: " + html.escape(str(event.data["why"]))
    return ""


def _hints_html(hint_list: Sequence[Hint]) -> str:
    e = html.escape
    if not hint_list:
        return "<p>No hint: nothing in the measurements stands out.</p>"
    items = "".join(
        f'<li class="hint" data-topic="{e(h.topic)}"><b>{e(h.run)}</b>: {e(h.message)} '
        f'<span class="measure">(from: {e(h.measurement)}; see {e(h.figure)})</span></li>'
        for h in hint_list
    )
    return f"<ul>{items}</ul>"


def _table_html(table: Any, colors: Mapping[str, str]) -> str:
    """The summary transposed: one column per plan, one row per measurement (fits the page)."""
    e = html.escape
    records = table.to_dict("records")
    head = "".join(
        f'<th><span class="swatch" style="background:{colors.get(str(r["run"]), "#999")}">'
        f"</span>{e(str(r['run']))}</th>"
        for r in records
    )
    body = []
    for column in table.columns:
        if column == "run":
            continue
        cells = []
        for r in records:
            value = r[column]
            numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
            css = ' class="num"' if numeric else ""
            cells.append(f"<td{css}>{e(_fmt(value))}</td>")
        body.append(f"<tr><th>{e(str(column))}</th>{''.join(cells)}</tr>")
    return (
        f'<div class="scroll"><table id="summary"><thead><tr><th>plan</th>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
        '<p class="measure">Also written as summary.csv (one row per plan); every logged step is '
        "in metrics.csv.</p>"
    )


def _plans_html(results: Mapping[str, Any], colors: Mapping[str, str]) -> str:
    e = html.escape
    parts = []
    for label, result in results.items():
        swatch = colors.get(label, "#999")
        parts.append(f'<h3><span class="swatch" style="background:{swatch}"></span>{e(label)}</h3>')
        explanation = getattr(result, "explanation", None)
        if explanation is None:
            parts.append(f"<p>Plan: {e(str(getattr(result, 'plan', '')))}</p>")
        else:
            parts.append(f'<pre class="explanation">{e(str(explanation))}</pre>')
            if hasattr(explanation, "_repr_html_"):
                parts.append(
                    "<details><summary>Resolution matrix with the applied row</summary>"
                    f'<div class="scroll">{explanation._repr_html_()}</div></details>'
                )
        outcome = getattr(result, "optimizer_outcome", None)
        if outcome is not None:
            parts.append(
                "<p><b>AdamW:</b> fused "
                f"{'used' if getattr(outcome, 'used', False) else 'not used'}"
                f" — {e(str(getattr(outcome, 'reason', '')))}</p>"
            )
    return "\n".join(parts) if parts else "<p>No run.</p>"


def _events_html(comparison: Any, results: Mapping[str, Any]) -> str:
    e = html.escape
    items = [f"<li>{e(str(ev))}</li>" for ev in getattr(comparison, "events", None) or []]
    seen = {str(ev) for ev in getattr(comparison, "events", None) or []}
    for label, result in results.items():
        for ev in getattr(result, "events", None) or []:
            if str(ev) not in seen and f"{label}: {ev}" not in seen:
                items.append(f"<li><b>{e(label)}</b>: {e(str(ev))}</li>")
    if not items:
        return "<p>No event: no fallback, warning or stop happened.</p>"
    return f"<ul>{''.join(items)}</ul>"
