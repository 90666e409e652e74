"""Turns a chunk of device-side values into host records: one transfer per logging interval.

The loop appends each attempt's loss (sum over microbatches) and its :class:`StepOutcome` to a
:class:`Chunk` as device tensors. :meth:`Recorder.flush` brings the whole chunk home with a single
``tolist()``, takes the skipped attempts from the found-inf flags (never from the scale going
down), counts the rest, stops the run when the precision says the scale left
``[min_loss_scale, inf)``, and collects the attempts' times (:class:`StepTimer`);
:meth:`Recorder.emit` writes one record. Gradient underflow statistics
(``TrainConfig.grad_stats_every``) travel in the same transfer.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from precision_nb.core.events import Event
from precision_nb.engine.batches import BatchShape
from precision_nb.engine.callbacks import Callbacks
from precision_nb.engine.memory_probe import MemoryProbe
from precision_nb.engine.metrics import Peak
from precision_nb.engine.peaks import beyond_peak
from precision_nb.engine.precision import Precision, StepOutcome
from precision_nb.engine.results import (
    RECORD_KEYS,
    LossScaleFloorError,
    NonFiniteLossError,
    RunResult,
)
from precision_nb.engine.update_probe import NO_UPDATE_STATS


class StepTimer:
    """Wall time of every optimizer attempt, without a host sync inside the loop: ``start()`` /
    ``stop()`` around each attempt, ``collect()`` at a logging point.

    - CPU: the host clock at the attempt's start and end (the work is synchronous).
    - MPS: the host clock; the last attempt before a logging point waits for the device
      (``torch.mps.synchronize()``) before its end time, so queued work lands in an attempt.
    - CUDA: a pair of CUDA events recorded around each attempt, read at the logging point, after
      the logging transfer has synchronised (``Event.elapsed_time`` then waits for nothing).

    Logging work between attempts is inside no attempt's time. A profiler can see where each
    attempt begins and ends: set :attr:`marker` to a factory of context managers
    (``lambda: torch.profiler.record_function("...")``); each attempt then runs inside one. The
    timed rounds leave it None.
    """

    def __init__(self, device: torch.device) -> None:
        self.kind = torch.device(device).type
        self._open: Any = None
        self._pairs: list[tuple[Any, Any]] = []
        #: None, or a factory of context managers entered around each attempt (a profiler mark)
        self.marker: Any = None
        self._mark: Any = None

    def start(self) -> None:
        if self.marker is not None:
            self._mark = self.marker()
            self._mark.__enter__()
        if self.kind == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._open = event
        else:
            self._open = time.perf_counter()

    def stop(self, last: bool = False) -> None:
        """End the open attempt; ``last``: a logging point follows (MPS waits for the device)."""
        if self._open is None:
            return
        if self.kind == "cuda":
            end: Any = torch.cuda.Event(enable_timing=True)
            end.record()
        else:
            if last and self.kind == "mps":
                torch.mps.synchronize()
            end = time.perf_counter()
        self._pairs.append((self._open, end))
        self._open = None
        if self._mark is not None:
            mark, self._mark = self._mark, None
            mark.__exit__(None, None, None)

    def collect(self) -> list[float]:
        """Seconds of each finished attempt since the last collect (an unfinished one is dropped).

        On CUDA call it after the logging transfer: the events are complete by then.
        """
        pairs, self._pairs, self._open = self._pairs, [], None
        if self.kind == "cuda":
            if pairs:
                pairs[-1][1].synchronize()  # complete already after the transfer: no wait
            return [start.elapsed_time(end) / 1e3 for start, end in pairs]
        return [end - start for start, end in pairs]


@dataclass
class Chunk:
    """Device-side values of the attempts since the last host transfer."""

    first_attempt: int
    losses: list[torch.Tensor] = field(default_factory=list)
    scales: list[torch.Tensor] = field(default_factory=list)
    found: list[torch.Tensor] = field(default_factory=list)
    norms: list[torch.Tensor] = field(default_factory=list)
    host_skips: list[int] = field(default_factory=list)  # skipped on the host (skip_nonfinite)
    final_scale: torch.Tensor | None = None  # the scale after the chunk's last update
    # (index of the attempt in the chunk, grad_underflow_stats of its gradients)
    stats: list[tuple[int, dict[str, torch.Tensor]]] = field(default_factory=list)

    def add(self, loss: torch.Tensor, out: StepOutcome) -> None:
        self.losses.append(loss)
        if out.scale is not None:
            self.scales.append(out.scale)
        if out.found_inf is not None:
            self.found.append(out.found_inf)
        elif out.stepped is False:
            self.host_skips.append(self.first_attempt + len(self.losses))
        if out.grad_norm is not None:
            self.norms.append(out.grad_norm)

    def add_stats(self, stats: dict[str, torch.Tensor]) -> None:
        """Gradient underflow stats of the attempt about to be added (call before :meth:`add`)."""
        self.stats.append((len(self.losses), stats))


#: Keys of ``grad_underflow_stats`` in the order they travel; record keys they become.
_STAT_ORDER = ("underflow", "worst_underflow", "worst_index", "overflow")
_STAT_KEYS = (
    "grad_underflow",
    "grad_underflow_worst",
    "grad_underflow_worst_param",
    "grad_overflow",
)
_NO_STATS: dict[str, Any] = dict.fromkeys(_STAT_KEYS)


@dataclass(frozen=True)
class RunContext:
    """What one fit's records are made from, fixed before its first step.

    ``base``: the record fields that never change in the fit (label, plan fields, device, fused
    AdamW, lab). ``where``: "plan <mode> on <device>", for error messages.
    """

    base: Mapping[str, Any]
    shape: BatchShape
    flops_per_step: int
    peak: Peak | None
    accumulation: int
    where: str
    precision: Precision
    param_names: tuple[str, ...] = ()


class Recorder:
    """Host-side bookkeeping of one fit: counted steps, skips, scale history and records.

    ``steps_done``: the trainer's counted steps before the fit (records continue from there).
    """

    def __init__(
        self,
        context: RunContext,
        result: RunResult,
        probe: MemoryProbe,
        timer: StepTimer,
        callbacks: Callbacks,
        steps_done: int,
    ) -> None:
        self.context, self.result, self.probe, self.timer = context, result, probe, timer
        self.callbacks, self.steps_done = callbacks, steps_done
        self.K = context.accumulation
        self.host_scale: float | None = None
        self.t_start = time.perf_counter()
        self._reset()
        self.lr: float | None = None
        self._warned_mfu = False
        self.norm: float | None = None
        #: The fit's :class:`~precision_nb.engine.update_probe.UpdateProbe` (None: off).
        self.update_probe: Any = None

    def _reset(self) -> None:
        self.attempts, self.skipped, self.losses, self.busy = 0, 0, [], 0.0
        self.grad_stats: dict[str, Any] = _NO_STATS

    def emit(self, now: float) -> None:
        """Write one record for the attempts since the last one (nothing when there were none).

        Speeds come from the attempts' own times: logging work and pauses between
        ``FitSession.advance`` calls are not in them.
        """
        n = self.attempts
        if n == 0:
            return
        dt = max(self.busy, 1e-12)
        finite = [v for v in self.losses if math.isfinite(v)]
        mem = self.probe.read()
        ctx = self.context
        fps = ctx.flops_per_step * n / dt
        peak, shape, K = ctx.peak, ctx.shape, self.K
        values = dict(
            ctx.base,
            step=self.steps_done,
            loss=sum(finite) / len(finite) if finite else float("nan"),
            loss_scale=self.host_scale,
            skipped=self.skipped,
            skipped_total=self.result.skipped_total,
            lr=self.lr,
            grad_norm=self.norm,
            step_time_s=dt / n,
            samples_per_s=shape.samples * K * n / dt,
            tokens_per_s=shape.tokens * K * n / dt if shape.tokens else None,
            flops_per_s=fps,
            mfu=fps / peak.flops_per_s if peak else None,
            mfu_peak_source=peak.source if peak else None,
            memory_kind=mem.kind,
            memory_bytes=mem.current,
            memory_peak_bytes=mem.peak,
            memory_reserved_bytes=mem.reserved,
            elapsed_s=now - self.t_start,
            **self.grad_stats,
            **(self.update_probe.take() if self.update_probe is not None else NO_UPDATE_STATS),
        )
        record = {key: values[key] for key in RECORD_KEYS}  # fixed order; KeyError if missing
        mfu, source = values["mfu"], values["mfu_peak_source"]
        if mfu is not None and mfu > 1 and not self._warned_mfu:
            self._warned_mfu = True
            msg = (
                f"mfu {mfu:.2f} > 1 at step {self.steps_done}: the achieved FLOP/s beat the peak "
                f"({source}): {beyond_peak(source)}, so read mfu as rough here"
            )
            data = {"mfu": mfu, "step": self.steps_done}
            self.result.events.append(Event("calibration", msg, data))
        self.result.records.append(record)
        self._reset()
        self.callbacks.log(record)

    def flush(self, chunk: Chunk, lr: float) -> int:
        """One host transfer for the chunk; returns the number of counted (not skipped) steps."""
        n = len(chunk.losses)
        if n == 0:
            self.timer.collect()
            return 0
        seqs = (chunk.scales, chunk.found, chunk.norms)
        if chunk.final_scale is None and not chunk.stats and not any(seqs):
            # losses only (no scaler, no clipping, no stats): one stack, one transfer
            flat = torch.stack(chunk.losses).tolist()
        else:
            parts = [torch.stack(chunk.losses).double()]
            parts += [torch.stack(seq).double() for seq in seqs if seq]
            if chunk.final_scale is not None:
                parts.append(chunk.final_scale.double().reshape(1))
            parts += [torch.stack([s[k].double() for k in _STAT_ORDER]) for _, s in chunk.stats]
            flat = torch.cat(parts).tolist()  # the one host sync of this logging interval
        times = self.timer.collect()  # after the transfer: CUDA events are complete

        def take(seq: list[Any], count: int) -> list[Any]:
            nonlocal flat
            if not seq:
                return [None] * count
            out, flat = flat[:count], flat[count:]
            return out

        losses = [v / self.K for v in take(chunk.losses, n)]
        scales, found, norms = (take(seq, n) for seq in (chunk.scales, chunk.found, chunk.norms))
        final = flat.pop(0) if chunk.final_scale is not None else None
        width = len(_STAT_ORDER)
        stats = {i: flat[j * width : (j + 1) * width] for j, (i, _) in enumerate(chunk.stats)}
        self.lr, self.norm = lr, norms[-1]
        good = 0
        for i in range(n):
            attempt = chunk.first_attempt + i + 1
            skipped = (found[i] is not None and found[i] > 0) or attempt in chunk.host_skips
            after = scales[i + 1] if i + 1 < n else final
            if not skipped and not math.isfinite(losses[i]):
                self._account(i, good)
                self._non_finite(good, losses[i])
            good += 0 if skipped else 1
            step = self.steps_done + good
            if i in stats:
                self._grad_stats(stats[i], attempt, step, scales[i])
            entry = dict(step=step, attempt=attempt, loss_scale=scales[i], skipped=bool(skipped))
            self.result.scale_history.append(entry)
            self.result.step_times_s.append(times[i] if i < len(times) else float("nan"))
            self.busy += times[i] if i < len(times) else 0.0
            self.losses.append(losses[i])
            if skipped:
                self.skipped += 1
                self.result.skipped_total += 1
            if after is not None:
                self.host_scale = after
                if self.context.precision.outside_floor(after):
                    self._account(i + 1, good)
                    self.below_floor(attempt, after)
        self._account(n, good)
        if final is not None:
            self.context.precision.scale_seen(final)
        return good

    def _grad_stats(self, values: list[float], attempt: int, step: int, scale: Any) -> None:
        """Keep one attempt's underflow stats for the next record and in ``result.grad_stats``."""
        under, worst, index, over = values
        names = self.context.param_names
        # nothing underflowed: no layer is the worst
        name = names[int(index)] if worst > 0 and 0 <= index < len(names) else None
        self.grad_stats = dict(zip(_STAT_KEYS, (under, worst, name, over), strict=True))
        self.result.grad_stats.append(
            dict(self.grad_stats, step=step, attempt=attempt, loss_scale=scale)
        )

    def _account(self, attempts: int, good: int) -> None:
        self.attempts += attempts
        self.result.attempts += attempts
        self.steps_done += good
        self.result.steps += good

    def _non_finite(self, good: int, value: float) -> None:
        step = self.steps_done + 1
        self.emit(time.perf_counter())
        if self.context.precision.scaled:
            why = "the grad scaler did not skip it: its gradients were finite"
            hint = "check the loss function and the data"
        else:
            why = "no grad scaler to skip it"
            hint = "pass TrainConfig(skip_nonfinite=True) to skip such steps"
        msg = (
            f"loss became {value} at step {step} ({self.context.where}, {why}); lower the learning "
            f"rate, check the data, or {hint}"
        )
        self.result.events.append(Event("stop", msg, {"reason": "non-finite loss", "step": step}))
        raise NonFiniteLossError(msg, self.result, step)

    def below_floor(self, attempt: int, scale: float, *, before: bool = False) -> None:
        """Stop the run: the loss scale left ``[min_loss_scale, inf)`` after ``attempt`` (or,
        ``before=True``, it was already outside before ``attempt`` could run)."""
        self.emit(time.perf_counter())
        floor = self.context.precision.min_loss_scale
        state = "fell below the floor" if math.isfinite(scale) else "is not finite"
        when = f"before attempt {attempt} ran" if before else f"after attempt {attempt}"
        msg = (
            f"the loss scale {state}: {scale:g} {when} (step {self.steps_done}, "
            f"{self.context.where}; floor train.min_loss_scale={floor:g}), so the run stopped "
            "without another step at that scale: a scale outside [floor, inf) means the scaler "
            "keeps finding inf/NaN gradients and skipping steps (and at a scale of 0 a step "
            "would write NaN into the weights). Lower the learning rate, check the data and the "
            "loss for inf/NaN, use bf16 where the device has it, or change "
            "train.min_loss_scale / train.init_scale"
        )
        data = {
            "reason": "loss scale below floor" if math.isfinite(scale) else "loss scale not finite",
            "scale": scale,
            "floor": floor,
            "attempt": attempt,
            "step": self.steps_done,
        }
        self.result.events.append(Event("scaler", msg, data))
        raise LossScaleFloorError(msg, self.result, self.steps_done, scale)
