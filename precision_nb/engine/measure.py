"""Measure plans like a benchmark: warm-up apart, then plans interleaved in rounds.

1. **Warm-up** (:func:`warm_up`): each plan first trains a throw-away copy (same initial weights,
   same batches) one step at a time until its step times settle: the last ``warmup_window`` step
   times lie within ``warmup_tolerance`` of their median (after at least ``warmup_min`` steps), or
   a cap is reached (``warmup_max`` steps or ``warmup_seconds``). The rule that ended it is
   recorded. First-call costs (kernel selection, oneDNN primitives, allocator growth, lazy init,
   the FLOP count and peak calibration, both cached per process) are paid there and reported on
   their own; the copy is then dropped, so the measured run trains exactly as a single ``fit``.
2. **Rounds** (:func:`run_rounds`): every plan's real session advances one block of steps per
   round, the order rotated every round; the per-step times of each block are kept. A plan whose
   session fails is reported with the rounds it completed; the others go on.
3. **Processes**: a process is a sample of its own (memory layout, allocator state, kernel
   choice), so a :class:`Measurement` holds this process's rounds and, where the workload can be
   rebuilt, those of fresh processes (:mod:`precision_nb.engine.measure_processes`); its
   speedups are then intervals over processes (:mod:`precision_nb.engine.stats`). Every
   measuring process first settles its host allocator (``cfg.allocator``,
   :mod:`precision_nb.engine.allocator`), so processes differ by less than their histories.

Sessions are anything with ``advance(n) -> int``, ``done``, ``result`` (with ``step_times_s``,
one wall time per optimizer attempt) and ``finish()`` (``Trainer.start`` returns one). Each plan
is named by a frozen :class:`PlanSpec` (its label and the precision request it is built from).

Several processes measuring together (a distributed profile: every rank runs every plan) must take
the same decisions or their collectives stop matching: the rounds and orders are deterministic,
the warm-up's end is not (step times, a time cap), so ``agree`` (an all-reduce over the ranks)
turns each rank's local "warm-up done" into one decision; ``fail_fast`` makes a failing session
raise at once instead of dropping that plan on one rank only.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from precision_nb.core.events import Event
from precision_nb.engine import allocator
from precision_nb.engine.measure_config import (
    MAX_PROCESSES,
    MeasureConfig,
    PlanSpec,
    block_sizes,
)
from precision_nb.engine.measurement import Measurement, PlanTiming, ProcessTiming, Warmup

log = logging.getLogger(__name__)

__all__ = [
    "MAX_PROCESSES",
    "MeasureConfig",
    "Measurement",
    "PlanSpec",
    "PlanTiming",
    "ProcessTiming",
    "Rounds",
    "Session",
    "Warmup",
    "WarmupExhausted",
    "block_sizes",
    "measure_plans",
    "run_rounds",
    "warm_up",
    "warmup_event",
]


class WarmupExhausted(ValueError):
    """The batches ran out before a plan's warm-up ended: its steps cannot be timed."""


class Session(Protocol):
    """The resumable run a measurement drives (``Trainer.start`` returns one)."""

    done: bool
    result: Any

    def advance(self, n: int) -> int: ...

    def finish(self) -> Any: ...


def _stable(times: Sequence[float], cfg: MeasureConfig) -> bool:
    if len(times) < max(cfg.warmup_min, cfg.warmup_window):
        return False
    last = times[-cfg.warmup_window :]
    mid = statistics.median(last)
    return mid > 0 and (max(last) - min(last)) / mid <= cfg.warmup_tolerance


