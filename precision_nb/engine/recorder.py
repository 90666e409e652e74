"""Turns a chunk of device-side values into host records: one transfer per logging interval.

The trainer appends each attempt's loss (sum over microbatches), the scaler's scale after the
update and the grad norm to a :class:`Chunk` as device tensors. :meth:`Recorder.flush` brings the
whole chunk home with a single ``tolist()``, works out which attempts the scaler skipped (the
scale went down) and counts the rest; :meth:`Recorder.emit` writes one record.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from precision_nb.core.events import Event
from precision_nb.engine.batches import BatchShape
from precision_nb.engine.metrics import MemoryProbe, Peak
from precision_nb.engine.results import RECORD_KEYS, NonFiniteLossError, RunResult


@dataclass
class Chunk:
    """Device-side values of the attempts since the last host transfer."""

    first_attempt: int
    losses: list[torch.Tensor] = field(default_factory=list)
    scales: list[torch.Tensor] = field(default_factory=list)
    norms: list[torch.Tensor] = field(default_factory=list)
    host_skips: list[int] = field(default_factory=list)  # skipped on the host (skip_nonfinite)


class Recorder:
    """Host-side bookkeeping of one fit: counted steps, skips, scale history and records."""

    def __init__(
        self,
        result: RunResult,
        base: dict[str, Any],
        probe: MemoryProbe,
        shape: BatchShape,
        flops_step: int,
        peak: Peak | None,
        accumulation: int,
        callbacks: list[Any],
        host_scale: float | None,
        steps_done: int,
        where: str,
    ) -> None:
        self.result, self.base, self.probe, self.shape = result, base, probe, shape
        self.flops_step, self.peak, self.K, self.callbacks = (
            flops_step,
            peak,
            accumulation,
            callbacks,
        )
        self.host_scale = host_scale
        self.steps_done = steps_done
        self.where = where
        self.t_start = time.perf_counter()
        self._reset(self.t_start)
        self.lr: float | None = None
        self._warned_mfu = False
        self.norm: float | None = None

    def _reset(self, now: float) -> None:
        self.attempts, self.skipped, self.losses, self.t = 0, 0, [], now

    def emit(self, now: float) -> None:
        """Write one record for the attempts since the last one (nothing when there were none)."""
        n = self.attempts
        if n == 0:
            return
        dt = max(now - self.t, 1e-12)
        finite = [v for v in self.losses if math.isfinite(v)]
        mem = self.probe.read()
        fps = self.flops_step * n / dt
        peak, shape, K = self.peak, self.shape, self.K
        values = dict(
            self.base,
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
        )
        record = {key: values[key] for key in RECORD_KEYS}  # fixed order; KeyError if missing
        if values["mfu"] is not None and values["mfu"] > 1 and not self._warned_mfu:
            self._warned_mfu = True
            self.result.events.append(
                Event(
                    "calibration",
                    f"mfu {values['mfu']:.2f} > 1 at step {self.steps_done}: the achieved FLOP/s "
                    f"beat the peak ({values['mfu_peak_source']}); a CPU peak measured while the "
                    "machine was busy is too low, so read mfu as rough here",
                    {"mfu": values["mfu"], "step": self.steps_done},
                )
            )
        self.result.records.append(record)
        self._reset(time.perf_counter())
        for cb in self.callbacks:
            if hasattr(cb, "on_log"):
                cb.on_log(record)

    def flush(self, chunk: Chunk, lr: float) -> int:
        """One host transfer for the chunk; returns the number of counted (not skipped) steps."""
        n = len(chunk.losses)
        if n == 0:
            return 0
        parts = [torch.stack(chunk.losses).double()]
        if chunk.scales:
            parts.append(torch.stack(chunk.scales).double())
        if chunk.norms:
            parts.append(torch.stack(chunk.norms).double())
        flat = torch.cat(parts).tolist()  # the one host sync of this logging interval
        losses = [v / self.K for v in flat[:n]]
        scales = flat[n : 2 * n] if chunk.scales else [None] * n
        norms = flat[-n:] if chunk.norms else [None] * n
        result = self.result
        good = 0
        for i in range(n):
            attempt = chunk.first_attempt + i + 1
            before, after = self.host_scale, scales[i]
            skipped = (after is not None and before is not None and after < before) or (
                attempt in chunk.host_skips
            )
            self.host_scale = after if after is not None else before
            if not skipped and not math.isfinite(losses[i]):
                self._non_finite(i, good, losses[i])
            good += 0 if skipped else 1
            result.scale_history.append(
                dict(
                    step=self.steps_done + good,
                    attempt=attempt,
                    loss_scale=before,
                    skipped=bool(skipped),
                )
            )
            self.losses.append(losses[i])
            if skipped:
                self.skipped += 1
                result.skipped_total += 1
        self.attempts += n
        self.lr, self.norm = lr, norms[-1]
        result.attempts += n
        self.steps_done += good
        result.steps += good
        return good

    def _non_finite(self, index: int, good: int, value: float) -> None:
        step = self.steps_done + good + 1
        self.attempts += index
        self.steps_done += good
        self.result.steps += good
        self.emit(time.perf_counter())
        msg = (
            f"loss became {value} at step {step} ({self.where}, no grad scaler to skip it); lower "
            "the learning rate, check the data, or pass TrainConfig(skip_nonfinite=True) to skip "
            "such steps"
        )
        self.result.events.append(Event("stop", msg, {"reason": "non-finite loss", "step": step}))
        raise NonFiniteLossError(msg, self.result, step)
