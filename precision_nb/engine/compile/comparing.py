"""What a comparison does for its compiled plans: graph breaks found before anything compiles,
plans dynamo cannot trace left out (their eager twins still measured), and the compile reports.

:func:`check_breaks` runs before the measurement (``torch._dynamo.explain`` resets dynamo, so it
must not run between a plan's compile and its measured steps). A compiled plan whose forward dynamo
captures no op of is dropped with a ``compile`` event naming the first break's reason: compiling it
would only add overhead. :func:`collect` builds one
:class:`~precision_nb.engine.compile.report.CompiledPlanReport` per compiled plan from the trainers'
compile logs, the measurement and the runs' losses.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any

import torch

from precision_nb.core.events import Event
from precision_nb.core.resolution import Explanation
from precision_nb.engine.batches import BatchSource, to_device
from precision_nb.engine.compile.breaks import GraphBreaks, graph_breaks
from precision_nb.engine.compile.record import CompileRecord, reset_compiled
from precision_nb.engine.compile.report import CompiledPlanReport, compile_reports
from precision_nb.engine.metrics import compute_dtype

log = logging.getLogger(__name__)

__all__ = ["check_breaks", "collect", "eager_twins"]


def eager_twins(explanations: Mapping[str, Explanation]) -> dict[str, str | None]:
    """Compiled label -> the label of the eager plan of the same precision (None: not planned)."""
    eager = {
        (e.plan, e.config.loss_scale_lab): label
        for label, e in explanations.items()
        if not e.compile.enabled
    }
    return {
        label: eager.get((e.plan, e.config.loss_scale_lab))
        for label, e in explanations.items()
        if e.compile.enabled
    }


def check_breaks(
    explanations: Mapping[str, Explanation],
    model: torch.nn.Module,
    batches: Any,
    loss_fn: Any,
    events: list[Event],
) -> tuple[dict[str, GraphBreaks], list[str]]:
    """The graph breaks of every compiled plan's forward (one explain per distinct precision
    plan) and the compiled labels to drop because dynamo cannot trace the model at all."""
    compiled = {label: e for label, e in explanations.items() if e.compile.enabled}
    if not compiled:
        return {}, []
    first = next(iter(compiled.values()))
    device = torch.device(first.device)
    batch = to_device(BatchSource(batches).get(0), device)
    found: dict[str, GraphBreaks] = {}
    by_plan: dict[Any, GraphBreaks] = {}
    work = copy.deepcopy(model).to(device)
    cuda = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):  # explain runs the model: training draws the same
        for label, e in compiled.items():
            if e.plan not in by_plan:
                by_plan[e.plan] = graph_breaks(work, batch, e.plan, loss_fn, label=label)
            found[label] = by_plan[e.plan]
    reset_compiled()
    dropped = []
    for label, breaks in found.items():
        data = {"run": label, "breaks": breaks.rows(), "traceable": breaks.forward.traceable}
        for line in breaks.lines():
            events.append(Event("compile", f"{label}: graph breaks: {line}", data))
        if not breaks.forward.traceable:
            dropped.append(label)
            events.append(
                Event(
                    "compile",
                    f"{label} not run: {breaks.forward.message()}; the eager plans are measured "
                    "as usual",
                    data,
                )
            )
    return found, dropped


def _record(label: str, warm: Any, run: Any) -> CompileRecord | None:
    """The compile record of ``label``: the warm-up trainer's (it compiled), with the measured
    trainer's compilations after it (it recompiles only if a guard failed); the measured
    trainer's alone without a warm-up."""
    if warm is not None and warm.compile_log.compiled:
        record = warm.compile_log.record()
        return record.merged(run.compile_log.record(), "measured") if run is not None else record
    if run is not None:
        return run.compile_log.record()
    return None


def collect(
    explanations: Mapping[str, Explanation],
    measurement: Any,
    results: Mapping[str, Any],
    trainers: Mapping[str, Any],
    warm_trainers: Mapping[str, Any],
    breaks: Mapping[str, GraphBreaks],
) -> tuple[dict[str, CompiledPlanReport], list[Event]]:
    """The compile report of every compiled plan that has a compile record, and its events."""
    twins = eager_twins(explanations)
    records: dict[str, CompileRecord] = {}
    for label in twins:
        record = _record(label, warm_trainers.get(label), trainers.get(label))
        if record is not None:
            records[label] = record
    losses, steps = {}, {}
    for label, result in results.items():
        logged = getattr(result, "records", None) or []
        losses[label] = [float(r["loss"]) for r in logged]
        steps[label] = [int(r["step"]) - 1 for r in logged]
    fp32 = next(
        (lab for lab, e in explanations.items() if e.plan.mode == "fp32" and not e.compile.enabled),
        None,
    )
    dtypes = {label: compute_dtype(e.plan) for label, e in explanations.items()}
    plans = {label: (e.compile, e.plan.mode) for label, e in explanations.items()}
    reports = compile_reports(
        measurement, records, twins, losses, dtypes, fp32_label=fp32, breaks=breaks, steps=steps,
        plans=plans,
    )  # fmt: skip
    events = []
    for report in reports.values():
        data = report.to_dict()
        events += [Event("compile", line, data) for line in report.lines()]
    return reports, events
