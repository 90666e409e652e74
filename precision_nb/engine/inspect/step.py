"""One instrumented training step on a copy of the model: memory by kind and dtype + op trace.

:func:`run_inspection` deep-copies the model, builds its own AdamW (and grad scaler) for the copy,
and runs one forward + backward + optimizer step under the plan with the op tracer and the
saved-tensor hooks on. The caller's model, optimizer and RNG stream are never touched (the RNG
state is forked and restored), and nothing of it runs inside timed steps.

Where the plan's device is simulated (a capability preset naming hardware this machine lacks),
nothing can run: the result carries the analytic memory rows (``bytes`` None) and autocast's
policy table for that device type, read from the installed torch (not a trace), labelled as such.
"""

from __future__ import annotations

import copy
import gc
import logging
import time
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import nn

from precision_nb.core.events import Event
from precision_nb.core.optim import OptimizerConfig
from precision_nb.core.plan import PrecisionPlan
from precision_nb.core.resolution import explain_precision
from precision_nb.engine.batches import BatchSource, output_to_loss, split_batch, to_device
from precision_nb.engine.inspect import memory as mem
from precision_nb.engine.inspect.op_trace import Flag, OpTracer, flags, summarise
from precision_nb.engine.inspect.policy import DISPATCH_KEYS, SOURCE, policy_rows
from precision_nb.engine.memory_probe import host_rss
from precision_nb.engine.precision import Precision, lab_applies, run_label
from precision_nb.engine.remedies import build_plan_optimizer
from precision_nb.engine.request import prepare
from precision_nb.engine.results import DeviceOutOfMemoryError
from precision_nb.engine.true_precision import cast_floating, cast_model
from precision_nb.engine.workloads import Workload

log = logging.getLogger(__name__)


@dataclass
class InspectionData:
    """Plain rows of one inspection (the views turn them into DataFrames)."""

    label: str
    plan: PrecisionPlan
    device: str
    simulated: bool
    memory: list[dict[str, Any]] = field(default_factory=list)
    ops: list[dict[str, Any]] = field(default_factory=list)
    summary: list[dict[str, Any]] = field(default_factory=list)
    policy: list[dict[str, Any]] = field(default_factory=list)
    flags: list[Flag] = field(default_factory=list)
    unattributed: list[dict[str, Any]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    seconds: float = 0.0
    loss: float | None = None

    def model_bytes(self) -> int:
        """Sum of the counted (model-memory) rows' measured bytes."""
        return sum(r["bytes"] or 0 for r in self.memory if r["counted"])

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for key in ("memory", "ops", "summary", "policy", "unattributed"):
            out[key] = [dict(r) for r in out[key]]
        out["plan"] = self.plan.to_dict()
        for key in ("flags", "events"):
            out[key] = [item.to_dict() for item in out[key]]
        return out


def _storages(tensors: Any) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors if isinstance(t, torch.Tensor)}