def warm_up(
    label: str,
    session: Session | None,
    cfg: MeasureConfig,
    agree: Callable[[bool], bool] | None = None,
) -> Warmup:
    """Advance ``session`` one step at a time until the warm-up rule ends it (see module doc).

    ``agree``: called after every step with this process's "warm-up done" (rule met or time cap
    reached) and returning the decision every process takes (e.g. an all-reduce over the ranks);
    without it the local decision is taken. When the processes agree to stop before this one's
    own rule is met, the rule says so.

    :class:`WarmupExhausted` (a ``ValueError``) when the batches run out before the warm-up ends
    (the message names the plan, the step and what is needed); a failing step raises as it is.
    """
    if cfg.warmup_max == 0:
        return Warmup(0, 0.0, "none: warm-up skipped (warmup_max=0)")
    t0 = time.perf_counter()
    times: list[float] = []
    rule = f"cap: {cfg.warmup_max} steps without stabilising"
    for n in range(cfg.warmup_max):
        got = session.advance(1)
        if got < 1:
            raise WarmupExhausted(
                f"batches ran out during the warm-up of plan {label} after {n} step(s): timing "
                f"needs up to {cfg.warmup_max} warm-up steps plus the measured steps; pass "
                "batches that can be replayed (a list, a DataLoader or a callable of the index) "
                "or fewer steps"
            )
        times = [float(t) for t in session.result.step_times_s]
        local: str | None = None
        if _stable(times, cfg):
            local = (
                f"stable: {cfg.warmup_window} consecutive step times within "
                f"{cfg.warmup_tolerance:.0%} of their median after {len(times)} steps"
            )
        elif time.perf_counter() - t0 > cfg.warmup_seconds:
            local = f"cap: {cfg.warmup_seconds:g} s of warm-up without stabilising"
        done = local is not None if agree is None else agree(local is not None)
        if done:
            rule = (
                local or f"agreed: the other processes ended the warm-up after {len(times)} steps"
            )
            break
    return Warmup(len(times), time.perf_counter() - t0, rule, tuple(times))


def warmup_event(label: str, warm: Warmup) -> Event:
    """The measurement event that reports a plan's warm-up (its steps and seconds, not counted)."""
    return Event(
        "measurement",
        f"{label}: first {warm.steps} step(s) cost {warm.seconds:.2f} s of warm-up, "
        f"not counted ({warm.rule})",
        {"run": label, "warmup_steps": warm.steps, "warmup_s": warm.seconds},
    )


@dataclass
class Rounds:
    """What :func:`run_rounds` measured: per label its blocks (``blocks[label][r]``), the order
    of each round, why a plan stopped (``failed``) and the exception (``failures``), events."""

    blocks: dict[str, list[list[float]]]
    orders: list[list[str]] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    failures: dict[str, BaseException] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    stopped: bool = False


def run_rounds(
    sessions: Mapping[str, Session],
    sizes: Sequence[int],
    stop: Any = None,
    *,
    fail_fast: bool = False,
    on_round: Callable[[int, int], None] | None = None,
    offset: int = 0,
) -> Rounds:
    """Advance every session one block per round, order rotated; returns the :class:`Rounds`.

    A session that raises is marked failed (its message and completed rounds kept) and dropped
    from later rounds, or with ``fail_fast`` raises at once; a session that makes fewer steps
    than asked without a stop request ran out of batches. ``on_round(r, rounds)`` is called as
    round r (1-based) starts. ``offset``: the rotation of the first round (a fresh process
    starts with another plan, so the order effects of the processes balance).
    """
    labels = list(sessions)
    out = Rounds({label: [] for label in labels})
    if not labels:  # every plan failed before its rounds (e.g. in warm-up): nothing to rotate
        return out
    for r, size in enumerate(sizes):
        if on_round is not None:
            on_round(r + 1, len(sizes))
        k = (r + offset) % len(labels)
        order = labels[k:] + labels[:k]
        out.orders.append(order)
        for label in order:
            blocks = out.blocks[label]
            if label in out.failed:
                blocks.append([])
                continue
            session = sessions[label]
            before = len(session.result.step_times_s)
            try:
                got = session.advance(size)
            except Exception as exc:  # noqa: BLE001 - kept with its rounds; compare() raises it
                if fail_fast:
                    raise
                out.failures[label] = exc
                out.failed[label] = f"failed in round {r + 1}: {type(exc).__name__}: {exc}"
                blocks.append([])
                out.events.append(_failed_event(label, r, out.failed[label], blocks))
                continue
            new = [float(t) for t in session.result.step_times_s[before:]]
            blocks.append(new if got == size else [])
            if got < size and not (stop is not None and stop.is_set()):
                out.failed[label] = f"batches ran out in round {r + 1} after {got} of {size} steps"
                out.events.append(_failed_event(label, r, out.failed[label], blocks))
        if stop is not None and stop.is_set():
            out.stopped = True
            break
    return out


def _failed_event(label: str, r: int, why: str, blocks: list[list[float]]) -> Event:
    """The event of a plan that failed in round ``r`` (0-based), kept with its completed rounds."""
    done = sum(1 for b in blocks if b)
    text = f"{label}: {why}; reported with the {done} round(s) it completed"
    return Event("measurement", text, {"run": label, "round": r + 1, "rounds": done})


