"""The ipywidgets panel: pick device and precision, see the resolved plan live, run, stop, compare.

``Panel()`` (displayed by evaluating it in a cell) shows the controls, the resolved plan with the
reason for each decision and the resolution matrix (applied row marked), a Run / Compare / Stop
row, a progress bar, live charts, the summary table and a "copy as code" snippet. Everything it
shows is available in code: ``panel.plan``, ``panel.explanation``, ``panel.records_frame``,
``panel.figures``, ``panel.run(block=True)``; ``panel.close()`` releases it.

This module is the construction and the public API. The pieces: :mod:`.controls` (input widgets),
:mod:`.plan_resolver` (the cached plan of a selection), :mod:`.outputs` (output widgets and what is
drawn into them), :mod:`.session` (background runs, the plotting budget, what is drawn after a
run) and :mod:`.run` (the worker thread and the throttled engine callback).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import ipywidgets as widgets

from precision_nb.core.capabilities import read_capabilities
from precision_nb.core.device import resolve_device
from precision_nb.core.optim import OptimizerConfig
from precision_nb.core.validate import positive_int, short_repr
from precision_nb.views.panel.analysis import AnalysisViews
from precision_nb.views.panel.analysis_api import AnalysisMixin
from precision_nb.views.panel.controls import (
    DEFAULT_COMPARE,
    SIM_PREFIX,
    Controls,
    Selection,
)
from precision_nb.views.panel.distributed import (
    DIST_CONTROLS,
    DistributedControls,
    DistributedPlanner,
)
from precision_nb.views.panel.distributed_run import user_inputs
from precision_nb.views.panel.outputs import (
    OUTPUT_WIDGETS,
    PanelOutputs,
    close_widgets,
    weak_callback,
)
from precision_nb.views.panel.plan_resolver import LivePlan, PlanResolver, device_options
from precision_nb.views.panel.readout import PanelReadout
from precision_nb.views.panel.run import Job, check_train_options
from precision_nb.views.panel.session import RunSession, UserModel

__all__ = ["Panel"]

COMPARE_ONE_PROCESS = (
    "Compare is off with a distributed strategy: comparisons run on one process here. For plans "
    "compared on several processes use pnb.profile(..., compare=(...), distributed="
    "pnb.Distributed(...)) (docs/distributed.md), or set the strategy to none."
)


def _workload_presets() -> dict[str, tuple[str, ...]]:
    from precision_nb.engine.workloads import PRESETS as SIZE_PRESETS
    from precision_nb.engine.workloads import WORKLOADS

    return {name: tuple(SIZE_PRESETS) for name in WORKLOADS}


def _release(root: Any, session: RunSession, analysis: AnalysisViews, timeout: float) -> None:
    """Stop the session's run, drop what it holds, close every widget (``close`` and the
    finaliser of a collected panel)."""
    session.close(timeout)
    analysis.close()
    close_widgets(root)


class Panel(AnalysisMixin, PanelReadout):
    """Jupyter panel for precision plans; see the module docstring and docs/panel.md.

    ``model`` / ``batches`` (with an optional ``loss_fn``) train your own ``nn.Module`` instead of
    a built-in workload; every run trains a fresh copy, so your model is left as it was. The other
    keyword arguments set the controls' initial values (the same names as :meth:`set`).
    """

    CLOSE_TIMEOUT_S = 5.0

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
        distributed: Any = None,
        factory: str | None = None,
    ) -> None:
        if (model is None) != (batches is None):
            missing = "batches" if batches is None else "model"
            raise ValueError(
                f"{missing} is None; pass model and batches together (your own nn.Module and "
                "its batches), or neither to use a built-in workload"
            )
        if optimizer is not None and not isinstance(optimizer, OptimizerConfig):
            raise ValueError(
                f"optimizer={short_repr(optimizer)} must be an OptimizerConfig (or None for the "
                "defaults)"
            )
        if log_every is not None:
            positive_int("log_every", log_every)
        is_number = isinstance(plot_budget, (int, float)) and not isinstance(plot_budget, bool)
        if not (is_number and 0 < plot_budget < 1):
            raise ValueError(
                f"plot_budget={short_repr(plot_budget)} must be a fraction between 0 and 1"
            )
        if model is not None and (workload is not None or preset is not None):
            raise ValueError(
                "workload/preset cannot be set together with model=...; the panel trains your "
                "model on your batches"
            )
        train_options = check_train_options(train_options)
        if factory is not None and (model is None or not isinstance(factory, str)):
            raise ValueError(
                f"factory={short_repr(factory)}: allowed: None, or with model=... an import path "
                "'package.module:function' returning the model for torchrun's workers"
            )
        user = None
        if model is not None:
            batches, batches_path, loss_fn, loss_path = user_inputs(batches, loss_fn)
            user = UserModel(model, batches, loss_fn, factory, batches_path, loss_path)
        self._capabilities = read_capabilities()
        self._resolver = PlanResolver(self._capabilities, optimizer or OptimizerConfig())
        self._applying = False
        self._closed = False

        workloads = {} if model is not None else _workload_presets()
        self.controls = Controls(
            device_options(self._capabilities), workloads, user_model=model is not None
        )
        self.dist_controls = DistributedControls()
        self.outputs = PanelOutputs(widgets.VBox([self.controls.box(), self.dist_controls.box]))
        self.widget = self.outputs.widget
        planner = DistributedPlanner(self.dist_controls)
        self._plan = LivePlan(self._resolver, self.controls, self.outputs, planner)
        for name in OUTPUT_WIDGETS:
            setattr(self, name, getattr(self.outputs, name))
        self.session = RunSession(
            self.outputs,
            user_model=user,
            optimizer_for=self._resolver.optimizer_for,
            log_every=log_every,
            train_options=train_options,
            on_released=weak_callback(self._update_buttons),
            plot_budget=plot_budget,
            refresh_interval_s=refresh_interval_s,
            after_run=weak_callback(self._after_run),
        )
        self.analysis = AnalysisViews(
            model_source=weak_callback(self._model_source),
            selected=weak_callback(self._selected_target),
            running=weak_callback(self._is_running),
            on_window=weak_callback(self._on_scale_window),
        )
        planner.session = self.session  # the user model, dropped on close
        self.outputs.insert_before(self.outputs.plan_html, self.analysis.box)
        self.outputs.insert_before(self.analysis.box, self.session.per_rank.box)
        self.inspect_button = self.analysis.button
        self.analysis.button.on_click(weak_callback(self._on_inspect_click))
        self.analysis.accordion.observe(weak_callback(self._on_view_opened), "selected_index")
        # A panel nobody references any more is collected: its run stops, its widgets close.
        self._finalizer = weakref.finalize(
            self, _release, self.widget, self.session, self.analysis, self.CLOSE_TIMEOUT_S
        )
        self._finalizer.atexit = False  # at exit the kernel's widgets and threads go anyway
        self.outputs.on_click(
            run=weak_callback(self._on_run_click),
            compare=weak_callback(self._on_compare_click),
            stop=weak_callback(self._on_stop_click),
            figure=weak_callback(self._on_figure_click),
        )

        initial: dict[str, Any] = dict(
            device=device, mode=mode, dtype=dtype, fused=fused, steps=steps, seed=seed,
            accumulation=accumulation, loss_scale_lab=loss_scale_lab, compare_plans=compare_plans,
        )  # fmt: skip
        if model is None:
            from precision_nb.engine.workloads import DEFAULT_WORKLOAD

            initial["workload"] = workload if workload is not None else DEFAULT_WORKLOAD
            initial["preset"] = preset if preset is not None else "tiny"
        self.controls.apply(self.controls.normalise(**initial))
        self.dist_controls.apply(self.dist_controls.normalise({"distributed": distributed}))
        self.controls.observe(weak_callback(self._on_control_change))
        self.dist_controls.observe(weak_callback(self._on_control_change))
        self.outputs.code_framework.observe(weak_callback(self._on_control_change), "value")
        self.refresh()

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    # ================================================================== live plan

    def _on_control_change(self, _change: dict[str, Any]) -> None:
        if not self._applying and not self._closed:
            self.refresh()

    def refresh(self) -> None:
        """Re-resolve the plan from the controls and update every view of it (also the code)."""
        self.dist_controls.update_enabled()
        self._plan.refresh()
        self._update_buttons()
        self.analysis.plan_changed()

    def _update_buttons(self) -> None:
        if self._closed:
            return
        self.outputs.set_buttons(
            running=self.running,
            block_reason=self._plan.block_reason(),
            has_result=self.session.source is not None,
            compare_reason=None if self._plan.distributed is None else COMPARE_ONE_PROCESS,
        )

    def _on_run_click(self, _button: Any) -> None:
        self._start("run")

    def _on_compare_click(self, _button: Any) -> None:
        self._start("compare")

    def _on_stop_click(self, _button: Any) -> None:
        self.stop()

    def _on_figure_click(self, _button: Any) -> None:
        try:
            self.draw_figure()
        except Exception as exc:  # noqa: BLE001 - UI boundary: shown in the panel, panel stays
            self.outputs.show_error(f"Draw figure failed: {type(exc).__name__}: {exc}", "figure")

    # ================================================================== running

    def _start(self, kind: str, *, raise_errors: bool = False) -> Job | None:
        """Start a run or comparison in the background; returns the job, or None when refused
        (the panel says why; with ``raise_errors`` the refusal is raised too)."""
        with self.session.lock:
            try:
                selection = self._check_can_start(kind)
            except (RuntimeError, ValueError):
                if raise_errors:
                    raise
                return None
            self.outputs.show_error(None)
            assert self._plan.explanation is not None
            job = self.session.start(
                kind, selection, self._plan.explanation, self._plan.distributed
            )
            self._update_buttons()
            job.start()
            return job

    def _check_can_start(self, kind: str) -> Selection:
        if self.running:
            message = "A run is already going: wait for it or press Stop before starting another."
            self.outputs.status.value = f"<b>{message}</b>"
            raise RuntimeError(message)
        self.refresh()
        reason = self._plan.block_reason()
        if reason is not None:
            error = self._plan.error
            if error is None:  # else the error box already says why
                self.outputs.show_error(reason, "input")
            if isinstance(error, ValueError):
                message = reason if str(error) in reason else f"{reason} {error}"
                raise ValueError(message) from error
            raise RuntimeError(reason)
        selection = self.controls.selection()
        if kind == "compare" and self._plan.distributed is not None:
            self.outputs.show_error(COMPARE_ONE_PROCESS, "input")
            raise RuntimeError(COMPARE_ONE_PROCESS)
        if kind == "compare" and not selection.compare_plans:
            message = "Compare needs at least one plan ticked in the Compare list."
            self.outputs.show_error(message)
            raise ValueError(f"compare_plans=() is empty; {message}")
        return selection

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this panel is closed: make a new Panel() to go on")

    # ================================================================== public API

    def set(self, **controls: Any) -> Panel:
        """Set controls by name (device, mode, dtype, fused, workload, preset, steps,
        accumulation, seed, loss_scale_lab, compare_plans); the plan refreshes once.

        A bad value raises ``ValueError`` (a device this machine lacks: ``RuntimeError``), is
        shown in the panel, and nothing is changed then.
        """
        self._check_open()
        try:
            dist = {k: controls.pop(k) for k in list(controls) if k in DIST_CONTROLS}
            dist_values = self.dist_controls.normalise(dist) if dist else {}
            values = self.controls.normalise(**controls)
            device = values.get("device")
            if device is not None and not device.startswith(SIM_PREFIX):
                resolve_device(device, self._capabilities)  # absent hardware raises here
        except (ValueError, RuntimeError) as exc:
            self.outputs.show_error(str(exc), "input")
            raise
        if self.error is not None and not self.running:
            self.outputs.show_error(None)
        self._applying = True  # apply every value, then resolve once
        try:
            self.controls.apply(values)
            self.dist_controls.apply(dist_values)
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
        self._check_open()
        job = self._start(kind, raise_errors=True)
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
        """End the current run between steps; every record made so far is kept."""
        if self.session.stop():
            self.outputs.stop_button.disabled = True
            self.outputs.progress_label.value += " · stopping..."

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the current run; True when none is going (anymore)."""
        return self.session.wait(timeout)

    def draw_figure(self) -> bytes:
        """Draw the matplotlib figure of the last run or comparison into the panel (the four
        panels of the live charts, from every record); returns the PNG bytes.

        Raises ``RuntimeError`` before the first run, while a run is going, or once closed.
        """
        self._check_open()
        return self.session.draw_figure()

    def close(self, timeout: float | None = None) -> None:
        """Release the panel: stop a running job (waiting up to ``timeout`` seconds, default
        ``CLOSE_TIMEOUT_S``, for it to end between steps), drop the model, its batches and the
        results, and close every widget. Closing twice is harmless; a closed panel refuses
        ``set``, ``run``, ``compare`` and ``draw_figure``."""
        if self._closed:
            return
        self._closed = True
        if timeout is not None:
            self.session.close(timeout)
        self._finalizer()  # stops the run (if still going), drops results, closes the widgets
