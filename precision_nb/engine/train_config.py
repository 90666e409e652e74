"""Loop settings: :class:`TrainConfig` (validated on construction) and the LR schedule."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from precision_nb.core import validate

SCHEDULES = ("constant", "cosine")


def _positive_int(name: str, value: Any, minimum: int = 1, maximum: int | None = None) -> int:
    return validate.integer(f"train.{name}", value, minimum, maximum)


def _positive(name: str, value: Any, minimum: float = 0.0, strict: bool = True) -> float:
    return validate.number(f"train.{name}", value, minimum=minimum, strict=strict)


@dataclass(frozen=True)
class TrainConfig:
    """Loop settings. Scaler settings apply to plans with a grad scaler (CUDA fp16, the lab).

    ``min_loss_scale``: the floor of the loss scale; a scale below it (or not finite) stops the
    run with an error, as DeepSpeed's ``min_loss_scale`` (default 1) does.
    ``grad_stats_every``: every N counted steps, the fp16 underflow and overflow of the gradients
    at the current loss scale, computed on the device and read with the logging transfer (records'
    ``grad_underflow*`` / ``grad_overflow`` keys); None: never.
    ``inspect``: run one instrumented step on a copy of the model before the first step
    (memory by kind and dtype, op dtype trace) into ``RunResult.inspection``.
    ``update_stats``: on logged steps, the fraction of parameter elements the step left unchanged
    and of those still at their start values (records' ``updates_rounded_away`` /
    ``weights_never_moved``, per layer in ``RunResult.update_stats``); None: on for true plans in
    a ``Trainer`` and the comparisons (compare, profile, the panel), off in ``fit()``.
    """

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
    min_loss_scale: float = 1.0
    grad_stats_every: int | None = None
    inspect: bool = False
    update_stats: bool | None = None

    def __post_init__(self) -> None:
        _positive_int("steps", self.steps, 1, validate.MAX_STEPS)
        _positive_int("accumulation", self.accumulation)
        _positive_int("log_every", self.log_every)
        _positive_int("warmup_steps", self.warmup_steps, 0)
        _positive_int("growth_interval", self.growth_interval)
        if self.grad_clip is not None:
            _positive("grad_clip", self.grad_clip)
        validate.choice("train.schedule", self.schedule, SCHEDULES)
        validate.number("train.min_lr_ratio", self.min_lr_ratio, minimum=0.0, maximum=1.0)
        if self.seed is not None:
            validate.integer("train.seed", self.seed, *validate.SEED_RANGE)
        for name in ("init_scale", "min_loss_scale"):
            object.__setattr__(self, name, _positive(name, getattr(self, name)))
        _positive("growth_factor", self.growth_factor, 1.0)
        backoff = _positive("backoff_factor", self.backoff_factor)
        if backoff >= 1:
            raise ValueError(
                f"train.backoff_factor: invalid value {backoff!r}; allowed: a number in (0, 1)"
            )
        if self.init_scale < self.min_loss_scale:
            raise ValueError(
                f"train.init_scale: invalid value {self.init_scale!r}; allowed: a finite number "
                f">= train.min_loss_scale ({self.min_loss_scale:g})"
            )
        steps = self.overflow_at_steps
        if not isinstance(steps, (tuple, list)) or any(
            isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in steps
        ):
            raise ValueError(
                f"train.overflow_at_steps: invalid value {validate.short_repr(steps)}; "
                "allowed: a tuple of attempt numbers (integers >= 1)"
            )
        object.__setattr__(self, "overflow_at_steps", tuple(steps))
        validate.choice("train.cuda_sync_debug", self.cuda_sync_debug, (None, "warn", "error"))
        if self.grad_stats_every is not None:
            _positive_int("grad_stats_every", self.grad_stats_every)
        if self.update_stats is not None:
            validate.boolean("train.update_stats", self.update_stats)
        for name in ("inspect", "skip_nonfinite", "progress", "measure_peak"):
            validate.boolean(f"train.{name}", getattr(self, name))
        if self.label is not None and not isinstance(self.label, str):
            raise ValueError(
                f"train.label: invalid value {validate.short_repr(self.label)}; "
                "allowed: a string or None"
            )

    def scaler_settings(self) -> dict[str, Any]:
        """Keyword arguments for ``torch.amp.GradScaler`` (via ``make_grad_scaler``)."""
        names = ("init_scale", "growth_factor", "backoff_factor", "growth_interval")
        return {name: getattr(self, name) for name in names}


def make_train_config(train: TrainConfig | None, options: dict[str, Any]) -> TrainConfig:
    """``train`` (or the defaults) with ``options`` applied; unknown names list the fields."""
    cfg = train if train is not None else TrainConfig()
    if not isinstance(cfg, TrainConfig):
        raise ValueError(
            f"train: invalid value {validate.short_repr(train)} ({type(train).__name__}); "
            "allowed: a TrainConfig or None"
        )
    names = [f.name for f in dataclasses.fields(TrainConfig)]
    unknown = [validate.short_repr(k) for k in options if k not in names]
    if unknown:
        raise ValueError(
            f"unknown train option(s) {', '.join(unknown[:5])}; TrainConfig fields: "
            + ", ".join(names)
        )
    return dataclasses.replace(cfg, **options) if options else cfg


def lr_factor(step: int, cfg: TrainConfig, total: int) -> float:
    """LR multiplier for counted step ``step`` (0-based): warmup, then constant/cosine."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    span = max(1, total - cfg.warmup_steps)
    progress = min(1.0, max(0.0, (step - cfg.warmup_steps) / span))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class CountedLR:
    """Sets each param group's LR before every attempt from the counted steps so far.

    ``after_attempt(stepped)`` advances the count when the step ran (``True``), not when it was
    skipped (``False``). ``stepped=None`` (only the device knows: a fused optimizer under a grad
    scaler) counts the attempt; :meth:`sync` puts in the true count at the next logging point
    (logging points depend on counted steps only, so the LR does not depend on how a run is
    split into ``advance`` calls).
    A constant schedule without warmup sets the LR once and does no per-step work.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, cfg: TrainConfig, counted: int) -> None:
        self.optimizer, self.cfg, self.counted = optimizer, cfg, counted
        self.total = counted + cfg.steps
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.base = [g["initial_lr"] for g in optimizer.param_groups]
        self.active = bool(cfg.warmup_steps) or cfg.schedule != "constant"
        if not self.active:
            for group, lr in zip(optimizer.param_groups, self.base, strict=True):
                group["lr"] = lr

    def before_attempt(self) -> None:
        """Set the LR for the next attempt (callers may skip this when not ``active``)."""
        if self.active:
            factor = lr_factor(self.counted, self.cfg, self.total)
            for group, lr in zip(self.optimizer.param_groups, self.base, strict=True):
                group["lr"] = lr * factor

    def after_attempt(self, stepped: bool | None) -> None:
        if stepped is not False:
            self.counted += 1

    def sync(self, counted: int) -> None:
        """The true number of counted steps, known on the host at a logging point."""
        self.counted = counted
