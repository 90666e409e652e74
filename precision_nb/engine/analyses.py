"""The analyses after a comparison, by one rule for ``profile`` and the panel: each plan's
inspection (memory by kind and dtype, op dtype trace) and one numerics analysis of the model.

The rule: every plan that ran to the end is inspected, once per resolved precision plan (a
compiled plan gets its eager twin's step, labelled so, with what the inspection cannot see of a
compiled graph first); the numerics analyse one fp32 step of the model on the plans' device, at
the last loss scale of the run that used a grad scaler (its history overlaid). Both run after
the timed steps, on copies, so they never touch the speed figures. A part that fails is left
out with a ``warning`` event; the measurement is kept. Nothing here draws or writes.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from precision_nb.core.events import Event
from precision_nb.engine.compile.visibility import mark_compiled
from precision_nb.engine.inspect import InspectionData, run_inspection
from precision_nb.engine.numerics.analysis import DEFAULT_FORMATS, NumericsResult, analyze
from precision_nb.engine.results import RunResult

__all__ = [
    "NUMERICS_COMPILED",
    "AnalysisTarget",
    "Analyses",
    "ModelSource",
    "analyse",
    "analyse_numerics",
    "cache_key",
    "inspect_targets",
    "scaled_run",
    "targets_of",
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
class ModelSource:
    """What the analyses instrument: a module with its batches and loss, or a workload name."""

    model: Any
    batches: Any = None
    loss_fn: Any = None
    preset: str = "tiny"

    @classmethod
    def of(cls, request: Any) -> ModelSource:
        """The model of a :class:`~precision_nb.engine.request.RunRequest`."""
        if isinstance(request.model, str):
            return cls(request.model, None, None, request.preset)
        return cls(request.model, request.batches, request.loss_fn, request.preset)


@dataclass(frozen=True)
class AnalysisTarget:
    """A plan to inspect: its label, resolved plan, device, simulated capabilities (or None) and
    its compile plan (None or eager: inspected as it is)."""

    label: str
    plan: Any
    device: str
    capabilities: Any = None
    compile: Any = None


@dataclass(frozen=True)
class Analyses:
    """What :func:`analyse` computed: label -> inspection, the numerics (or None) with the scaled
    run it overlays, the seconds each part took, and a ``warning`` event per part left out."""

    inspections: Mapping[str, InspectionData] = field(default_factory=dict)
    numerics: NumericsResult | None = None
    scaled: RunResult | None = None
    seconds: Mapping[str, float] = field(default_factory=dict)
    events: tuple[Event, ...] = ()


def targets_of(
    results: Mapping[str, RunResult], failed: Iterable[str] = ()
) -> list[AnalysisTarget]:
    """The plans of a comparison that ran to the end, as inspection targets."""
    gone = set(failed)
    return [
        AnalysisTarget(
            label, r.plan, str(r.device), compile=getattr(r.explanation, "compile", None)
        )
        for label, r in results.items()
        if label not in gone and getattr(r, "plan", None) is not None
    ]


def inspect_targets(
    source: ModelSource,
    targets: Iterable[AnalysisTarget],
    cache: MutableMapping[Any, InspectionData] | None = None,
) -> dict[str, InspectionData]:
    """Label -> inspection of each target: one instrumented step per (plan, device, capabilities),
    kept in ``cache`` (a caller's dict keeps them across calls); a compiled target is marked."""
    cache = {} if cache is None else cache
    out: dict[str, InspectionData] = {}
    for t in targets:
        key = cache_key(source, t)
        if key not in cache:
            cache[key] = run_inspection(
                source.model, source.batches, t.plan, preset=source.preset,
                loss_fn=source.loss_fn, device=t.device, capabilities=t.capabilities,
            )  # fmt: skip
        data = cache[key]
        if t.compile is not None and t.compile.enabled:
            data = mark_compiled(copy.deepcopy(data), t.compile, t.label)
        out[t.label] = data
    return out


def cache_key(source: ModelSource, target: AnalysisTarget | None) -> Any:
    """What an inspection of ``target`` depends on: its plan, device, simulated capabilities and
    the model (a workload by name and preset, a module by identity); the model alone for None."""
    model = (source.model, source.preset) if isinstance(source.model, str) else id(source.model)
    return model if target is None else (target.plan, target.device, target.capabilities, model)


def scaled_run(results: Mapping[str, RunResult]) -> RunResult | None:
    """The first run with a grad scaler and a scale history, or None."""
    for result in results.values():
        plan = getattr(result, "plan", None)
        if getattr(plan, "use_scaler", False) and getattr(result, "scale_history", None):
            return result
    return None


def analyse_numerics(
    source: ModelSource,
    device: Any,
    run: RunResult | None,
    formats: Sequence[Any] = DEFAULT_FORMATS,
) -> NumericsResult:
    """One numerics analysis of the model on ``device`` in ``formats``, at the last loss scale
    of ``run``."""
    history = run.scale_history if run is not None else []
    scales = [h.get("loss_scale") for h in history if h.get("loss_scale")]
    return analyze(
        source.model, source.batches, loss_fn=source.loss_fn, device=device, formats=formats,
        scale=scales[-1] if scales else None, preset=source.preset,
    )  # fmt: skip


def analyse(request: Any, comparison: Any) -> Analyses:
    """Inspect each plan and analyse the numerics of ``comparison``, as ``request`` asks
    (``request.analyses``; a distributed comparison has per-rank memory from its run, so it
    is not inspected here)."""
    source = ModelSource.of(request)
    results = comparison.results
    run = scaled_run(results)
    device = next((r.device for r in results.values()), request.device)
    asked = set(request.analyses) if results else set()
    jobs: dict[str, Callable[[], Any]] = {}
    if "inspect" in asked and request.distributed is None:
        targets = targets_of(results, comparison.failures)
        jobs["inspection"] = lambda: inspect_targets(source, targets)
    if "numerics" in asked:
        jobs["numerics"] = lambda: analyse_numerics(source, device, run)
    values: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    events: list[Event] = []
    for name, job in jobs.items():
        start = time.perf_counter()
        try:
            values[name] = job()
        except (RuntimeError, ValueError) as exc:
            message = f"the {name} section was left out: {type(exc).__name__}: {exc}"
            log.warning(message)
            events.append(Event("warning", message, {"section": name}))
            continue
        seconds[name] = time.perf_counter() - start
    if "numerics" in values and comparison.compiled:
        events.append(Event("compile", NUMERICS_COMPILED, {"section": "numerics"}))
    return Analyses(
        values.get("inspection") or {}, values.get("numerics"), run, seconds, tuple(events)
    )
