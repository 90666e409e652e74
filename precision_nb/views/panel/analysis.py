"""The panel's Memory, Ops and Numerics views: what one instrumented step shows of each plan.

:class:`AnalysisViews` runs ``run_inspection`` (memory by kind and dtype, the op dtype trace) for
the selected plan and the last run's plans, and ``numerics`` (gradient underflow, the safe fp16
loss-scale window) for the model, always on a copy and outside the timed steps. They run:

- after a run, in the worker thread, when their expected cost fits the plotting budget (all
  plotting and inspecting of a run stays within ``budget`` of its training time); otherwise the
  note says what they would cost and **Inspect** runs them on demand;
- when the plan changed and a view's tab is opened (or Inspect is pressed), never while a run
  goes.

Results are cached per (plan, device, model), so reopening a view costs nothing. What they cost
here is learnt from the ones run so far (a first guess before any). What is inspected and how the
numerics are analysed is the engine's one rule (:mod:`precision_nb.engine.analyses`), the same
as ``profile``'s.
"""

from __future__ import annotations

import html
import logging
import time
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets

from precision_nb.core.resolution import Explanation
from precision_nb.engine.analyses import AnalysisTarget as Target
from precision_nb.engine.analyses import ModelSource, analyse_numerics, cache_key
from precision_nb.engine.analyses import inspect_targets as inspect_all
from precision_nb.engine.numerics.analysis import DEFAULT_FORMATS
from precision_nb.engine.precision import lab_applies, run_label
from precision_nb.views.panel.analysis_html import memory_chart_svg, numerics_html, ops_html
from precision_nb.views.panel.selection import Selection

log = logging.getLogger(__name__)

__all__ = ["AnalysisViews", "selected_target"]


def selected_target(explanation: Explanation | None, selection: Selection) -> Target | None:
    """The target of the selected plan (a simulated device's capabilities preset with it); None
    when the selection cannot be resolved."""
    if explanation is None:
        return None
    plan = explanation.plan
    label = run_label(plan.mode, lab_applies(explanation))
    return Target(label, plan, str(explanation.device), selection.simulated_preset)


