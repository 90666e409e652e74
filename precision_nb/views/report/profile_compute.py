"""What a profile computes after its timed steps: each plan's inspection (memory by kind and dtype,
op dtype trace) and one numerics analysis of the model (gradient underflow by layer and format,
the safe fp16 scale window, with the scaled plan's history overlaid).

:func:`analyse` runs both and returns them as one value; a part that fails is left out with a
``warning`` event, so the measurement is kept. Nothing here draws or writes.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from precision_nb.core.events import Event
from precision_nb.engine.compare import Comparison
from precision_nb.engine.compile.visibility import mark_compiled
from precision_nb.engine.inspect import InspectionData, run_inspection
from precision_nb.engine.numerics.analysis import analyze
from precision_nb.engine.results import RunResult
from precision_nb.views.report.numerics import Numerics

if TYPE_CHECKING:
    from precision_nb.views.report.profile import ProfileRequest

__all__ = [
    "NUMERICS_COMPILED",
    "Analyses",
    "analyse",
    "analyze_numerics",
    "inspect_plans",
    "scaled_run",
]

#: What the numerics analysis says of compiled plans (it runs the eager model).
NUMERICS_COMPILED = (
    "numerics: the analysis runs one instrumented eager step of the model (hooks on module "
    "outputs), for compiled plans too: a compiled graph computes the same tensors up to "
    "rounding (see the agreement in the torch.compile section), but the intermediates its fused "
    "kernels keep are not module outputs, so no hook sees them"
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Analyses:
    """What :func:`analyse` computed: label -> inspection, the numerics (or None), the seconds
    each part took, and a ``warning`` event for each part that failed and was left out."""

    inspections: Mapping[str, InspectionData] = field(default_factory=dict)
    numerics: Numerics | None = None
    seconds: Mapping[str, float] = field(default_factory=dict)
    events: tuple[Event, ...] = ()


def analyse(request: ProfileRequest, comparison: Comparison) -> Analyses:
    """Inspect each plan and analyse the numerics, after the timed steps (as ``request`` asks).

    A failure of a part (e.g. out of memory in the instrumented step) leaves it out, with a
    ``warning`` event and a logged warning.
    """
    values: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    events: list[Event] = []
    jobs = (
        # A distributed profile has per-rank memory from its run; the inspection is one process's.
        ("inspection", request.inspect and not request.distributed, inspect_plans),
        ("numerics", request.numerics, analyze_numerics),
    )
    for name, wanted, run in jobs:
        if not wanted or not comparison.results:
            continue
        start = time.perf_counter()
        try:
            values[name] = run(request, comparison)
        except (RuntimeError, ValueError) as exc:
            message = f"the {name} section was left out: {type(exc).__name__}: {exc}"
            log.warning(message)
            events.append(Event("warning", message, {"section": name}))
            continue
        seconds[name] = time.perf_counter() - start
    if "numerics" in values and getattr(comparison, "compiled", None):
        events.append(Event("compile", NUMERICS_COMPILED, {"section": "numerics"}))
    return Analyses(values.get("inspection") or {}, values.get("numerics"), seconds, tuple(events))


def _model_source(request: ProfileRequest) -> tuple[Any, Any, Any]:
    """(model or workload name, batches, loss_fn) of a profile request."""
    if request.model is not None:
        return request.model, request.batches, request.loss_fn
    return request.workload, None, None


def inspect_plans(request: ProfileRequest, comparison: Comparison) -> dict[str, InspectionData]:
    """Label -> ``InspectionData`` for every plan that ran to the end.

    Runs after the measurement on a copy of the model, so it never touches the speed figures.
    A compiled plan gets the eager step of its precision (inspected once per precision plan),
    labelled so and with what the inspection cannot see of a compiled graph as its first flags
    (:func:`~precision_nb.engine.compile.visibility.mark_compiled`).
    """
    model, batches, loss_fn = _model_source(request)
    out: dict[str, InspectionData] = {}
    by_plan: dict[Any, InspectionData] = {}
    for label, result in comparison.results.items():
        if label in comparison.failures:
            continue
        if result.plan not in by_plan:
            by_plan[result.plan] = run_inspection(
                model, batches, result.plan, preset=request.preset, loss_fn=loss_fn,
                device=result.device,
            )  # fmt: skip
        data = by_plan[result.plan]
        compiled = getattr(result.explanation, "compile", None)
        if compiled is not None and compiled.enabled:
            data = mark_compiled(copy.deepcopy(data), compiled, label)
        out[label] = data
    return out


def scaled_run(comparison: Comparison) -> RunResult | None:
    """The first run with a grad scaler and a scale history (the fp16 plan), or None."""
    for result in comparison.results.values():
        if result.plan.use_scaler and result.scale_history:
            return result
    return None


def analyze_numerics(request: ProfileRequest, comparison: Comparison) -> Numerics:
    """A :class:`~precision_nb.views.report.numerics.Numerics` of the profiled model; the fp16
    plan's scale history is overlaid when there is one."""
    model, batches, loss_fn = _model_source(request)
    run = scaled_run(comparison)
    history = run.scale_history if run is not None else []
    scales = [h.get("loss_scale") for h in history if h.get("loss_scale")]
    devices = [r.device for r in comparison.results.values()]
    result = analyze(
        model,
        batches,
        loss_fn=loss_fn,
        device=devices[0] if devices else request.device,
        scale=scales[-1] if scales else None,
        preset=request.preset,
    )
    return Numerics(result, run)
