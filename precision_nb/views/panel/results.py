"""The panel's Compare tab: the verdict first, then the table, and the notes that say how its
numbers were measured.

After a comparison the tab opens with one line per plan: the engine's verdict in its own words
(the interval is part of them), marked by the verdict's kind (faster, slower, unresolved, too few
rounds, baseline); nothing here words a verdict. How the speed was measured follows, as the
engine describes its measurement, then a table sized to the output width (plan, speedup with
its interval, step time, rate, memory, numerics, warm-up) and every column of the summary under
"All columns". A single run's figures are medians over its logged intervals: the tab says so and
shows no interval, no verdict.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from precision_nb.core.text import confidence_text, fmt, speedup_text, times_text
from precision_nb.core.text import number as as_number
from precision_nb.views.report import tables as col
from precision_nb.views.report.time_split import outcomes_html

__all__ = [
    "COMPARE_LIVE_NOTE",
    "HOST_RSS",
    "SINGLE_RUN_NOTE",
    "allocator_kinds",
    "note_html",
    "results_html",
    "table_html",
    "verdict_lines_html",
    "warmup_note_html",
]

SINGLE_RUN_NOTE = (
    "single-run figures: medians over this run's logged intervals, no interval, no verdict "
    "(Compare measures plans interleaved in rounds, with intervals)"
)
COMPARE_LIVE_NOTE = (
    f"live figures per logged interval; the measured speed (interleaved rounds, with "
    f"{confidence_text()} intervals) is in the Compare tab when the comparison ends"
)
SPEEDUP_HEADER = f"speedup vs fp32 ({confidence_text()} CI)"
#: The memory kind that is the whole process's resident memory, not a plan's own.
HOST_RSS = "host_rss"
#: The All columns header of a peak that is host RSS only.
PROCESS_MEMORY_COLUMN = f"{col.PEAK_MIB} (host RSS: the whole process)"

#: Colours of a verdict's mark, by the engine's ``verdict_kind`` (never by its wording).
_KIND_STYLE = {
    "faster": "background:#d4edda;color:#155724;border-color:#28a745",
    "slower": "background:#f8d7da;color:#721c24;border-color:#dc3545",
    "unresolved": "background:#eee;color:#333;border-color:#999",
    "too_few": "background:#fff3cd;color:#856404;border-color:#d39e00",
    "baseline": "background:#e7f1ff;color:#1b4f8a;border-color:#6c9bd2",
}
_OTHER_STYLE = "background:#f8f8f8;color:#333;border-color:#bbb"


def verdict_lines_html(labels: Sequence[str], outcomes: Mapping[str, Any]) -> str:
    """One line per plan with a verdict: the plan marked by the verdict's kind, then the
    engine's verdict text (and why the plan failed, where it did)."""
    lines = []
    for label in labels:
        outcome = outcomes.get(label)
        verdict = getattr(outcome, "verdict", None)
        failed = getattr(outcome, "failure", None)
        if verdict is None and not failed:
            continue
        kind = verdict.kind if verdict is not None else ""
        style = _KIND_STYLE.get(kind, _OTHER_STYLE)
        mark = (
            f"<span class='pnb-verdict-plan' style='{style};border:1px solid;border-radius:10px;"
            f"padding:0 8px;margin-right:8px;white-space:nowrap'>{html.escape(label)}</span>"
        )
        more = f" <i>failed: {html.escape(str(failed))}</i>" if failed else ""
        text = html.escape(str(verdict or ""))
        lines.append(
            f"<div class='pnb-verdict' data-kind='{html.escape(kind, quote=True)}' "
            f"style='margin:4px 0'>{mark}{text}{more}</div>"
        )
    return f"<div class='pnb-verdicts'>{''.join(lines)}</div>" if lines else ""


def _method_html(method: Mapping[str, Any] | None) -> str:
    """How the speed was measured, as the engine's measurement describes it."""
    if not method:
        return (
            "<div class='pnb-method'><i>Speed measured like a benchmark: warm-up apart, plans "
            "interleaved in rounds.</i></div>"
        )
    items = "".join(
        f"<li><b>{html.escape(str(k))}</b>: {html.escape(str(v))}</li>" for k, v in method.items()
    )
    return (
        "<details class='pnb-method'><summary><i>How the speed was measured (like a benchmark: "
        "warm-up apart, plans interleaved in rounds)</i></summary>"
        f"<ul style='margin:2px 0;font-size:12px'>{items}</ul></details>"
    )


def _ms(value: Any) -> str:
    number = as_number(value)
    return "" if number is None else f"{1000 * number:.3g}"


