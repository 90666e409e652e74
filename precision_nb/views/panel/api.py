"""The ipywidgets panel: pick device and precision, see the resolved plan live, run, stop, compare.

``Panel()`` (displayed by evaluating it in a cell) shows the controls, the resolved plan with the
reason for each decision and the spec's matrix (applied row marked), a Run / Compare / Stop row, a
progress bar, live figures, the summary table and a "copy as code" snippet. Everything it shows is
available in code: ``panel.plan``, ``panel.explanation``, ``panel.results``, ``panel.figures``,
``panel.run(block=True)``.

Resolution comes from :mod:`precision_nb.core`, training from :mod:`precision_nb.engine`
(``fit`` / ``compare`` with callbacks and a stop flag), figures and tables from
:mod:`precision_nb.views.report.figures` and :mod:`precision_nb.views.report.tables`; this
module only wires them to widgets.
"""

from __future__ import annotations

import copy
import html
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import ipywidgets as widgets

from precision_nb.core.capabilities import read_capabilities
from precision_nb.core.device import resolve_device
from precision_nb.core.optim import OptimizerConfig
from precision_nb.core.plan import PrecisionConfig, PrecisionPlan
from precision_nb.core.resolution import Explanation
from precision_nb.views.panel.controls import (
    COMPARE_CHOICES,
    DEFAULT_COMPARE,
    SIM_PREFIX,
    Controls,
    Selection,
)
from precision_nb.views.panel.live_charts import live_charts_html
from precision_nb.views.panel.plan_resolver import PlanView, badge_html, code_for, device_options
from precision_nb.views.panel.run import (
    Job,
    LiveView,
    check_train_options,
    describe_failure,
    metrics_text,
)

log = logging.getLogger(__name__)

__all__ = ["Panel"]

_ERROR_STYLE = (
    "background:#f8d7da;color:#721c24;border:1px solid #f5c6cb;padding:6px 10px;"
    "border-radius:4px;white-space:pre-wrap"
)


def _workload_presets() -> dict[str, tuple[str, ...]]:
    from precision_nb.engine.workloads import PRESETS as SIZE_PRESETS
    from precision_nb.engine.workloads import WORKLOADS

    return {name: tuple(SIZE_PRESETS) for name in WORKLOADS}


CONTROL_NAMES = (
    "device",
    "mode",
    "dtype",
    "fused",
    "workload",
    "preset",
    "steps",
    "accumulation",
    "seed",
    "loss_scale_lab",
    "compare_plans",
)


def _control_property(name: str) -> property:
    def getter(self: Any) -> Any:
        value = getattr(self.selection, name)
        return value

    def setter(self: Any, value: Any) -> None:
        self.set(**{name: value})

    doc = f"The {name} control (reading gives the current value; assigning calls set({name}=...))."
    return property(getter, setter, doc=doc)


