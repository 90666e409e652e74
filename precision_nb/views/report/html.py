"""The profile report: its sections, the self-contained ``report.html`` and the folder's files.

A report is built in three steps. Compute: the comparison, and optionally each plan's inspection,
the numerics analysis and the distributed results, all made before anything here runs. Sections:
:func:`report_sections` turns them into frozen :class:`~.sections.Section` values (title, HTML,
files), the answer first (one card per plan), then what the measurements say, the figures, the
details and the settings last (collapsed). Write: :func:`write_report` writes the sections' files
and ``report.html`` atomically (:func:`~precision_nb.views.report.folder.write_files`).
"""

from __future__ import annotations

import datetime as _dt
import html
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from precision_nb.engine.compare import Comparison
from precision_nb.views.report import figures as F
from precision_nb.views.report.answer import answer_section, answers, other_hints
from precision_nb.views.report.compiled import compiled_section
from precision_nb.views.report.folder import write_files
from precision_nb.views.report.hints import Hint, hints, hints_by_run
from precision_nb.views.report.inspection import inspection_section
from precision_nb.views.report.markup import details, fmt, img_html, page, swatch, td
from precision_nb.views.report.numerics import numerics_section
from precision_nb.views.report.profile_distributed import distributed_section
from precision_nb.views.report.sections import (
    ReportFile,
    Section,
    csv_file,
    files_of,
    section_html,
)
from precision_nb.views.report.source import as_comparison
from precision_nb.views.report.tables import RecordSource, summary, to_frame
from precision_nb.views.report.time_split import time_split_section

__all__ = [
    "FIGURES",
    "OUTPUT_FILES",
    "make_figures",
    "render_html",
    "report_files",
    "report_sections",
    "write_report",
]

#: Figure file stem -> figure function; every one is written as ``<stem>.png``.
FIGURES: dict[str, Callable[..., Figure]] = {
    "dashboard": F.dashboard_figure,
    "loss": F.loss_figure,
    "loss_scale": F.loss_scale_figure,
    "throughput": F.throughput_figure,
    "memory": F.memory_figure,
}

#: Every file a report writes without inspection, numerics or distributed sections.
OUTPUT_FILES = ("metrics.csv", "summary.csv", *(f"{s}.png" for s in FIGURES), "report.html")

DEFAULT_TITLE = "precision_nb profile"


def make_figures(
    source: RecordSource,
    *,
    colors: Mapping[str, str] | None = None,
    inspections: Mapping[str, Any] | None = None,
) -> dict[str, Figure]:
    """Every report figure (stem -> Figure), one colour map for all. With ``inspections`` the
    dashboard's memory panel is memory by kind (see :func:`~.figures.dashboard_figure`)."""
    comparison = as_comparison(source)
    colors = colors or F.plan_colors(list(comparison.results))
    dashboard = {"inspections": inspections}
    return {
        stem: make(comparison, colors=colors, **(dashboard if make is F.dashboard_figure else {}))
        for stem, make in FIGURES.items()
    }


def report_sections(
    source: RecordSource,
    *,
    settings: Mapping[str, Any] | None = None,
    inspections: Mapping[str, Any] | None = None,
    numerics: Any = None,
    distributed: Mapping[str, Any] | None = None,
    hint_list: Sequence[Hint] | None = None,
    table: Any = None,
    pngs: Mapping[str, bytes] | None = None,
) -> tuple[Section, ...]:
    """The report's sections in page order, each with the files it adds to the folder.

    ``hint_list`` / ``table`` / ``pngs`` (figure stem -> PNG): already computed values to reuse;
    each is computed when None (``pngs={}`` leaves the figures out).
    """
    comparison = as_comparison(source)
    table = summary(comparison) if table is None else table
    hint_list = hints(comparison) if hint_list is None else list(hint_list)
    if pngs is None:
        figures = make_figures(comparison, inspections=inspections)
        pngs = {stem: F.figure_to_png(fig) for stem, fig in figures.items()}
    plans = answers(comparison, inspections=inspections, numerics=numerics)
    colors = F.plan_colors(list(comparison.results) or table["run"].tolist())
    sections = [
        answer_section(plans, comparison.load_note),
        Section("hints", "What the measurements say", _hints_html(other_hints(hint_list, plans))),
        _figures_section(comparison, pngs),
        _summary_section(comparison, table, hint_list, colors, pngs),
    ]
    if comparison.time_split is not None:
        sections.append(time_split_section(comparison.time_split))
    if getattr(comparison, "compiled", None):
        sections.append(compiled_section(comparison.compiled))
    if distributed:
        sections.append(distributed_section(distributed))
    if inspections:
        sections.append(inspection_section(inspections))
    if numerics is not None:
        sections.append(numerics_section(numerics))
    sections += [
        Section("plans", "Plans and why they resolved that way", _plans_html(comparison, colors)),
        Section("events", "Events", _events_html(comparison)),
        Section("settings", "Settings", _settings_html(comparison, settings), collapsed=True),
    ]
    return tuple(sections)


