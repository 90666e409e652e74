"""Measure the plans in several processes, the way pyperf does: one process is not a sample.

:func:`measure` measures every plan in this process first (:func:`~precision_nb.engine.measure.
measure_plans`; these sessions are the runs the report shows), then, where the workload can reach
a fresh process (:func:`rebuild_spec`), in fresh worker processes run one after the other
(:mod:`~precision_nb.engine.measure_worker`, each a new interpreter). Each worker builds the same
model from the same seed (or receives this process's initial model) and measures every plan
interleaved in rounds, so its process effect is paired like a round's drift; it starts its
rotation with another plan than the previous one. Only its step times come back. What cannot
travel is measured here only, and ``stopped_by`` says why ("measured here: ...").

How many processes: as ``MeasureConfig.processes`` says, the target looked at from
:data:`~precision_nb.engine.stats.MIN_PROCESSES` on, each look at
:data:`~precision_nb.engine.stats.LOOK_CONFIDENCE`; the budget's room for another process is
estimated from the last one. What stopped it is recorded (``Measurement.stopped_by``), as is the
machine's load at the start and the end. A worker that fails is an event; no more workers are
started after it and the interval covers the processes that finished.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from precision_nb.core.events import Event
from precision_nb.core.text import plus_minus_text
from precision_nb.engine import allocator, process_start, shipping, stats
from precision_nb.engine import load as machine_load
from precision_nb.engine.callbacks import Callbacks
from precision_nb.engine.measure import (
    MAX_PROCESSES,
    MeasureConfig,
    Measurement,
    PlanSpec,
    PlanTiming,
    ProcessTiming,
    Session,
    Warmup,
    measure_plans,
)
from precision_nb.engine.worker_spec import WorkerSpec, rebuild_spec

log = logging.getLogger(__name__)

__all__ = ["WorkerSpec", "measure", "rebuild_spec", "trainer_sessions"]

#: Seconds a fresh process is guessed to need before its first step, until one has been timed.
STARTUP_GUESS_S = 3.0
#: A fresh process's warm-ups and rounds are guessed to take this many times this process's.
FIRST_GUESS_FACTOR = 1.25
#: A worker still running this long after its deadline is ended (terminate, then kill).
KILL_GRACE_S = 30.0


def trainer_sessions(
    initial: Any,
    batches: Any,
    *,
    device: Any,
    plans: Mapping[str, Any],
    optimizer: Any,
    train: Any,
    loss_fn: Any = None,
    info: Mapping[str, Any] | None = None,
    callbacks: Iterable[Any] = (),
    stop: Any = None,
    trainers: dict[str, Any] | None = None,
    compiles: Mapping[str, str] | None = None,
    warm_trainers: dict[str, Any] | None = None,
) -> Callable[[str, int, bool], Session]:
    """``make_session(label, steps, warmup)`` for :func:`measure_plans`: a ``Trainer`` on a copy
    of ``initial`` with the plan's precision request and compile mode (``compiles``, default
    "off"); real sessions get the callbacks and the stop flag (and land in ``trainers``), warm-up
    ones neither (they land in ``warm_trainers``: a compiled plan's compile step runs there)."""
    from precision_nb.engine.batches import BatchSource
    from precision_nb.engine.trainer import Trainer

    def make_session(label: str, steps: int, warmup: bool) -> Session:
        cfg = dataclasses.replace(train, label=label, progress=train.progress and not warmup)
        trainer = Trainer(
            copy.deepcopy(initial),
            BatchSource(batches),
            device=device,
            precision=plans[label],
            optimizer=optimizer,
            train=cfg,
            loss_fn=loss_fn,
            workload_info=dict(info or {}),
            compile=(compiles or {}).get(label, "off"),
        )
        kept = warm_trainers if warmup else trainers
        if kept is not None:
            kept[label] = trainer
        return trainer.start(
            steps=steps, callbacks=() if warmup else callbacks, stop=None if warmup else stop
        )

    return make_session


def measure(
    plans: Sequence[PlanSpec],
    make_session: Callable[[str, int, bool], Session],
    steps: int,
    cfg: MeasureConfig,
    *,
    rebuild: WorkerSpec | None = None,
    single_reason: str = "",
    baseline: str | None = None,
    stop: Any = None,
    on_warmup: Callable[[str, Warmup | None], None] | None = None,
    callbacks: Iterable[Any] = (),
    progress: bool = False,
) -> tuple[Measurement, dict[str, Session], dict[str, BaseException]]:
    """Measure ``plans`` here, then in fresh processes as the module docstring says; returns
    the :class:`Measurement` (with ``load``, ``stopped_by``, ``processes``), this process's
    sessions and failures. ``rebuild``: how a worker rebuilds the workload (None: only this
    process, ``single_reason`` says why). ``baseline``: the label the target is checked against
    (default: the first plan). ``callbacks`` with an ``on_phase(text)`` method hear each process
    start."""
    start = machine_load.sample()
    t0 = time.perf_counter()
    first, sessions, failures = measure_plans(plans, make_session, steps, cfg, stop, on_warmup)
    labels = tuple(p.label for p in plans)
    dispatch = callbacks if isinstance(callbacks, Callbacks) else Callbacks(callbacks)
    phases = (dispatch.phase,) if dispatch.wants("on_phase") else ()
    ctx = _Context(cfg, labels, baseline or labels[0], t0, stop, phases)
    measured = _more_processes(first, rebuild, single_reason, ctx, progress)
    measured.load = machine_load.Load(start, machine_load.sample())
    measured.seconds = time.perf_counter() - t0
    measured.events.append(measured.load.event())
    n, why = measured.process_count, measured.stopped_by
    text = f"measured in {n} process(es); stopped by {why}"
    measured.events.append(Event("measurement", text, {"processes": n, "stopped_by": why}))
    return measured, sessions, failures


def _estimates(m: Measurement, labels: Sequence[str], baseline: str) -> dict[str, np.ndarray]:
    """Each plan's per-process estimates against ``baseline`` (the values its interval uses)."""
    base = m.blocks_by_process(baseline)
    return {
        label: stats.process_estimates(list(zip(base, m.blocks_by_process(label), strict=False)))
        for label in labels
        if label != baseline
    }


def _widest_words(estimates: Mapping[str, np.ndarray], confidence: float) -> str:
    """The largest relative half-width over the plans at ``confidence``, in words."""
    widest = 0.0
    for values in estimates.values():
        if values.size < 2:
            return "no interval yet"
        _, low, high = stats.process_interval(values, confidence)
        widest = max(widest, float(stats.relative_half_width(low, high)))
    if not math.isfinite(widest):
        return "no interval yet"
    if widest >= 10:
        return f"largest half-width over {plus_minus_text(10)}"
    return f"largest half-width {plus_minus_text(widest, '.1f')}"


def _target_reached(estimates: Mapping[str, np.ndarray], target: float) -> bool:
    """Whether every plan's interval reached ``target`` at this look (:func:`stats.first_stop`
    over its process estimates: the rule the calibration simulation checks)."""
    return all(
        values.size >= stats.MIN_PROCESSES and stats.first_stop(values, target) == values.size
        for values in estimates.values()
    )


@dataclass(frozen=True)
class _Context:
    """What the process loop needs of the measurement request."""

    cfg: MeasureConfig
    labels: tuple[str, ...]
    baseline: str
    t0: float
    stop: Any
    phases: tuple[Callable[[str], None], ...]


def _more_processes(
    m: Measurement, rebuild: WorkerSpec | None, single_reason: str, ctx: _Context, progress: bool
) -> Measurement:
    if ctx.cfg.processes != 1 and rebuild is None:
        return _here(m, single_reason)
    failed = [label for label, p in m.plans.items() if p.failed]
    alone = (  # (whether this process measures alone, why), the first that holds
        (ctx.cfg.processes == 1, "one process, as asked (processes=1)"),
        (m.stopped, "stopped on request in the first process"),
        (len(ctx.labels) < 2, "one process: a single plan has no speedup to measure"),
        (failed, f"one process: {', '.join(failed)} failed in this process"),
    )
    m.stopped_by = next((why for holds, why in alone if holds), "")
    if m.stopped_by or rebuild is None:
        return m
    from tqdm.auto import tqdm

    folder = Path(tempfile.mkdtemp(prefix="precision_nb_measure_"))
    try:
        starts = process_start.Starts(_worker_env(ctx.cfg.allocator))
        bar = tqdm(
            total=ctx.cfg.processes, desc="fresh processes", unit="process",
            disable=not progress, leave=False,
        )  # fmt: skip
        began = time.perf_counter()
        try:
            m.stopped_by = _loop(m, rebuild, ctx, folder, bar, starts)
        finally:
            bar.close()
        if starts.count:
            m.events.append(_rate_event(m, time.perf_counter() - began))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return m


def _here(m: Measurement, reason: str) -> Measurement:
    """Fresh processes were asked for, but only this one can measure: say why, in the result."""
    here = f"{stats.MEASURED_HERE}{reason}"
    m.stopped_by = f"one process, {here}"
    m.events.append(Event("measurement", here, {"measured_here": reason}))
    return m


def _rate_event(m: Measurement, seconds: float) -> Event:
    """How the fresh processes were started, how many were measured per second, and the median
    start-up of one (from its start to its first warm-up step)."""
    count = len(m.processes)
    rate = count / seconds if seconds > 0 else 0.0
    startups = [p.startup_s for p in m.processes if p.startup_s is not None]
    startup = float(np.median(startups)) if startups else None
    each = "" if startup is None else f"; each started in {startup:.2f} s (median)"
    how = process_start.HOW
    text = f"{count} fresh process(es) in {seconds:.1f} s ({rate:.2f} per second{each}), {how}"
    data = {"fresh_processes": count, "seconds": seconds, "per_second": rate, "start": how}
    return Event("measurement", text, dict(data, startup_s=startup))


def _worker_env(policy: str) -> dict[str, str]:
    """This environment for a fresh process: the package importable, the allocator settled as
    this process settled its own (:func:`allocator.settle`, idempotent)."""
    env = allocator.worker_env(os.environ, allocator.settle(policy)[0])
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    return env


def _loop(
    m: Measurement,
    rebuild: WorkerSpec,
    ctx: _Context,
    folder: Path,
    bar: Any,
    starts: process_start.Starts,
) -> str:
    """Start fresh processes until a rule ends the measurement; returns what ended it."""
    cfg, stop = ctx.cfg, ctx.stop
    adaptive = cfg.processes is None
    wanted = cfg.processes if cfg.processes is not None else MAX_PROCESSES
    durations: list[float] = []
    while True:
        n = m.process_count
        estimates = _estimates(m, ctx.labels, ctx.baseline)
        sequential = adaptive and cfg.target is not None and n >= stats.MIN_PROCESSES
        shown = _widest_words(estimates, stats.LOOK_CONFIDENCE if sequential else stats.CONFIDENCE)
        if sequential:
            m.sequential = True
            if _target_reached(estimates, cfg.target):
                return (
                    f"target: every interval within {plus_minus_text(cfg.target)} after {n} "
                    f"processes ({shown})"
                )
        if n >= wanted:
            if adaptive:
                return f"the maximum of {MAX_PROCESSES} processes ({shown})"
            return f"{n} processes, as asked ({shown})"
        elapsed = time.perf_counter() - ctx.t0
        guess = float(np.mean(durations)) if durations else _first_guess(m)
        if cfg.budget_s is not None and elapsed + guess > cfg.budget_s:
            # processes=N cut short by the budget: said with both numbers, never silently
            asked = "" if adaptive else f" of the {wanted} processes asked"
            if n == 1:
                return (
                    f"budget: this process's measurement took {elapsed:.0f} s of the "
                    f"{cfg.budget_s:g} s budget and no fresh process fit (one needs about "
                    f"{guess:.0f} s): 1{asked or ' process'} measured, so the interval covers "
                    "this process's rounds only"
                )
            target = f", target {plus_minus_text(cfg.target)}" if adaptive and cfg.target else ""
            return (
                f"budget: {cfg.budget_s:g} s; another process (about {guess:.0f} s) did not fit "
                f"after {elapsed:.0f} s, {n}{asked or ' processes'} measured ({shown}{target})"
            )
        if stop is not None and stop.is_set():
            m.stopped = True
            return f"stopped on request after {n} processes"
        if rebuild.shipped and n == 1:  # written once, when a fresh process is about to start
            try:
                sent = shipping.pack(folder, rebuild.shipped)
            except shipping.CannotShip as exc:
                return _here(m, str(exc)).stopped_by
            m.events.append(Event("measurement", sent.describe(), {"bytes": sent.bytes}))
        for phase in ctx.phases:
            budget = "" if cfg.budget_s is None else f" of the {cfg.budget_s:g} s budget"
            phase(
                f"process {n + 1}: measuring every plan in a fresh process ({shown} so far; "
                f"{elapsed:.0f} s{budget} spent)"
            )
        deadline = None if cfg.budget_s is None else time.time() + cfg.budget_s - elapsed
        timing, error, seconds = _run_worker(rebuild, cfg, n, deadline, folder, stop, starts)
        durations.append(seconds)
        if timing is None:
            text = f"process {n + 1} failed: {error}"
            m.events.append(Event("warning", text, {"process": n + 1}))
            if stop is not None and stop.is_set():
                m.stopped = True
                return f"stopped on request after {n} processes"
            if n == 1 and error.startswith(NOT_RECEIVED):
                return _here(m, error).stopped_by
            only = " (the interval covers this process's rounds only)" if n == 1 else ""
            return f"a fresh process failed ({error}); {n} process(es) measured{only}"
        m.processes.append(timing)
        bar.update(1)
        bar.set_postfix_str(shown)
        log.info("process %d measured in %.1f s", n + 1, durations[-1])


#: How a worker's failure begins when what this process sent did not load there.
NOT_RECEIVED = "what this process sent did not load in a fresh process"


def _first_guess(m: Measurement) -> float:
    """Seconds the first fresh process is guessed to need: this process's warm-ups and rounds
    (not its one-off costs: FLOP count, peak calibration, logging), with a margin, and a start."""
    timed = sum(
        (p.warmup.seconds if p.warmup is not None else 0.0) + sum(map(sum, p.blocks))
        for p in m.plans.values()
    )
    return FIRST_GUESS_FACTOR * timed + STARTUP_GUESS_S


def _run_worker(
    rebuild: WorkerSpec,
    cfg: MeasureConfig,
    index: int,
    deadline: float | None,
    folder: Path,
    stop: Any,
    starts: process_start.Starts,
) -> tuple[ProcessTiming | None, str, float]:
    """Run one worker to its end: (its timing, "", seconds) or (None, why it failed, seconds);
    the seconds count from its start."""
    spec = rebuild.to_dict(index, cfg, deadline)
    out = folder / f"process{index + 1}.json"
    spec["out"] = str(out)
    if rebuild.initial is not None:
        import torch

        path = folder / "initial.pt"
        if not path.exists():
            torch.save(rebuild.initial.state_dict(), path)
        spec["model"]["state_dict"] = str(path)
    if rebuild.shipped:
        spec["shipped"] = {"folder": str(folder), "names": sorted(rebuild.shipped)}
    spec_path = folder / f"spec{index + 1}.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    errors = folder / f"process{index + 1}.err"
    began = time.perf_counter()
    child = starts.launch(spec_path, errors)
    try:
        while (code := child.poll(0.1)) is None:
            if stop is not None and stop.is_set():
                child.end()
                return None, "stopped on request", time.perf_counter() - began
            if deadline is not None and time.time() > deadline + KILL_GRACE_S:
                child.end()
                why = f"still running {KILL_GRACE_S:g} s after the time budget; ended"
                return None, why, time.perf_counter() - began
    except BaseException:
        child.end()
        raise
    seconds = time.perf_counter() - began
    data = json.loads(out.read_text(encoding="utf-8")) if out.exists() else {}
    if data.get("error"):
        why = f"{NOT_RECEIVED} ({data['error']})" if data.get("not_received") else data["error"]
        return None, str(why), seconds
    if code != 0 or not data:
        tail = errors.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-3:]
        return None, f"exit code {code}: {' | '.join(tail) or 'no message'}", seconds
    plans = {label: PlanTiming.from_dict(label, d) for label, d in data["plans"].items()}
    failed = [f"{label}: {p.failed}" for label, p in plans.items() if p.failed]
    if failed:  # a plan that fails there is not a sample of its speed: end the additions
        return None, f"plan {'; plan '.join(failed)}", seconds
    startup = None  # from its launch to its first warm-up step, both on the wall clock
    if child.launched is not None and data.get("started") is not None:
        startup = float(data["started"]) - child.launched
    timing = ProcessTiming(
        index + 1, plans, list(data["sizes"]), [list(o) for o in data["orders"]], seconds,
        int(data["pid"]), bool(data.get("stopped")), startup, data.get("time_split"),
    )  # fmt: skip
    return timing, "", seconds
