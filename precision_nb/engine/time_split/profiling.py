"""A few profiled training steps per plan, after the timed rounds, grouped into op families.

:func:`split_trainer` takes a plan's :class:`~precision_nb.engine.trainer.Trainer` once its timed
rounds are over and runs a short fit of its own on it (the same loop, batches and optimizer as the
timed steps): one warm step, ``unprofiled`` steps timed without the profiler, ``steps`` steps under
``torch.profiler`` (CPU activities, CUDA kernels too on CUDA; shapes recorded), then
``unprofiled`` more. Each profiled step runs inside a ``record_function`` mark (the step timer's
:attr:`~precision_nb.engine.step_timer.StepTimer.marker`), so the trace says where each step
begins and ends. Afterwards the trainer's model, optimizer state, counters and RNG are restored:
the profiled steps change nothing a caller reads.

The profiler has its own cost. It is stated, never hidden: the profiled step against the timed
rounds' median (``overhead``), and against the unprofiled steps of the same short fit. A profiler
that cannot start (another one is recording, a device it cannot see) leaves a split that says why
it is missing; the speed measurement is not touched either way.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import statistics
import time
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from precision_nb.core import validate
from precision_nb.engine import checkpoint as ckpt
from precision_nb.engine.callbacks import Callbacks
from precision_nb.engine.inspect.autocast_probe import cpp_output_to_debug_log
from precision_nb.engine.quiet import profiler_ranges_unsaid
from precision_nb.engine.session import FitSession
from precision_nb.engine.time_split.families import FAMILIES, STEP_MARK, StepSplit, steps_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SplitConfig:
    """How many steps each plan's split profiles (``steps``) and times without the profiler
    around them (``unprofiled``, before and after), and the tolerance (a fraction) within which
    the reconstructed speedup must meet the calibrated interval."""

    steps: int = 3
    unprofiled: int = 1
    tolerance: float = 0.10

    def __post_init__(self) -> None:
        validate.positive_int("steps", self.steps)
        validate.integer("unprofiled", self.unprofiled, 0)
        validate.number("tolerance", self.tolerance, minimum=0.0)


@dataclass(frozen=True)
class CastSummary:
    """The casts of one step (means over the profiled steps): how many, bytes written, time;
    and the part autocast issued."""

    count: float = 0.0
    nbytes: float = 0.0
    seconds: float = 0.0
    autocast_count: float = 0.0
    autocast_nbytes: float = 0.0


@dataclass(frozen=True)
class MatmulShape:
    """A matmul shape of one step: op, (M, K, N) (M None for a convolution), input dtype, calls
    and seconds per step."""

    op: str
    m: int | None
    k: int
    n: int
    dtype: str
    calls: float
    seconds: float


@dataclass(frozen=True)
class TimeSplit:
    """One plan's step time by op family (see :mod:`~precision_nb.engine.time_split.families`).

    ``families``: seconds per step of each family, medians over the ``steps`` profiled steps
    (each step's families sum to its wall time in the trace); ``step_s``: their sum, the
    profiled step. ``timer_s``: the median of the same steps by the step timer (another clock:
    ``sum_error`` holds the families against it); ``unprofiled_s``: the median of the
    unprofiled steps of the same short fit; ``measured_s``: the timed rounds' median step time.
    ``view``: what the seconds are (the host's self time, or the kernels' time on a GPU).
    ``missing``: why there is no split (then the figures are empty).
    """

    label: str
    families: Mapping[str, float] = field(default_factory=dict)
    step_s: float = 0.0
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
    #: Profiled attempts the grad scaler skipped (no optimizer step in them).
    skipped: int = 0
    notes: tuple[str, ...] = ()
    #: Seconds the whole split took (its cost), profiler start and trace reading included.
    seconds: float = 0.0
    missing: str | None = None

    @property
    def available(self) -> bool:
        return self.missing is None

    def share(self, family: str) -> float:
        """The family's fraction of the profiled step."""
        return self.families.get(family, 0.0) / self.step_s if self.step_s > 0 else 0.0

    @property
    def overhead(self) -> float | None:
        """The profiled step over the timed rounds' median, minus 1 (the profiler's cost)."""
        if not self.measured_s or not self.step_s:
            return None
        return self.step_s / self.measured_s - 1.0

    @property
    def sum_error(self) -> float | None:
        """Families' sum over the step timer's time of the same steps, minus 1."""
        if not self.timer_s:
            return None
        return sum(self.families.values()) / self.timer_s - 1.0

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
def _mark(device: torch.device):  # noqa: ANN202
    """The range around one profiled step; on CUDA it waits for the step's kernels, so the
    step's wall time holds them."""
    with record_function(STEP_MARK):
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
    """Profile ``config.steps`` steps of ``trainer`` and group their time into families.

    ``measured_s``: the plan's median step time from the timed rounds (the profiler's overhead
    is stated against it). Returns a split with ``missing`` set when the profiler cannot start
    or the steps fail; the trainer is restored either way.
    """
    cfg = config if config is not None else SplitConfig()
    label = label if label is not None else trainer.label
    device = torch.device(trainer.device)
    t0 = time.perf_counter()
    if profiler_busy():
        why = "another profiler is recording in this process (torch allows one at a time)"
        return missing(label, why, measured_s)
    try:
        activities, view, notes = _activities(device)
    except ValueError as exc:
        return missing(label, str(exc), measured_s)
    saved = _snapshot(trainer)
    try:
        return _profiled(trainer, label, cfg, device, activities, view, notes, measured_s, t0)
    except Exception as exc:  # noqa: BLE001 - any error of the extra steps (the model's own
        # included, raised as itself) leaves the measured comparison whole: said, never hidden
        log.warning("%s: no time split: %s: %s", label, type(exc).__name__, exc)
        return missing(label, f"the profiled steps failed: {type(exc).__name__}: {exc}", measured_s)
    finally:
        _restore(trainer, saved)


def _profiled(
    trainer: Any,
    label: str,
    cfg: SplitConfig,
    device: torch.device,
    activities: list[ProfilerActivity],
    view: str,
    notes: tuple[str, ...],
    measured_s: float | None,
    t0: float,
) -> TimeSplit:
    n, u = cfg.steps, cfg.unprofiled
    session = _session(trainer, 1 + 2 * u + n)
    session.advance(1 + u)
    prof = profile(activities=activities, record_shapes=True)
    # the profiler's C++ side prints at its start and stop (and once from a thread): not for users
    with cpp_output_to_debug_log("starting torch.profiler"):
        prof.start()
    session.timer.marker = lambda: _mark(device)
    try:
        with profiler_ranges_unsaid():  # a compiled plan traced inside a step mark
            session.advance(n)
    finally:
        session.timer.marker = None
        with cpp_output_to_debug_log("stopping torch.profiler"):
            prof.stop()
    session.advance(u)
    result = session.finish()
    times = list(result.step_times_s)
    history = list(result.scale_history)
    if len(times) < 1 + 2 * u + n:
        raise RuntimeError(f"the short fit stopped after {len(times)} of {1 + 2 * u + n} steps")
    profiled = slice(1 + u, 1 + u + n)
    split_steps = steps_of(
        prof.events(), device=ProfilerActivity.CUDA in activities,
        autocast=bool(getattr(trainer.plan, "autocast_enabled", False)),
    )  # fmt: skip
    if len(split_steps) != n:
        raise RuntimeError(f"the trace holds {len(split_steps)} step marks for {n} steps")
    unprofiled = times[1 : 1 + u] + times[1 + u + n :]
    families = _median_families(split_steps)
    notes += _compiled_notes(trainer, split_steps)
    return TimeSplit(
        label,
        families=families,
        step_s=sum(families.values()),
        timer_s=statistics.median(times[profiled]),
        unprofiled_s=statistics.median(unprofiled) if unprofiled else None,
        measured_s=measured_s,
        steps=n,
        view=view,
        device=str(device),
        casts=_casts(split_steps),
        matmuls=_matmuls(split_steps),
        ops=_top_ops(split_steps),
        overlap_s=statistics.fmean(s.overlap_s for s in split_steps),
        events=int(statistics.median(s.events for s in split_steps)),
        skipped=sum(1 for h in history[profiled] if h.get("skipped")),
        notes=notes,
        seconds=time.perf_counter() - t0,
    )


def _median_families(steps: list[StepSplit]) -> dict[str, float]:
    """Each family's median over the profiled steps: a step the machine interrupted (a time
    slice lost inside one op) moves one step's family, not the median."""
    return {f: statistics.median(s.families[f] for s in steps) for f in FAMILIES}


def _casts(steps: list[StepSplit]) -> CastSummary:
    n = len(steps)
    every = [c for s in steps for c in s.casts]
    auto = [c for c in every if c.autocast]
    return CastSummary(
        len(every) / n,
        sum(c.nbytes for c in every) / n,
        sum(c.seconds for c in every) / n,
        len(auto) / n,
        sum(c.nbytes for c in auto) / n,
    )


def _matmuls(steps: list[StepSplit]) -> tuple[MatmulShape, ...]:
    n = len(steps)
    acc: dict[tuple[Any, ...], list[float]] = {}
    for s in steps:
        for m in s.matmuls:
            entry = acc.setdefault((m.op, m.m, m.k, m.n, m.dtype), [0.0, 0.0])
            entry[0] += 1
            entry[1] += m.seconds
    shapes = [MatmulShape(*key, calls / n, sec / n) for key, (calls, sec) in acc.items()]
    return tuple(sorted(shapes, key=lambda m: -m.seconds))


def _top_ops(steps: list[StepSplit]) -> dict[str, tuple[tuple[str, float], ...]]:
    n = len(steps)
    out: dict[str, tuple[tuple[str, float], ...]] = {}
    for fam in FAMILIES:
        acc: dict[str, float] = {}
        for s in steps:
            for name, sec in s.ops.get(fam, {}).items():
                acc[name] = acc.get(name, 0.0) + sec / n
        out[fam] = tuple(sorted(acc.items(), key=lambda kv: -kv[1])[:5])
    return out


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


def split_plans(
    trainers: Mapping[str, Any],
    measured_s: Mapping[str, float | None] | None = None,
    *,
    failures: Mapping[str, str] | None = None,
    config: SplitConfig | None = None,
) -> dict[str, TimeSplit]:
    """Label -> :class:`TimeSplit` of every plan, one after the other, after the timed rounds.
    ``failures``: label -> why a plan failed (it gets no split, and the split says so)."""
    medians, failed = dict(measured_s or {}), dict(failures or {})
    out: dict[str, TimeSplit] = {}
    for label in [*trainers, *(k for k in failed if k not in trainers)]:
        if label in failed:
            out[label] = missing(label, f"the plan failed, so it has no split: {failed[label]}")
            continue
        out[label] = split_trainer(
            trainers[label], label, measured_s=medians.get(label), config=config
        )
    return out