def render_html(
    source: RecordSource,
    *,
    title: str = DEFAULT_TITLE,
    sections: Sequence[Section] | None = None,
    **parts: Any,
) -> str:
    """A self-contained HTML page (no external files or scripts) of the report's sections.

    ``sections``: already built ones; otherwise :func:`report_sections` builds them from
    ``source`` and ``parts`` (its keyword arguments).
    """
    if sections is None:
        sections = report_sections(source, **parts)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return page(
        title, [section_html(s) for s in sections], stamp=f"Generated {stamp} by precision_nb."
    )


def report_files(
    source: RecordSource,
    *,
    title: str = DEFAULT_TITLE,
    wording: Callable[[str], str] | None = None,
    **parts: Any,
) -> tuple[ReportFile, ...]:
    """Every file of the report folder: the sections' files, then ``report.html``. ``wording``
    rewrites the text files (HTML, CSV) for their reader, e.g. the command line's flags where the
    library names a Python argument."""
    sections = report_sections(source, **parts)
    text = render_html(source, title=title, sections=sections)
    files = (*files_of(sections), ReportFile("report.html", text.encode("utf-8")))
    if wording is None:
        return files
    return tuple(
        ReportFile(f.name, wording(f.data.decode("utf-8")).encode("utf-8"))
        if f.name.endswith((".html", ".csv"))
        else f
        for f in files
    )


def write_report(
    source: RecordSource,
    out_dir: str | Path,
    *,
    title: str = DEFAULT_TITLE,
    stop: Any = None,
    wording: Callable[[str], str] | None = None,
    **parts: Any,
) -> dict[str, Path]:
    """Write metrics.csv, summary.csv, one PNG per figure, the sections' files and report.html
    into ``out_dir``, all at once or not at all.

    ``parts``: the keyword arguments of :func:`report_sections` (``settings``, ``inspections``,
    ``numerics``, ``distributed``, ...). summary.csv is the summary table plus a ``hints``
    column (the messages of the hints about that plan, `` | ``-separated). ``out_dir`` is created
    when missing; a write that fails raises ``ReportWriteError`` and leaves it as it was, as does
    Ctrl-C or ``stop`` (see :func:`~precision_nb.views.report.folder.write_files`). ``wording``:
    see :func:`report_files`. Returns file name -> path for every file written.
    """
    files = report_files(source, title=title, wording=wording, **parts)
    return write_files(Path(out_dir), files, stop=stop)


# ----------------------------------------------------------------------------- sections


def _figures_section(comparison: Comparison, pngs: Mapping[str, bytes]) -> Section:
    files = tuple(ReportFile(f"{stem}.png", png) for stem, png in pngs.items())
    parts = [img_html(stem, png) for stem, png in pngs.items() if stem == "dashboard"]
    shown = [s for s in ("loss", "loss_scale", "throughput") if s in pngs]
    if "loss_scale" in shown and not F.uses_loss_scale(comparison):
        shown.remove("loss_scale")  # its file is still written: it says no plan has a scale
    singles = [img_html(stem, pngs[stem]) for stem in shown]
    if singles:
        grid = f'<div class="grid">{"".join(singles)}</div>'
        parts.append(details("Each figure on its own (also written as PNG files)", grid))
    return Section("figures", "Figures", "\n".join(parts), files)


