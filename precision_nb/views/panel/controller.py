"""What a panel's buttons, controls and tabs do: re-resolve the plan, start and stop runs, inspect.

:class:`PanelController` holds the parts one panel is made of (:mod:`.builder` makes and wires
them) and does what each event asks: a control change re-resolves the plan
(:class:`~.plan_resolver.LivePlan`); Run and Compare start a job on the
:class:`~.session.RunSession` once the checks that may refuse it (with the reason shown) pass; Stop
asks the job to end; opening the Memory, Ops or Numerics tab inspects the selected plan
(:class:`~.analysis.AnalysisViews`). It never refers to the ``Panel`` itself, so a panel nobody
refers to any more is collected even while its widgets hold the controller's methods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from precision_nb.core.capabilities import Capabilities
from precision_nb.core.device import resolve_device
from precision_nb.core.plan_code import framework_name
from precision_nb.views.panel.analysis import AnalysisViews
from precision_nb.views.panel.controls import Controls
from precision_nb.views.panel.distributed import DIST_CONTROLS, DistributedControls
from precision_nb.views.panel.layout import ANALYSIS_TABS, TABS, PanelWidgets, select_tab, tab_name
from precision_nb.views.panel.outputs import PanelOutputs, close_widgets
from precision_nb.views.panel.plan_resolver import LivePlan, PlanResolver
from precision_nb.views.panel.run import Job
from precision_nb.views.panel.selection import SIM_PREFIX, Selection
from precision_nb.views.panel.session import RunSession

__all__ = ["COMPARE_ONE_PROCESS", "PanelController"]

COMPARE_ONE_PROCESS = (
    "Compare is off with a distributed strategy: comparisons run on one process here. For plans "
    "compared on several processes use pnb.profile(..., compare=(...), distributed="
    "pnb.Distributed(...)) (docs/distributed.md), or set the strategy to none."
)


@dataclass(eq=False)
class PanelController:
    """The parts of one panel and what its events do (see the module docstring)."""

    capabilities: Capabilities
    resolver: PlanResolver
    controls: Controls
    dist: DistributedControls
    outputs: PanelOutputs
    plan: LivePlan
    session: RunSession
    analysis: AnalysisViews
    widgets: PanelWidgets
    closed: bool = False
    applying: bool = False  # set() applies several values: resolve once, after the last

    # ================================================================== the plan

    def on_control_change(self, _change: dict[str, Any]) -> None:
        if not self.applying and not self.closed:
            self.refresh()

    def refresh(self) -> None:
        """Re-resolve the plan from the controls and update every view of it (also the code)."""
        self.dist.update_enabled()
        self.widgets.tabs.set_title(TABS.index("Distributed"), self.dist.title)
        self.plan.refresh()
        self.update_buttons()
        self.analysis.plan_changed()

    def update_buttons(self) -> None:
        if self.closed:
            return
        self.outputs.set_buttons(
            running=self.session.running,
            block_reason=self.plan.block_reason(),
            has_result=self.session.source is not None,
            compare_reason=None if self.plan.distributed is None else COMPARE_ONE_PROCESS,
        )

    def set_controls(self, controls: dict[str, Any]) -> None:
        """``Panel.set``: check every value first (a bad one is shown and raised, nothing
        changes), then apply them all and resolve once."""
        self.check_open()
        try:
            dist = {k: controls.pop(k) for k in list(controls) if k in DIST_CONTROLS}
            dist_values = self.dist.normalise(dist) if dist else {}
            framework = controls.pop("code_framework", None)
            if framework is not None:
                framework = framework_name(framework)
            values = self.controls.normalise(**controls)
            device = values.get("device")
            if device is not None and not device.startswith(SIM_PREFIX):
                resolve_device(device, self.capabilities)  # absent hardware raises here
        except (ValueError, RuntimeError) as exc:
            self.outputs.show_error(str(exc), "input")
            raise
        if self.outputs.error is not None and not self.session.running:
            self.outputs.show_error(None)
        self.applying = True
        try:
            self.controls.apply(values)
            self.dist.apply(dist_values)
            if framework is not None:
                self.outputs.code_framework.value = framework
        finally:
            self.applying = False
        self.refresh()

    # ================================================================== runs

    def on_figure_click(self, _button: Any) -> None:
        try:
            self.session.draw_figure()
        except Exception as exc:  # noqa: BLE001 - UI boundary: shown in the panel, panel stays
            self.outputs.show_error(f"Draw figure failed: {type(exc).__name__}: {exc}", "figure")

    def start(self, kind: str, *, raise_errors: bool = False) -> Job | None:
        """Start a run or comparison in the background and show the Live tab; returns the job,
        or None when refused (the panel says why; with ``raise_errors`` it is raised too)."""
        with self.session.lock:
            try:
                selection = self.check_can_start(kind)
            except (RuntimeError, ValueError):
                if raise_errors:
                    raise
                return None
            self.outputs.show_error(None)
            assert self.plan.explanation is not None
            job = self.session.start(kind, selection, self.plan.explanation, self.plan.distributed)
            self.update_buttons()
            select_tab(self.widgets.tabs, "Live")
            job.thread.start()
            return job

    def check_can_start(self, kind: str) -> Selection:
        if self.session.running:
            message = "A run is already going: wait for it or press Stop before starting another."
            self.outputs.status.value = f"<b>{message}</b>"
            raise RuntimeError(message)
        self.refresh()
        reason = self.plan.block_reason()
        if reason is not None:
            error = self.plan.error
            if error is None:  # else the error box already says why
                self.outputs.show_error(reason, "input")
            if isinstance(error, ValueError):
                message = reason if str(error) in reason else f"{reason} {error}"
                raise ValueError(message) from error
            raise RuntimeError(reason)
        selection = self.controls.selection()
        if kind == "compare" and self.plan.distributed is not None:
            self.outputs.show_error(COMPARE_ONE_PROCESS, "input")
            raise RuntimeError(COMPARE_ONE_PROCESS)
        if kind == "compare" and not selection.compare_plans:
            message = "Compare needs at least one plan ticked in the Compare list."
            self.outputs.show_error(message)
            raise ValueError(f"compare_plans=() is empty; {message}")
        return selection

    def launch(self, kind: str, block: bool, timeout: float | None) -> Any:
        """``Panel.run`` / ``Panel.compare``: start, and with ``block`` wait and return the
        result (re-raising what the run raised)."""
        self.check_open()
        job = self.start(kind, raise_errors=True)
        assert job is not None
        if not block:
            return None
        if not job.wait(timeout):
            raise TimeoutError(f"the {kind} did not finish within {timeout} s (it goes on)")
        if job.error is not None:
            raise job.error
        distributed = self.session.per_rank.result  # as pnb.fit(..., distributed=...) returns
        return distributed if distributed is not None else self.session.source

    def stop(self) -> None:
        if self.session.stop():
            self.outputs.stop_button.disabled = True
            self.outputs.progress_label.value += " · stopping..."

    def after_run(self, source: Any, training_s: float, plotted_s: float) -> None:
        """Worker thread, after a run: the analysis views (within the plotting budget), then a
        finished comparison's verdicts, if the Live tab is still what the user looks at."""
        try:
            self.analysis.after_run(
                source, training_s=training_s, spent_s=plotted_s, budget=self.session.plot_budget
            )
        except Exception as exc:  # noqa: BLE001 - UI boundary: the run's results are kept
            self.outputs.show_error(f"Inspect failed: {type(exc).__name__}: {exc}", "figure")
        self.show_inspected()
        compared = getattr(source, "measurement", None) is not None
        showing_live = tab_name(self.widgets.tabs.selected_index) == "Live"
        if compared and showing_live and self.session.last_exception is None:
            select_tab(self.widgets.tabs, "Compare")

    # ================================================================== inspection

    def on_tab_change(self, change: dict[str, Any]) -> None:
        opened = tab_name(change.get("new"))
        if opened in ANALYSIS_TABS and self.analysis.stale and not self.closed:
            self.inspect_now()

    def inspect_now(self) -> None:
        message = self.analysis.open_or_inspect()
        if message is not None:
            self.outputs.show_error(message, "figure")
        self.show_inspected()

    def show_inspected(self) -> None:
        """The last comparison's plans were inspected: show the Compare tab again (a true
        plan's saving against the mixed plan comes from the inspections)."""
        if self.analysis.attached and not self.closed and not self.session.running:
            self.analysis.attached = False
            self.session.show_results()

    def inspect(self) -> None:
        """``Panel.inspect``: compute what the analysis views lack, now."""
        self.check_open()
        if self.session.running:
            raise RuntimeError("a run is going: inspect when it has ended")
        self.analysis.compute()
        self.show_inspected()

    # ================================================================== lifetime

    def check_open(self) -> None:
        if self.closed:
            raise RuntimeError("this panel is closed: make a new Panel() to go on")

    def release(self, timeout: float) -> None:
        """Stop the session's run, drop what it holds, close every widget (``Panel.close`` and
        the finaliser of a collected panel)."""
        self.closed = True
        self.session.close(timeout)
        self.analysis.close()
        close_widgets(self.widgets.root)
