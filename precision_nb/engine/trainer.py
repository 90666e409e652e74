"""The training loop: ``Trainer`` / ``fit()`` with autocast, grad scaling, accumulation and records.

Lifecycle of one ``fit()`` call (the spec's trainer, plus what the project adds):

1. a fresh grad scaler from ``make_grad_scaler(plan)``; scaler state from a checkpoint loaded
   since the previous fit is restored into it (deferred restore);
2. optimizer attempts in chunks that end at logging points, so a run never overshoots the
   requested step count; each attempt runs K microbatches (loss / K), optional clipping after
   ``scaler.unscale_``, one optimizer step, one LR-schedule step, ``zero_grad(set_to_none=True)``;
3. losses, loss scales and grad norms stay on the device; at each logging point one host transfer
   brings the chunk home; a step the scaler skipped (its scale went down) is recorded and not
   counted; memory is read then too.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from precision_nb.core.amp import autocast_context, make_grad_scaler
from precision_nb.core.device import resolve_device
from precision_nb.core.events import Event
from precision_nb.core.optim import OptimizerConfig, build_optimizer
from precision_nb.core.plan import PrecisionConfig
from precision_nb.core.resolution import explain_precision
from precision_nb.engine import checkpoint as ckpt
from precision_nb.engine.batches import (
    BatchesExhausted,
    BatchSource,
    batch_shape,
    output_to_loss,
    split_batch,
    to_device,
)
from precision_nb.engine.metrics import MemoryProbe, compute_dtype, count_step_flops, peak_flops
from precision_nb.engine.recorder import Chunk, Recorder
from precision_nb.engine.results import DeviceOutOfMemoryError, FitError, RunResult
from precision_nb.engine.train_config import TrainConfig, lr_factor
from precision_nb.engine.workloads import Workload, get_workload

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    """Seed torch's CPU generator and those of available accelerators.

    Same effect as ``torch.manual_seed`` for CPU, CUDA and MPS, without its lazy-CUDA bookkeeping,
    which formats a stack trace on every call (~1.5 ms: a visible share of a short CPU fit).
    """
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        torch.mps.manual_seed(seed)


def _move_model(model: nn.Module, device: torch.device) -> None:
    """Move ``model`` to ``device``; on any failure move it back, so it is never half-moved."""
    first = next(model.parameters(), None)
    original = first.device if first is not None else torch.device("cpu")
    try:
        model.to(device)
    except BaseException:
        model.to(original)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        raise


class Trainer:
    """Trains ``model`` on ``batches`` under a resolved precision plan; see module docstring."""

    def __init__(
        self,
        model: nn.Module,
        batches: Any,
        *,
        device: Any = "auto",
        precision: PrecisionConfig | str | None = None,
        optimizer: OptimizerConfig | None = None,
        train: TrainConfig | None = None,
        loss_fn: Callable[..., torch.Tensor] | None = None,
        workload_info: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise ValueError(f"model has type {type(model).__name__}; allowed: a torch.nn.Module")
        if not any(p.requires_grad for p in model.parameters()):
            raise ValueError(
                f"model {type(model).__name__} has no trainable parameters "
                "(none with requires_grad=True); nothing to train"
            )
        self.train = train if train is not None else TrainConfig()
        if not isinstance(self.train, TrainConfig):
            raise ValueError(f"train has type {type(train).__name__}; allowed: TrainConfig or None")
        self.precision = (
            precision
            if isinstance(precision, PrecisionConfig)
            else PrecisionConfig(mode=precision if precision is not None else "auto")
        )
        self.optimizer_config = optimizer if optimizer is not None else OptimizerConfig()
        self.explanation = explain_precision(
            self.precision, device, optimizer=self.optimizer_config
        )
        self.plan = self.explanation.plan
        self.device = torch.device(self.explanation.device)
        self.model = model
        self.source = batches if isinstance(batches, BatchSource) else BatchSource(batches)
        self.loss_fn = loss_fn
        self.workload_info = dict(workload_info or {})
        _move_model(model, self.device)
        self.optimizer = build_optimizer(model, self.optimizer_config, self.device)
        self.optimizer_outcome = getattr(self.optimizer, "precision_nb_fused", None)
        self.steps_done = 0
        self.attempts_done = 0
        self.microbatches_done = 0
        self.scaler: Any = None
        self._pending_scaler: dict[str, Any] | None = None
        self._pending_events: list[Event] = []
        self._task: str | None = None
        self.last_result: RunResult | None = None

    # ----------------------------------------------------------------------------- helpers

    @property
    def lab(self) -> bool:
        return bool(self.precision.loss_scale_lab and self.plan.use_scaler)

    @property
    def fused(self) -> bool:
        return bool(getattr(self.optimizer_outcome, "used", False))

    def scale_value(self) -> float | None:
        """The grad scaler's current loss scale (a host read; for inspection, not the loop)."""
        if self.scaler is None or getattr(self.scaler, "_scale", None) is None:
            return None
        return float(self.scaler.get_scale())

    def _loss(self, batch: Any) -> torch.Tensor:
        args, kwargs, labels = split_batch(batch)
        with autocast_context(self.plan, self.device):
            out = self.model(*args, **kwargs)
            loss, task = output_to_loss(out, labels, self.loss_fn)
        self._task = task
        return loss

    def _new_result(self, label: str) -> RunResult:
        return RunResult(
            label=label,
            plan=self.plan,
            explanation=self.explanation,
            optimizer_outcome=self.optimizer_outcome,
            device=str(self.device),
        )

    def _record_base(self, label: str) -> dict[str, Any]:
        p = self.plan.to_dict()
        return {
            "run": label,
            "mode": p["mode"],
            "dtype": p["dtype"],
            "use_scaler": p["use_scaler"],
            "autocast_enabled": p["autocast_enabled"],
            "device_type": p["device_type"],
            "device": str(self.device),
            "fused_adamw": self.fused,
            "loss_scale_lab": self.lab,
        }

    # --------------------------------------------------------------------------- fitting

    def fit(
        self,
        steps: int | None = None,
        *,
        callbacks: Sequence[Any] = (),
        stop: Any = None,
    ) -> RunResult:
        """Run ``steps`` counted optimizer steps (default ``train.steps``); returns a RunResult.

        ``callbacks``: objects with any of ``on_fit_start(result)``, ``on_log(record)``,
        ``on_fit_end(result)``. ``stop``: a ``threading.Event``-like object (``is_set()``)
        checked between steps; Ctrl-C stops the same way. Either way ``result.stopped`` is True
        and every record made so far is kept.
        """
        cfg = self.train if steps is None else dataclasses.replace(self.train, steps=steps)
        label = cfg.label or self.plan.mode + (" (loss-scale lab)" if self.lab else "")
        result = self._new_result(label)
        result.events.extend(self._pending_events)
        self._pending_events = []
        self.last_result = result
        try:
            self._fit(cfg, result, list(callbacks), stop)
        except torch.OutOfMemoryError as exc:
            raise self._oom(exc, cfg, result) from exc
        except FitError:
            raise
        except BaseException as exc:
            exc.precision_nb_result = result  # type: ignore[attr-defined]
            raise
        return result

    def _oom(self, exc: BaseException, cfg: TrainConfig, result: RunResult) -> FitError:
        probe = MemoryProbe(self.device)
        peak = probe.read().peak
        self.optimizer.zero_grad(set_to_none=True)
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        samples = self.workload_info.get("batch_size", "?")
        msg = (
            f"out of memory on {self.device} with plan {self.plan.mode} "
            f"(dtype {self.plan.dtype}, scaler {self.plan.use_scaler}), batch size {samples} "
            f"x {cfg.accumulation} microbatches, peak {peak / 2**20:.0f} MiB ({probe.kind}); "
            "memory was released. Use a smaller preset or batch, more accumulation, or a "
            "mixed-precision plan."
        )
        result.events.append(Event("oom", msg, {"peak_bytes": peak, "memory_kind": probe.kind}))
        return DeviceOutOfMemoryError(msg, result)

    def _setup_scaler(self, cfg: TrainConfig, result: RunResult) -> float | None:
        kwargs = dict(
            init_scale=cfg.init_scale,
            growth_factor=cfg.growth_factor,
            backoff_factor=cfg.backoff_factor,
            growth_interval=cfg.growth_interval,
        )
        self.scaler = make_grad_scaler(self.plan, **kwargs) if self.plan.use_scaler else None
        host_scale = cfg.init_scale if self.scaler is not None else None
        if self._pending_scaler is not None:
            if self.scaler is not None:
                self.scaler.load_state_dict(self._pending_scaler)
                host_scale = float(self._pending_scaler.get("scale", cfg.init_scale))
                result.events.append(
                    Event(
                        "checkpoint",
                        f"grad scaler state restored from checkpoint (scale {host_scale:g})",
                        {"scale": host_scale},
                    )
                )
            else:
                result.events.append(
                    Event(
                        "checkpoint",
                        "checkpoint grad scaler state not used: this plan has no scaler",
                    )
                )
            self._pending_scaler = None
        if cfg.overflow_at_steps and self.scaler is None:
            result.events.append(
                Event(
                    "warning",
                    f"overflow_at_steps={cfg.overflow_at_steps} ignored: plan {self.plan.mode} has "
                    "no grad scaler (use fp16 on CUDA or "
                    "PrecisionConfig(mode='fp16', loss_scale_lab=True))",
                )
            )
        return host_scale

    def _fit(self, cfg: TrainConfig, result: RunResult, callbacks: list[Any], stop: Any) -> None:
        if cfg.seed is not None and self.steps_done == 0 and self.attempts_done == 0:
            seed_everything(cfg.seed)
        host_scale = self._setup_scaler(cfg, result)
        probe = MemoryProbe(self.device)
        probe.reset()
        # first microbatch: shape, FLOPs (once per workload + shape), reused as microbatch 0
        first = to_device(self.source.get(self.microbatches_done), self.device)
        self._peeked: tuple[int, Any] | None = (self.microbatches_done, first)
        self.workload_info.setdefault("batch_size", batch_shape(first, None).samples)
        flops_mb = count_step_flops(
            self.model, batch_shape(first, None).signature, lambda: self._loss(first)
        )
        # The FLOP count is cached per model shape, so on a cache hit ``_loss`` did not run and
        # ``_task`` is unknown; the workload's own task keeps tokens/s for built-in workloads.
        if self._task is None:
            self._task = self.workload_info.get("task")
        shape = batch_shape(first, self._task)
        flops_step = flops_mb * cfg.accumulation
        peak = peak_flops(self.device, compute_dtype(self.plan), calibrate=cfg.measure_peak)
        params = sum(p.numel() for p in self.model.parameters())
        result.workload = {
            "name": self.workload_info.get("name", type(self.model).__name__),
            "preset": self.workload_info.get("preset"),
            "batch_size": shape.samples,
            "accumulation": cfg.accumulation,
            "params": params,
            "flops_per_step": flops_step,
            "flops_source": "torch.utils.flop_counter (one microbatch forward+backward x K)",
            "peak_flops_per_s": peak.flops_per_s if peak else None,
            "peak_source": peak.source if peak else None,
            "task": self._task,
            "dims": self.workload_info.get("dims", {}),
        }
        if peak is None:
            result.events.append(
                Event("calibration", f"no peak FLOP/s known for {self.device}: mfu is None")
            )
        for cb in callbacks:
            if hasattr(cb, "on_fit_start"):
                cb.on_fit_start(result)
        base = self._record_base(result.label)
        params_list = [p for p in self.model.parameters() if p.requires_grad]
        # attempts of this fit, numbered from 1, that get an injected overflow (lab / teaching)
        start_attempt = self.attempts_done
        overflow = (
            {start_attempt + a for a in cfg.overflow_at_steps} if self.scaler is not None else set()
        )
        total_sched = self.attempts_done + cfg.steps
        for group in self.optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        base_lrs = [g["initial_lr"] for g in self.optimizer.param_groups]
        self._scheduled = bool(cfg.warmup_steps) or cfg.schedule != "constant"
        if not self._scheduled:
            for group, lr in zip(self.optimizer.param_groups, base_lrs, strict=True):
                group["lr"] = lr
        bar = tqdm(
            total=cfg.steps, desc=result.label, unit="step", disable=not cfg.progress, leave=False
        )
        sync_mode = cfg.cuda_sync_debug if self.device.type == "cuda" else None
        old_sync_mode = torch.cuda.get_sync_debug_mode() if sync_mode else 0

        counted = 0
        stop_reason: str | None = None
        rec = Recorder(
            result,
            base,
            probe,
            shape,
            flops_step,
            peak,
            cfg.accumulation,
            callbacks,
            host_scale,
            self.steps_done,
            f"plan {self.plan.mode} on {self.device}",
        )
        flush, emit, t_start = rec.flush, rec.emit, rec.t_start
        try:
            while counted < cfg.steps and stop_reason is None:
                want = min(cfg.steps - counted, cfg.log_every - counted % cfg.log_every)
                chunk = Chunk(first_attempt=self.attempts_done)
                if sync_mode:  # CUDA sync check on for the attempts, off for logging
                    torch.cuda.set_sync_debug_mode(sync_mode)
                try:
                    for _ in range(want):
                        if stop is not None and stop.is_set():
                            stop_reason = "stopped by request"
                            break
                        self._attempt(chunk, cfg, params_list, overflow, base_lrs, total_sched)
                except KeyboardInterrupt:
                    stop_reason = "interrupted (KeyboardInterrupt)"
                    self.optimizer.zero_grad(set_to_none=True)
                except BatchesExhausted:
                    stop_reason = "batch source ran out"
                except Exception:
                    if sync_mode:
                        torch.cuda.set_sync_debug_mode(old_sync_mode)
                    try:  # keep the finished attempts of this interval, then re-raise
                        flush(chunk, self.optimizer.param_groups[0]["lr"])
                        emit(time.perf_counter())
                    except Exception:
                        log.exception("could not record the steps made before the failure")
                    raise
                if sync_mode:
                    torch.cuda.set_sync_debug_mode(old_sync_mode)
                good = flush(chunk, self.optimizer.param_groups[0]["lr"])
                counted += good
                bar.update(good)
                if counted % cfg.log_every == 0 or counted >= cfg.steps or stop_reason:
                    emit(time.perf_counter())
        finally:
            self.steps_done = rec.steps_done
            if sync_mode:
                torch.cuda.set_sync_debug_mode(old_sync_mode)
            bar.close()
        if stop_reason is not None:
            result.stopped = True
            result.events.append(
                Event(
                    "stop",
                    f"{stop_reason} after {counted} of {cfg.steps} steps",
                    {"reason": stop_reason, "steps": counted, "of": cfg.steps},
                )
            )
        result.seconds = time.perf_counter() - t_start
        finite = [r["loss"] for r in result.records if math.isfinite(r["loss"])]
        result.final_loss = finite[-1] if finite else None
        for cb in callbacks:
            if hasattr(cb, "on_fit_end"):
                cb.on_fit_end(result)

    def _attempt(
        self,
        chunk: Chunk,
        cfg: TrainConfig,
        params: list[nn.Parameter],
        overflow: set[int],
        base_lrs: list[float],
        total_sched: int,
    ) -> None:
        """One optimizer attempt: K microbatches, (unscale, clip,) step, schedule, zero_grad."""
        opt, scaler, K = self.optimizer, self.scaler, cfg.accumulation
        if self._scheduled:  # a constant LR without warmup needs no per-step work
            factor = lr_factor(self.attempts_done, cfg, total_sched)
            for group, lr in zip(opt.param_groups, base_lrs, strict=True):
                group["lr"] = lr * factor
        acc = None
        for _ in range(K):
            index = self.microbatches_done
            if self._peeked is not None and self._peeked[0] == index:
                batch = self._peeked[1]
                self._peeked = None
            else:
                batch = to_device(self.source.get(index), self.device)
            loss = self._loss(batch)
            self.microbatches_done += 1
            d = loss.detach()
            if acc is None:
                acc = d
            else:
                acc = acc + d
            if K > 1:
                loss = loss / K
            (scaler.scale(loss) if scaler is not None else loss).backward()
        self.attempts_done += 1
        attempt = self.attempts_done
        if attempt in overflow:  # teaching: a real overflow the real scaler must catch
            next(p for p in params if p.grad is not None).grad.view(-1)[0] = float("inf")
        skip_host = False
        if cfg.skip_nonfinite and scaler is None:
            skip_host = not bool(torch.isfinite(acc))  # opt-in: one host sync per step
        if scaler is not None:
            if cfg.grad_clip is not None:
                scaler.unscale_(opt)
                chunk.norms.append(nn.utils.clip_grad_norm_(params, cfg.grad_clip))
            scaler.step(opt)
            scaler.update()
            chunk.scales.append(scaler._scale.clone())  # on device; no get_scale() (.item())
        elif skip_host:
            chunk.host_skips.append(attempt)
            if cfg.grad_clip is not None:
                chunk.norms.append(torch.zeros((), device=self.device))
        else:
            if cfg.grad_clip is not None:
                chunk.norms.append(nn.utils.clip_grad_norm_(params, cfg.grad_clip))
            opt.step()
        opt.zero_grad(set_to_none=True)
        chunk.losses.append(acc)

    # ------------------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Plain state for a checkpoint (scaler state: the last fit's scaler, or a pending one)."""
        scaler_state = self._pending_scaler
        if self.scaler is not None:
            scaler_state = self.scaler.state_dict()
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": scaler_state,
            "counters": {
                "steps": self.steps_done,
                "attempts": self.attempts_done,
                "microbatches": self.microbatches_done,
            },
            "rng": ckpt.rng_state(),
            "plan": self.plan.to_dict(),
        }

    def save_checkpoint(self, path: Any) -> Any:
        """Write model, optimizer, scaler, counters, RNG and plan to ``path``."""
        return ckpt.save_checkpoint(path, self.state_dict())

    def load_checkpoint(self, path: Any) -> None:
        """Restore a checkpoint; the grad scaler state is restored into the next fit's scaler.

        Every entry is checked first (``ValueError`` naming each bad one); with any bad entry
        nothing is changed.
        """
        payload = ckpt.load_checkpoint(path, map_location=self.device)
        ckpt.validate_state(payload, self.model, self.optimizer, f"checkpoint {str(path)!r}")
        self.model.load_state_dict(payload["model"])
        self.optimizer.load_state_dict(payload["optimizer"])
        counters = payload["counters"]
        self.steps_done = counters["steps"]
        self.attempts_done = counters["attempts"]
        self.microbatches_done = counters["microbatches"]
        ckpt.restore_rng(payload["rng"])
        self._pending_scaler = payload["scaler"] or None
        if payload["plan"] != self.plan.to_dict():
            self._pending_events.append(
                Event(
                    "checkpoint",
                    f"checkpoint was written under plan {payload['plan'].get('mode')!r}; "
                    f"continuing under plan {self.plan.mode!r}",
                )
            )


