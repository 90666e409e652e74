"""The panel's results table and the notes that say how its numbers were measured.

A comparison's speed figures come from the interleaved measurement (warm-up apart, rounds, paired
speedups with a 95 % interval): the table shows each speedup with its interval beside it
("1.31× (1.22–1.40)") and the verdict in words. A single run's figures are medians over its logged
intervals: the table says so and shows no interval, no verdict.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from typing import Any

from precision_nb.engine.stats import MIN_ROUNDS

__all__ = ["SINGLE_RUN_NOTE", "results_table_html", "speedup_text", "warmup_note_html"]

SINGLE_RUN_NOTE = (
    "single-run figures: medians over this run's logged intervals, no interval, no verdict "
    "(Compare measures plans interleaved in rounds, with intervals)"
)
COMPARE_LIVE_NOTE = (
    "live figures per logged interval; the measured speed (interleaved rounds, with 95 % "
    "intervals) is in the table when the comparison ends"
)
_DROP = ("speedup_vs_fp32", "speedup_ci_low", "speedup_ci_high", "verdict")


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def speedup_text(row: Mapping[str, Any]) -> str:
    """``"1.31× (1.22–1.40)"``; without an interval the reason (too few rounds) instead."""
    estimate = _number(row.get("speedup_vs_fp32"))
    if estimate is None:
        return ""
    low, high = _number(row.get("speedup_ci_low")), _number(row.get("speedup_ci_high"))
    if str(row.get("verdict", "")).endswith("is the baseline."):
        return f"{estimate:.2f}× (baseline)"
    if low is None or high is None:
        rounds = row.get("rounds")
        return f"{estimate:.2f}× (no interval: {rounds} rounds, {MIN_ROUNDS} needed)"
    return f"{estimate:.2f}× ({low:.2f}–{high:.2f})"


def results_table_html(summary: Any, *, measured: bool) -> str:
    """The summary table: with ``measured`` (a comparison) a leading speedup-with-interval and
    verdict column; otherwise marked as single-run figures."""
    frame = summary.copy()
    if measured and "speedup_vs_fp32" in frame.columns:
        rows = frame.to_dict("records")
        frame = frame.drop(columns=[c for c in _DROP if c in frame.columns])
        frame.insert(1, "speedup vs fp32 (95 % CI)", [speedup_text(r) for r in rows])
        frame.insert(2, "verdict", [r.get("verdict") or "" for r in rows])
        head = (
            "<div class='pnb-method'><i>Speed measured like a benchmark: warm-up apart, plans "
            "interleaved in rounds, speedup from per-round paired ratios with a 95 % interval "
            "(what it covers and what stopped the measurement: the verdict).</i></div>"
        )
    else:
        frame = frame.drop(columns=[c for c in _DROP if c in frame.columns])
        head = f"<div class='pnb-method'><i>{html.escape(SINGLE_RUN_NOTE)}.</i></div>"
    table = frame.to_html(index=False, na_rep="", float_format=lambda v: f"{v:.4g}", escape=True)
    return head + table


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
