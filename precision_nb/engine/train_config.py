"""Loop settings: :class:`TrainConfig` (validated on construction) and the LR schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from precision_nb.core.validate import integer

SCHEDULES = ("constant", "cosine")


def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
    return integer(f"train.{name}", value, minimum)


@dataclass(frozen=True)
class TrainConfig:
    """Loop settings. Scaler settings apply to plans with a grad scaler (CUDA fp16, the lab)."""

    steps: int = 20
    accumulation: int = 1
    log_every: int = 10
    grad_clip: float | None = None
    warmup_steps: int = 0
    schedule: str = "constant"
    min_lr_ratio: float = 0.1
    seed: int | None = 0
    skip_nonfinite: bool = False
    progress: bool = True
    label: str | None = None
    init_scale: float = 2.0**16
    growth_interval: int = 2000
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    overflow_at_steps: tuple[int, ...] = ()
    cuda_sync_debug: str | None = None
    measure_peak: bool = True

    def __post_init__(self) -> None:
        _positive_int("steps", self.steps)
        _positive_int("accumulation", self.accumulation)
        _positive_int("log_every", self.log_every)
        _positive_int("warmup_steps", self.warmup_steps, 0)
        _positive_int("growth_interval", self.growth_interval)
        if self.grad_clip is not None and not (
            isinstance(self.grad_clip, (int, float)) and self.grad_clip > 0
        ):
            raise ValueError(
                f"train.grad_clip: invalid value {self.grad_clip!r}; allowed: None or a number > 0"
            )
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"train.schedule: invalid value {self.schedule!r}; allowed: {SCHEDULES}"
            )
        if not 0.0 <= float(self.min_lr_ratio) <= 1.0:
            raise ValueError(
                f"train.min_lr_ratio: invalid value {self.min_lr_ratio!r}; allowed: [0, 1]"
            )
        if not (self.init_scale > 0 and self.growth_factor > 1 and 0 < self.backoff_factor < 1):
            raise ValueError(
                f"train scaler settings invalid: init_scale={self.init_scale!r} (> 0), "
                f"growth_factor={self.growth_factor!r} (> 1), "
                f"backoff_factor={self.backoff_factor!r} (between 0 and 1)"
            )
        steps = tuple(self.overflow_at_steps)
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in steps):
            raise ValueError(
                f"train.overflow_at_steps: invalid value {self.overflow_at_steps!r}; "
                "allowed: attempt numbers (integers >= 1)"
            )
        object.__setattr__(self, "overflow_at_steps", steps)
        if self.cuda_sync_debug not in (None, "warn", "error"):
            raise ValueError(
                f"train.cuda_sync_debug: invalid value {self.cuda_sync_debug!r}; "
                "allowed: None, 'warn', 'error'"
            )


def lr_factor(step: int, cfg: TrainConfig, total: int) -> float:
    """LR multiplier for optimizer attempt ``step`` (0-based): warmup, then constant/cosine."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    span = max(1, total - cfg.warmup_steps)
    progress = min(1.0, max(0.0, (step - cfg.warmup_steps) / span))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
