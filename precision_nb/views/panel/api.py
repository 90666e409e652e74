"""The ipywidgets panel: pick device and precision, see the resolved plan live, run, stop, compare.

``Panel()`` (displayed by evaluating it in a cell; its header and tabs: :mod:`.layout`) is the
front door: the user's verbs and read-only state; every widget is ``panel.widgets.<name>``. How it
is put together is :mod:`.builder`'s job, what its events do :mod:`.controller`'s.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from precision_nb.core.defaults import DEFAULT_BUDGET_S
from precision_nb.core.optim import OptimizerConfig
from precision_nb.core.plan import PrecisionPlan
from precision_nb.core.resolution import Explanation
from precision_nb.core.validate import short_repr
from precision_nb.views.panel.builder import build_panel
from precision_nb.views.panel.distributed import DIST_CONTROLS
from precision_nb.views.panel.layout import PanelWidgets
from precision_nb.views.panel.selection import DEFAULT_COMPARE, Selection

__all__ = ["CONTROLS", "Panel", "Timings"]

#: The names :meth:`Panel.set` takes: the selection's fields, the Distributed tab's, and the
#: framework of "copy as code".
CONTROLS = (*(f.name for f in dataclasses.fields(Selection)), *DIST_CONTROLS, "code_framework")


@dataclass(frozen=True)
class Timings:
    """Seconds a panel spent on its own work (what ``benchmarks/bench_panel.py`` reads).

    ``plan_refresh_s``: the last plan refresh; ``live_frames``, ``live_plot_s``, ``callbacks_s``:
    the last run's live frames, the seconds spent drawing them and all seconds spent inside the
    engine's callbacks; ``final_render_s``: drawing after the last run; ``inspect_s``: the last
    inspection of the Memory, Ops and Numerics views.
    """

    plan_refresh_s: float
    live_frames: int
    live_plot_s: float
    callbacks_s: float
    final_render_s: float
    inspect_s: float


class Panel:
    """Jupyter panel for precision plans; see the module docstring and docs/panel.md.

    ``model`` / ``batches`` (with an optional ``loss_fn``) train your own ``nn.Module`` instead of
    a built-in workload; every run trains a fresh copy, so your model is left as it was. The
    controls' keyword arguments set their initial values (the same names as :meth:`set`).
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
        compile: str | bool | None = "off",
        workload: str | None = None,
        preset: str | None = None,
        steps: int = 30,
        accumulation: int = 1,
        seed: int = 0,
        loss_scale_lab: bool = False,
        compare_plans: Sequence[str] = DEFAULT_COMPARE,
        budget: float = DEFAULT_BUDGET_S,
        optimizer: OptimizerConfig | None = None,
        log_every: int | None = None,
        train_options: dict[str, Any] | None = None,
        plot_budget: float = 0.025,
        refresh_interval_s: float = 0.5,
        distributed: Any = None,
        factory: str | None = None,
    ) -> None:
        initial: dict[str, Any] = dict(
            device=device, mode=mode, dtype=dtype, fused=fused, compile=compile, steps=steps,
            seed=seed, accumulation=accumulation, loss_scale_lab=loss_scale_lab,
            compare_plans=compare_plans, budget=budget,
        )  # fmt: skip
        if model is None:
            from precision_nb.engine.workloads import DEFAULT_WORKLOAD

            initial["workload"] = workload if workload is not None else DEFAULT_WORKLOAD
            initial["preset"] = preset if preset is not None else "tiny"
        controller = build_panel(
            initial, distributed, model, batches, loss_fn=loss_fn, factory=factory,
            workload=workload, preset=preset, optimizer=optimizer, log_every=log_every,
            train_options=train_options, plot_budget=plot_budget,
            refresh_interval_s=refresh_interval_s,
        )  # fmt: skip
        # the panel's only two attributes, set past the front door that refuses every other
        object.__setattr__(self, "_controller", controller)
        # A panel nobody references any more is collected: its run stops, its widgets close.
        finalizer = weakref.finalize(self, controller.release, self.CLOSE_TIMEOUT_S)
        finalizer.atexit = False  # at exit the kernel's widgets and threads go anyway
        object.__setattr__(self, "_finalizer", finalizer)

    def __setattr__(self, name: str, value: Any) -> None:
        """Refused: ``panel.steps = -5`` would change nothing the panel runs. A control changes
        through :meth:`set` (which checks the value and refreshes the plan once); the state is
        read-only; no other attribute can be created."""
        raise AttributeError(_refusal(name, f"panel.{name} = {short_repr(value)}", value))

    def __delattr__(self, name: str) -> None:
        raise AttributeError(
            f"del panel.{name}: a Panel's attributes cannot be deleted; panel.close() releases it"
        )

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        """The widgets, and the panel in one line of plain text (what nbconvert to text, a
        notebook diff or a log shows in place of the widgets): the selected plan, or the error
        the panel shows."""
        bundle = self.widget._repr_mimebundle_(**kwargs)
        if isinstance(bundle, dict):  # a text reader gets the plan, not the widget tree
            explanation = self.explanation
            shown = (self.error or "no plan") if explanation is None else explanation.summary()
            text = f"precision_nb panel (widgets; open in Jupyter): {shown}"
            bundle = {**bundle, "text/plain": text}
        return bundle

    # ================================================================== verbs

    def set(self, **controls: Any) -> Panel:
        """Set controls by name (device, mode, dtype, fused, compile, workload, preset, steps,
        accumulation, seed, loss_scale_lab, compare_plans, budget; distributed, strategy, nproc,
        comm_hook, backend, param_dtype, reduce_dtype, output_dtype; code_framework, the
        framework of "copy as code"); the plan refreshes once.

        A bad value raises ``ValueError`` (a device this machine lacks: ``RuntimeError``), is
        shown in the panel, and nothing is changed then.
        """
        self._controller.set_controls(controls)
        return self

    def run(self, block: bool = False, timeout: float | None = None) -> Any:
        """Train the selected plan (like pressing Run).

        ``block=True`` waits and returns the RunResult (a ``DistributedResult`` with a strategy;
        re-raising a failure after showing it in the panel); otherwise returns at once (the run
        goes on in the background). Raises ``RuntimeError`` when a run is already going or the
        device is simulated.
        """
        return self._controller.launch("run", block, timeout)

    def compare(self, block: bool = False, timeout: float | None = None) -> Any:
        """Run the plans chosen under Compare on the same seed (like pressing Compare).

        ``block=True`` waits and returns the engine's Comparison.
        """
        return self._controller.launch("compare", block, timeout)

    def stop(self) -> None:
        """End the current run between steps; every record made so far is kept."""
        self._controller.stop()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the current run; True when none is going (anymore)."""
        return self._controller.session.wait(timeout)

    def inspect(self) -> dict[str, Any]:
        """Inspect the selected plan and the last run's plans now (memory by kind and dtype,
        op dtypes; one instrumented step on a copy each) and analyse the model's gradient
        numerics; the Memory, Ops and Numerics tabs show them. Returns label -> Inspection.
        Raises ``RuntimeError`` while a run goes or once closed."""
        self._controller.inspect()
        return self.inspections

    def draw_figure(self) -> bytes:
        """Draw the matplotlib figure of the last run or comparison into the Live tab (the four
        panels of the live charts, from every record); returns the PNG bytes.

        Raises ``RuntimeError`` before the first run, while a run is going, or once closed.
        """
        self._controller.check_open()
        return self._controller.session.draw_figure()

    def close(self, timeout: float | None = None) -> None:
        """Release the panel: stop a running job (waiting up to ``timeout`` seconds, default
        ``CLOSE_TIMEOUT_S``, for it to end between steps), drop the model, its batches and the
        results, and close every widget. Closing twice is harmless; a closed panel refuses
        ``set``, ``run``, ``compare``, ``inspect`` and ``draw_figure``."""
        if self._controller.closed:
            return
        self._controller.closed = True
        if timeout is not None:
            self._controller.session.close(timeout)
        self._finalizer()  # stops the run (if still going), drops results, closes the widgets

    # ================================================================== read-only state

    @property
    def widget(self) -> Any:
        """The root ipywidgets ``VBox`` (what displaying the panel shows)."""
        return self._controller.widgets.root

    @property
    def widgets(self) -> PanelWidgets:
        """Every widget by name: ``panel.widgets.run_button``, ``panel.widgets.mode``, ..."""
        return self._controller.widgets

    @property
    def selection(self) -> Selection:
        """The controls' current values (``panel.selection.mode``, ...); change them with
        :meth:`set`."""
        return self._controller.controls.selection()

    @property
    def explanation(self) -> Explanation | None:
        """The explanation of the current selection (None when it cannot be resolved)."""
        return self._controller.plan.explanation

    @property
    def plan(self) -> PrecisionPlan | None:
        """The resolved plan of the current selection."""
        explanation = self.explanation
        return None if explanation is None else explanation.plan

    @property
    def plan_text(self) -> str:
        """The explanation as readable text (what the Plan tab shows)."""
        explanation = self.explanation
        return "" if explanation is None else str(explanation)

    @property
    def simulated(self) -> bool:
        """True when the selected device is a simulated hardware preset."""
        explanation = self.explanation
        return bool(explanation is not None and explanation.simulated)

    @property
    def code(self) -> str:
        """The "copy as code" script of the selected plan, in :attr:`code_framework`."""
        return self._controller.outputs.code_area.value

    @property
    def code_framework(self) -> str:
        """The framework of :attr:`code`: pytorch, lightning, accelerate or transformers
        (``set(code_framework=...)`` or the Framework menu chooses it)."""
        return str(self._controller.outputs.code_framework.value)

    @property
    def error(self) -> str | None:
        """The message shown in the panel's error box, if any."""
        return self._controller.outputs.error

    @property
    def running(self) -> bool:
        """True while a run or comparison is going."""
        return self._controller.session.running

    @property
    def closed(self) -> bool:
        return self._controller.closed

    @property
    def result(self) -> Any:
        """The last RunResult (Run) or Comparison (Compare); partial after Stop or a failure."""
        return self._controller.session.source

    @property
    def last_exception(self) -> BaseException | None:
        """What the last run raised, or None."""
        return self._controller.session.last_exception

    @property
    def records_frame(self) -> Any:
        """Every record of the last run or comparison as a pandas DataFrame (live while running)."""
        from precision_nb.views.report.tables import to_frame

        session = self._controller.session
        if session.source is None and session.live is not None:
            return to_frame(session.live.snapshot()[0])
        return to_frame(session.source if session.source is not None else [])

    @property
    def summary(self) -> Any:
        """One row per plan of the last run or comparison (views.report.tables.summary)."""
        from precision_nb.views.report.tables import summary

        source = self._controller.session.source
        return summary(source if source is not None else [])

    @property
    def figures(self) -> dict[str, Any]:
        """Fresh matplotlib Figures of the last run: loss, loss_scale, throughput, memory,
        dashboard (empty dict before any run)."""
        source = self._controller.session.source
        if source is None:
            return {}
        from precision_nb.views.report.html import FIGURES

        names = ("loss", "loss_scale", "throughput", "memory", "dashboard")
        return {name: FIGURES[name](source) for name in names}

    @property
    def inspections(self) -> dict[str, Any]:
        """Label -> ``Inspection`` of the plans the Memory and Ops tabs show."""
        from precision_nb.views.report.inspection import Inspection

        shown = self._controller.analysis.shown
        return {label: Inspection(data) for label, data in shown.items()}

    @property
    def numerics(self) -> Any:
        """The ``Numerics`` the Numerics tab shows (None before one was made)."""
        return self._controller.analysis.numerics

    @property
    def distributed(self) -> Any:
        """The ``Distributed`` request of the Distributed tab (None: strategy "none", or a
        request the library refuses, ``panel.error`` saying why); change it with
        ``set(distributed=...)``."""
        plan = self._controller.plan.distributed
        return None if plan is None else plan.request

    @property
    def distributed_plan(self) -> Any:
        """The DistributedPlan of the selection (None without a strategy)."""
        return self._controller.plan.distributed

    @property
    def distributed_result(self) -> Any:
        """The last distributed run's DistributedResult (every rank's records; a failed run's
        too), or None."""
        return self._controller.session.per_rank.result

    @property
    def rank_tables(self) -> dict[str, Any]:
        """The per-rank view's tables as DataFrames: ``steps`` (step time median and IQR, final
        loss), ``memory`` (bytes by kind and dtype), ``comm`` (bytes per step by op and dtype);
        empty before a distributed run."""
        return self._controller.session.per_rank.tables()

    @property
    def timings(self) -> Timings:
        """Seconds the panel spent on its own work (see :class:`Timings`)."""
        c = self._controller
        live = c.session.last_live
        return Timings(
            plan_refresh_s=c.plan.refresh_seconds,
            live_frames=0 if live is None else live.frames,
            live_plot_s=0.0 if live is None else live.plot_seconds,
            callbacks_s=0.0 if live is None else live.callback_seconds,
            final_render_s=c.session.last_render_seconds,
            inspect_s=c.analysis.seconds,
        )


def _refusal(name: str, what: str, value: Any) -> str:
    """Why ``what`` (``panel.<name> = value``) is refused, and what does it instead."""
    if name in CONTROLS:
        reads = {f.name for f in dataclasses.fields(Selection)}
        read = f"; panel.selection.{name} reads it" if name in reads else ""
        return (
            f"{what}: a control is not an attribute; use panel.set({name}={short_repr(value)}) "
            f"(it checks the value, shows a bad one in the panel and refreshes the plan once){read}"
        )
    if isinstance(getattr(Panel, name, None), property):
        return f"{what}: panel.{name} is read-only; controls change with panel.set(...)"
    return (
        f"{what}: a Panel has no attribute {name!r} to set and takes no new ones; controls "
        f"change with panel.set(...), allowed names: {', '.join(CONTROLS)}"
    )
