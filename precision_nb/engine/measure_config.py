"""How a comparison is measured, as plain checked values: :class:`MeasureConfig`, the plans named
by :class:`PlanSpec`, and how the measured steps split into rounds.

Nothing here measures (:mod:`precision_nb.engine.measure` does); these values travel to fresh
processes and torchrun's ranks as they are.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from precision_nb.core import validate
from precision_nb.core.defaults import (
    ALLOCATOR_POLICIES,
    DEFAULT_ALLOCATOR,
    DEFAULT_ROUNDS,
    MAX_PROCESSES,
    MIN_PROCESSES,
)
from precision_nb.core.text import plus_minus_text

__all__ = [
    "MAX_PROCESSES",
    "MeasureConfig",
    "PlanSpec",
    "block_sizes",
    "check_options",
    "check_rounds",
]


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
    over them; None: 8, or one per step when fewer steps are measured; more rounds than steps
    are refused). ``warmup_max=0`` skips the warm-up (recorded as such).
    ``processes``: how many processes measure the plans: 1 (this one only), N (this one and
    N - 1 fresh ones) or None (fresh processes are added, from
    :data:`~precision_nb.core.defaults.MIN_PROCESSES` on, until every speedup's interval has a
    relative half-width within ``target``, the ``budget_s`` is spent or :data:`MAX_PROCESSES`
    is reached). ``target``: that half-width (0.05 = ±5 %); ``budget_s``: the wall-clock seconds
    the whole measurement may take (warm-ups included; None: no limit). This process always
    completes its rounds; the budget decides whether another process fits.
    ``rebuild``: for a model object, the ``("module:factory", "module:batches")`` it came from,
    so fresh processes can rebuild it (built-in workloads need nothing).
    ``refuse_small_budget``: a budget too small for a single round is refused (a budget asked
    for); False for a default budget, which then only limits the fresh processes.
    ``allocator``: "settled" sets glibc malloc's thresholds alike in every measuring process,
    "as-is" leaves them (:mod:`precision_nb.engine.allocator`).
    """

    rounds: int | None = None
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
    allocator: str = DEFAULT_ALLOCATOR

    def __post_init__(self) -> None:
        if self.rounds is not None:
            validate.integer("measure.rounds", self.rounds, minimum=1)
        validate.integer("measure.warmup_min", self.warmup_min, minimum=0)
        validate.integer("measure.warmup_max", self.warmup_max, minimum=0)
        validate.integer("measure.warmup_window", self.warmup_window, minimum=2)
        validate.number("measure.warmup_tolerance", self.warmup_tolerance, minimum=0.0)
        validate.number("measure.warmup_seconds", self.warmup_seconds, minimum=0.0)
        validate.boolean("measure.refuse_small_budget", self.refuse_small_budget)
        validate.choice("measure.allocator", self.allocator, ALLOCATOR_POLICIES)
        names = ("measure.processes", "measure.target", "measure.budget_s", "measure.rebuild")
        check_options(self.processes, self.target, self.budget_s, self.rebuild, names)
        if self.rebuild is not None:
            object.__setattr__(self, "rebuild", tuple(self.rebuild))

    def describe(self) -> str:
        rounds = (
            f"{DEFAULT_ROUNDS} rounds per process (one per step when fewer steps are measured)"
            if self.rounds is None
            else f"{self.rounds} rounds per process"
        ) + ", plan order rotated each round"
        warm = "no warm-up"
        if self.warmup_max:
            warm = (
                f"warm-up until {self.warmup_window} consecutive step times lie within "
                f"{self.warmup_tolerance:.0%} of their median (at least {self.warmup_min} steps; "
                f"cap {self.warmup_max} steps or {self.warmup_seconds:g} s)"
            )
        return f"{warm}; {rounds}; {self.describe_processes()}"

    def describe_processes(self) -> str:
        budget = "no time limit" if self.budget_s is None else f"a {self.budget_s:g} s budget"
        if self.processes == 1:
            return "one process"
        if self.processes is not None:
            return f"{self.processes} processes (this one and fresh ones), {budget}"
        target = (
            "no target" if self.target is None else f"a target of {plus_minus_text(self.target)}"
        )
        return (
            f"fresh processes added from {MIN_PROCESSES} on until {target} or {budget} "
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


def block_sizes(steps: int, rounds: int | None) -> list[int]:
    """``steps`` split over ``rounds`` blocks, sizes differing by at most one; ``rounds`` None:
    :data:`~precision_nb.core.defaults.DEFAULT_ROUNDS`, or one per step when fewer steps are
    measured; more rounds than steps are refused (:func:`check_rounds`)."""
    check_rounds(rounds, steps)
    rounds = min(DEFAULT_ROUNDS, steps) if rounds is None else rounds
    base, extra = divmod(steps, rounds)
    return [base + (1 if r < extra else 0) for r in range(rounds)]


def check_rounds(
    rounds: int | None, steps: int, names: Sequence[str] = ("rounds", "steps")
) -> None:
    """``ValueError`` for more rounds than measured steps: a round measures at least one step of
    every plan, so such a request cannot be kept (it is refused, never quietly lowered)."""
    if rounds is not None and rounds > steps:
        raise ValueError(
            f"{names[0]}: invalid value {rounds} with {names[1]}={steps}: every round measures "
            f"at least one step of each plan, so {rounds} rounds need at least {rounds} measured "
            f"steps; allowed: {names[0]} at most {steps}, or {names[1]} of at least {rounds}"
        )
