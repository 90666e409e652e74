"""The panel's run session: the background jobs, the plotting budget, and what is drawn after.

:class:`RunSession` starts ``fit`` / ``compare`` in a worker thread (:class:`~.run.Job`) with a
:class:`~.run.LiveCallback` feeding the progress and live frames, keeps the last result, and after
a run shows the final charts, the results (Compare tab), the events and, when it fits the plotting
budget, the matplotlib figure. It writes to the panel's widgets only through
:class:`~.outputs.PanelOutputs` (plain value assignments, safe from the worker thread).

The plotting budget: all plotting of a run (live frames and the final figure) stays within
``plot_budget`` (a fraction) of its training time. What a frame costs here is learnt from the
frames drawn so far; before any, a first guess of one second.
"""

from __future__ import annotations

import copy
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from precision_nb.core.optim import OptimizerConfig
from precision_nb.core.plan import PrecisionConfig
from precision_nb.core.resolution import Explanation
from precision_nb.views.panel.distributed_run import DistributedView, fit_target
from precision_nb.views.panel.outputs import PanelOutputs, panel_png
from precision_nb.views.panel.run import Job, LiveCallback, describe_failure
from precision_nb.views.panel.selection import COMPARE_CHOICES, Selection, compare_measure

log = logging.getLogger(__name__)

__all__ = ["RunSession", "UserModel", "figure_fits_budget"]


@dataclass
class UserModel:
    """The user's own model (trained on a fresh copy per run), its batches and loss."""

    model: Any
    batches: Any
    loss_fn: Any = None
    factory: str | None = None  # import paths for distributed runs (docs/distributed.md)
    batches_path: str | None = None
    loss_fn_path: str | None = None


def figure_fits_budget(
    *, training_s: float, plotted_s: float, cost_s: float, budget: float
) -> bool:
    """True when one more frame of ``cost_s`` keeps all plotting within ``budget`` of training."""
    return plotted_s + cost_s <= budget * training_s


