"""What a fit works out once before its first step: seed, sizes and FLOPs, the loss check, and
what the run records then: the plan's fallbacks and the autocast probe.

Every fallback of the plan (the explanation's decisions with ``fallback=True``) and of fused AdamW
(what ``build_optimizer`` really built) becomes an ``Event("fallback", ...)`` of the run and a
``logging`` warning. ``verify_autocast`` runs one small matmul under the plan's autocast and is
recorded as an ``Event("verify", ...)``; a dtype other than the plan's is also a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from precision_nb.core.amp import verify_autocast
from precision_nb.core.events import Event
from precision_nb.engine.batches import BatchShape, batch_shape
from precision_nb.engine.metrics import (
    Peak,
    compute_dtype,
    count_step_flop_classes,
    peak_flops,
    tf32_state,
)
from precision_nb.engine.peaks import cuda_fp32_peak

if TYPE_CHECKING:
    from precision_nb.core.plan import PrecisionPlan
    from precision_nb.engine.train_config import TrainConfig

log = logging.getLogger(__name__)

_FUSED_FIELD = "fused AdamW"


def seed_everything(seed: int) -> None:
    """Seed torch's CPU generator and those of available accelerators.

    Same effect as ``torch.manual_seed`` for CPU, CUDA and MPS, without its lazy-CUDA bookkeeping:
    while CUDA is not initialised, ``torch.manual_seed`` formats a stack trace on every call
    (still so in torch 2.13; benchmarks/bench_fit.py shows what a fit's setup costs).
    """
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        torch.mps.manual_seed(seed)


@dataclass(frozen=True)
class RunShape:
    """What a fit works out from its first microbatch: the batch's shape, FLOPs per optimizer
    step, the peak FLOP/s its MFU divides by and the ``RunResult.workload`` entry."""

    shape: BatchShape
    flops_per_step: int
    peak: Peak | None
    workload: dict[str, Any]
    events: tuple[Event, ...] = ()


def describe_run(
    model: torch.nn.Module,
    device: torch.device,
    plan: PrecisionPlan,
    cfg: TrainConfig,
    info: dict[str, Any],
    first: Any,
    loss_and_task: Callable[[Any], tuple[torch.Tensor, str | None]],
) -> RunShape:
    """Shape, FLOPs per step and peak FLOP/s of a fit from its first microbatch ``first``.

    A CUDA fp32 plan's peak is that of its FLOP mix (:func:`~precision_nb.engine.peaks.
    cuda_fp32_peak`: convolutions and matmuls at the TF32 peak where the flags send them there).

    ``loss_and_task(batch)`` computes the loss as the fit does (FLOPs are counted by running it
    once per model and shape; the count is cached). ``info``: the workload info the trainer was
    given (its ``task`` names the task when the cached count ran no loss).
    """
    seen: list[str | None] = []

    def loss() -> torch.Tensor:
        value, task = loss_and_task(first)
        seen.append(task)
        return value

    by_class = count_step_flop_classes(model, batch_shape(first, None).signature, loss)
    flops_mb = sum(by_class.values())
    # The FLOP count is cached per model shape, so on a cache hit the loss did not run and the
    # task is unknown here (a built-in workload names its own); tokens per step do not depend on
    # it: batch_shape reads them from the batch's token ids.
    task = (seen[-1] if seen else None) or info.get("task")
    shape = batch_shape(first, task)
    flops_step = flops_mb * cfg.accumulation
    dtype = compute_dtype(plan)
    peak = peak_flops(device, dtype, calibrate=cfg.measure_peak)
    tf32 = tf32_state() if device.type == "cuda" and dtype == torch.float32 else None
    if peak is not None and tf32 is not None:
        # the datasheet fp32 column is only right for the FLOPs that did not run as TF32
        peak = cuda_fp32_peak(torch.cuda.get_device_name(device), by_class, tf32) or peak
    workload = {
        "name": info.get("name", type(model).__name__),
        "preset": info.get("preset"),
        "batch_size": shape.samples,
        "accumulation": cfg.accumulation,
        "params": sum(p.numel() for p in model.parameters()),
        "flops_per_step": flops_step,
        "flops_source": "torch.utils.flop_counter (one microbatch forward+backward x K)",
        "flops_by_class": {k: v * cfg.accumulation for k, v in by_class.items()},
        "peak_flops_per_s": peak.flops_per_s if peak else None,
        "peak_source": peak.source if peak else None,
        "peak_flops_low": peak.low if peak else None,
        "peak_flops_high": peak.high if peak else None,
        "task": task,
        "dims": info.get("dims", {}),
        "tf32": tf32,
    }
    events = ()
    if peak is None:
        events = (Event("calibration", f"no peak FLOP/s known for {device}: mfu is None"),)
    return RunShape(shape, flops_step, peak, workload, events)


def check_loss(loss: Any, loss_fn: Any) -> None:
    """The first loss of a fit must be a scalar tensor (checked once: not per step)."""
    if isinstance(loss, torch.Tensor) and loss.dim() == 0:
        return
    source = "the model's loss output"
    if loss_fn is not None:
        source = f"loss_fn {getattr(loss_fn, '__name__', type(loss_fn).__name__)!r}"
    got = f"a {type(loss).__name__}"
    if isinstance(loss, torch.Tensor):
        got = f"a tensor of shape {tuple(loss.shape)}"
    raise ValueError(
        f"{source} returned {got}; expected a scalar (0-dimensional) loss tensor, e.g. "
        "reduce it with .mean() or .sum()"
    )


def fallback_events(explanation: Any, optimizer_outcome: Any) -> list[Event]:
    """One ``fallback`` event per decision not honoured as asked, each logged as a warning."""
    events = []
    for decision in getattr(explanation, "fallbacks", ()):
        if decision.field == _FUSED_FIELD:
            continue  # the optimizer's real outcome below says what was built
        requested = getattr(getattr(explanation, "config", None), decision.field, None)
        events.append(
            Event(
                "fallback",
                f"{decision.field}: {decision.outcome}. {decision.reason}",
                {
                    "field": decision.field,
                    "requested": None if requested is None else str(requested),
                    "used": decision.outcome,
                },
            )
        )
    outcome = optimizer_outcome
    # fused was asked for (True), or left to the probe on CUDA, where it is expected
    attempted = outcome is not None and (
        outcome.requested is True
        or (outcome.requested is None and str(outcome.device).startswith("cuda"))
    )
    if attempted and not outcome.used:
        events.append(
            Event(
                "fallback",
                f"fused AdamW: plain AdamW. {outcome.reason}",
                {"field": _FUSED_FIELD, "requested": outcome.requested, "used": "plain AdamW"},
            )
        )
    for event in events:
        log.warning("%s", event.message)
    return events


def verify_event(plan: Any, device: torch.device) -> Event:
    """Run ``verify_autocast`` on the training device and record what it found."""
    check = verify_autocast(plan, device)
    data = {
        "requested": str(check.requested_dtype),
        "computed": None if check.computed_dtype is None else str(check.computed_dtype),
        "ok": check.ok,
    }
    if not check.ok:
        log.warning("autocast check: %s", check.detail)
    return Event("verify", f"autocast check: {check.detail}", data)
