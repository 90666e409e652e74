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
   speedups are then intervals over processes (:mod:`precision_nb.engine.stats`).

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

import dataclasses
import logging
import math
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
    "check_options",
    "measure_plans",
    "run_rounds",
    "warm_up",
    "warmup_event",
]

#: The most processes one measurement starts (a target that cannot be reached stops here).
MAX_PROCESSES = 40


class WarmupExhausted(ValueError):
    """The batches ran out before a plan's warm-up ended: its steps cannot be timed."""


class Session(Protocol):
    """The resumable run a measurement drives (``Trainer.start`` returns one)."""

    done: bool
    result: Any

    def advance(self, n: int) -> int: ...

    def finish(self) -> Any: ...


@dataclass(frozen=True)
class PlanSpec:
    """One plan to measure: its label, the precision request it is built from (a
    ``PrecisionConfig``; None where the caller builds sessions itself) and its compile mode."""

    label: str
    precision: Any = None
    compile: str = "off"

    def to_dict(self) -> dict[str, Any]:
        precision = self.precision
        if hasattr(precision, "to_dict"):
            precision = precision.to_dict()
        return {"label": self.label, "precision": precision, "compile": self.compile}


@dataclass(frozen=True)
class MeasureConfig:
    """How a comparison is measured; see the module docstring.

    ``rounds``: rounds of blocks per process (the measured steps of each plan are split evenly
    over them). ``warmup_max=0`` skips the warm-up (recorded as such).
    ``processes``: how many processes measure the plans: 1 (this one only), N (this one and
    N - 1 fresh ones) or None (fresh processes are added, from
    :data:`~precision_nb.engine.stats.MIN_PROCESSES` on, until every speedup's interval has a
    relative half-width within ``target``, the ``budget_s`` is spent or :data:`MAX_PROCESSES`
    is reached). ``target``: that half-width (0.05 = ±5 %); ``budget_s``: the wall-clock seconds
    the whole measurement may take (warm-ups included; None: no limit). This process always
    completes its rounds; the budget decides whether another process fits.
    ``rebuild``: for a model object, the ``("module:factory", "module:batches")`` it came from,
    so fresh processes can rebuild it (built-in workloads need nothing).
    ``refuse_small_budget``: a budget too small for a single round is refused (a budget asked
    for); False for a default budget, which then only limits the fresh processes.
    """

    rounds: int = 8
    warmup_min: int = 3
    warmup_max: int = 20
    warmup_window: int = 3
    warmup_tolerance: float = 0.15
    warmup_seconds: float = 3.0
    processes: int | None = 1
    target: float | None = 0.05
    budget_s: float | None = None
    rebuild: tuple[str, str] | None = None
    refuse_small_budget: bool = True

    def __post_init__(self) -> None:
        validate.integer("measure.rounds", self.rounds, minimum=1)
        validate.integer("measure.warmup_min", self.warmup_min, minimum=0)
        validate.integer("measure.warmup_max", self.warmup_max, minimum=0)
        validate.integer("measure.warmup_window", self.warmup_window, minimum=2)
        validate.number("measure.warmup_tolerance", self.warmup_tolerance, minimum=0.0)
        validate.number("measure.warmup_seconds", self.warmup_seconds, minimum=0.0)
        validate.boolean("measure.refuse_small_budget", self.refuse_small_budget)
        names = ("measure.processes", "measure.target", "measure.budget_s", "measure.rebuild")
        check_options(self.processes, self.target, self.budget_s, self.rebuild, names)
        if self.rebuild is not None:
            object.__setattr__(self, "rebuild", tuple(self.rebuild))

    def describe(self) -> str:
        rounds = f"{self.rounds} rounds per process, plan order rotated each round"
        warm = (
            "no warm-up"
            if self.warmup_max == 0
            else (
                f"warm-up until {self.warmup_window} consecutive step times lie within "
                f"{self.warmup_tolerance:.0%} of their median (at least {self.warmup_min} steps; "
                f"cap {self.warmup_max} steps or {self.warmup_seconds:g} s)"
            )
        )
        return f"{warm}; {rounds}; {self.describe_processes()}"

    def describe_processes(self) -> str:
        budget = "no time limit" if self.budget_s is None else f"a {self.budget_s:g} s budget"
        if self.processes == 1:
            return "one process"
        if self.processes is not None:
            return f"{self.processes} processes (this one and fresh ones), {budget}"
        target = "no target" if self.target is None else f"a target of ±{self.target:.0%}"
        return (
            f"fresh processes added from {stats.MIN_PROCESSES} on until {target} or {budget} "
            f"(at most {MAX_PROCESSES})"
        )


