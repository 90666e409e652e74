"""What a measurement holds: every plan's raw step times per round and per process, its warm-up,
and the speedups and spreads computed from them (:class:`Measurement`).

:mod:`precision_nb.engine.measure` fills it in this process; fresh processes
(:mod:`precision_nb.engine.measure_processes`) and torchrun's ranks send theirs as
:meth:`PlanTiming.to_dict` values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from precision_nb.core.events import Event
from precision_nb.engine import stats
from precision_nb.engine.measure_config import MeasureConfig, PlanSpec

__all__ = ["Measurement", "PlanTiming", "ProcessTiming", "Warmup"]


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
        warmup = Warmup(**dict(warm, times=tuple(warm["times"]))) if warm else None
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
    #: Label -> this process's time split as JSON data (``time_split.ranks.to_json``), or None.
    time_split: dict[str, Any] | None = None


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
    #: The host allocator the processes measured under (:mod:`precision_nb.engine.allocator`).
    allocator: str = ""

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
        base, plan = self.blocks_by_process(baseline), self.blocks_by_process(label)
        if len(base) > 1 and len(plan) > 1:
            pairs = list(zip(base, plan, strict=False))
            return stats.process_speedup(
                pairs, sequential=self.sequential, stopped_by=self.stopped_by
            )
        return stats.paired_speedup(base[0], plan[0], stopped_by=self.stopped_by)

    def method(self) -> dict[str, Any]:
        """What the report's settings show about the method."""
        out: dict[str, Any] = {
            "method": self.config.describe(),
            "rounds": len(self.sizes),
            "steps per block": "/".join(map(str, sorted(set(self.sizes)))),
            "processes": self.process_count,
            "timing": "per optimizer step (CUDA events on CUDA, host clock elsewhere)",
            "speedup": (
                stats.process_method(self.process_count, stats.CONFIDENCE, self.sequential)
                if self.processes
                else stats.round_method(len(self.sizes), stats.CONFIDENCE, self.stopped_by)
            ),
        }
        if self.stopped_by:
            out["measurement stopped by"] = self.stopped_by
        if self.seconds:
            out["measurement time"] = f"{self.seconds:.1f} s"
        if self.load is not None:
            out["machine load"] = self.load.describe()
        if self.allocator:
            out["host allocator"] = self.allocator
        return out
