"""Why a plan is (not) faster, in the report, the notebook and the panel: one card per plan with
its step time by op family, the sentence against the baseline, the reconciliation with the
calibrated speedup, the profiler's cost and the advice, each with its figure.

Everything shown is read from a comparison's
:class:`~precision_nb.engine.time_split.TimeAnalysis`; ``time_by_family.csv`` holds its rows
(:meth:`~precision_nb.engine.time_split.TimeAnalysis.rows`).
"""

from __future__ import annotations

import csv
import html
import io
from collections.abc import Mapping
from typing import Any

from precision_nb.engine.time_split import FAMILIES, TimeAnalysis, TimeSplit
from precision_nb.engine.time_split.reconcile import ms, times
from precision_nb.views.report.markup import table_html
from precision_nb.views.report.sections import ReportFile, Section

__all__ = [
    "CSV_NAME",
    "TITLE",
    "outcomes_html",
    "time_split_html",
    "time_split_lines",
    "time_split_section",
]

TITLE = "Why faster or not: the step by op family"
CSV_NAME = "time_by_family.csv"
#: The columns of time_by_family.csv, in order.
COLUMNS = (
    "run", "family", "family_title", "ms_per_step", "share", "baseline", "baseline_ms",
    "change_ms", "times_faster_there", "step_ms", "traced_step_ms", "profiler_ms",
    "measured_median_ms", "profiler_overhead",
    "reconstructed_speedup", "calibrated_speedup", "calibrated_low", "calibrated_high",
    "tolerance", "agrees", "view", "profiled_steps", "processes", "events_per_step", "missing",
)  # fmt: skip
_HEADERS = {"title": "family", "ms": "ms per step", "share": "share", "change": "vs baseline"}

METHOD = (
    "After the timed rounds, each plan trains a few more steps on its own trainer under "
    "torch.profiler, the plans' steps interleaved in rotated rounds with unprofiled steps before "
    "and after (the trainers are restored afterwards); each op's own time goes to one family, "
    "and what no op covers is 'outside ops'. The profiler's own cost (the profiled steps against "
    "the unprofiled ones, stated per plan) is taken out of the families; where fresh processes "
    "measured, each profiles a few steps of its own too and the families are their means over "
    "the processes; the reconstructed speedup is the baseline's step over the plan's, held "
    "against the calibrated speedup."
)


def _family_rows(split: TimeSplit, diff: Any) -> list[dict[str, Any]]:
    rows = []
    for family, title in FAMILIES.items():
        seconds = split.families.get(family, 0.0)
        change = diff.change(family) if diff is not None and diff.missing is None else None
        if seconds <= 0 and (change is None or change.baseline_s <= 0):
            continue
        if change is None:
            versus = ""
        else:
            sign = "+" if change.change_s >= 0 else "−"
            ratio = f" ({times(change.times_faster)} faster there)" if change.times_faster else ""
            versus = f"{sign}{ms(abs(change.change_s))}{ratio}"
        rows.append(
            {"title": title, "ms": ms(seconds), "share": f"{split.share(family):.0%}",
             "change": versus}
        )  # fmt: skip
    return rows


def _facts(split: TimeSplit) -> list[str]:
    out = [
        f"{split.steps} profiled steps, {split.events} profiler events each; seconds are "
        f"{split.view}."
    ]
    if split.measured_s:
        out.append(
            f"Profiled step {ms(split.traced_s)} against the timed rounds' median "
            f"{ms(split.measured_s)}: the profiler's cost is {split.overhead:+.0%}."
        )
    if split.unprofiled_s:
        between = f"The unprofiled steps between the profiled ones took {ms(split.unprofiled_s)}: "
        pooled = "the plans profiled together"
        if split.processes > 1:  # pooled: no unprofiled steps, the timed rounds stand for them
            between = (
                f"The timed rounds' medians, averaged over the {split.processes} processes, were "
                f"{ms(split.unprofiled_s)}: "
            )
            pooled = "the plans and the processes"
        if split.profiler_s > 0:
            where = (
                "the GPU's idle time"
                if split.device.startswith("cuda")
                else "the families by their events"
            )
            out.append(
                f"{between}the profiler's {ms(split.profiler_s)} per step (its cost per event "
                f"outside casts, pooled over {pooled}) are taken out of {where}."
            )
        else:
            out.append(f"{between}no profiler cost is taken out of the families.")
    else:
        out.append("No unprofiled steps: the families include the profiler's cost.")
    if split.sum_error is not None:
        out.append(
            f"The families add up to {split.sum_error:+.1%} of the step timer's time for the "
            "same steps."
        )
    if split.overlap_s > 0:
        out.append(f"Ops on several threads overlapped by {ms(split.overlap_s)} per step.")
    if split.skipped:
        out.append(f"{split.skipped} profiled steps were skipped by the grad scaler.")
    return out + list(split.notes)