def measure_plans(
    plans: Sequence[str | PlanSpec],
    make_session: Callable[[str, int, bool], Session],
    steps: int,
    cfg: MeasureConfig,
    stop: Any = None,
    on_warmup: Callable[[str, Warmup | None], None] | None = None,
    *,
    agree: Callable[[bool], bool] | None = None,
    fail_fast: bool = False,
    on_round: Callable[[int, int], None] | None = None,
    offset: int = 0,
) -> tuple[Measurement, dict[str, Session], dict[str, BaseException]]:
    """Warm each plan up on a throw-away session, then run the real sessions in rounds, in this
    process. Returns the :class:`Measurement`, the real sessions and the failures by label.

    ``plans``: :class:`PlanSpec` values (or bare labels). ``make_session(label, steps, warmup)``
    builds a session from the shared initial state; ``warmup=True`` asks for a throw-away one
    (no callbacks, no progress bar). A plan whose warm-up fails is marked failed (0 rounds) and
    not measured; batches running out in a warm-up (:class:`WarmupExhausted`) stop the
    measurement. ``on_warmup(label, None)`` is called as a plan's warm-up starts and
    ``on_warmup(label, warmup)`` when it ended (for live views: the warm-up's throw-away session
    reports to no callback). ``agree`` goes to :func:`warm_up`; ``fail_fast``, ``on_round`` and
    ``offset`` to :func:`run_rounds` (with ``fail_fast`` a failing warm-up raises too). See the
    module docstring for several processes.
    """
    specs = [p if isinstance(p, PlanSpec) else PlanSpec(str(p)) for p in plans]
    labels = [s.label for s in specs]
    t0 = time.perf_counter()
    sizes = block_sizes(steps, cfg.rounds)
    timings = {s.label: PlanTiming(s.label, spec=s) for s in specs}
    measurement = Measurement(cfg, sizes, timings, allocator=allocator.settle(cfg.allocator)[1])
    failures: dict[str, BaseException] = {}
    for label in labels:
        if stop is not None and stop.is_set():
            break
        if on_warmup is not None:
            on_warmup(label, None)
        try:  # warmup_max=0: no throw-away session is built (warm_up records the skip)
            throwaway = make_session(label, cfg.warmup_max, True) if cfg.warmup_max else None
            warm = warm_up(label, throwaway, cfg, agree)
        except WarmupExhausted:
            raise
        except Exception as exc:  # noqa: BLE001 - this plan cannot run; the others go on
            if fail_fast:
                raise
            failures[label] = exc
            timing = timings[label]
            timing.failed = f"failed in warm-up: {type(exc).__name__}: {exc}"
            text = f"{label}: {timing.failed}"
            measurement.events.append(Event("measurement", text, {"run": label, "rounds": 0}))
            continue
        timings[label].warmup = warm
        if on_warmup is not None:
            on_warmup(label, warm)
        measurement.events.append(warmup_event(label, warm))
    _check_budget(cfg, timings, sizes, time.perf_counter() - t0)
    sessions = {
        label: make_session(label, steps, False) for label in labels if label not in failures
    }
    rounds = run_rounds(
        sessions, sizes, stop, fail_fast=fail_fast, on_round=on_round, offset=offset
    )
    for label, timing in timings.items():  # a failed warm-up never got to the rounds: no blocks
        timing.blocks = rounds.blocks.get(label) or [[] for _ in rounds.orders]
        timing.failed = rounds.failed.get(label, timing.failed)
    failures.update(rounds.failures)
    measurement.orders = rounds.orders
    measurement.events.extend(rounds.events)
    measurement.stopped = rounds.stopped
    measurement.seconds = time.perf_counter() - t0
    return measurement, sessions, failures


def _check_budget(
    cfg: MeasureConfig, timings: Mapping[str, PlanTiming], sizes: Sequence[int], spent: float
) -> None:
    """A time budget too small for a single round is refused, naming the minimum (one round of
    every plan, estimated from the last step times of their warm-ups)."""
    if cfg.budget_s is None or not cfg.refuse_small_budget or not sizes:
        return
    per_step = [
        statistics.median(t.warmup.times[-3:])
        for t in timings.values()
        if t.warmup is not None and t.warmup.times
    ]
    one_round = sizes[0] * sum(per_step)
    if one_round > cfg.budget_s:
        raise ValueError(
            f"measure.budget_s: invalid value {cfg.budget_s:g} s: too small for a single round "
            f"here (one round of {sizes[0]} step(s) per plan takes about {one_round:.2f} s, after "
            f"warm-ups of {spent:.2f} s); allowed: at least {one_round:.2f} s, or None for no limit"
        )