def check_options(
    processes: Any,
    target: Any,
    budget_s: Any,
    rebuild: Any = None,
    names: Sequence[str] = ("processes", "target", "budget_s", "rebuild"),
) -> None:
    """``ValueError`` naming the field (``names``: how the caller spells them, e.g. the command
    line's flags) for a bad number of processes, precision target, time budget or rebuild pair."""
    if processes is not None:
        validate.integer(names[0], processes, 1, MAX_PROCESSES)
    for name, value, allowed, top in (
        (names[1], target, "a relative half-width above 0 and below 1 (0.05 = ±5 %)", 1.0),
        (names[2], budget_s, "a number of seconds above 0", math.inf),
    ):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if value is not None and not (ok and 0 < value < top and math.isfinite(value)):
            raise ValueError(
                f"{name}: invalid value {validate.short_repr(value)}; allowed: {allowed}, or none"
            )
    if rebuild is not None and (
        not isinstance(rebuild, (tuple, list))
        or len(rebuild) != 2
        or not all(isinstance(x, str) and ":" in x for x in rebuild)
    ):
        raise ValueError(
            f"{names[3]}: invalid value {validate.short_repr(rebuild)}; allowed: "
            "('module:factory', 'module:batches') or None"
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
    spec: PlanSpec | None = None

    @property
    def rounds_completed(self) -> int:
        return sum(1 for b in self.blocks if b)

    @property
    def times(self) -> list[float]:
        return [t for block in self.blocks for t in block]

    @property
    def spread(self) -> stats.Spread:
        return stats.spread(self.times)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: warm-up, blocks, failure (what a fresh process sends back)."""
        warm = dataclasses.asdict(self.warmup) if self.warmup is not None else None
        return {"warmup": warm, "blocks": self.blocks, "failed": self.failed}

    @classmethod
    def from_dict(cls, label: str, data: Mapping[str, Any]) -> PlanTiming:
        warm = data.get("warmup")
        warmup = None
        if warm:
            warmup = Warmup(
                int(warm["steps"]), float(warm["seconds"]), str(warm["rule"]), tuple(warm["times"])
            )
        blocks = [[float(t) for t in block] for block in data.get("blocks") or []]
        return cls(label, warmup, blocks, data.get("failed"))


@dataclass
class ProcessTiming:
    """One fresh process's measurement of every plan (its own warm-ups and rounds)."""

    index: int
    plans: dict[str, PlanTiming]
    sizes: list[int] = field(default_factory=list)
    orders: list[list[str]] = field(default_factory=list)
    seconds: float = 0.0
    pid: int | None = None
    stopped: bool = False
    #: Seconds from the process's start to its first warm-up step (interpreter, torch, model).
    startup_s: float | None = None


@dataclass
class Measurement:
    """Every plan's timing in this process, the fresh processes' timings, what happened.

    ``plans`` / ``sizes`` / ``orders``: this process's rounds (the sessions whose results the
    report shows). ``processes``: the fresh processes that measured the plans too.
    ``stopped_by``: how the measurement ended (target, budget, the number asked for, why only
    one process); ``sequential``: the number of processes was chosen by looking at the interval;
    ``load``: the machine's load at the start and the end (:class:`~precision_nb.engine.load.Load`).
    """

    config: MeasureConfig
    sizes: list[int]
    plans: dict[str, PlanTiming] = field(default_factory=dict)
    orders: list[list[str]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    stopped: bool = False
    processes: list[ProcessTiming] = field(default_factory=list)
    stopped_by: str = ""
    sequential: bool = False
    load: Any = None
    seconds: float = 0.0

    @property
    def load_note(self) -> str:
        """On a busy machine, the sentence to show before any figure ("" on a quiet one, or
        when the load was not recorded)."""
        return self.load.note() if self.load is not None else ""

    @property
    def process_count(self) -> int:
        """Processes that measured the plans: this one and the fresh ones."""
        return 1 + len(self.processes)

    def blocks_by_process(self, label: str) -> list[list[list[float]]]:
        """The blocks of ``label`` in every process (this one first)."""
        out = [self.plans[label].blocks] if label in self.plans else []
        return out + [p.plans[label].blocks for p in self.processes if label in p.plans]

    def times(self, label: str) -> list[float]:
        """Every measured step time of ``label``, all processes pooled."""
        return [t for blocks in self.blocks_by_process(label) for b in blocks for t in b]

    def spread(self, label: str) -> stats.Spread:
        """Median and quartiles of ``label``'s step times, all processes pooled."""
        return stats.spread(self.times(label))

    def speedup(self, label: str, baseline: str) -> stats.Speedup:
        """``label`` over ``baseline``: over processes when fresh ones measured, else over this
        process's rounds (:mod:`precision_nb.engine.stats`)."""
        base = self.blocks_by_process(baseline)
        plan = self.blocks_by_process(label)
        if len(base) > 1 and len(plan) > 1:
            pairs = list(zip(base, plan, strict=False))
            return stats.process_speedup(
                pairs, sequential=self.sequential, stopped_by=self.stopped_by
            )
        return stats.paired_speedup(base[0], plan[0], stopped_by=self.stopped_by)

    def method(self) -> dict[str, Any]:
        """What the report's settings show about the method."""
        steps = sorted(set(self.sizes))
        out: dict[str, Any] = {
            "method": self.config.describe(),
            "rounds": len(self.sizes),
            "steps per block": "/".join(map(str, steps)),
            "processes": self.process_count,
            "timing": "per optimizer step (CUDA events on CUDA, host clock elsewhere)",
            "speedup": (
                stats.process_method(self.process_count, stats.CONFIDENCE, self.sequential)
                if self.processes
                else stats.round_method(len(self.sizes))
            ),
        }
        if self.stopped_by:
            out["measurement stopped by"] = self.stopped_by
        if self.seconds:
            out["measurement time"] = f"{self.seconds:.1f} s"
        if self.load is not None:
            out["machine load"] = self.load.describe()
        return out


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
    return Event(
        "measurement",
        f"{label}: {why}; reported with the {done} round(s) it completed",
        {"run": label, "round": r + 1, "rounds": done},
    )


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
    measurement = Measurement(cfg, sizes, timings)
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
            except Exception as exc:  # noqa: BLE001 - this plan cannot run; the others go on
                if fail_fast:
                    raise
                failures[label] = exc
                timing = timings[label]
                timing.failed = f"failed in warm-up: {type(exc).__name__}: {exc}"
                measurement.events.append(
                    Event("measurement", f"{label}: {timing.failed}", {"run": label, "rounds": 0})
                )
                continue
        else:
            warm = warm_up(label, _NoSession(), cfg)
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
    for label, blocks in rounds.blocks.items():
        timings[label].blocks = blocks
        timings[label].failed = rounds.failed.get(label, timings[label].failed)
    failures.update(rounds.failures)
    measurement.orders = rounds.orders
    measurement.events.extend(rounds.events)
    measurement.stopped = rounds.stopped
    for label in labels:  # plans that never got to the rounds (failed warm-up): no blocks
        if not timings[label].blocks:
            timings[label].blocks = [[] for _ in measurement.orders]
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


class _NoSession:
    done = True
    result: Any = None

    def advance(self, n: int) -> int:
        return 0

    def finish(self) -> Any:
        return None