class Panel:
    """Jupyter panel for precision plans; see the module docstring and the README.

    ``model`` / ``batches`` (with an optional ``loss_fn``) train your own ``nn.Module`` instead of
    a built-in workload; every run trains a fresh copy, so your model is left as it was. The other
    keyword arguments set the controls' initial values (the same names as :meth:`set`).
    """

    def __init__(
        self,
        model: Any = None,
        batches: Any = None,
        *,
        loss_fn: Any = None,
        device: str = "auto",
        mode: str = "auto",
        dtype: Any = None,
        fused: bool | str | None = None,
        workload: str | None = None,
        preset: str | None = None,
        steps: int = 30,
        accumulation: int = 1,
        seed: int = 0,
        loss_scale_lab: bool = False,
        compare_plans: Sequence[str] = DEFAULT_COMPARE,
        optimizer: OptimizerConfig | None = None,
        log_every: int | None = None,
        train_options: dict[str, Any] | None = None,
        plot_budget: float = 0.025,
        refresh_interval_s: float = 0.5,
    ) -> None:
        if (model is None) != (batches is None):
            missing = "batches" if batches is None else "model"
            raise ValueError(
                f"{missing} is None; pass model and batches together (your own nn.Module and "
                "its batches), or neither to use a built-in workload"
            )
        if optimizer is not None and not isinstance(optimizer, OptimizerConfig):
            raise ValueError(
                f"optimizer={optimizer!r} must be an OptimizerConfig (or None for the defaults)"
            )
        if log_every is not None and (
            isinstance(log_every, bool) or not isinstance(log_every, int) or log_every < 1
        ):
            raise ValueError(f"log_every={log_every!r} must be None or an integer >= 1")
        self._train_options = check_train_options(train_options)
        if not 0 < plot_budget < 1:
            raise ValueError(f"plot_budget={plot_budget!r} must be a fraction between 0 and 1")
        self._model = model
        self._batches = batches
        self._loss_fn = loss_fn
        self._optimizer = optimizer or OptimizerConfig()
        self._log_every = log_every
        self._plot_budget = plot_budget
        self._refresh_interval_s = refresh_interval_s
        self._capabilities = read_capabilities()
        self._plans = PlanView(self._capabilities, self._optimizer)
        self._explanation: Explanation | None = None
        self._selection: Selection | None = None
        self._plan_error: str | None = None
        self._error: str | None = None
        self._job: Job | None = None
        self._start_lock = threading.Lock()
        self._applying = False
        self._source: Any = None  # the last RunResult or Comparison
        self._live: LiveView | None = None
        self.last_exception: BaseException | None = None
        self.last_live: LiveView | None = None
        self.refresh_seconds: float = 0.0  # the last plan refresh
        self.last_render_seconds: float = 0.0  # final figures + table of the last run
        # What a figure costs to draw here, learnt from earlier frames; the first live frame of
        # the first run waits until the plotting budget covers this guess.
        self._frame_cost_s = 1.0

        workloads = {} if model is not None else _workload_presets()
        self.controls = Controls(
            device_options(self._capabilities), workloads, user_model=model is not None
        )
        self._build_widgets()

        initial: dict[str, Any] = {
            "device": device,
            "mode": mode,
            "dtype": dtype,
            "fused": fused,
            "steps": steps,
            "accumulation": accumulation,
            "seed": seed,
            "loss_scale_lab": loss_scale_lab,
            "compare_plans": compare_plans,
        }
        if model is None:
            from precision_nb.engine.workloads import DEFAULT_WORKLOAD

            initial["workload"] = workload if workload is not None else DEFAULT_WORKLOAD
            initial["preset"] = preset if preset is not None else "tiny"
        elif workload is not None or preset is not None:
            raise ValueError(
                "workload/preset cannot be set together with model=...; the panel trains your "
                "model on your batches"
            )
        self.controls.apply(self.controls.normalise(**initial))
        self.controls.observe(self._on_control_change)
        self.refresh()

    # ================================================================== widgets

    def _build_widgets(self) -> None:
        self.badge = widgets.HTML()
        self.badge.add_class("pnb-badge")
        title = widgets.HTML("<b style='font-size:1.15em'>precision_nb</b> &mdash; precision plan")
        self.run_button = widgets.Button(
            description="Run", button_style="success", icon="play", tooltip="Train the plan"
        )
        self.compare_button = widgets.Button(
            description="Compare",
            button_style="info",
            icon="columns",
            tooltip="Run the plans ticked under Compare on the same seed, overlaid",
        )
        self.stop_button = widgets.Button(
            description="Stop", button_style="danger", icon="stop", disabled=True
        )
        self.run_reason = widgets.HTML()
        self.error_box = widgets.HTML(layout=widgets.Layout(display="none"))
        self.status = widgets.HTML()
        self.progress = widgets.IntProgress(
            value=0, min=0, max=1, description="Progress", layout=widgets.Layout(width="360px")
        )
        self.progress_label = widgets.Label(value="idle")
        self.live_metrics = widgets.HTML()
        self.live_charts = widgets.HTML()
        self._last_charts = -float("inf")
        self.plan_html = widgets.HTML()
        self.figure_image = widgets.Image(
            format="png", layout=widgets.Layout(max_width="100%", display="none")
        )
        self.figure_note = widgets.HTML()
        self.figure_button = widgets.Button(
            description="Draw figure",
            icon="image",
            disabled=True,
            tooltip="Draw the matplotlib figure of the last run (loss, loss scale, throughput, "
            "memory), as in panel.figures",
        )
        self.results_html = widgets.HTML()
        self.events_html = widgets.HTML()
        self.code_area = widgets.Textarea(
            layout=widgets.Layout(width="100%", height="320px"),
            description="",
            disabled=False,
        )
        for widget, css in (
            (self.run_button, "pnb-run"),
            (self.compare_button, "pnb-compare"),
            (self.stop_button, "pnb-stop"),
            (self.run_reason, "pnb-run-reason"),
            (self.error_box, "pnb-error"),
            (self.status, "pnb-status"),
            (self.progress, "pnb-progress"),
            (self.progress_label, "pnb-progress-label"),
            (self.live_metrics, "pnb-live-metrics"),
            (self.live_charts, "pnb-live-charts"),
            (self.plan_html, "pnb-plan"),
            (self.figure_image, "pnb-figures"),
            (self.figure_note, "pnb-figures-note"),
            (self.figure_button, "pnb-figure-button"),
            (self.results_html, "pnb-results"),
            (self.events_html, "pnb-events"),
            (self.code_area, "pnb-code"),
        ):
            widget.add_class(css)

        self.run_button.on_click(lambda _b: self._start("run"))
        self.compare_button.on_click(lambda _b: self._start("compare"))
        self.stop_button.on_click(lambda _b: self.stop())
        self.figure_button.on_click(lambda _b: self._draw_figure_clicked())

        buttons = widgets.HBox([self.run_button, self.compare_button, self.stop_button])
        progress = widgets.HBox([self.progress, self.progress_label])
        code_title = widgets.HTML(
            "<b>Copy as code</b> &mdash; plain PyTorch (no precision_nb) reproducing this plan"
        )
        self.widget = widgets.VBox(
            [
                widgets.HBox([title, self.badge]),
                self.controls.box(),
                buttons,
                self.run_reason,
                self.error_box,
                progress,
                self.live_metrics,
                self.live_charts,
                self.status,
                widgets.HBox([self.figure_button, self.figure_note]),
                self.figure_image,
                self.results_html,
                self.events_html,
                self.plan_html,
                code_title,
                self.code_area,
            ]
        )
        self.widget.add_class("pnb-panel")

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    # ================================================================== live plan

    def _on_control_change(self, _change: dict[str, Any]) -> None:
        if not self._applying:
            self.refresh()

    def refresh(self) -> None:
        """Re-resolve the plan from the controls and update every view of it (also the code)."""
        start = time.perf_counter()
        selection = self.controls.selection()
        self._selection = selection
        try:
            resolved = self._plans.resolve(selection)
        except (ValueError, RuntimeError) as exc:
            self._explanation = None
            self._plan_error = f"Cannot resolve this selection: {exc}"
            self.controls.update_enabled(lab_applies=False, lab_reason="")
            self.plan_html.value = ""
            self.code_area.value = ""
            self._show_error(self._plan_error)
            self._update_buttons()
            self.refresh_seconds = time.perf_counter() - start
            return
        explanation = resolved.explanation
        self._explanation = explanation
        self._plan_error = None
        self.controls.update_enabled(
            lab_applies=resolved.lab_applies, lab_reason=resolved.lab_reason
        )
        self.plan_html.value = explanation._repr_html_()
        self.badge.value = badge_html(explanation)
        if explanation.simulated:
            self.badge.add_class("pnb-simulated")
        else:
            self.badge.remove_class("pnb-simulated")
        self.code_area.value = code_for(explanation, selection)
        if self._error is not None and self._error.startswith("Cannot resolve"):
            self._show_error(None)
        self._update_buttons()
        self.refresh_seconds = time.perf_counter() - start

    # ================================================================== buttons and errors

    def _run_block_reason(self) -> str | None:
        """Why Run cannot start now (None when it can)."""
        if self._plan_error is not None:
            return "Run is disabled: the selection cannot be resolved (see the message above)."
        if self._explanation is not None and self._explanation.simulated:
            name = self._explanation.capabilities.name
            return (
                f"Run is disabled: {name} is simulated hardware. The plan shows what it would "
                "resolve to there; pick a real device (auto, cpu, ...) to run."
            )
        return None

    def _update_buttons(self) -> None:
        running = self.running
        reason = self._run_block_reason()
        self.run_button.disabled = running or reason is not None
        self.compare_button.disabled = running or reason is not None
        self.stop_button.disabled = not running
        self.figure_button.disabled = running or self._source is None
        if running:
            self.run_reason.value = "<i>A run is going: Stop ends it between steps.</i>"
        elif reason is not None:
            self.run_reason.value = f"<span style='color:#856404'>{html.escape(reason)}</span>"
        else:
            self.run_reason.value = ""

    def _show_error(self, message: str | None) -> None:
        self._error = message
        if message is None:
            self.error_box.value = ""
            self.error_box.layout.display = "none"
            return
        self.error_box.value = f"<div style='{_ERROR_STYLE}'>{html.escape(message)}</div>"
        self.error_box.layout.display = None

    # ================================================================== running

    def _start(self, kind: str, *, raise_errors: bool = False) -> Job | None:
        """Start a run or comparison in the background; returns the job, or None when refused."""
        with self._start_lock:
            if self.running:
                message = (
                    "A run is already going: wait for it or press Stop before starting another."
                )
                self.status.value = f"<b>{html.escape(message)}</b>"
                if raise_errors:
                    raise RuntimeError(message)
                return None
            self.refresh()
            reason = self._run_block_reason()
            if reason is not None:
                self._show_error(reason)
                if raise_errors:
                    raise RuntimeError(reason)
                return None
            selection = self.controls.selection()
            explanation = self._explanation
            assert explanation is not None
            if kind == "compare" and not selection.compare_plans:
                message = "Compare needs at least one plan ticked in the Compare list."
                self._show_error(message)
                if raise_errors:
                    raise ValueError(f"compare_plans=() is empty; {message}")
                return None
            self._show_error(None)
            self.last_exception = None
            live = LiveView(
                steps=selection.steps,
                runs=1 if kind == "run" else max(1, len(selection.compare_plans)),
                progress=self._set_progress,
                draw=self._draw_live,
                budget=self._plot_budget,
                min_interval_s=self._refresh_interval_s,
                first_cost_guess_s=self._frame_cost_s,
            )
            self._live = live
            self.last_live = live
            self._source = None
            self.progress.value = 0
            self.progress.max = live.steps * live.runs
            self.progress.bar_style = ""
            self.progress_label.value = "starting..."
            self.live_metrics.value = ""
            self.live_charts.value = ""
            self._last_charts = -float("inf")
            self.status.value = ""
            self.events_html.value = ""
            self.results_html.value = ""
            self._show_figure(None, "")
            if kind == "run":

                def target(stop: threading.Event) -> Any:
                    return self._fit(selection, explanation, live, stop)
            else:

                def target(stop: threading.Event) -> Any:
                    return self._compare(selection, live, stop)

            job = Job(
                target=target,
                on_done=self._finish,
                on_released=lambda _job: self._update_buttons(),
                kind=kind,
                context=selection,
            )
            self._job = job
            self._update_buttons()
            job.start()
            return job

    def _train_config(self, selection: Selection, label: str | None = None) -> Any:
        from precision_nb.engine.trainer import TrainConfig

        log_every = self._log_every or max(1, selection.steps // 50)
        return TrainConfig(
            **{
                "log_every": log_every,
                **self._train_options,
                "steps": selection.steps,
                "accumulation": selection.accumulation,
                "seed": selection.seed,
                "progress": False,
                "label": label,
            }
        )

    def _optimizer_for(self, selection: Selection) -> OptimizerConfig:
        return self._plans.optimizer_for(selection)

    def _fit(
        self, selection: Selection, explanation: Explanation, live: LiveView, stop: Any
    ) -> Any:
        from precision_nb.engine.trainer import fit

        common: dict[str, Any] = dict(
            device=selection.device,
            precision=explanation.config,
            optimizer=self._optimizer_for(selection),
            train=self._train_config(selection),
            callbacks=[live],
            stop=stop,
        )
        if self._model is not None:
            return fit(copy.deepcopy(self._model), self._batches, loss_fn=self._loss_fn, **common)
        return fit(selection.workload, preset=selection.preset, **common)

    def _compare(self, selection: Selection, live: LiveView, stop: Any) -> Any:
        from precision_nb.engine.compare import compare

        modes = [
            PrecisionConfig(mode=COMPARE_CHOICES[name][0], loss_scale_lab=COMPARE_CHOICES[name][1])
            for name in selection.compare_plans
        ]
        common: dict[str, Any] = dict(
            device=selection.device,
            optimizer=self._optimizer_for(selection),
            train=self._train_config(selection),
            callbacks=[live],
            stop=stop,
        )
        if self._model is not None:
            return compare(
                modes, model=self._model, batches=self._batches, loss_fn=self._loss_fn, **common
            )
        return compare(modes, selection.workload, selection.preset, **common)

    def _set_progress(
        self, done: int, total: int, text: str, record: dict[str, Any] | None
    ) -> None:
        self.progress.max = max(1, total)
        self.progress.value = min(done, self.progress.max)
        self.progress_label.value = text
        if record is not None:
            self.live_metrics.value = metrics_text(record)
            live, now = self._live, time.perf_counter()
            # SVG charts cost milliseconds, so they follow the run at most twice a second
            # (and at each run's end), unlike matplotlib frames, which wait for the budget.
            if live is not None and (now - self._last_charts >= 0.5 or done >= total):
                self._last_charts = now
                self.live_charts.value = live_charts_html(live.snapshot()[0])

    def _draw_live(self, records: list[dict[str, Any]], results: list[Any]) -> None:
        """A live frame from the records so far (see :func:`_panel_png`)."""
        if not records:
            return
        from precision_nb.views.report.tables import scale_histories, to_frame

        histories = scale_histories({r.label: r for r in results})
        self._show_figure(
            _panel_png(to_frame(records), histories, dpi=60),
            "<i>Live figure (redrawn while the run goes, within the plotting budget)</i>",
        )

    def _show_figure(self, png: bytes | None, note: str) -> None:
        """Show ``png`` (None hides the image) with ``note`` beside the Draw figure button."""
        self.figure_image.value = png or b""
        self.figure_image.layout.display = None if png else "none"
        self.figure_note.value = note

    def _finish(self, job: Job) -> None:
        """Worker thread, after the run: keep the records, show the final charts and table (and
        the matplotlib figure when it fits the plotting budget), re-enable."""
        live = self._live
        try:
            source = job.result
            if job.error is not None:
                self.last_exception = job.error
                # A failed fit keeps its RunResult on the error; a failed comparison keeps the
                # live records of every run so far (below).
                partial = getattr(job.error, "result", None) or getattr(
                    job.error, "precision_nb_result", None
                )
                source = partial if job.kind == "run" else None
                selection = job.context
                hint = f"now {selection.preset}" if getattr(selection, "preset", None) else ""
                self._show_error(describe_failure(job.error, batch_hint=hint))
                self.progress.bar_style = "danger"
            self._source = source
            if source is None and live is not None and live.records:
                self._source = list(live.records)
            if live is not None and live.draw_error is not None and job.error is None:
                self._show_error(f"Live figures stopped during the run: {live.draw_error}")
            start = time.perf_counter()
            try:
                frame = self._render_final()
                if frame is not None:
                    self._final_figure(live, frame)
            except Exception as exc:  # noqa: BLE001 - UI boundary: the records are kept, say so
                log.info("drawing the results failed", exc_info=True)
                self._show_error(
                    f"The run's records are kept (panel.results), but drawing them failed: "
                    f"{type(exc).__name__}: {exc}"
                )
            self.last_render_seconds = time.perf_counter() - start
            if live is not None and live.frames:
                self._frame_cost_s = live.last_frame_seconds
        finally:
            self._live = None

    def _final_figure(self, live: LiveView | None, frame: Any) -> None:
        """Draw the matplotlib figure after a run when it fits the plotting budget.

        The live charts already show the finished run. The matplotlib figure costs a frame
        (learnt from earlier frames; about a second on a slow CPU), so it is drawn automatically
        only while all plotting of the run stays within ``plot_budget`` of its training time;
        otherwise the note says so and Draw figure (or :meth:`draw_figure`) draws it on demand.
        """
        training = sum(r.seconds for r in _results_of(self._source).values())
        plotted = 0.0
        if live is not None:
            training -= live.callback_seconds
            plotted = live.plot_seconds
        cost = self._frame_cost_s
        if plotted + cost <= self._plot_budget * training:
            self._draw_final(frame)
            return
        why = (
            f"a frame costs about {cost:.1f} s here, over the plotting budget of "
            f"{100 * self._plot_budget:g} % of this run's {max(training, 0.0):.1f} s of training"
        )
        if live is not None and live.frames and self.figure_image.value:
            self.figure_note.value = (
                f"<i>The figure below is the last live frame; the charts above show the finished "
                f"run. The final figure was not drawn ({why}): Draw figure draws it now.</i>"
            )
            return
        self._show_figure(
            None,
            f"<i>The charts above show the finished run. The matplotlib figure was not drawn "
            f"({why}): Draw figure draws it now.</i>",
        )

    def draw_figure(self) -> bytes:
        """Draw the matplotlib figure of the last run or comparison into the panel (the four
        panels of the live charts, from every record); returns the PNG bytes.

        Raises ``RuntimeError`` before the first run or while a run is going.
        """
        if self.running:
            raise RuntimeError("a run is going: draw the figure when it has ended")
        if self._source is None:
            raise RuntimeError("no run yet: Run or Compare first, then draw its figure")
        from precision_nb.views.report.tables import to_frame

        frame = to_frame(self._source)
        if frame.empty:
            raise RuntimeError("the last run made no records: there is nothing to draw")
        return self._draw_final(frame)

    def _draw_final(self, frame: Any) -> bytes:
        from precision_nb.views.report.tables import scale_histories

        start = time.perf_counter()
        png = _panel_png(frame, scale_histories(self._source), dpi=72)
        self._frame_cost_s = time.perf_counter() - start
        self._show_figure(png, "")
        return png

    def _draw_figure_clicked(self) -> None:
        try:
            self.draw_figure()
        except Exception as exc:  # noqa: BLE001 - UI boundary: shown in the panel, panel stays
            log.info("Draw figure failed", exc_info=True)
            self._show_error(f"Draw figure failed: {type(exc).__name__}: {exc}")

    def _render_final(self) -> Any:
        """Live charts, status, summary table and events of the finished run; returns its
        records as a DataFrame (None when there are none)."""
        source = self._source
        if source is None:
            self.progress_label.value = "failed before the first step"
            return None
        from precision_nb.views.report.tables import summary, to_frame

        frame = to_frame(source)
        self.live_charts.value = live_charts_html(frame.to_dict("records"))
        stopped = bool(getattr(source, "stopped", False))
        steps = int(frame["step"].max()) if not frame.empty else 0
        if self.last_exception is None:
            self.progress.bar_style = "warning" if stopped else "success"
        word = "Stopped" if stopped else ("Failed" if self.last_exception else "Finished")
        runs = list(dict.fromkeys(frame["run"])) if not frame.empty else []
        seconds = sum(r.seconds for r in _results_of(source).values())
        self.status.value = html.escape(
            f"{word}: {len(runs)} run(s) ({', '.join(map(str, runs))}), last logged step "
            f"{steps}, {seconds:.1f} s of training, {len(frame)} records kept."
        )
        if frame.empty:
            return None
        self.results_html.value = summary(source).to_html(
            index=False, na_rep="", float_format=lambda v: f"{v:.4g}"
        )
        events = list(getattr(source, "events", []) or [])
        if events:
            items = "".join(f"<li>{html.escape(str(e))}</li>" for e in events)
            self.events_html.value = (
                f"<details open><summary>Events</summary><ul>{items}</ul></details>"
            )
        return frame

    # ================================================================== public API

    device = _control_property("device")
    mode = _control_property("mode")
    dtype = _control_property("dtype")
    fused = _control_property("fused")
    workload = _control_property("workload")
    preset = _control_property("preset")
    steps = _control_property("steps")
    accumulation = _control_property("accumulation")
    seed = _control_property("seed")
    loss_scale_lab = _control_property("loss_scale_lab")
    compare_plans = _control_property("compare_plans")

    @property
    def selection(self) -> Selection:
        """The controls' current values."""
        return self.controls.selection()

    @property
    def explanation(self) -> Explanation | None:
        """The explanation of the current selection (None when it cannot be resolved)."""
        return self._explanation

    @property
    def plan(self) -> PrecisionPlan | None:
        """The resolved plan of the current selection."""
        return None if self._explanation is None else self._explanation.plan

    @property
    def plan_text(self) -> str:
        """The explanation as readable text (what the plan area shows)."""
        return "" if self._explanation is None else str(self._explanation)

    @property
    def simulated(self) -> bool:
        return bool(self._explanation is not None and self._explanation.simulated)

    @property
    def code(self) -> str:
        """The plain PyTorch snippet reproducing the selected plan ("copy as code")."""
        return self.code_area.value

    @property
    def error(self) -> str | None:
        """The message shown in the panel's error area, if any."""
        return self._error

    @property
    def running(self) -> bool:
        return self._job is not None and self._job.running

    @property
    def result(self) -> Any:
        """The last RunResult (Run) or Comparison (Compare); partial after Stop or a failure."""
        return self._source

    @property
    def results(self) -> Any:
        """Every record of the last run or comparison as a pandas DataFrame (live while running)."""
        from precision_nb.views.report.tables import to_frame

        if self._source is None and self._live is not None:
            return to_frame(self._live.snapshot()[0])
        return to_frame(self._source if self._source is not None else [])

    @property
    def summary(self) -> Any:
        """One row per plan of the last run or comparison (views.tables.summary)."""
        from precision_nb.views.report.tables import summary

        return summary(self._source if self._source is not None else [])

    @property
    def figures(self) -> dict[str, Any]:
        """Fresh matplotlib Figures of the last run: loss, loss_scale, throughput, memory,
        dashboard (empty dict before any run)."""
        if self._source is None:
            return {}
        from precision_nb.views.report import figures as f

        return {
            "loss": f.loss_figure(self._source),
            "loss_scale": f.loss_scale_figure(self._source),
            "throughput": f.throughput_figure(self._source),
            "memory": f.memory_figure(self._source),
            "dashboard": f.dashboard_figure(self._source),
        }

    def set(self, **controls: Any) -> Panel:
        """Set controls by name (device, mode, dtype, fused, workload, preset, steps,
        accumulation, seed, loss_scale_lab, compare_plans); the plan refreshes once.

        A bad value raises ``ValueError`` (a device this machine lacks: ``RuntimeError``), is
        shown in the panel, and nothing is changed then.
        """
        try:
            values = self.controls.normalise(**controls)
            device = values.get("device")
            if device is not None and not device.startswith(SIM_PREFIX):
                resolve_device(device, self._capabilities)  # absent hardware raises here
        except (ValueError, RuntimeError) as exc:
            self._show_error(str(exc))
            raise
        if self._error is not None and not self.running:
            self._show_error(None)
        self._applying = True  # apply every value, then resolve once
        try:
            self.controls.apply(values)
        finally:
            self._applying = False
        self.refresh()
        return self

    def run(self, block: bool = False, timeout: float | None = None) -> Any:
        """Train the selected plan (like pressing Run).

        ``block=True`` waits and returns the RunResult (re-raising a failure after showing it in
        the panel); otherwise returns at once (the run goes on in the background).
        Raises ``RuntimeError`` when a run is already going or the device is simulated.
        """
        return self._launch("run", block, timeout)

    def compare(self, block: bool = False, timeout: float | None = None) -> Any:
        """Run the plans chosen under Compare on the same seed (like pressing Compare).

        ``block=True`` waits and returns the engine's Comparison.
        """
        return self._launch("compare", block, timeout)

    def _launch(self, kind: str, block: bool, timeout: float | None) -> Any:
        job = self._start(kind, raise_errors=True)
        assert job is not None
        if not block:
            return None
        if not job.wait(timeout):
            raise TimeoutError(f"the {kind} did not finish within {timeout} s (it goes on)")
        if job.error is not None:
            raise job.error
        return self._source

    def stop(self) -> None:
        """End the current run between steps; every record made so far is kept."""
        job = self._job
        if job is None or not job.running:
            return
        job.stop_event.set()
        self.stop_button.disabled = True
        self.progress_label.value = self.progress_label.value + " · stopping..."

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the current run; True when none is going (anymore)."""
        job = self._job
        return True if job is None else job.wait(timeout)


def _panel_png(frame: Any, histories: dict[str, Any], *, dpi: int) -> bytes:
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


def _results_of(source: Any) -> dict[str, Any]:
    from precision_nb.views.report.tables import results_of

    return results_of(source)