def fit(
    model: nn.Module | Workload | str,
    batches: Any = None,
    *,
    preset: str = "tiny",
    device: Any = "auto",
    precision: PrecisionConfig | str | None = None,
    optimizer: OptimizerConfig | None = None,
    train: TrainConfig | None = None,
    loss_fn: Callable[..., torch.Tensor] | None = None,
    callbacks: Iterable[Any] = (),
    stop: Any = None,
    **train_options: Any,
) -> RunResult:
    """Train once and return the :class:`RunResult`.

    ``model``: an ``nn.Module`` (with ``batches``), a :class:`Workload`, or a built-in workload
    name (with ``preset``). Extra keyword arguments are :class:`TrainConfig` fields
    (``fit("mlp", steps=50, accumulation=2)``).
    """
    cfg = make_train_config(train, train_options)
    model, batches, info = prepare(model, batches, preset, device, cfg.seed)
    trainer = Trainer(
        model,
        batches,
        device=device,
        precision=precision,
        optimizer=optimizer,
        train=cfg,
        loss_fn=loss_fn,
        workload_info=info,
    )
    return trainer.fit(callbacks=list(callbacks), stop=stop)


def make_train_config(train: TrainConfig | None, options: dict[str, Any]) -> TrainConfig:
    """``train`` (or the defaults) with ``options`` applied; unknown names list the fields."""
    cfg = train if train is not None else TrainConfig()
    if not options:
        return cfg
    try:
        return dataclasses.replace(cfg, **options)
    except TypeError as exc:
        fields = ", ".join(f.name for f in dataclasses.fields(TrainConfig))
        raise ValueError(f"{exc}; TrainConfig fields: {fields}") from None


def prepare(
    model: nn.Module | Workload | str | None,
    batches: Any,
    preset: str,
    device: Any,
    seed: int | None,
) -> tuple[nn.Module, Any, dict[str, Any]]:
    """Model, batches and workload info from a module (+ batches) or a workload / its name.

    A workload's model is built right after ``seed_everything(seed)`` and its batches are
    placed on the device the trainer will resolve.
    """
    info: dict[str, Any] = {}
    if isinstance(model, str):
        model = get_workload(model, preset)
    if isinstance(model, Workload):
        seed_everything(seed or 0)
        info = dict(model.info)
        if batches is None:
            batches = model.make_batches(resolve_device(device))
        model = model.make_model()
    if batches is None:
        raise ValueError("batches is None; pass batches for your own model (or a workload name)")
    return model, batches, info
