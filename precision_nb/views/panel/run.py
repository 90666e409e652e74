"""Background runs for the panel: a worker thread, a stop flag, and throttled live updates.

The training loop runs in a worker thread so the kernel keeps handling widget events (Stop works).
The worker never touches ``Output`` widgets; it only sets widget values through the callbacks the
panel gives it. Live figures are redrawn at most every ``min_interval_s`` and only while the time
spent plotting stays under ``budget`` (a fraction) of the time spent training, measured as the run
goes, so plotting cannot dominate a run whatever the figure costs on this machine.
"""

from __future__ import annotations

import dataclasses
import html
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from precision_nb.engine.callbacks import Callback
from precision_nb.views.panel.results import HOST_RSS

log = logging.getLogger(__name__)

__all__ = ["Job", "LiveCallback", "check_train_options", "describe_failure", "metrics_text"]


class LiveCallback(Callback):
    """Throttled engine callback (``on_fit_start`` / ``on_log`` / ``on_fit_end``) feeding the panel.

    ``progress(done, total, text, record)`` is called at most every ``PROGRESS_INTERVAL_S`` (and
    at each run's start and end) with the latest record (None before the first);
    ``draw(records, results)`` renders a live frame when the throttle and the plotting budget
    allow. ``runs`` is the number of runs expected (1, or the plans of a comparison).
    """

    PROGRESS_INTERVAL_S = 0.1

    def __init__(
        self,
        *,
        steps: int,
        runs: int,
        progress: Callable[[int, int, str, dict[str, Any] | None], None],
        draw: Callable[[list[dict[str, Any]], list[Any]], None],
        budget: float = 0.03,
        min_interval_s: float = 0.5,
        first_cost_guess_s: float = 0.5,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not 0 < budget < 1:
            raise ValueError(f"budget={budget!r} must be a fraction between 0 and 1")
        self.steps = steps
        self.runs = runs
        self._progress = progress
        self._draw = draw
        self.budget = budget
        self.min_interval_s = min_interval_s
        self._clock = clock
        self.records: list[dict[str, Any]] = []
        self.results: list[Any] = []
        #: label -> the comparison's warm-up of that plan (None while it goes), in plan order.
        self.warmups: dict[str, Any] = {}
        self.frames = 0
        self.plot_seconds = 0.0
        self.callback_seconds = 0.0  # everything spent inside the engine's callbacks
        self.last_frame_seconds = first_cost_guess_s  # a guess until the first frame
        self.draw_error: str | None = None
        self._start = clock()
        self._last_draw = -float("inf")
        self._last_progress = -float("inf")
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ engine callbacks

    def on_fit_start(self, result: Any) -> None:
        start = time.perf_counter()
        with self._lock:
            self.results.append(result)
        self._report(step=0, record=None, force=True)
        self.callback_seconds += time.perf_counter() - start

    def on_warmup(self, label: str, warmup: Any) -> None:
        """A comparison's warm-up of ``label`` started (``warmup`` None) or ended (a Warmup)."""
        start = time.perf_counter()
        with self._lock:
            self.warmups[label] = warmup
        text = (
            f"warming up {label} (throw-away copy, not timed)"
            if warmup is None
            else (f"{label} warmed up: {warmup.steps} step(s), {warmup.seconds:.2f} s")
        )
        done = max(0, len(self.results) - 1) * self.steps
        self._progress(done, self.steps * self.runs, text, None)
        self.callback_seconds += time.perf_counter() - start

    def on_phase(self, text: str) -> None:
        """A comparison's measurement moved on (a fresh process starts): said in the header; the
        live charts keep showing this process's runs."""
        start = time.perf_counter()
        total = self.steps * self.runs
        self._progress(total, total, text, None)
        self.callback_seconds += time.perf_counter() - start

    def on_log(self, record: dict[str, Any]) -> None:
        start = time.perf_counter()
        with self._lock:
            self.records.append(record)
        self._report(step=int(record.get("step") or 0), record=record, force=False)
        self.maybe_draw()
        self.callback_seconds += time.perf_counter() - start

    def on_fit_end(self, result: Any) -> None:
        start = time.perf_counter()
        last = result.records[-1] if result.records else None
        self._report(step=0 if last is None else int(last["step"]), record=last, force=True)
        self.callback_seconds += time.perf_counter() - start

    # ------------------------------------------------------------------ throttling

    def snapshot(self) -> tuple[list[dict[str, Any]], list[Any]]:
        with self._lock:
            return list(self.records), list(self.results)

    def maybe_draw(self) -> bool:
        """Draw a live frame when the interval has passed and one more frame keeps plotting
        within budget. A failing frame never stops training: live frames end, and
        ``draw_error`` says why (the panel shows it)."""
        now = self._clock()
        if self.draw_error is not None or now - self._last_draw < self.min_interval_s:
            return False
        training = max(0.0, now - self._start - self.plot_seconds)
        if self.plot_seconds + self.last_frame_seconds > self.budget * training:
            return False
        records, results = self.snapshot()
        try:
            self._draw(records, results)
        except Exception as exc:  # noqa: BLE001 - recorded in draw_error and shown by the panel
            log.info("live frame failed", exc_info=True)
            self.draw_error = f"{type(exc).__name__}: {exc}"
        done = self._clock()
        self.last_frame_seconds = done - now
        self.plot_seconds += self.last_frame_seconds
        self._last_draw = done
        self.frames += 1
        return True

    # ------------------------------------------------------------------ progress

    def _report(self, *, step: int, record: dict[str, Any] | None, force: bool) -> None:
        now = self._clock()
        if not force and now - self._last_progress < self.PROGRESS_INTERVAL_S:
            return
        self._last_progress = now
        index = max(1, len(self.results))
        label = getattr(self.results[-1], "label", "") if self.results else ""
        elapsed = now - self._start
        parts = [f"{step}/{self.steps} steps"]
        if self.runs > 1:  # "up to": plans that resolve the same are trained once
            parts.insert(0, f"plan {index} of up to {self.runs}: {label}")
        parts.append(f"{elapsed:.1f} s elapsed")
        step_time = record.get("step_time_s") if record else None
        if step_time:
            parts.append(f"{1.0 / step_time:.1f} steps/s")
        done = (index - 1) * self.steps + step
        self._progress(done, self.steps * self.runs, " · ".join(parts), record)


@dataclass
class Job:
    """One background run: ``target(stop_event)`` in a daemon thread; outcome kept for the panel.

    ``on_done(job)`` runs in the worker thread after the target returned or raised, while the job
    still counts as running (so nothing new starts while the final figures are drawn);
    ``on_released(job)`` runs after it stopped counting as running.
    """

    target: Callable[[threading.Event], Any]
    on_done: Callable[[Job], None]
    on_released: Callable[[Job], None] | None = None
    kind: str = "run"
    context: Any = None

    def __post_init__(self) -> None:
        self.stop_event = threading.Event()
        self.done_event = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(
            target=self._main, name=f"precision-nb-{self.kind}", daemon=True
        )

    @property
    def running(self) -> bool:
        return not self.done_event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self.done_event.wait(timeout)

    def _main(self) -> None:
        try:
            try:
                self.result = self.target(self.stop_event)
            # A worker thread is a UI boundary: whatever the run raised (SystemExit from a model's
            # forward included) is kept in .error and shown by the panel; nothing is hidden.
            except BaseException as exc:  # noqa: BLE001
                log.info("panel %s failed", self.kind, exc_info=True)
                self.error = exc
            self.on_done(self)
        finally:  # whatever happened, the job stops counting as running
            self.done_event.set()
            if self.on_released is not None:
                self.on_released(self)


def describe_failure(exc: BaseException, *, batch_hint: str = "") -> str:
    """A short, user-facing message for a failed run (plain text, no traceback).

    The engine's errors (``FitError``, its ``DeviceOutOfMemoryError`` included) already name the
    plan, what happened and what to change, so they are shown as they are; any other error (your
    model's, say) with its type. A comparison's failure names the plan that raised it. A torch
    out-of-memory error that did not pass through the engine gets the advice added here.
    """
    from precision_nb.engine.results import FitError, partial_result

    text = str(exc).strip() or type(exc).__name__
    failed = getattr(partial_result(exc), "failures", None) or {}
    if failed:  # a comparison raises its first failing plan's error
        text = f"plan {next(iter(failed))}: {text}"
    if isinstance(exc, FitError):
        return f"Out of memory: {text}" if is_out_of_memory(exc) else f"Run failed: {text}"
    if is_out_of_memory(exc):
        advice = (
            "What to change: pick a smaller size preset"
            + (f" ({batch_hint})" if batch_hint else "")
            + " or smaller batches, raise accumulation (same samples per step, less memory per "
            "microbatch), or use a mixed-precision plan (bf16/fp16 keep activations smaller)."
        )
        return f"Out of memory: {text}\n{advice}"
    return f"Run failed ({type(exc).__name__}): {text}"


def is_out_of_memory(exc: BaseException) -> bool:
    """True for torch's out-of-memory error, the engine's, or a failure whose partial result
    recorded an ``oom`` event (decided by type and event kind, never by message text)."""
    from precision_nb.core.events import of_kind
    from precision_nb.engine.results import DeviceOutOfMemoryError, partial_result

    if isinstance(exc, (DeviceOutOfMemoryError, torch.OutOfMemoryError)):
        return True
    return bool(of_kind(getattr(partial_result(exc), "events", None), "oom"))


_CONTROLLED = ("steps", "accumulation", "seed", "progress", "label")


def check_train_options(options: dict[str, Any] | None) -> dict[str, Any]:
    """Validate extra TrainConfig fields (e.g. ``overflow_at_steps``, ``grad_clip``)."""
    from precision_nb.engine.train_config import TrainConfig

    options = dict(options or {})
    names = [f.name for f in dataclasses.fields(TrainConfig)]
    for key in options:
        if key in _CONTROLLED:
            raise ValueError(
                f"train_options[{key!r}] is set by the panel's controls; pass {key}=... to "
                "Panel or panel.set() instead"
            )
        if key not in names:
            allowed = ", ".join(n for n in names if n not in _CONTROLLED)
            raise ValueError(
                f"train_options[{key!r}] is not a TrainConfig field; allowed: {allowed}"
            )
    TrainConfig(**options)  # raises ValueError naming a bad value
    return options


def metrics_text(record: dict[str, Any], note: str = "") -> str:
    """One line of the latest numbers (cheap to update often, unlike a figure), with ``note``
    (how they were measured) after them."""
    parts = [f"<b>{html.escape(str(record.get('run', '')))}</b>"]
    loss = record.get("loss")
    if isinstance(loss, (int, float)):
        parts.append(f"loss {loss:.4g}")
    scale = record.get("loss_scale")
    if isinstance(scale, (int, float)):
        parts.append(f"loss scale {scale:g} ({int(record.get('skipped_total') or 0)} skipped)")
    for key, unit in (("tokens_per_s", "tokens/s"), ("samples_per_s", "samples/s")):
        value = record.get(key)
        if isinstance(value, (int, float)):
            parts.append(f"{value:,.0f} {unit}")
            break
    memory = record.get("memory_bytes")
    if isinstance(memory, (int, float)) and record.get("memory_kind") == HOST_RSS:
        parts.append(f"process memory {memory / 2**20:,.0f} MiB (host RSS)")  # not the plan's
    elif isinstance(memory, (int, float)):
        kind = html.escape(str(record.get("memory_kind") or "memory"))
        parts.append(f"{memory / 2**20:,.0f} MiB {kind}")
    text = " &middot; ".join(parts)
    return f"{text} <i class='pnb-figure-kind'>({html.escape(note)})</i>" if note else text