def _summary_section(
    comparison: Comparison,
    table: Any,
    hint_list: Sequence[Hint],
    colors: Mapping[str, str],
    pngs: Mapping[str, bytes],
) -> Section:
    """The summary table (one column per plan), the memory the runs recorded, and the CSVs."""
    per_run = hints_by_run(hint_list, [str(label) for label in table["run"]])
    with_hints = table.assign(
        hints=[" | ".join(h.message for h in per_run[str(label)]) for label in table["run"]]
    )
    files = (csv_file("metrics.csv", to_frame(comparison)), csv_file("summary.csv", with_hints))
    parts = [_table_html(table, colors)]
    if "memory" in pngs:
        caption = "Peak memory as the runs recorded it"
        if "memory_kind" in table and "host_rss" in table["memory_kind"].tolist():
            caption += (
                " (host RSS: the whole Python process, interpreter, torch and libraries "
                "included, not the model's tensors; memory by kind is in the dashboard and the "
                "inspection)"
            )
        parts.append(f'<p class="measure">{html.escape(caption)}.</p>')
        parts.append(img_html("memory", pngs["memory"]))
    return Section("summary", "Summary", "\n".join(parts), files)


def _settings_html(comparison: Comparison, settings: Mapping[str, Any] | None) -> str:
    e = html.escape
    rows: dict[str, Any] = dict(settings or {})
    info = next((r.workload for r in comparison.results.values()), {})
    for key in ("name", "preset", "batch_size", "params", "flops_per_step"):
        if key in info and f"workload {key}" not in rows:
            rows[f"workload {key}"] = info[key]
    if "dims" in info and "workload dims" not in rows:
        rows["workload dims"] = ", ".join(f"{k}={v}" for k, v in info["dims"].items())
    if not rows:
        return "<p>No setting was recorded.</p>"
    body = "".join(f"<tr><th>{e(str(k))}</th><td>{e(fmt(v))}</td></tr>" for k, v in rows.items())
    return f"<table>{body}</table>"


def _hints_html(hint_list: Sequence[Hint]) -> str:
    e = html.escape
    if not hint_list:
        return "<p>No hint: nothing else in the measurements stands out.</p>"
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
        f"<th>{swatch(colors.get(str(r['run']), '#999'))}{e(str(r['run']))}</th>" for r in records
    )
    body = [
        f"<tr><th>{e(str(c))}</th>{''.join(td(r[c], fmt(r[c])) for r in records)}</tr>"
        for c in table.columns
        if c != "run"
    ]
    return (
        f'<div class="scroll"><table id="summary"><thead><tr><th>plan</th>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
        '<p class="measure">Also written as summary.csv (one row per plan); every logged step is '
        "in metrics.csv.</p>"
    )


def _plans_html(comparison: Comparison, colors: Mapping[str, str]) -> str:
    e = html.escape
    parts = []
    for label, result in comparison.results.items():
        parts.append(f"<h3>{swatch(colors.get(label, '#999'))}{e(label)}</h3>")
        explanation = result.explanation
        if explanation is None:
            parts.append(f"<p>Plan: {e(str(result.plan))}</p>")
        else:
            parts.append(f'<pre class="explanation">{e(str(explanation))}</pre>')
            matrix = f'<div class="scroll">{explanation._repr_html_()}</div>'
            parts.append(details("Resolution matrix with the applied row", matrix))
        outcome = result.optimizer_outcome
        if outcome is not None:
            parts.append(
                f"<p><b>AdamW:</b> fused {'used' if outcome.used else 'not used'}"
                f" — {e(str(outcome.reason))}</p>"
            )
    return "\n".join(parts) if parts else "<p>No run.</p>"


def _events_html(comparison: Comparison) -> str:
    e = html.escape
    items = [f"<li>{e(str(ev))}</li>" for ev in comparison.events]
    seen = {str(ev) for ev in comparison.events}
    for label, result in comparison.results.items():
        for ev in result.events:
            if str(ev) not in seen and f"{label}: {ev}" not in seen:
                items.append(f"<li><b>{e(label)}</b>: {e(str(ev))}</li>")
    if not items:
        return "<p>No event: no fallback, warning or stop happened.</p>"
    return f"<ul>{''.join(items)}</ul>"
