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

Sessions are anything with ``advance(n) -> int``, ``done``, ``result`` (with ``step_times_s``,
one wall time per optimizer attempt) and ``finish()`` (``Trainer.start`` returns one).

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

from precision_nb.core import validate
from precision_nb.core.events import Event
from precision_nb.engine import stats

log = logging.getLogger(__name__)

__all__ = [
    "MeasureConfig",
    "Measurement",
    "PlanTiming",
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


@dataclass(frozen=True)
class MeasureConfig:
    """How a comparison is measured; see the module docstring.

    ``rounds``: rounds of blocks (the measured steps of each plan are split evenly over them).
    ``warmup_max=0`` skips the warm-up (recorded as such).
    """

    rounds: int = 8
    warmup_min: int = 3
    warmup_max: int = 20
    warmup_window: int = 3
    warmup_tolerance: float = 0.15
    warmup_seconds: float = 3.0

    def __post_init__(self) -> None:
        validate.integer("measure.rounds", self.rounds, minimum=1)
        validate.integer("measure.warmup_min", self.warmup_min, minimum=0)
        validate.integer("measure.warmup_max", self.warmup_max, minimum=0)
        validate.integer("measure.warmup_window", self.warmup_window, minimum=2)
        validate.number("measure.warmup_tolerance", self.warmup_tolerance, minimum=0.0)
        validate.number("measure.warmup_seconds", self.warmup_seconds, minimum=0.0)

    def describe(self) -> str:
        if self.warmup_max == 0:
            return f"no warm-up; {self.rounds} rounds"
        return (
            f"warm-up until {self.warmup_window} consecutive step times lie within "
            f"{self.warmup_tolerance:.0%} of their median (at least {self.warmup_min} steps; cap "
            f"{self.warmup_max} steps or {self.warmup_seconds:g} s); {self.rounds} rounds, plan "
            "order rotated each round"
        )


def block_sizes(steps: int, rounds: int) -> list[int]:
    """``steps`` split over at most ``rounds`` blocks, sizes differing by at most one."""
    rounds = max(1, min(rounds, steps))
    base, extra = divmod(steps, rounds)
    return [base + (1 if r < extra else 0) for r in range(rounds)]


@dataclass(frozen=True)
class Warmup:
    """How one plan's warm-up went: steps, total seconds, the rule that ended it, its times."""

    steps: int
    seconds: float
    rule: str
    times: tuple[float, ...] = ()


@dataclass
class PlanTiming:
    """Per-round step times of one plan (``blocks[r]``: the step times of its block in round r)."""

    label: str
    warmup: Warmup | None = None
    blocks: list[list[float]] = field(default_factory=list)
    failed: str | None = None

    @property
    def rounds_completed(self) -> int:
        return sum(1 for b in self.blocks if b)

    @property
    def times(self) -> list[float]:
        return [t for block in self.blocks for t in block]

    @property
    def spread(self) -> stats.Spread:
        return stats.spread(self.times)


@dataclass
class Measurement:
    """Every plan's timing, the order of each round and what happened (events)."""

    config: MeasureConfig
    sizes: list[int]
    plans: dict[str, PlanTiming] = field(default_factory=dict)
    orders: list[list[str]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    stopped: bool = False

    def speedup(self, label: str, baseline: str) -> stats.Speedup:
        base, plan = self.plans[baseline], self.plans[label]
        return stats.paired_speedup(base.blocks, plan.blocks)

    def method(self) -> dict[str, Any]:
        """What the report's settings show about the method."""
        steps = sorted(set(self.sizes))
        return {
            "method": self.config.describe(),
            "rounds": len(self.sizes),
            "steps per block": "/".join(map(str, steps)),
            "timing": "per optimizer step (CUDA events on CUDA, host clock elsewhere)",
            "speedup": stats.Speedup(1.0, None, None, 0, ()).method,
        }


def _stable(times: Sequence[float], cfg: MeasureConfig) -> bool:
    if len(times) < max(cfg.warmup_min, cfg.warmup_window):
        return False
    last = times[-cfg.warmup_window :]
    mid = statistics.median(last)
    return mid > 0 and (max(last) - min(last)) / mid <= cfg.warmup_tolerance


def warm_up(
    label: str,
    session: Session,
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


def run_rounds(
    sessions: Mapping[str, Session],
    sizes: Sequence[int],
    measurement: Measurement,
    stop: Any = None,
    *,
    fail_fast: bool = False,
    on_round: Callable[[int, int], None] | None = None,
) -> dict[str, BaseException]:
    """Advance every session one block per round, order rotated; returns failures by label.

    Each plan's block times land in ``measurement.plans[label].blocks``. A session that raises
    is marked failed (its message and completed rounds kept) and dropped from later rounds, or
    with ``fail_fast`` raises at once; a session that makes fewer steps than asked without a stop
    request ran out of batches. ``on_round(r, rounds)`` is called as round r (1-based) starts.
    """
    labels = list(sessions)
    failures: dict[str, BaseException] = {}
    if not labels:  # every plan failed before its rounds (e.g. in warm-up): nothing to rotate
        return failures
    for r, size in enumerate(sizes):
        if on_round is not None:
            on_round(r + 1, len(sizes))
        k = r % len(labels)
        order = labels[k:] + labels[:k]
        measurement.orders.append(order)
        for label in order:
            timing = measurement.plans[label]
            if timing.failed is not None:
                timing.blocks.append([])
                continue
            session = sessions[label]
            before = len(session.result.step_times_s)
            try:
                got = session.advance(size)
            except (RuntimeError, ValueError) as exc:  # the plan is reported with its rounds
                if fail_fast:
                    raise
                failures[label] = exc
                timing.failed = f"failed in round {r + 1}: {type(exc).__name__}: {exc}"
                timing.blocks.append([])
                measurement.events.append(_failed_event(label, r, timing))
                continue
            new = [float(t) for t in session.result.step_times_s[before:]]
            timing.blocks.append(new if got == size else [])
            if got < size and not (stop is not None and stop.is_set()):
                timing.failed = f"batches ran out in round {r + 1} after {got} of {size} steps"
                measurement.events.append(_failed_event(label, r, timing))
        if stop is not None and stop.is_set():
            measurement.stopped = True
            break
    return failures


def _failed_event(label: str, r: int, timing: Any) -> Event:
    """The event of a plan that failed in round ``r`` (0-based), kept with its completed rounds."""
    return Event(
        "measurement",
        f"{label}: {timing.failed}; reported with the {timing.rounds_completed} round(s) it "
        "completed",
        {"run": label, "round": r + 1, "rounds": timing.rounds_completed},
    )


def measure_plans(
    labels: Sequence[str],
    make_session: Callable[[str, int, bool], Session],
    steps: int,
    cfg: MeasureConfig,
    stop: Any = None,
    on_warmup: Callable[[str, Warmup | None], None] | None = None,
    *,
    agree: Callable[[bool], bool] | None = None,
    fail_fast: bool = False,
    on_round: Callable[[int, int], None] | None = None,
) -> tuple[Measurement, dict[str, Session], dict[str, BaseException]]:
    """Warm each plan up on a throw-away session, then run the real sessions in rounds.

    ``make_session(label, steps, warmup)`` builds a session from the shared initial state;
    ``warmup=True`` asks for a throw-away one (no callbacks, no progress bar). A plan whose
    warm-up fails is marked failed (0 rounds) and not measured; batches running out in a warm-up
    (:class:`WarmupExhausted`) stop the measurement. ``on_warmup(label, None)`` is called as a
    plan's warm-up starts and ``on_warmup(label, warmup)`` when it ended (for live views: the
    warm-up's throw-away session reports to no callback). ``agree`` goes to :func:`warm_up`;
    ``fail_fast`` and ``on_round`` to :func:`run_rounds` (with ``fail_fast`` a failing warm-up
    raises too). See the module docstring for several processes.
    """
    sizes = block_sizes(steps, cfg.rounds)
    measurement = Measurement(cfg, sizes, {label: PlanTiming(label) for label in labels})
    failures: dict[str, BaseException] = {}
    for label in labels:
        if stop is not None and stop.is_set():
            break
        if on_warmup is not None:
            on_warmup(label, None)
        if cfg.warmup_max:
            try:
                warm = warm_up(label, make_session(label, cfg.warmup_max, True), cfg, agree)
            except WarmupExhausted:
                raise
            except (RuntimeError, ValueError) as exc:  # this plan cannot run; the others go on
                if fail_fast:
                    raise
                failures[label] = exc
                timing = measurement.plans[label]
                timing.failed = f"failed in warm-up: {type(exc).__name__}: {exc}"
                measurement.events.append(
                    Event("measurement", f"{label}: {timing.failed}", {"run": label, "rounds": 0})
                )
                continue
        else:
            warm = warm_up(label, _NoSession(), cfg)
        measurement.plans[label].warmup = warm
        if on_warmup is not None:
            on_warmup(label, warm)
        measurement.events.append(warmup_event(label, warm))
    sessions = {
        label: make_session(label, steps, False) for label in labels if label not in failures
    }
    failures.update(
        run_rounds(sessions, sizes, measurement, stop, fail_fast=fail_fast, on_round=on_round)
    )
    return measurement, sessions, failures


class _NoSession:
    done = True
    result: Any = None

    def advance(self, n: int) -> int:
        return 0

    def finish(self) -> Any:
        return None