def _batch_tensors(batch: Any) -> list[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return [batch]
    items = batch.values() if isinstance(batch, dict) else batch
    return [t for t in items if isinstance(t, torch.Tensor)]


def _runnable_here(device_type: str) -> bool:
    if device_type == "cpu":
        return True
    if device_type == "cuda":
        return torch.cuda.is_available()
    if device_type == "mps":
        mps = getattr(torch.backends, "mps", None)
        return bool(mps is not None and mps.is_available())
    return False


def resolve(
    precision: Any, device: Any, capabilities: Any, optimizer: OptimizerConfig | None
) -> tuple[PrecisionPlan, torch.device, str, list[Event]]:
    """The plan, device, label and resolution events for a plan, config or mode string."""
    if isinstance(precision, PrecisionPlan):
        dev = torch.device(precision.device_type if device in (None, "auto") else str(device))
        return precision, dev, run_label(precision.label, False), []
    explanation = explain_precision(
        precision if precision is not None else "auto", device, capabilities, optimizer
    )
    events = [
        Event("fallback", f"{d.field}: {d.reason}", {"field": d.field, "used": d.outcome})
        for d in explanation.fallbacks
    ]
    label = run_label(explanation.plan.label, lab_applies(explanation))
    return explanation.plan, torch.device(explanation.device), label, events


def simulated_inspection(
    model: nn.Module, plan: PrecisionPlan, device: torch.device, label: str, events: list[Event]
) -> InspectionData:
    """What can be said without running: analytic memory rows and autocast's policy table."""
    rows = mem.expected_rows(model, plan, "expected only: simulated device (AdamW state)")
    policy = policy_rows(device.type, plan.dtype) if device.type in DISPATCH_KEYS else []
    message = (
        f"{device} is simulated: nothing ran. Memory shows hand arithmetic only; the ops table is "
        f"for {device.type}: {SOURCE}"
        if policy
        else f"{device} is simulated and autocast has no policy for its device type"
    )
    return InspectionData(
        label,
        plan,
        str(device),
        True,
        memory=rows,
        policy=policy,
        flags=[Flag("simulated", message, {"device": str(device)})],
        events=events,
    )


def _oom_error(exc: BaseException, plan: PrecisionPlan, device: torch.device, batch: Any) -> Any:
    """The same message a run gives when the device runs out of memory."""
    peak = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else host_rss()
    kind = "cuda_allocated" if device.type == "cuda" else "host_rss"
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    samples = int(batch[0].shape[0]) if batch and batch[0].dim() else "?"
    msg = (
        f"out of memory on {device} with plan {plan.mode} (dtype {plan.dtype}, scaler "
        f"{plan.use_scaler}), batch size {samples} x 1 microbatches, peak {peak / 2**20:.0f} MiB "
        f"({kind}); memory was released. Use a smaller preset or batch, more accumulation, or a "
        "mixed-precision plan. (during the inspection step)"
    )
    return DeviceOutOfMemoryError(msg, None)


def run_inspection(
    model: nn.Module | Workload | str,
    batches: Any = None,
    precision: Any = "auto",
    *,
    preset: str = "tiny",
    loss_fn: Any = None,
    device: Any = "auto",
    capabilities: Any = None,
    optimizer: OptimizerConfig | None = None,
) -> InspectionData:
    """Inspect one training step of ``model`` on its first batch under ``precision``.

    ``model``: an ``nn.Module`` with ``batches``, or a built-in workload (name + ``preset``, or a
    :class:`Workload`) built as ``fit()`` builds it. ``precision``: a :class:`PrecisionPlan`, a
    ``PrecisionConfig`` or a mode string. ``capabilities``: a preset name or ``Capabilities``
    (simulated hardware -> autocast's policy table). Raises ``DeviceOutOfMemoryError`` (the run's
    message) when the step does not fit.
    """
    if isinstance(model, (str, Workload)):
        with torch.random.fork_rng(devices=[]):
            auto = device in (None, "auto")
            target = device if auto or _runnable_here(torch.device(device).type) else "cpu"
            model, batches, _info = prepare(model, batches, preset, target, 0)
    if not isinstance(model, nn.Module):
        raise ValueError(f"model has type {type(model).__name__}; allowed: a torch.nn.Module")
    if not mem.trainable(model):
        raise ValueError(f"model {type(model).__name__} has no trainable parameters to inspect")
    plan, dev, label, events = resolve(precision, device, capabilities, optimizer)
    if not _runnable_here(dev.type):
        return simulated_inspection(model, plan, dev, label, events)
    source = BatchSource(batches)
    if source.one_shot:
        msg = "batches is a one-shot iterator: the inspection consumed its first batch"
        log.warning(msg)
        events.append(Event("warning", msg))
    cuda = [dev] if dev.type == "cuda" else []
    batch = None
    with torch.random.fork_rng(devices=cuda):
        try:
            # The peak window opens before the copy and the batch exist: both are the step's
            # memory (a model already on the GPU is copied there), as the counted rows say.
            base = mem.start_peak_window(dev)
            work = _copy(model)
            cast_model(work, plan)  # a true plan: the copy in the plan's dtype (the user's
            # model is not touched); a model a true trainer cast already is left as it is
            batch = to_device(source.get(0), dev)
            if plan.true_weights:
                batch = cast_floating(batch, plan.dtype)
            return _instrumented_step(
                work, batch, plan, dev, label, events, loss_fn, optimizer, base
            )
        except torch.OutOfMemoryError as exc:
            work = None
            raise _oom_error(exc, plan, dev, _batch_tensors(batch or ())) from exc


def _instrumented_step(
    work: nn.Module,
    batch: Any,
    plan: Any,
    dev: torch.device,
    label: str,
    events: list,
    loss_fn: Any,
    optimizer: Any,
    base: Any,
) -> InspectionData:
    """One training step of ``work`` (the copy) on ``batch`` under the tracers: its memory rows,
    op rows, flags and what could not be attributed."""
    t0 = time.perf_counter()
    opt = build_plan_optimizer(work, optimizer or OptimizerConfig(), dev, plan)
    work.zero_grad(set_to_none=True)
    amp = Precision.for_plan(plan, dev)
    amp.start_fit()  # a fresh scaler with GradScaler's default settings, as a first fit has
    param_ptrs = _storages(work.parameters())
    input_ptrs = _storages(_batch_tensors(batch))
    tracer = OpTracer(param_ptrs, input_ptrs)
    saved = mem.SavedTensors(param_ptrs, input_ptrs, tracer)
    args, kwargs, labels = split_batch(batch, work, loss_fn)
    with tracer, saved:
        with amp.forward_context():
            out = work(*args, **kwargs)
            loss, _task = output_to_loss(out, labels, loss_fn)
        del out
        tracer.phase = "backward"
        amp.backward(loss)
    rows = mem.parameter_rows(work) + mem.gradient_rows(work)
    amp.step(opt)
    rows += mem.optimizer_rows(work, opt)
    rows += mem.weight_copy_rows(work, tracer.weight_copy_sizes(), plan, tracer.parameter_casts())
    rows += saved.rows() + mem.scaler_rows(amp.state_tensors())
    rows += mem.device_rows(dev, rows, base)
    ops = tracer.rows(plan)
    unattributed = tracer.unattributed_rows() + [
        {"what": "saved tensor", "reason": reason, "count": n}
        for reason, n in saved.unattributed.items()
    ]
    found = flags(ops, plan)
    if unattributed:
        n = sum(u["count"] for u in unattributed)
        found.append(
            Flag(
                "unattributed",
                f"{n} ops or saved tensors could not be fully "
                "attributed (see .unattributed for the reasons)",
                {"count": n},
            )
        )
    loss_value = float(loss.detach().float())
    return InspectionData(
        label,
        plan,
        str(dev),
        False,
        memory=rows,
        ops=ops,
        summary=summarise(ops),
        flags=found,
        unattributed=unattributed,
        events=events,
        seconds=time.perf_counter() - t0,
        loss=loss_value,
    )


def _copy(model: nn.Module) -> nn.Module:
    try:
        return copy.deepcopy(model)
    except (TypeError, copy.Error) as exc:
        raise ValueError(
            f"model {type(model).__name__} cannot be copied for inspection (copy.deepcopy "
            f"raised {type(exc).__name__}: {exc}); inspection never trains the model itself"
        ) from exc