def table_html(
    head: Sequence[str], rows: Sequence[Sequence[str]], wrap: Sequence[int] = (), css: str = ""
) -> str:
    """A table in the panel's style (``css``: classes added to ``pnb-table``), sized to its
    content: numbers on one line, the text columns ``wrap`` wrapping and left-aligned; it scrolls
    inside the tab when wider than the output."""
    text = " class='pnb-text'"

    def cells(tag: str, values: Sequence[str]) -> str:
        return "".join(
            f"<{tag}{text if i in wrap else ''}>{html.escape(v)}</{tag}>"
            for i, v in enumerate(values)
        )

    body = "".join(f"<tr>{cells('td', row)}</tr>" for row in rows)
    classes = f"pnb-table {css}".strip()
    return (
        f"<div class='pnb-table-wrap'><table class='{classes}'>"
        f"<thead><tr>{cells('th', head)}</tr></thead><tbody>{body}</tbody></table></div>"
    )


def _compact(records: list[dict[str, Any]], outcomes: Mapping[str, Any], *, measured: bool) -> str:
    """Plan, speedup, step time, rate, memory, numerics, warm-up: the columns people compare
    (the rest is under "All columns")."""
    present = {k for r in records for k, v in r.items() if fmt(v)}
    allocator = allocator_kinds(records)
    rate = "tokens_per_s" if "tokens_per_s" in present else "samples_per_s"
    columns: list[tuple[str, Any]] = [("plan", lambda r: str(r.get("run", "")))]
    if measured:
        columns.append((SPEEDUP_HEADER, lambda r: speedup_text(outcomes.get(str(r.get("run"))))))
    columns += [
        ("step ms, median (IQR)", _step_cell),
        (rate.replace("_per_s", "/s"), lambda r: fmt(_round(r.get(rate)))),
    ]
    if allocator:  # the device's allocator: the plan's own tensors (host RSS is not shown here)
        columns.append((f"peak MiB ({', '.join(allocator)})", _allocator_cell))
    columns += [
        ("final loss", lambda r: fmt(r.get("final_loss"))),
        ("Δ loss vs fp32", lambda r: fmt(r.get(col.LOSS_DIFF))),
        ("weights rel. diff vs fp32", lambda r: fmt(r.get(col.PARAM_DIFF))),
        ("skipped steps", lambda r: fmt(r.get(col.SKIPPED))),
    ]
    if measured:
        columns.append(("warm-up", _warmup_cell))
    columns += _true_columns(records, outcomes)
    wrap = []
    if col.ALSO_REQUESTED in present:
        wrap.append(len(columns))
        columns.append(("also requested as", lambda r: str(r.get(col.ALSO_REQUESTED) or "")))
    rows = [[cell(r) for _name, cell in columns] for r in records]
    return table_html([name for name, _cell_of in columns], rows, wrap)


def _true_columns(
    records: Sequence[Mapping[str, Any]], outcomes: Mapping[str, Any]
) -> list[tuple[str, Any]]:
    """A true plan's columns, read from its typed outcome (where any plan has them): its
    parameter + gradient + optimizer-state bytes against the mixed plan of its dtype, and the
    updates its weights rounded away at the last measured step."""
    found = [outcomes.get(str(r.get("run"))) for r in records]
    out: list[tuple[str, Any]] = []
    if any(getattr(o, "saving", None) is not None for o in found):
        out.append(("params+grads+optimizer bytes vs mixed", lambda r: _saving_cell(outcomes, r)))
    if any(getattr(o, "lost_updates", None) is not None for o in found):
        out.append(("updates rounded away (step)", lambda r: _lost_cell(outcomes, r)))
    return out


def _saving_cell(outcomes: Mapping[str, Any], row: Mapping[str, Any]) -> str:
    saving = getattr(outcomes.get(str(row.get("run"))), "saving", None)
    return "" if saving is None else f"{times_text(saving.ratio, '.3f')} {saving.mixed}"


def _lost_cell(outcomes: Mapping[str, Any], row: Mapping[str, Any]) -> str:
    lost = getattr(outcomes.get(str(row.get("run"))), "lost_updates", None)
    return "" if lost is None else f"{lost.updates_rounded_away:.1%} ({lost.step})"


