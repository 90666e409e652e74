"""What a fit works out once before its first step: seed, scaler state, sizes, loss check."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from precision_nb.core.events import Event
from precision_nb.engine.batches import BatchShape, batch_shape
from precision_nb.engine.metrics import Peak, compute_dtype, count_step_flops, peak_flops

if TYPE_CHECKING:
    from precision_nb.engine.amp_step import AmpStep
    from precision_nb.engine.session import FitSession
    from precision_nb.engine.train_config import TrainConfig
    from precision_nb.engine.trainer import Trainer


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


def restore_scaler(trainer: Trainer, amp: AmpStep, cfg: TrainConfig) -> list[Event]:
    """Load scaler state from a checkpoint loaded since the last fit; events say what happened."""
    events = []
    pending = trainer._pending_scaler
    if pending is not None:
        if amp.scaler is not None:
            amp.load_state_dict(pending)
            scale = float(pending.get("scale", cfg.init_scale))
            events.append(
                Event(
                    "checkpoint",
                    f"grad scaler state restored from checkpoint (scale {scale:g})",
                    {"scale": scale},
                )
            )
        else:
            msg = "checkpoint grad scaler state not used: this plan has no scaler"
            events.append(Event("checkpoint", msg))
        trainer._pending_scaler = None
    if cfg.overflow_at_steps and amp.scaler is None:
        events.append(
            Event(
                "warning",
                f"overflow_at_steps={cfg.overflow_at_steps} ignored: plan {trainer.plan.mode} has "
                "no grad scaler (use fp16 on CUDA or "
                "PrecisionConfig(mode='fp16', loss_scale_lab=True))",
            )
        )
    return events


def describe_run(session: FitSession, first: Any) -> tuple[BatchShape, int, Peak | None]:
    """Batch shape, FLOPs per step and peak FLOP/s from the first microbatch; fills
    ``result.workload`` (FLOPs are counted once per workload and shape)."""
    t, cfg, result = session.trainer, session.cfg, session.result
    t.workload_info.setdefault("batch_size", batch_shape(first, None).samples)
    flops_mb = count_step_flops(
        t.model, batch_shape(first, None).signature, lambda: session.loss(first)
    )
    # The FLOP count is cached per model shape, so on a cache hit the loss did not run and the
    # task is unknown; the workload's own task keeps tokens/s for built-in workloads.
    task = session._task or t.workload_info.get("task")
    session._task = task
    shape = batch_shape(first, task)
    flops_step = flops_mb * cfg.accumulation
    peak = peak_flops(t.device, compute_dtype(t.plan), calibrate=cfg.measure_peak)
    result.workload = {
        "name": t.workload_info.get("name", type(t.model).__name__),
        "preset": t.workload_info.get("preset"),
        "batch_size": shape.samples,
        "accumulation": cfg.accumulation,
        "params": sum(p.numel() for p in t.model.parameters()),
        "flops_per_step": flops_step,
        "flops_source": "torch.utils.flop_counter (one microbatch forward+backward x K)",
        "peak_flops_per_s": peak.flops_per_s if peak else None,
        "peak_source": peak.source if peak else None,
        "peak_flops_low": peak.low if peak else None,
        "peak_flops_high": peak.high if peak else None,
        "task": task,
        "dims": t.workload_info.get("dims", {}),
    }
    if peak is None:
        result.events.append(
            Event("calibration", f"no peak FLOP/s known for {t.device}: mfu is None")
        )
    return shape, flops_step, peak


def check_loss(loss: Any, loss_fn: Any) -> None:
    """The first loss of a fit must be a scalar tensor (checked once: not per step)."""
    if isinstance(loss, torch.Tensor) and loss.dim() == 0:
        return
    source = (
        f"loss_fn {getattr(loss_fn, '__name__', type(loss_fn).__name__)!r}"
        if loss_fn is not None
        else "the model's loss output"
    )
    got = (
        f"a tensor of shape {tuple(loss.shape)}"
        if isinstance(loss, torch.Tensor)
        else f"a {type(loss).__name__}"
    )
    raise ValueError(
        f"{source} returned {got}; expected a scalar (0-dimensional) loss tensor, e.g. "
        "reduce it with .mean() or .sum()"
    )