class RunSession:
    """Owns the panel's runs: one job at a time, the last result, the plotting budget.

    ``optimizer_for(selection)`` gives the optimizer config of a selection; ``log_every`` (None:
    ``steps // 50``) and ``train_options`` (other TrainConfig fields) complete its TrainConfig.
    Two hooks, set by the panel's builder: ``on_released(job)`` is called (in the worker thread)
    once a job no longer counts as running, so the panel can re-enable its buttons;
    ``after_run(source, training_s, plotted_s)`` after a run that left a result (the panel's
    inspections, within the budget). Nothing here refers to the panel itself, so a panel nobody
    references is collected even while its session's worker thread runs.
    """

    def __init__(
        self,
        outputs: PanelOutputs,
        *,
        user_model: UserModel | None,
        optimizer_for: Callable[[Selection], OptimizerConfig],
        log_every: int | None,
        train_options: dict[str, Any],
        plot_budget: float,
        refresh_interval_s: float,
    ) -> None:
        if not 0 < plot_budget < 1:
            raise ValueError(f"plot_budget={plot_budget!r} must be a fraction between 0 and 1")
        self.outputs = outputs
        self.user_model = user_model
        self._optimizer_for = optimizer_for
        self.log_every = log_every
        self.train_options = dict(train_options)
        self.plot_budget = plot_budget
        self.refresh_interval_s = refresh_interval_s
        self.on_released: Callable[[Job], None] | None = None
        self.after_run: Callable[[Any, float, float], None] | None = None
        self.lock = threading.Lock()
        self.job: Job | None = None
        self.source: Any = None  # the last RunResult or Comparison
        self.per_rank = DistributedView()  # a distributed run's result, shown per rank
        self.live: LiveCallback | None = None
        self.last_live: LiveCallback | None = None
        self.last_exception: BaseException | None = None
        self.last_render_seconds = 0.0  # final charts, table (and figure) of the last run
        # What a figure costs to draw here, learnt from earlier frames; the first live frame of
        # the first run waits until the plotting budget covers this guess.
        self.frame_cost_s = 1.0
        self.closed = False

    @property
    def running(self) -> bool:
        return self.job is not None and self.job.running

    # ------------------------------------------------------------------ starting

    def start(
        self, kind: str, selection: Selection, explanation: Explanation, distributed: Any = None
    ) -> Job:
        """Start a run (``kind="run"``; with a ``DistributedPlan``, under torchrun) or a
        comparison in the background (call under ``lock``)."""
        self.last_exception = None
        self.per_rank.clear()
        live = LiveCallback(
            steps=selection.steps,
            runs=1
            if kind == "run"
            else max(1, len(selection.compare_plans)) * len(compare_compiles(selection)),
            progress=self._progress,
            draw=self._draw_live,
            budget=self.plot_budget,
            min_interval_s=self.refresh_interval_s,
            first_cost_guess_s=self.frame_cost_s,
        )
        self.live = self.last_live = live
        self.source = None
        self.outputs.reset_for_run(
            live.steps * live.runs, measured=kind == "compare", warmups=live.warmups
        )
        if kind == "compare":
            target = functools.partial(self._compare, selection, live)
        elif distributed is not None:
            target = functools.partial(fit_target, self, selection, explanation, distributed, live)
        else:
            target = functools.partial(self._fit, selection, explanation, live)
        job = Job(
            target=target,
            on_done=self._finish,
            on_released=self.on_released,
            kind=kind,
            context=selection,
        )
        self.job = job
        return job

    def train_config(self, selection: Selection) -> Any:
        from precision_nb.engine.train_config import TrainConfig

        log_every = self.log_every or max(1, selection.steps // 50)
        return TrainConfig(
            **{
                "log_every": log_every,
                **self.train_options,
                "steps": selection.steps,
                "accumulation": selection.accumulation,
                "seed": selection.seed,
                "progress": False,
                "label": None,
            }
        )

    def stop(self) -> bool:
        """Ask the running job to end between steps; False when none is going."""
        job = self.job
        if job is None or not job.running:
            return False
        job.stop_event.set()
        return True

    def wait(self, timeout: float | None = None) -> bool:
        job = self.job
        return True if job is None else job.wait(timeout)

    def close(self, timeout: float) -> None:
        """Stop a running job (waiting up to ``timeout`` s), then drop the model and results."""
        self.closed = True
        job = self.job
        # A panel may be collected by the garbage collector inside its own worker thread: that
        # thread cannot wait for itself (it sees the stop flag at its next step).
        if self.stop() and job is not None and job.thread is not threading.current_thread():
            self.wait(timeout)
        self.user_model = self.source = self.live = self.last_live = self.last_exception = None
        if self.job is not None and not self.job.running:
            self.job = None

    def request(
        self,
        selection: Selection,
        precisions: Sequence[PrecisionConfig],
        *,
        distributed: bool = False,
        compiles: Sequence[str] = ("off",),
    ) -> Any:
        """The engine's :class:`~precision_nb.engine.request.RunRequest` of a panel run or
        comparison: the panel's model (a copy of the user's, or the selected workload), device,
        optimizer and loop settings, and ``precisions``. ``distributed``: for torchrun's workers,
        the user's model as it is (its state dict travels) with its batches and loss by import
        path. ``compiles``: the compile modes (every precision under each).
        """
        from precision_nb.engine.request import RunRequest

        user = self.user_model
        if user is None:
            model, batches, loss_fn = selection.workload, None, None
        elif distributed:
            model, batches, loss_fn = user.model, user.batches_path, user.loss_fn_path
        else:
            model, batches, loss_fn = copy.deepcopy(user.model), user.batches, user.loss_fn
        return RunRequest(
            model=model,
            batches=batches,
            preset=selection.preset or "tiny",  # a user model has no preset
            device=selection.device,
            precisions=tuple(precisions),
            optimizer=self._optimizer_for(selection),
            train=self.train_config(selection),
            loss_fn=loss_fn,
            compiles=tuple(compiles),
        )

    def _fit(self, selection: Selection, explanation: Explanation, live: Any, stop: Any) -> Any:
        from precision_nb.engine.entry import run

        request = self.request(selection, [explanation.config], compiles=(selection.compile,))
        return run(request, callbacks=[live], stop=stop)

    def _compare(self, selection: Selection, live: Any, stop: Any) -> Any:
        from precision_nb.engine.compare import run_comparison

        modes = [
            PrecisionConfig(mode=COMPARE_CHOICES[name][0], loss_scale_lab=COMPARE_CHOICES[name][1])
            for name in selection.compare_plans
        ]
        request = self.request(selection, modes, compiles=compare_compiles(selection))
        # the step by op family, after the timed rounds: the Compare tab's "why faster or not"
        wanted = request.replace(analyses=(*request.analyses, "time_split"))
        return run_comparison(
            wanted, callbacks=[live], stop=stop, measure=compare_measure(selection)
        )

    # ------------------------------------------------------------------ during the run

    def _progress(self, done: int, total: int, text: str, record: dict[str, Any] | None) -> None:
        live = self.live

        def records() -> list[dict[str, Any]]:
            return live.snapshot()[0] if live is not None else []

        self.outputs.show_progress(done, total, text, record, records, time.perf_counter())

    def _draw_live(self, records: list[dict[str, Any]], results: list[Any]) -> None:
        """A live frame from the records so far (see :func:`~.outputs.panel_png`)."""
        if not records:
            return
        from precision_nb.views.report.tables import scale_histories, to_frame

        histories = scale_histories({r.label: r for r in results})
        self.outputs.show_figure(
            panel_png(to_frame(records), histories, dpi=60),
            "<i>Live figure (redrawn while the run goes, within the plotting budget)</i>",
        )

    # ------------------------------------------------------------------ after the run

    def _finish(self, job: Job) -> None:
        """Worker thread, after the run: keep the records, show the final charts and table (and
        the matplotlib figure when it fits the plotting budget)."""
        live = self.live
        try:
            if self.closed:  # closed while the run went on: nothing to show, nothing to keep
                return
            source = job.result
            if job.error is not None:
                self.last_exception = job.error
                # A failed fit keeps its RunResult on the error (.result), a failed comparison
                # its Comparison; else the live records (below).
                from precision_nb.engine.compare import Comparison
                from precision_nb.engine.results import partial_result

                partial = partial_result(job.error)
                wanted = job.kind == "run" or isinstance(partial, Comparison)
                source = partial if wanted else None
                selection = job.context
                hint = f"now {selection.preset}" if getattr(selection, "preset", None) else ""
                self.outputs.show_error(describe_failure(job.error, batch_hint=hint), "run")
                self.outputs.progress.bar_style = "danger"
            self.source = self.per_rank.take(source, job.error)  # a DistributedResult: merged
            if self.source is None and live is not None and live.records:
                self.source = list(live.records)
            if live is not None and live.draw_error is not None and job.error is None:
                self.outputs.show_error(
                    f"Live figures stopped during the run: {live.draw_error}", "figure"
                )
            start = time.perf_counter()
            try:
                frame = self._render_final()
                if frame is not None:
                    self._final_figure(live, frame)
            except Exception as exc:  # noqa: BLE001 - UI boundary: the records are kept, say so
                log.info("drawing the results failed", exc_info=True)
                self.outputs.show_error(
                    f"The run's records are kept (panel.records_frame), but drawing them failed: "
                    f"{type(exc).__name__}: {exc}",
                    "figure",
                )
            self.last_render_seconds = time.perf_counter() - start
            if self.after_run is not None and self.source is not None:
                training, plotted = self.training_seconds(live)
                self.after_run(self.source, training, plotted + self.last_render_seconds)
            if live is not None and live.frames:
                self.frame_cost_s = live.last_frame_seconds
        finally:
            self.live = None

    def show_results(self) -> None:
        """Show the last run's results again (its outcomes gained figures since)."""
        if self.source is not None:
            self._render_final()

    def _render_final(self) -> Any:
        """Charts, status, results and events of the finished run; returns its records as
        a DataFrame (None when there are none)."""
        source = self.source
        if source is None:  # an error that carries no result (SystemExit...) and no record
            self.outputs.progress_label.value = "failed before the first step"
            self.outputs.status.value = "Failed before the first logged step; no records to show."
            return None
        from precision_nb.views.report.source import as_comparison
        from precision_nb.views.report.tables import results_of, summary, to_frame

        frame = to_frame(source)
        stopped = bool(getattr(source, "stopped", False))
        if self.last_exception is None:
            self.outputs.progress.bar_style = "warning" if stopped else "success"
        word = "Stopped" if stopped else ("Failed" if self.last_exception else "Finished")
        seconds = sum(r.seconds for r in results_of(source).values())
        table = summary(source) if not frame.empty else None
        # measured figures only when the interleaved measurement made them (not bare records)
        measurement = getattr(source, "measurement", None)
        self.outputs.measured = measurement is not None
        events = list(getattr(source, "events", []) or [])
        comparison = as_comparison(source)
        self.outputs.show_final(
            frame,
            table,
            events,
            word=word,
            seconds=seconds,
            # a single run's outcome holds its result: a true plan's lost updates are on it
            outcomes={label: comparison.outcome(label) for label in comparison.results},
            method=None if measurement is None else measurement.method(),
            compiled=getattr(source, "compiled", None) or {},
            load_note=measurement.load_note if measurement is not None else "",
        )
        return None if frame.empty else frame

    def training_seconds(self, live: Any) -> tuple[float, float]:
        """(training, plotted) seconds of the last run: the engine's time less the callbacks'."""
        from precision_nb.views.report.tables import results_of

        training = sum(r.seconds for r in results_of(self.source).values())
        if live is None:
            return training, 0.0
        return training - live.callback_seconds, live.plot_seconds

    def _final_figure(self, live: Any, frame: Any) -> None:
        """Draw the matplotlib figure after a run when it fits the plotting budget (see the
        module docstring; a frame costs about a second on a slow CPU); otherwise the note says so
        and Draw figure (or ``Panel.draw_figure``) draws it on demand."""
        training, plotted = self.training_seconds(live)
        cost = self.frame_cost_s
        if figure_fits_budget(
            training_s=training, plotted_s=plotted, cost_s=cost, budget=self.plot_budget
        ):
            self.draw_final(frame)
            return
        why = (
            f"a frame costs about {cost:.1f} s here, over the plotting budget of "
            f"{100 * self.plot_budget:g} % of this run's {max(training, 0.0):.1f} s of training"
        )
        if live is not None and live.frames and self.outputs.figure_image.value:
            self.outputs.figure_note.value = (
                f"<i>The figure below is the last live frame; the charts above show the finished "
                f"run. The final figure was not drawn ({why}): Draw figure draws it now.</i>"
            )
            return
        self.outputs.show_figure(
            None,
            f"<i>The charts above show the finished run. The matplotlib figure was not drawn "
            f"({why}): Draw figure draws it now.</i>",
        )

    def draw_figure(self) -> bytes:
        """Draw the matplotlib figure of the last run; see ``Panel.draw_figure``."""
        if self.running:
            raise RuntimeError("a run is going: draw the figure when it has ended")
        if self.source is None:
            raise RuntimeError("no run yet: Run or Compare first, then draw its figure")
        from precision_nb.views.report.tables import to_frame

        frame = to_frame(self.source)
        if frame.empty:
            raise RuntimeError("the last run made no records: there is nothing to draw")
        return self.draw_final(frame)

    def draw_final(self, frame: Any) -> bytes:
        from precision_nb.views.report.tables import scale_histories

        start = time.perf_counter()
        png = panel_png(frame, scale_histories(self.source), dpi=72)
        self.frame_cost_s = time.perf_counter() - start
        self.outputs.show_figure(png, "")
        return png


def compare_compiles(selection: Selection) -> tuple[str, ...]:
    """The compile modes a panel comparison measures: eager only, or eager and the selected
    mode (so every plan is compared with its own eager twin)."""
    return ("off",) if selection.compile == "off" else ("off", selection.compile)