class AnalysisViews:
    """The views' widgets, their cached results and when they are computed.

    ``model_source()`` gives the ``ModelSource`` of the panel's current model; ``selected()``
    the :class:`Target` of the current selection (None when it cannot be resolved);
    ``running()`` whether a run goes; ``on_window(window)`` receives the safe fp16 window
    ``(lo, hi)`` (log2) once a numerics analysis found one.
    """

    FIRST_COST_GUESS_S = 2.0

    def __init__(
        self,
        *,
        model_source: Callable[[], ModelSource],
        selected: Callable[[], Target | None],
        running: Callable[[], bool],
        on_window: Callable[[tuple[int, int]], None],
    ) -> None:
        self._model_source = model_source
        self._selected = selected
        self._running = running
        self._on_window = on_window
        self.button = widgets.Button(
            description="Inspect",
            icon="search",
            tooltip="Inspect the selected plan (and the last run's plans): memory by kind and "
            "dtype, op dtypes, gradient numerics; one instrumented step on a copy each",
        )
        self.note = widgets.HTML()
        self.memory_html = widgets.HTML()
        self.ops_html = widgets.HTML()
        self.numerics_html = widgets.HTML()
        self.formats = widgets.Text(
            value=", ".join(DEFAULT_FORMATS),
            description="Formats",
            continuous_update=False,
            tooltip="the numerics analysis's formats, comma-separated: fp16, bf16, fp8_e4m3, "
            "fp8_e5m2, and the block-scaled mxfp8_e4m3, mxfp8_e5m2, mxfp4, nvfp4 (torchao)",
            layout=widgets.Layout(width="100%"),
        )
        for w, css in (
            (self.button, "pnb-inspect"),
            (self.note, "pnb-analysis-note"),
            (self.memory_html, "pnb-memory"),
            (self.ops_html, "pnb-ops"),
            (self.numerics_html, "pnb-numerics"),
            (self.formats, "pnb-numerics-formats"),
        ):
            w.add_class(css)
        self.inspections: dict[Any, Any] = {}  # (plan, device, model key) -> InspectionData
        self.numerics_cache: dict[Any, Any] = {}  # (model key, run id) -> Numerics
        self.run_targets: list[Target] = []  # the plans of the last run
        self.last_run: Any = None
        self.cost_s = self.FIRST_COST_GUESS_S  # per inspection or analysis, learnt
        self.seconds = 0.0  # spent by the last compute()
        self.shown: dict[str, Any] = {}  # label -> InspectionData now shown
        self.numerics: Any = None  # the Numerics now shown
        self.attached = False  # the last compute() gave the last run's outcomes inspections

    # ------------------------------------------------------------------ what to compute

    def targets(self) -> list[Target]:
        """The selected plan first, then the last run's plans (each label once)."""
        out: dict[str, Target] = {}
        selected = self._selected()
        if selected is not None:
            out[selected.label] = selected
        for target in self.run_targets:
            out.setdefault(target.label, target)
        return list(out.values())

    def _key(self, target: Target) -> Any:
        return cache_key(self._model_source(), target)

    def missing(self) -> int:
        """How many inspections and analyses the views lack now (each costs about ``cost_s``)."""
        count = sum(1 for t in self.targets() if self._key(t) not in self.inspections)
        return count + (self._numerics_key() not in self.numerics_cache)

    @property
    def stale(self) -> bool:
        """True when the views do not show the current targets (the plan changed, a run ended)."""
        shown = {label: id(data) for label, data in self.shown.items()}
        wanted = {t.label: id(self.inspections.get(self._key(t))) for t in self.targets()}
        numerics = self.numerics_cache.get(self._numerics_key())
        return shown != wanted or numerics is None or numerics is not self.numerics

    def _numerics_key(self) -> Any:
        model = cache_key(self._model_source(), None)
        return (model, id(self._numerics_run()), tuple(self.numerics_formats()))

    def numerics_formats(self) -> list[str]:
        """The formats typed into the Numerics tab (checked by the analysis: a bad one is an
        error shown in the panel, naming every allowed format)."""
        return [f.strip() for f in self.formats.value.split(",") if f.strip()]

    def _numerics_run(self) -> Any:
        """The last run's result of the selected plan when it used a loss scaler, else None."""
        selected = self._selected()
        results = getattr(self.last_run, "results", None)
        runs = dict(results) if isinstance(results, dict) else {}
        if not runs and self.last_run is not None and hasattr(self.last_run, "scale_history"):
            runs = {getattr(self.last_run, "label", ""): self.last_run}
        for label, result in runs.items():
            plan = getattr(result, "plan", None)
            if getattr(plan, "use_scaler", False) and (
                selected is None or label == selected.label or plan == selected.plan
            ):
                return result
        return None

    # ------------------------------------------------------------------ computing

    def compute(self) -> float:
        """Inspect every target not cached, analyse the numerics, show them; returns seconds."""
        from precision_nb.views.report.numerics import Numerics

        start = time.perf_counter()
        source = self._model_source()
        targets = self.targets()
        missing = sum(1 for t in targets if self._key(t) not in self.inspections)
        self.shown = inspect_all(source, targets, self.inspections)
        self._attach()
        if missing:
            self.cost_s = (time.perf_counter() - start) / missing
        nkey = self._numerics_key()
        if nkey not in self.numerics_cache:
            t0 = time.perf_counter()
            selected = self._selected()
            device = "cpu" if selected is None or selected.capabilities else selected.device
            run = self._numerics_run()
            result = analyse_numerics(source, device, run, formats=self.numerics_formats())
            self.numerics_cache[nkey] = Numerics(result, run)
            self.cost_s = time.perf_counter() - t0
        self.numerics = self.numerics_cache[nkey]
        self.render()
        self.seconds = time.perf_counter() - start
        return self.seconds

    def _attach(self) -> None:
        """Give the last run's comparison the inspections of its own plans (a true plan's
        outcome then carries its saving against the mixed plan); ``attached`` says it did."""
        run = self.last_run
        if not hasattr(run, "attach_inspections"):
            return
        mine = {
            t.label: self.shown[t.label]
            for t in self.run_targets
            if t.label in self.shown and self.shown[t.label].plan == t.plan
            and run.outcome(t.label).inspection is not self.shown[t.label]
        }  # fmt: skip
        if mine:
            run.attach_inspections(mine)
            self.attached = True

    def render(self) -> None:
        self.memory_html.value = memory_chart_svg(self.shown)
        selected = self._selected()
        label = selected.label if selected is not None else next(iter(self.shown), None)
        data = self.shown.get(label) if label is not None else None
        self.ops_html.value = "" if data is None else ops_html(label, data)
        self.numerics_html.value = "" if self.numerics is None else numerics_html(self.numerics)
        window = None if self.numerics is None else self.numerics.window
        if window is not None and window.get("lo") is not None:
            self._on_window((int(window["lo"]), int(window["hi"])))
        plans = ", ".join(self.shown)
        self.note.value = f"<i>Inspected: {html.escape(plans)} (one step each, on a copy).</i>"

    # ------------------------------------------------------------------ when

    def plan_changed(self) -> None:
        """The selection changed: the views show older plans until opened or Inspect pressed."""
        if self.shown and self.stale:
            self.note.value = (
                "<i>The plan changed: opening the Memory, Ops or Numerics tab (or Inspect) "
                "inspects it.</i>"
            )

    def open_or_inspect(self) -> str | None:
        """A view was opened or Inspect pressed: compute what is missing unless a run goes.
        Returns an error message for the panel's error box, or None."""
        if self._running():
            self.note.value = "<i>A run is going: the views are inspected when it ends.</i>"
            return None
        try:
            self.compute()
        except Exception as exc:  # noqa: BLE001 - UI boundary: shown in the panel, panel stays
            log.info("inspection failed", exc_info=True)
            self.note.value = ""
            return f"Inspect failed: {type(exc).__name__}: {exc}"
        return None

    def after_run(self, source: Any, *, training_s: float, spent_s: float, budget: float) -> None:
        """Worker thread, after a run: inspect its plans if the expected cost, with what was
        already spent plotting, fits ``budget`` of the training time; else say so."""
        from precision_nb.views.report.tables import results_of

        self.seconds = 0.0
        self.last_run = source
        self.run_targets = [
            Target(label, r.plan, str(r.device))
            for label, r in results_of(source).items()
            if getattr(r, "plan", None) is not None
        ]
        missing = self.missing()
        if missing == 0 or spent_s + missing * self.cost_s <= budget * max(training_s, 0.0):
            self.compute()
            return
        self.note.value = (
            f"<i>Not inspected after the run: {missing} step(s) of about "
            f"{self.cost_s:.1f} s each here, over the budget of {100 * budget:g} % of this run's "
            f"{max(training_s, 0.0):.1f} s of training. Inspect (or opening a view) runs them "
            "now.</i>"
        )

    def close(self) -> None:
        self.inspections.clear()
        self.numerics_cache.clear()
        self.shown = {}
        self.numerics = None
        self.last_run = None
        self.run_targets = []