def allocator_kinds(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The memory kinds of ``records`` read from a device allocator (``cuda_allocated``,
    ``mps_allocated``): every kind but host RSS, which is the whole process's memory."""
    kinds = {str(r.get("memory_kind")) for r in records if r.get("memory_kind")}
    return sorted(kinds - {HOST_RSS})


def _allocator_cell(row: Mapping[str, Any]) -> str:
    if row.get("memory_kind") == HOST_RSS:
        return ""
    return fmt(row.get(col.PEAK_MIB))


def _process_memory_note(records: Sequence[Mapping[str, Any]], *, charted: bool) -> str:
    """Where a plan's memory is only host RSS: why the table leaves it out and where the plan's
    own memory is (``charted``: the memory chart follows the table)."""
    rss = [str(r.get("run", "")) for r in records if r.get("memory_kind") == HOST_RSS]
    if not rss:
        return ""
    which = "" if len(rss) == len(records) else f" of {', '.join(rss)}"
    where = "the process memory chart below and All columns" if charted else "All columns"
    text = (
        f"Memory: the only memory reading{which} in this run is host RSS, the memory of the whole "
        "Python process (interpreter, torch, every loaded library), not the plan's own: it is not "
        f"precision-specific, so this table leaves it out (see {where}). The Memory tab shows "
        "each plan's memory by kind and dtype, counted in one instrumented training step."
    )
    return note_html(text, "pnb-memory-note")


def note_html(text: str, css: str = "") -> str:
    """``text`` as a small italic note (with the class ``css``, if given)."""
    cls = f" class='{css}'" if css else ""
    return f"<div{cls} style='font-size:12px'><i>{html.escape(text)}</i></div>"


def _step_cell(row: Mapping[str, Any]) -> str:
    median, iqr = _ms(row.get(col.MEDIAN_STEP)), _ms(row.get(col.STEP_IQR))
    return f"{median} ({iqr})" if median and iqr else median


def _round(value: Any) -> Any:
    number = as_number(value)
    return None if number is None else round(number)


def _warmup_cell(row: Mapping[str, Any]) -> str:
    steps, seconds = as_number(row.get(col.WARMUP_STEPS)), as_number(row.get(col.WARMUP_S))
    if steps is None:
        return ""
    return f"{int(steps)} steps, {seconds or 0.0:.2f} s"


def results_html(
    summary: Any,
    outcomes: Mapping[str, Any],
    *,
    measured: bool,
    method: Mapping[str, Any] | None = None,
    charts: str = "",
    compiled: Mapping[str, Any] | None = None,
    load_note: str = "",
) -> str:
    """The Compare tab: with ``measured`` (a comparison) the machine's load note first where it
    was busy (the verdicts refer to it), the verdict lines, how the speed was measured, then the
    table; otherwise the table marked as single-run figures. ``outcomes``: label -> the
    comparison's typed :class:`~precision_nb.engine.comparison.PlanOutcome` (verdict, speedup);
    ``charts``: HTML shown after the table (the comparison's overlaid charts); ``compiled``: the
    compiled plans' reports, shown after the verdicts (compile step, speed against eager,
    pay-back, agreement, graph breaks, in the engine's words)."""
    records = summary.to_dict("records")
    labels = [str(r.get("run")) for r in records]
    if measured:
        head = verdict_lines_html(labels, outcomes) + compiled_html(compiled) + _method_html(method)
        if load_note:
            head = f"<div class='pnb-load-note'><b>{html.escape(load_note)}</b></div>" + head
    else:
        head = f"<div class='pnb-method'><i>{html.escape(SINGLE_RUN_NOTE)}.</i></div>"
    full = _all_columns(summary, records).to_html(
        index=False,
        na_rep="",
        float_format=lambda v: f"{v:.4g}",
        escape=True,
        classes="pnb-table pnb-all-columns",
        border=0,
    )
    rest = (
        f"<details><summary>All columns</summary><div class='pnb-table-wrap'>{full}</div></details>"
    )
    compact = _compact(records, outcomes, measured=measured)
    compact += _process_memory_note(records, charted=bool(charts))
    why = outcomes_html(outcomes) if measured else ""  # the step by op family, after the rest
    return head + compact + charts + rest + why


def _all_columns(summary: Any, records: Sequence[Mapping[str, Any]]) -> Any:
    """``summary`` as All columns shows it: a peak that is host RSS for every plan is headed as
    the whole process's memory."""
    kinds = {r.get("memory_kind") for r in records}
    if kinds != {HOST_RSS} or col.PEAK_MIB not in summary:
        return summary
    return summary.rename(columns={col.PEAK_MIB: PROCESS_MEMORY_COLUMN})


def compiled_html(compiled: Mapping[str, Any] | None) -> str:
    """The compiled plans' sentences (the engine's), one block per plan; "" without any."""
    if not compiled:
        return ""
    blocks = []
    for label, report in compiled.items():
        items = "".join(f"<li>{html.escape(line)}</li>" for line in report.lines())
        blocks.append(f"<b>{html.escape(label)}</b><ul style='margin:0'>{items}</ul>")
    return (
        "<div class='pnb-compiled' style='font-size:12px;margin:4px 0'><b>torch.compile</b> "
        "(the compile step runs before training, so no step time holds it):"
        f"{''.join(blocks)}</div>"
    )


def warmup_note_html(warmups: Mapping[str, Any]) -> str:
    """One line per plan: its warm-up's steps, seconds and the rule that ended it (None: going)."""
    if not warmups:
        return ""
    items = []
    for label, warm in warmups.items():
        if warm is None:
            text = f"{label}: warming up now (a throw-away copy; not timed, not charted)"
        else:
            text = f"{label}: {warm.steps} step(s), {warm.seconds:.2f} s ({warm.rule})"
        items.append(f"<li>{html.escape(text)}</li>")
    return (
        "<div class='pnb-warmup' style='font-size:12px;background:#eee;padding:2px 6px'>"
        "<b>Warm-up</b> (before timing, on a throw-away copy; not in the charts or the speed "
        f"figures):<ul style='margin:0'>{''.join(items)}</ul></div>"
    )
