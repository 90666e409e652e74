"""The panel's output widgets and what is drawn into them.

:class:`PanelOutputs` builds every widget the panel shows besides the controls and the analysis
views (the badge and the one-line plan, buttons, error box, progress, live metrics and charts, the
figure with its note and Draw figure button, the results, the events, the plan and the "copy as
code" area); :mod:`.layout` arranges them. Its methods only assign widget values, so the run's
worker thread may call them: no ``with output:`` block, no display call, nothing that needs the
kernel's main thread.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ipywidgets as widgets

from precision_nb.core.plan_code import FRAMEWORKS
from precision_nb.views.panel.live_charts import live_charts_html
from precision_nb.views.panel.results import (
    COMPARE_LIVE_NOTE,
    SINGLE_RUN_NOTE,
    results_html,
    warmup_note_html,
)
from precision_nb.views.panel.run import metrics_text

__all__ = ["STATUS_WIDTH", "PanelOutputs", "close_widgets", "panel_png", "status_line"]

_ERROR_STYLE = (
    "background:#f8d7da;color:#721c24;border:1px solid #f5c6cb;padding:6px 10px;"
    "border-radius:4px;white-space:pre-wrap"
)

_CSS = {
    "badge": "pnb-badge",
    "headline": "pnb-headline",
    "run_button": "pnb-run",
    "compare_button": "pnb-compare",
    "stop_button": "pnb-stop",
    "run_reason": "pnb-run-reason",
    "error_box": "pnb-error",
    "status": "pnb-status",
    "progress": "pnb-progress",
    "progress_label": "pnb-progress-label",
    "live_metrics": "pnb-live-metrics",
    "live_charts": "pnb-live-charts",
    "plan_html": "pnb-plan",
    "figure_image": "pnb-figures",
    "figure_note": "pnb-figures-note",
    "figure_button": "pnb-figure-button",
    "results_html": "pnb-results",
    "events_html": "pnb-events",
    "code_area": "pnb-code",
    "code_title": "pnb-code-title",
}


class PanelOutputs:
    """The output widgets (arranged by :func:`~.layout.build_layout`) and what is drawn into them.

    ``error`` is the message shown in the error box and ``error_source`` what set it
    (``"input"``, ``"selection"``, ``"run"``, ``"figure"``), so a refresh clears only the messages
    it owns.
    """

    CHART_INTERVAL_S = 0.5
    COMPARE_TOOLTIP = "Run the plans ticked under Compare on the same seed, overlaid"
    CODE_TITLE = "<b>Copy as code</b> &mdash; plain PyTorch (no precision_nb) reproducing this plan"
    FRAMEWORK_CODE_TITLE = (
        "<b>Copy as code</b> &mdash; {name} set up as this plan (what does not carry over is said "
        "in comments)"
    )
    FIT_CODE_TITLE = "<b>Copy as code</b> &mdash; the precision_nb call the Run button makes"
    RESULTS_PLACEHOLDER = (
        "<i>Compare runs the plans ticked under Compare (Plan tab) on the same seed, interleaved "
        "in rounds: each plan's verdict with its interval opens this tab, the table follows. "
        "After a single Run this tab shows its figures, marked single-run.</i>"
    )

    def __init__(self) -> None:
        button = widgets.Layout(width="auto")
        self.badge = widgets.HTML()
        self.headline = widgets.HTML(layout=widgets.Layout(flex="1 1 auto", margin="0 0 0 8px"))
        self.run_button = widgets.Button(
            description="Run",
            button_style="success",
            icon="play",
            tooltip="Train the plan",
            layout=button,
        )
        self.compare_button = widgets.Button(
            description="Compare",
            button_style="info",
            icon="columns",
            tooltip=self.COMPARE_TOOLTIP,
            layout=button,
        )
        self.stop_button = widgets.Button(
            description="Stop", button_style="danger", icon="stop", disabled=True, layout=button
        )
        self.run_reason = widgets.HTML()
        self.error_box = widgets.HTML(layout=widgets.Layout(display="none"))
        self.status = widgets.HTML()
        self.progress = widgets.IntProgress(
            max=1, layout=widgets.Layout(width="220px", margin="0 8px")
        )
        # takes what is left of the toolbar's line (at least 200 px), cut short with an ellipsis
        self.progress_label = widgets.Label(
            value="idle", layout=widgets.Layout(flex="1 1 0%", min_width="200px")
        )
        self.live_metrics = widgets.HTML()
        self.live_charts = widgets.HTML()
        self.plan_html = widgets.HTML()
        self.figure_image = widgets.Image(
            format="png", layout=widgets.Layout(max_width="100%", display="none")
        )
        self.figure_note = widgets.HTML(layout=widgets.Layout(flex="1 1 auto"))
        self.figure_button = widgets.Button(
            description="Draw figure",
            icon="image",
            disabled=True,
            tooltip="Draw the matplotlib figure of the last run (loss, loss scale, throughput, "
            "memory), as in panel.figures",
            layout=widgets.Layout(width="auto", flex="0 0 auto"),
        )
        self.results_html = widgets.HTML(self.RESULTS_PLACEHOLDER)
        self.events_html = widgets.HTML()
        self.code_title = widgets.HTML(self.CODE_TITLE)
        self.code_framework = widgets.Dropdown(
            options=[(name, key) for key, name in FRAMEWORKS.items()],
            value="pytorch",
            description="Framework",
        )
        self.code_area = widgets.Textarea(
            layout=widgets.Layout(width="100%", height="320px"),
            placeholder="No code: this selection cannot be resolved (see the message above).",
        )
        for name, css in _CSS.items():
            getattr(self, name).add_class(css)
        self.error: str | None = None
        self.error_source: str | None = None
        self._last_charts = -float("inf")
        self.measured = False  # the run going (or last) is a comparison: measured figures
        self.warmups: dict[str, Any] = {}  # its warm-ups, label -> Warmup (None while going)
        self.scale_window: tuple[int, int] | None = None  # safe fp16 window (log2), if known

    # ------------------------------------------------------------------ messages

    def show_error(self, message: str | None, source: str = "input") -> None:
        """Show ``message`` in the error box (None hides it)."""
        self.error = message
        self.error_source = None if message is None else source
        if message is None:
            self.error_box.value = ""
            self.error_box.layout.display = "none"
            return
        self.error_box.value = f"<div style='{_ERROR_STYLE}'>{html.escape(message)}</div>"
        self.error_box.layout.display = None

    def set_buttons(
        self,
        *,
        running: bool,
        block_reason: str | None,
        has_result: bool,
        compare_reason: str | None = None,
    ) -> None:
        """``compare_reason``: why Compare alone is off (Run stays available)."""
        blocked = running or block_reason is not None
        self.run_button.disabled = blocked
        self.compare_button.disabled = blocked or compare_reason is not None
        self.compare_button.tooltip = compare_reason or self.COMPARE_TOOLTIP
        self.stop_button.disabled = not running
        self.figure_button.disabled = running or not has_result
        reason = block_reason if block_reason is not None else compare_reason
        if running:
            self.run_reason.value = "<i>A run is going: Stop ends it between steps.</i>"
        elif reason is not None:
            self.run_reason.value = f"<span style='color:#856404'>{html.escape(reason)}</span>"
        else:
            self.run_reason.value = ""

    # ------------------------------------------------------------------ plan

    def show_plan(
        self,
        plan_html: str,
        badge_html: str,
        headline_html: str,
        simulated: bool,
        code: str,
        fit_code: bool = False,
        framework: str = "pytorch",
    ) -> None:
        """``fit_code``: ``code`` is the precision_nb call (a distributed run), not plain torch;
        otherwise it is the plan in ``framework`` (a key of ``core.plan_code.FRAMEWORKS``)."""
        self.plan_html.value = plan_html
        self.badge.value = badge_html
        self.headline.value = headline_html
        if simulated:
            self.badge.add_class("pnb-simulated")
        else:
            self.badge.remove_class("pnb-simulated")
        self.code_area.value = code
        self.code_framework.disabled = fit_code  # a distributed run: the precision_nb call
        if fit_code:
            self.code_title.value = self.FIT_CODE_TITLE
        elif framework == "pytorch":
            self.code_title.value = self.CODE_TITLE
        else:
            self.code_title.value = self.FRAMEWORK_CODE_TITLE.format(name=FRAMEWORKS[framework])

    def clear_plan(self) -> None:
        self.plan_html.value = ""
        self.code_area.value = ""  # its placeholder says why it is empty
        self.headline.value = (
            "<span style='color:#721c24'>this selection cannot be resolved (see the message "
            "below)</span>"
        )

    # ------------------------------------------------------------------ a run

    def reset_for_run(self, total: int, *, measured: bool = False, warmups: Any = None) -> None:
        """Empty every view of the previous run before a new one starts; ``measured``: a
        comparison (its live numbers are per interval, its table measured); ``warmups``: the
        live dict of its warm-ups."""
        self.measured = measured
        self.warmups = warmups if warmups is not None else {}
        self.progress.value = 0
        self.progress.max = max(1, total)
        self.progress.bar_style = ""
        self.progress_label.value = self.progress_label.tooltip = "starting..."
        self.live_metrics.value = ""
        self.live_charts.value = ""
        self._last_charts = -float("inf")
        self.status.value = ""
        self.events_html.value = ""
        self.results_html.value = (
            "<i>A comparison is going: each plan's verdict and the table appear here when it "
            "ends.</i>"
            if measured
            else "<i>A run is going: its figures appear here when it ends.</i>"
        )
        self.show_figure(None, "")

    def show_progress(
        self,
        done: int,
        total: int,
        text: str,
        record: dict[str, Any] | None,
        records: Callable[[], list[dict[str, Any]]],
        now: float,
    ) -> None:
        """Progress bar and label; with a record, the live numbers, and the SVG charts at most
        every ``CHART_INTERVAL_S`` (and at each run's end) from ``records()``."""
        self.progress.max = max(1, total)
        self.progress.value = min(done, self.progress.max)
        self.progress_label.value = text
        self.progress_label.tooltip = text  # the whole line, where the toolbar cuts it short
        if record is None:
            if self.warmups:  # a comparison's warm-up started or ended
                self.live_charts.value = self.charts(records())
            return
        note = COMPARE_LIVE_NOTE if self.measured else SINGLE_RUN_NOTE
        self.live_metrics.value = metrics_text(record, note)
        if now - self._last_charts >= self.CHART_INTERVAL_S or done >= total:
            self._last_charts = now
            self.live_charts.value = self.charts(records())

    def charts(self, records: list[dict[str, Any]]) -> str:
        """The live charts (safe scale window as a band when known) and the warm-up note."""
        return live_charts_html(records, scale_window=self.scale_window) + warmup_note_html(
            self.warmups
        )

    def show_figure(self, png: bytes | None, note: str) -> None:
        """Show ``png`` (None hides the image) with ``note`` beside the Draw figure button."""
        self.figure_image.value = png or b""
        self.figure_image.layout.display = None if png else "none"
        self.figure_note.value = note

    def show_final(
        self,
        frame: Any,
        summary: Any,
        events: list[Any],
        *,
        word: str,
        seconds: float,
        outcomes: Mapping[str, Any] | None = None,
        method: Mapping[str, Any] | None = None,
        compiled: Mapping[str, Any] | None = None,
        load_note: str = "",
    ) -> None:
        """The finished run's charts, status line, results and events; ``outcomes`` and
        ``method``: a comparison's typed outcome per plan and how it was measured;
        ``compiled``: its compiled plans' reports; ``load_note``: the busy machine's note."""
        self.live_charts.value = self.charts(frame.to_dict("records"))
        if frame.empty:
            self.progress_label.value = f"{word.lower()} before the first logged step"
            self.status.value = html.escape(
                f"{word} before the first logged step ({seconds:.1f} s); no records to show."
            )
            self.results_html.value = "<i>No records to show.</i>"
            return
        steps = int(frame["step"].max())
        runs = list(dict.fromkeys(frame["run"]))
        self.status.value = html.escape(status_line(word, runs, steps, seconds, len(frame)))
        if self.measured:  # not the last plan's progress, which reads as if it still went on
            self.progress_label.value = self.progress_label.tooltip = (
                f"{word.lower()}: {len(runs)} plan(s) compared, {seconds:.1f} s of training"
            )
        elif word != "Finished":  # "stopped: 125/20000 steps ...", not a run that seems to go on
            self.progress_label.value = self.progress_label.tooltip = (
                f"{word.lower()}: {self.progress_label.value}"
            )
        self.results_html.value = results_html(
            summary,
            outcomes or {},
            measured=self.measured,
            method=method,
            # the table's memory note covers the chart: one note, not two
            charts=(
                live_charts_html(frame.to_dict("records"), memory_note=False)
                if self.measured
                else ""
            ),
            compiled=compiled,
            load_note=load_note,
        )
        if events:
            items = "".join(f"<li>{html.escape(str(e))}</li>" for e in events)
            self.events_html.value = (
                f"<details open><summary>Events</summary><ul>{items}</ul></details>"
            )


def close_widgets(root: widgets.Widget) -> int:
    """Close ``root`` and every widget it holds (children, layouts, styles: ipywidgets keeps
    them registered until closed); returns how many."""
    seen: set[int] = set()
    stack = [root]
    closed = 0
    while stack:
        widget = stack.pop()
        if id(widget) in seen:
            continue
        seen.add(id(widget))
        for name in widget.keys:
            value = getattr(widget, name, None)
            items = value if isinstance(value, (list, tuple)) else (value,)
            stack.extend(item for item in items if isinstance(item, widgets.Widget))
        if widget.comm is not None:
            closed += 1
        widget.close()
    return closed


def panel_png(frame: Any, histories: dict[str, Any], *, dpi: int) -> bytes:
    """The panel's figure: the dashboard's four panels (loss, loss scale with skipped steps,
    throughput, peak memory) drawn by views.figures on a figure with a fixed layout, which costs
    about half of the constrained-layout ``dashboard_figure`` (``panel.figures`` has that one)."""
    from matplotlib.figure import Figure

    from precision_nb.views.report import figures as f

    labels = [str(label) for label in dict.fromkeys(frame["run"])]
    colors = f.plan_colors(labels)
    fig = Figure(figsize=(9.0, 5.5))
    (loss, scale), (throughput, memory) = fig.subplots(2, 2)
    f.draw_loss(loss, frame, labels, colors)
    f.draw_loss_scale(scale, frame, labels, colors, histories)
    f.draw_throughput(throughput, frame, labels, colors)
    kinds = f.memory_kinds(frame)
    f.draw_memory(memory, frame, labels, colors, kinds[0] if kinds else None)
    fig.subplots_adjust(left=0.08, right=0.98, top=0.95, bottom=0.09, hspace=0.45, wspace=0.25)
    return f.figure_to_png(fig, dpi=dpi)


#: The longest status line: one line of the panel, as every printed line of the toolkit.
STATUS_WIDTH = 100


def status_line(word: str, runs: Sequence[Any], steps: int, seconds: float, records: int) -> str:
    """The finished run in one line of at most :data:`STATUS_WIDTH` characters: the runs are
    named while they fit (the verdicts and the table name them anyway), else counted."""
    rest = f"last logged step {steps}, {seconds:.1f} s of training, {records:,} records kept."
    named = f"{word}: {len(runs)} run(s) ({', '.join(map(str, runs))}), {rest}"
    return named if len(named) <= STATUS_WIDTH else f"{word}: {len(runs)} run(s), {rest}"
