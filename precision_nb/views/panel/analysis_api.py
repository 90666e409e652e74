"""The panel's Memory, Ops and Numerics API: what :class:`~.analysis.AnalysisViews` needs from
the panel (its model, the selected plan, whether a run goes) and the public ``inspect()``,
``inspections`` and ``numerics``. A mixin of :class:`~.api.Panel`, kept apart so each module
keeps one job.
"""

from __future__ import annotations

from typing import Any

from precision_nb.engine.precision import lab_applies, run_label
from precision_nb.views.panel.analysis import Target
from precision_nb.views.panel.controls import SIM_PREFIX

__all__ = ["AnalysisMixin"]


class AnalysisMixin:
    """Panel methods behind the Memory, Ops and Numerics views (see docs/panel.md)."""

    # provided by Panel
    analysis: Any
    controls: Any
    outputs: Any
    session: Any
    _plan: Any
    _closed: bool
    running: Any
    records_frame: Any

    def _check_open(self) -> None:  # pragma: no cover - Panel defines it
        raise NotImplementedError

    def _model_source(self) -> tuple[Any, Any, Any, str]:
        user = self.session.user_model
        if user is not None:
            return user.model, user.batches, user.loss_fn, "tiny"
        selection = self.controls.selection()
        return selection.workload, None, None, selection.preset or "tiny"

    def _selected_target(self) -> Target | None:
        explanation = self._plan.explanation
        if explanation is None:
            return None
        plan = explanation.plan
        device = str(self.controls.selection().device)
        sim = device[len(SIM_PREFIX) :] if device.startswith(SIM_PREFIX) else None
        label = run_label(plan.mode, lab_applies(explanation))
        return Target(label, plan, str(explanation.device), explanation.simulated, sim)

    def _is_running(self) -> bool:
        return self.running

    def _on_scale_window(self, window: tuple[int, int]) -> None:
        self.outputs.scale_window = window
        if not self.running and self.session.source is not None:
            records = self.records_frame.to_dict("records")
            self.outputs.live_charts.value = self.outputs.charts(records)

    def _after_run(self, source: Any, training_s: float, plotted_s: float) -> None:
        try:
            self.analysis.after_run(
                source, training_s=training_s, spent_s=plotted_s, budget=self.session.plot_budget
            )
        except Exception as exc:  # noqa: BLE001 - UI boundary: the run's results are kept
            self.outputs.show_error(f"Inspect failed: {type(exc).__name__}: {exc}", "figure")

    def _on_inspect_click(self, _button: Any) -> None:
        self._inspect_now()

    def _on_view_opened(self, change: dict[str, Any]) -> None:
        if change.get("new") is not None and self.analysis.stale and not self._closed:
            self._inspect_now()

    def _inspect_now(self) -> None:
        message = self.analysis.open_or_inspect()
        if message is not None:
            self.outputs.show_error(message, "figure")

    def inspect(self) -> dict[str, Any]:
        """Inspect the selected plan and the last run's plans now (memory by kind and dtype,
        op dtypes; one instrumented step on a copy each) and analyse the model's gradient
        numerics; the Memory, Ops and Numerics views show them. Returns label -> Inspection.
        Raises ``RuntimeError`` while a run goes or once closed."""
        self._check_open()
        if self.running:
            raise RuntimeError("a run is going: inspect when it has ended")
        self.analysis.compute()
        return self.inspections

    @property
    def inspections(self) -> dict[str, Any]:
        """Label -> ``Inspection`` of the plans the Memory and Ops views show."""
        from precision_nb.views.report.inspection import Inspection

        return {label: Inspection(data) for label, data in self.analysis.shown.items()}

    @property
    def numerics(self) -> Any:
        """The ``Numerics`` the Numerics view shows (None before one was made)."""
        return self.analysis.numerics
