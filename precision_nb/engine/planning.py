"""The one planning step of a comparison: each plan resolved once, the baseline fixed once.

:func:`plan_runs` turns a :class:`~precision_nb.engine.request.RunRequest` into a frozen
:class:`Planning`: one :class:`PlannedRun` per distinct plan (its label, its explanation, hence
its precision request and compile mode), the requests merged into another's run because they
resolve to the same plan, the events that say so, and the speed baseline. A comparison in this
process, one over fresh processes and one over torchrun's ranks all start from it.

A label is the requested mode, with " (loss-scale lab)" where the lab applies, then ``+compile``
(``+compile:<mode>``) for a compiled plan. The baseline is the eager fp32 plan, else the first
fp32 plan (every plan compiled), else none (no speedups then).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from precision_nb.core.events import Event
from precision_nb.core.plan import PrecisionConfig
from precision_nb.core.resolution import Explanation, explain_precision
from precision_nb.engine.measure_config import PlanSpec
from precision_nb.engine.precision import lab_applies, run_label

__all__ = ["PlannedRun", "Planning", "plan_runs"]

#: How a request is resolved: (precision request, compile mode) -> its explanation.
Explain = Callable[[PrecisionConfig, str], Explanation]


@dataclass(frozen=True)
class PlannedRun:
    """One distinct plan to measure: its label and the explanation it was resolved to."""

    label: str
    explanation: Explanation

    @property
    def precision(self) -> PrecisionConfig:
        """The precision request the plan is built from."""
        return self.explanation.config

    @property
    def compile(self) -> str:
        """The compile mode ("off": eager)."""
        return str(self.explanation.compile.requested)


@dataclass(frozen=True)
class Planning:
    """Every distinct plan of a request, once, with the baseline; see the module docstring."""

    runs: tuple[PlannedRun, ...] = ()
    #: Request label -> the label of the run it was merged into (same resolved plan).
    merged: Mapping[str, str] = field(default_factory=dict)
    events: tuple[Event, ...] = ()

    @property
    def baseline(self) -> str | None:
        """The label every speedup is measured against (None without an fp32 plan)."""
        fp32 = [r for r in self.runs if r.precision.requested == "fp32"]
        eager = [r for r in fp32 if r.compile == "off"]
        return next((r.label for r in eager + fp32), None)

    @property
    def labels(self) -> list[str]:
        return [r.label for r in self.runs]

    @property
    def specs(self) -> list[PlanSpec]:
        """The plans as the measurement names them."""
        return [PlanSpec(r.label, r.precision, r.compile) for r in self.runs]

    @property
    def explanations(self) -> dict[str, Explanation]:
        return {r.label: r.explanation for r in self.runs}

    @property
    def precisions(self) -> dict[str, PrecisionConfig]:
        return {r.label: r.precision for r in self.runs}

    @property
    def compiles(self) -> dict[str, str]:
        return {r.label: r.compile for r in self.runs}

    def without(self, labels: Iterable[str]) -> Planning:
        """The planning less ``labels`` (plans left out before measuring, e.g. untraceable)."""
        gone = set(labels)
        runs = tuple(r for r in self.runs if r.label not in gone)
        return Planning(runs, self.merged, self.events)


def plan_runs(request: Any, explain: Explain | None = None) -> Planning:
    """Resolve every precision of ``request`` under every compile mode, once.

    ``explain``: how one (precision, compile mode) is resolved; by default
    :func:`~precision_nb.core.resolution.explain_precision` on the request's device and optimizer
    (a distributed profile passes the precision part of its distributed resolution). Requests
    that resolve to the same plan are merged into the first (an event says why); the lab asked
    for where it does not apply is an event too.
    """

    def resolve(precision: PrecisionConfig, mode: str) -> Explanation:
        if explain is not None:
            return explain(precision, mode)
        optimizer = request.optimizer
        return explain_precision(precision, request.device, optimizer=optimizer, compile=mode)

    runs: list[PlannedRun] = []
    merged: dict[str, str] = {}
    events: list[Event] = []
    seen: dict[Any, str] = {}
    for precision, mode in [(p, c) for p in request.precisions for c in request.compiles]:
        explanation = resolve(precision, mode)
        plan = explanation.plan
        label = run_label(precision.label, lab_applies(explanation)) + explanation.compile.suffix
        if precision.loss_scale_lab and not lab_applies(explanation):
            # The lab is a CPU opt-in; elsewhere (CUDA fp16 has the real scaler) the label must
            # not claim it.
            text = (
                f"{run_label(label, True)}: the loss-scale lab applies to fp16 on CPU only; "
                f"on {explanation.device} this runs as plain {precision.requested}"
            )
            data = {"field": "loss_scale_lab", "requested": True, "used": False, "run": label}
            events.append(Event("fallback", text, data))
        if label in merged or any(r.label == label for r in runs):
            text = f"{label}: requested twice; run once"
            events.append(Event("merged", text, {"label": label, "into": label}))
            continue
        key = (plan, explanation.compile.requested)
        if key in seen:
            first = merged[label] = seen[key]
            reasons = explanation.fallbacks or explanation.decisions
            why = "; ".join(d.reason for d in reasons if d.field != "device")
            text = (
                f"{label} resolves to the same plan as {first} ({plan.label} on "
                f"{explanation.device}); run once. Why: {why}"
            )
            events.append(Event("merged", text, {"label": label, "into": first, "why": why}))
            continue
        seen[key] = label
        runs.append(PlannedRun(label, explanation))
    return Planning(tuple(runs), merged, tuple(events))
