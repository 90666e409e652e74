"""A few profiled training steps per plan, after the timed rounds, grouped into op families.

:func:`split_plans` takes the plans' trainers once their timed rounds are over and runs a short fit
on them together (their own loop, batches and optimizer), in the order
:func:`~precision_nb.engine.time_split.schedule.schedule` gives, the profiled blocks under
``torch.profiler`` (CPU activities, CUDA kernels too on CUDA). Each profiled step runs inside a
``record_function`` mark of its plan, so the trace says where each step begins and ends. Afterwards
every trainer's model, optimizer state, counters and RNG are restored: the profiled steps change
nothing a caller reads. The profiler's own cost is stated and taken out
(:func:`~precision_nb.engine.time_split.schedule.without_profiler`). A profiler that cannot start
(another one is recording, a device it cannot see) leaves a split that says why it is missing; the
speed measurement is not touched either way.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import statistics
import time
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from precision_nb.engine import allocator
from precision_nb.engine import checkpoint as ckpt
from precision_nb.engine.callbacks import Callbacks
from precision_nb.engine.inspect.autocast_probe import cpp_output_to_debug_log
from precision_nb.engine.quiet import profiler_ranges_unsaid
from precision_nb.engine.session import FitSession
from precision_nb.engine.time_split.families import (
    FAMILIES,
    STEP_MARK,
    StepSplit,
    median_families,
    steps_of,
    top_ops,
)
from precision_nb.engine.time_split.schedule import SplitConfig, schedule, without_profiler
from precision_nb.engine.time_split.shapes import (
    CastSummary,
    MatmulShape,
    cast_summary,
    lend_steps,
    matmul_shapes,
)
from precision_nb.engine.time_split.trace import host_events

log = logging.getLogger(__name__)

#: The note a split keeps when heap was faulted in ahead of its short fit (``heap_ahead``).
HEAP_AHEAD = (
    "heap faulted in before the short fit (the allocator settled): the profiler's records "
    "fragment the heap, and the steps' tensors would otherwise fault in fresh pages that the "
    "timed rounds did not"
)


@dataclass(frozen=True)
class TimeSplit:
    """One plan's step time by op family (see :mod:`~precision_nb.engine.time_split.families`).

    ``traced``: seconds per step of each family as the trace has them, medians over the
    ``steps`` profiled steps (each step's families sum to its wall time in the trace);
    ``traced_s``: their sum, the profiled step. ``timer_s``: the median of the same steps by the
    step timer (another clock: ``sum_error`` holds the traced families against it);
    ``unprofiled_s``: the median of the unprofiled steps of the same short fit, interleaved with
    the profiled ones. ``profiler_s``: the profiler's own cost per step, taken out of the families
    by :func:`without_profiler` (0 without unprofiled steps): ``families`` and ``step_s`` are
    what is left, the step without the profiler, which every difference and the reconstructed
    speedup use.
    ``measured_s``: the timed rounds' median step time.
    ``view``: what the seconds are (the host's self time, or the kernels' time on a GPU).
    ``missing``: why there is no split (then the figures are empty).
    """

    label: str
    families: Mapping[str, float] = field(default_factory=dict)
    step_s: float = 0.0
    traced: Mapping[str, float] = field(default_factory=dict)
    traced_s: float = 0.0
    profiler_s: float = 0.0
    timer_s: float = 0.0
    unprofiled_s: float | None = None
    measured_s: float | None = None
    steps: int = 0
    view: str = ""
    device: str = ""
    casts: CastSummary = field(default_factory=CastSummary)
    matmuls: tuple[MatmulShape, ...] = ()
    #: Family -> (op name, seconds per step), the largest first (five at most).
    ops: Mapping[str, tuple[tuple[str, float], ...]] = field(default_factory=dict)
    overlap_s: float = 0.0
    #: Events the profiler recorded per profiled step (median): its cost grows with them.
    events: int = 0
    #: Family -> events recorded in it per profiled step (median).
    family_events: Mapping[str, float] = field(default_factory=dict)
    #: Profiled attempts the grad scaler skipped (no optimizer step in them).
    skipped: int = 0
    notes: tuple[str, ...] = ()
    #: Seconds the whole split took (its cost), profiler start and trace reading included.
    seconds: float = 0.0
    missing: str | None = None
    #: How many processes' splits this one pools (:mod:`~precision_nb.engine.time_split.pool`).
    processes: int = 1

    @property
    def available(self) -> bool:
        return self.missing is None

    def share(self, family: str) -> float:
        """The family's fraction of the profiled step."""
        return self.families.get(family, 0.0) / self.step_s if self.step_s > 0 else 0.0

    @property
    def overhead(self) -> float | None:
        """The traced step over the timed rounds' median, minus 1 (the profiler's cost)."""
        if not self.measured_s or not self.traced_s:
            return None
        return self.traced_s / self.measured_s - 1.0

    @property
    def sum_error(self) -> float | None:
        """Traced families' sum over the step timer's time of the same steps, minus 1."""
        if not self.timer_s:
            return None
        return sum(self.traced.values()) / self.timer_s - 1.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def missing(label: str, why: str, measured_s: float | None = None) -> TimeSplit:
    """A split that is not there, saying why."""
    return TimeSplit(label, measured_s=measured_s, missing=why)


def profiler_busy() -> bool:
    """Whether a profiler is recording in this process already (torch's own flag; one profiler
    at a time: a second one would stop the first)."""
    return bool(torch._C._autograd._profiler_enabled())


def _activities(device: torch.device) -> tuple[list[ProfilerActivity], str, tuple[str, ...]]:
    """The profiler activities for ``device``, the time view they give and notes on it."""
    if device.type == "cpu":
        return [ProfilerActivity.CPU], "host self time per op (CPU)", ()
    if device.type == "cuda":
        if ProfilerActivity.CUDA in torch.profiler.supported_activities():
            view = f"kernel time on {device} per launching op"
            return [ProfilerActivity.CPU, ProfilerActivity.CUDA], view, ()
        raise ValueError("this torch's profiler cannot record CUDA kernels (no CUDA activity)")
    if device.type == "mps":
        note = (
            "MPS: the profiler records the host only, so each op's time is the time to queue "
            "its work; the GPU's own time is not seen"
        )
        return [ProfilerActivity.CPU], "host self time per op (MPS work queued)", (note,)
    raise ValueError(f"the profiler cannot see work on {device}; supported: cpu, cuda, mps")


@contextmanager
def _mark(device: torch.device, name: str = STEP_MARK):  # noqa: ANN202
    """The range ``name`` around one profiled step; on CUDA it waits for the step's kernels, so
    the step's wall time holds them."""
    with record_function(name):
        yield
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def _snapshot(trainer: Any) -> dict[str, Any]:
    return {
        "model": copy.deepcopy(trainer.model.state_dict()),
        "optimizer": copy.deepcopy(trainer.optimizer.state_dict()),
        "counters": dataclasses.replace(trainer.counters),
        "rng": ckpt.rng_state(),
        # the precision's per-fit state (its grad scaler object, floor settings) as it is: the
        # short fit replaces the scaler, and the old object is put back untouched
        "precision": dict(vars(trainer.precision)),
        "last": trainer.last_result,
    }


def _restore(trainer: Any, saved: dict[str, Any]) -> None:
    trainer.model.load_state_dict(saved["model"])
    trainer.optimizer.load_state_dict(saved["optimizer"])
    for name in ("steps", "attempts", "microbatches"):
        setattr(trainer.counters, name, getattr(saved["counters"], name))
    ckpt.restore_rng(saved["rng"])
    state = vars(trainer.precision)
    state.clear()
    state.update(saved["precision"])
    trainer.last_result = saved["last"]


def _session(trainer: Any, steps: int) -> FitSession:
    """A short fit of ``steps`` on ``trainer``: the timed rounds' settings, without what only
    the first fit does (inspection, peak calibration, progress bar, injected overflows), the
    loss scale where the timed rounds left it, one logging interval."""
    cfg = dataclasses.replace(
        trainer.train, steps=steps, log_every=steps, progress=False, inspect=False,
        measure_peak=False, overflow_at_steps=(), grad_stats_every=None,
    )  # fmt: skip
    trainer.precision.load_state_dict(trainer.precision.state_dict() or None)
    events = trainer.precision.start_fit(cfg, trainer.counters.attempts)
    return FitSession(trainer, cfg, Callbacks(()), None, events)


def split_trainer(
    trainer: Any,
    label: str | None = None,
    *,
    measured_s: float | None = None,
    config: SplitConfig | None = None,
) -> TimeSplit:
    """Profile ``config.steps`` steps of ``trainer`` and group their time into families
    (:func:`split_plans` for one plan). ``measured_s``: the plan's median step time from the
    timed rounds (the profiler's overhead is stated against it)."""
    label = label if label is not None else trainer.label
    return split_plans({label: trainer}, {label: measured_s}, config=config)[label]


def split_plans(
    trainers: Mapping[str, Any],
    measured_s: Mapping[str, float | None] | None = None,
    *,
    failures: Mapping[str, str] | None = None,
    config: SplitConfig | None = None,
) -> dict[str, TimeSplit]:
    """Label -> :class:`TimeSplit` of every plan, after the timed rounds. The plans on one device
    are profiled together, their steps interleaved in rounds with the order rotated (as the
    timed rounds interleave them), so a slower stretch of the machine falls on every plan alike.
    ``failures``: label -> why a plan failed (it gets no split, and the split says so)."""
    cfg = config if config is not None else SplitConfig()
    medians, failed = dict(measured_s or {}), dict(failures or {})
    out: dict[str, TimeSplit] = {
        label: missing(label, f"the plan failed, so it has no split: {why}")
        for label, why in failed.items()
    }
    groups: dict[str, dict[str, Any]] = {}
    for label, trainer in trainers.items():
        if label not in failed:
            groups.setdefault(str(torch.device(trainer.device)), {})[label] = trainer
    for group in groups.values():
        out.update(_split_together(group, medians, cfg))
    order = [*trainers, *(k for k in failed if k not in trainers)]
    return {label: out[label] for label in order}


def _split_together(
    trainers: dict[str, Any], medians: Mapping[str, float | None], cfg: SplitConfig
) -> dict[str, TimeSplit]:
    """The splits of ``trainers`` (one device), profiled in one interleaved run; if that run
    fails with several plans, each plan is profiled alone, so the failure is its own plan's."""
    t0 = time.perf_counter()
    if profiler_busy():
        why = "another profiler is recording in this process (torch allows one at a time)"
        return {label: missing(label, why, medians.get(label)) for label in trainers}
    device = torch.device(next(iter(trainers.values())).device)
    try:
        activities, view, notes = _activities(device)
    except ValueError as exc:
        return {label: missing(label, str(exc), medians.get(label)) for label in trainers}
    saved = {label: _snapshot(trainer) for label, trainer in trainers.items()}
    try:
        with allocator.reserved(cfg.heap_ahead if device.type == "cpu" else 0) as ahead:
            notes += (HEAP_AHEAD,) if ahead else ()
            return _profiled(trainers, cfg, device, (activities, view, notes), medians, t0)
    except Exception as exc:  # noqa: BLE001 - any error of the extra steps (the model's own
        # included, raised as itself) leaves the measured comparison whole: said, never hidden
        if len(trainers) > 1:
            log.info("interleaved profiling failed (%s); profiling each plan alone", exc)
        else:
            (label,) = trainers
            log.warning("%s: no time split: %s: %s", label, type(exc).__name__, exc)
            why = f"the profiled steps failed: {type(exc).__name__}: {exc}"
            return {label: missing(label, why, medians.get(label))}
    finally:
        for label, trainer in trainers.items():
            _restore(trainer, saved[label])
    return {k: _split_together({k: t}, medians, cfg)[k] for k, t in trainers.items()}


def _profiled(
    trainers: dict[str, Any],
    cfg: SplitConfig,
    device: torch.device,
    how: tuple[list[ProfilerActivity], str, tuple[str, ...]],
    medians: Mapping[str, float | None],
    t0: float,
) -> dict[str, TimeSplit]:
    activities, view, notes = how
    labels = list(trainers)
    plan = schedule(labels, cfg)
    kinds = {label: [k for who, k in plan if who == label] for label in labels}
    sessions = {label: _session(t, len(kinds[label])) for label, t in trainers.items()}
    marks = {label: f"{STEP_MARK}#{i}" for i, label in enumerate(labels)}
    #: The kind of every attempt: a step the loss scale skips is tried again, one more attempt
    #: (its own time, record and mark) of the same kind.
    tries: dict[str, list[str]] = {label: [] for label in labels}

    def advance(label: str, kind: str) -> None:
        before = sessions[label].counters.attempts
        sessions[label].advance(1)
        tries[label] += [kind] * (sessions[label].counters.attempts - before)

    first = next(i for i, (_, kind) in enumerate(plan) if kind == "profiled")
    last = max(i for i, (_, kind) in enumerate(plan) if kind == "profiled")
    for step in plan[: first - 1]:  # up to the settling step before the first profiled one
        advance(*step)
    prof = _under_profiler(plan[first - 1 : last + 1], sessions, marks, device, activities, advance)
    tail = plan[last + 1 :]
    for step in (step for step in tail if step[1] != "shapes"):
        advance(*step)
    shaped = [step for step in tail if step[1] == "shapes"]  # the last steps: see shapes.py
    cpu = [ProfilerActivity.CPU]
    shaped_prof = _under_profiler(shaped, sessions, marks, device, cpu, advance, shapes=True)
    results = {label: session.finish() for label, session in sessions.items()}
    kernels = ProfilerActivity.CUDA in activities
    events = (None if kernels else host_events(prof)) or prof.events()
    shaped_events = host_events(shaped_prof) or shaped_prof.events()
    lent = {label: lend_steps(events, shaped_events, marks[label]) for label in labels}
    seconds = (time.perf_counter() - t0) / len(labels)  # the run's cost, shared by its plans
    splits = {}
    for label, trainer in trainers.items():  # each plan's split from the trace and its short fit
        times, history = list(results[label].step_times_s), list(results[label].scale_history)
        counted, asked = sessions[label].counted, len(kinds[label])
        if counted < asked:
            raise RuntimeError(f"the short fit stopped after {counted} of {asked} steps")
        if len(times) < len(tries[label]):
            raise RuntimeError(f"{len(times)} step times for {len(tries[label])} attempts")
        profiled = [i for i, kind in enumerate(tries[label]) if kind == "profiled"]
        autocast = bool(getattr(trainer.plan, "autocast_enabled", False))
        steps = steps_of(events, device=kernels, autocast=autocast, mark=marks[label])
        if len(steps) != len(profiled):
            raise RuntimeError(
                f"the trace holds {len(steps)} step marks for {len(profiled)} profiled attempts"
            )
        unprofiled = [t for t, k in zip(times, tries[label], strict=False) if k == "unprofiled"]
        traced = median_families(steps)
        splits[label] = TimeSplit(
            label,
            families=traced,
            step_s=sum(traced.values()),
            traced=traced,
            traced_s=sum(traced.values()),
            timer_s=statistics.median(times[i] for i in profiled),
            unprofiled_s=statistics.median(unprofiled) if unprofiled else None,
            measured_s=medians.get(label),
            steps=cfg.steps,
            view=view,
            device=str(device),
            casts=cast_summary(steps),
            matmuls=matmul_shapes(steps),
            ops=top_ops(steps),
            overlap_s=statistics.fmean(s.overlap_s for s in steps),
            events=int(statistics.median(s.events for s in steps)),
            family_events={
                f: float(statistics.median(s.family_events[f] for s in steps)) for f in FAMILIES
            },
            skipped=sum(1 for i in profiled if i < len(history) and history[i].get("skipped")),
            notes=notes + lent[label] + _compiled_notes(trainer, steps),
            seconds=seconds,
        )
    if not cfg.take_out:
        return splits
    return without_profiler(splits, kernels=kernels)


def _under_profiler(
    steps: list[tuple[str, str]],
    sessions: Mapping[str, FitSession],
    marks: Mapping[str, str],
    device: torch.device,
    activities: list[ProfilerActivity],
    advance: Callable[[str, str], None],
    shapes: bool = False,
) -> Any:
    """Run ``steps`` (label, kind) with ``advance`` under a profiler (recording input shapes
    when ``shapes``), each attempt of a step of kind "profiled" or "shapes" inside its plan's
    mark; returns the stopped profiler."""
    prof = profile(activities=activities, record_shapes=shapes)
    # the profiler's C++ side prints at its start and stop (and once from a thread): not for users
    with cpp_output_to_debug_log("starting torch.profiler"):
        prof.start()
    try:
        with profiler_ranges_unsaid():  # a compiled plan traced inside a step mark
            for label, kind in steps:
                timer = sessions[label].timer
                if kind in ("profiled", "shapes"):
                    timer.marker = lambda name=marks[label]: _mark(device, name)
                try:
                    advance(label, kind)
                finally:
                    timer.marker = None
    finally:
        with cpp_output_to_debug_log("stopping torch.profiler"):
            prof.stop()
    return prof


def _compiled_notes(trainer: Any, steps: list[StepSplit]) -> tuple[str, ...]:
    compiled = statistics.fmean(s.families["compiled"] for s in steps)
    if not trainer.explanation.compile.enabled:
        return ()
    return (
        "compiled plan: the profiler names the compiled graph and the library kernels it calls "
        "(matmuls through ATen stay matmuls), not the fused kernels inside it; their "
        f"{compiled * 1e3:.3f} ms per step are 'compiled kernels, not attributed', and casts "
        "fused into them are not seen as casts",
    )