def _card(label: str, analysis: TimeAnalysis, level: int) -> str:
    e = html.escape
    split = analysis.splits[label]
    diff = analysis.differences.get(label)
    card = f'<div class="card time-split" data-plan="{e(label)}">'
    parts = [f"<h{level}>{e(label)}</h{level}>"]
    if not split.available:
        return f"{card}{parts[0]}<p>No split: {e(split.missing)}</p></div>"
    if diff is not None and diff.missing is None:
        parts.append(f'<p class="verdict">{e(diff.sentence)}</p>')
        verdict = {True: "agrees", False: "does not agree", None: "not reconciled"}[diff.agrees]
        parts.append(f"<p><b>Reconciliation ({verdict})</b>: {e(diff.reconcile)}.</p>")
    elif diff is not None:
        parts.append(f"<p>No difference from the baseline: {e(diff.missing)}</p>")
    elif label == analysis.baseline:
        parts.append("<p>The baseline.</p>")
    parts.append(table_html(_family_rows(split, diff), list(_HEADERS), headers=_HEADERS))
    advice = analysis.advice.get(label, ())
    if advice:
        items = "".join(f"<li>{e(a.message)}</li>" for a in advice)
        parts.append(f"<p><b>What would make it faster</b></p><ul>{items}</ul>")
    facts = "".join(f"<li>{e(f)}</li>" for f in _facts(split))
    parts.append(f'<ul class="measure">{facts}</ul>')
    return f"{card}{''.join(parts)}</div>"


def time_split_html(analysis: TimeAnalysis, *, level: int = 3) -> str:
    """The cards of every plan (``level``: the heading level of a plan's name)."""
    cards = "".join(_card(label, analysis, level) for label in analysis.splits)
    return f'<p class="measure">{html.escape(METHOD)}</p><div class="cards">{cards}</div>'


def outcomes_html(outcomes: Mapping[str, Any], *, level: int = 4) -> str:
    """The cards from a comparison's typed outcomes (each holding its split, its difference and
    its advice); "" when no plan was split."""
    splits = {k: o.time_split for k, o in outcomes.items() if o.time_split is not None}
    if not splits:
        return ""
    diffs = {k: o.difference for k, o in outcomes.items() if o.difference is not None}
    base = next((k for k in splits if k not in diffs), None)
    advice = {k: tuple(o.advice) for k, o in outcomes.items()}
    title = f"<h{level}>{html.escape(TITLE)}</h{level}>"
    return title + time_split_html(TimeAnalysis(splits, diffs, advice, base), level=level + 1)


def time_split_lines(analysis: TimeAnalysis) -> list[str]:
    """The same in plain text: per plan its sentence (or why it has none) and its advice."""
    out = []
    for label, split in analysis.splits.items():
        diff = analysis.differences.get(label)
        if not split.available:
            out.append(f"{label}: no time split: {split.missing}")
        elif diff is not None and diff.missing is None:
            out.append(diff.sentence)
            if diff.agrees is False:
                out.append(f"  {diff.reconcile}")
        out += [f"  advice: {a.message}" for a in analysis.advice.get(label, ())]
    return out


def _csv(analysis: TimeAnalysis) -> ReportFile:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(COLUMNS), extrasaction="ignore")
    writer.writeheader()
    writer.writerows(analysis.rows())
    return ReportFile(CSV_NAME, buffer.getvalue().encode("utf-8"))


def time_split_section(analysis: TimeAnalysis) -> Section:
    """The report's section, with ``time_by_family.csv``."""
    return Section("time-split", TITLE, time_split_html(analysis), (_csv(analysis),))
