"""Precision in the training loop: one :class:`Precision` per trainer, like a precision plugin.

``Precision.for_plan(plan, device, lab=...)`` returns

- :class:`Precision` (fp32): no autocast, plain ``backward`` and ``optimizer.step``;
- :class:`Autocast` (bf16, or fp16 without a scaler): the forward under ``torch.autocast``;
- :class:`ScaledAutocast` (fp16 on CUDA, the CPU loss-scale lab): autocast plus a ``GradScaler``.

The base has every hook with a default that does nothing special; each subclass overrides only what
differs (Lightning's ``fabric/plugins/precision`` is the model). One object lives as long as its
:class:`~precision_nb.engine.trainer.Trainer`; :meth:`Precision.start_fit` resets it for each fit.
The loop, the inspection step and the numerics analysis all train through ``forward_context()``,
``backward(loss)`` and ``step(optimizer, clip, params)``, so none of them branches on precision.

Skips come from the scaler's own found-inf result, never from the scale going down (a scale of 0
or inf cannot go down). torch's private ``GradScaler`` state is read only by
:class:`ScalerInternals`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import nn

from precision_nb.core.amp import autocast_context, make_grad_scaler
from precision_nb.core.events import Event
from precision_nb.core.plan import PrecisionPlan
from precision_nb.engine.train_config import TrainConfig

if TYPE_CHECKING:
    from precision_nb.core.resolution import Explanation

#: What a loss-scale-lab run's label carries after the mode.
LAB_SUFFIX = " (loss-scale lab)"

#: ``torch.amp.GradScaler.state_dict()`` keys (an empty dict: a disabled scaler).
SCALER_STATE_KEYS = (
    "scale",
    "growth_factor",
    "backoff_factor",
    "growth_interval",
    "_growth_tracker",
)

#: Below the smallest normal fp32 number the scale tensor can round to 0 in one backoff.
_FP32_NORMAL_MIN = 2.0**-126


def run_label(name: str, lab: bool) -> str:
    """A run's label: the mode (or requested mode) name, with " (loss-scale lab)" for the lab."""
    return name + LAB_SUFFIX if lab else name


def lab_applies(explanation: Explanation) -> bool:
    """Whether ``explanation`` resolved through the loss-scale lab (CPU fp16 + ``loss_scale_lab``).

    Elsewhere ``loss_scale_lab=True`` changes nothing (CUDA fp16 has the real scaler), so a run
    there is not labelled as the lab.
    """
    row = explanation.row
    return bool(row is not None and row.source == "lab")


class StepOutcome(NamedTuple):
    """What one optimizer attempt did, as device tensors (read on the host at logging points).

    ``scale``: the loss scale the attempt used (None without a scaler). ``found_inf``: > 0 when
    the step was skipped (None when no skip is possible). ``grad_norm``: total norm before
    clipping (None without clipping). ``stepped``: whether the host knows the optimizer step ran
    (True/False) or only the device knows (None: a fused optimizer under a scaler).
    """

    scale: torch.Tensor | None
    found_inf: torch.Tensor | None
    grad_norm: torch.Tensor | None
    stepped: bool | None


class ScalerInternals:
    """The one place that reads ``torch.amp.GradScaler``'s private state.

    torch keeps the scale and the growth tracker as device tensors (``_scale``,
    ``_growth_tracker``, made on the first ``scale()``) and each optimizer's found-inf flags in
    ``_per_optimizer_states[id(optimizer)]["found_inf_per_device"]`` until ``update()``. The
    public API reads them only through a host sync (``get_scale()``) or not at all; a test pins
    this layout against the installed torch.
    """

    @staticmethod
    def scale(scaler: Any) -> torch.Tensor | None:
        """The scale tensor on the device (None before the scaler's first ``scale()``)."""
        return getattr(scaler, "_scale", None)

    @staticmethod
    def tensors(scaler: Any) -> list[torch.Tensor]:
        """The scaler's device tensors: the scale (fp32) and the growth tracker (int32)."""
        found = (getattr(scaler, "_scale", None), getattr(scaler, "_growth_tracker", None))
        return [t for t in found if t is not None]

    @staticmethod
    def found_inf(scaler: Any, optimizer: torch.optim.Optimizer) -> torch.Tensor:
        """The found-inf flag for ``optimizer`` after ``scaler.step``, before ``update()``.

        A device tensor (> 0: the step was skipped). Raises ``RuntimeError`` if this torch keeps
        it elsewhere.
        """
        try:
            per_device = scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
            values = list(per_device.values())
        except (AttributeError, KeyError, TypeError) as exc:
            raise RuntimeError(
                f"torch {torch.__version__} GradScaler keeps no per-optimizer found_inf where "
                "precision_nb reads it (_per_optimizer_states[id(opt)]['found_inf_per_device'])"
            ) from exc
        if not values:
            raise RuntimeError("the grad scaler recorded no inf check for this optimizer step")
        if len(values) == 1:
            return values[0]  # a fresh tensor per step; update() only adds into it with >1 device
        device = scaler._scale.device
        return torch.stack([v.to(device, non_blocking=True) for v in values]).sum()


def poison_gradient(params: Sequence[nn.Parameter]) -> None:
    """Put an inf into the first gradient (the lab's injected overflow the scaler must catch)."""
    grad = next(p.grad for p in params if p.grad is not None)
    grad.view(-1)[0] = float("inf")


class Precision:
    """fp32: no autocast, no scaler. The base of the other precisions; see the module docstring.

    ``skip_nonfinite`` (a fit's setting, no scaler only): skip the step when the loss is
    NaN/inf, at the cost of one host read per step.
    """

    scaler: Any = None
    #: Whether this precision scales the loss (and can skip a step on inf/NaN gradients).
    scaled = False

    def __init__(self, plan: PrecisionPlan, device: Any, *, lab: bool = False) -> None:
        self.plan = plan
        self.device = torch.device(device)
        self.lab = lab
        self.skip_nonfinite = False
        self.min_loss_scale = 1.0
        self._pending: dict[str, Any] | None = None  # checkpointed scaler state, for start_fit

    @staticmethod
    def for_plan(plan: PrecisionPlan, device: Any, *, lab: bool = False) -> Precision:
        """The precision for ``plan``: scaled when the plan has a grad scaler this torch makes."""
        if plan.use_scaler and make_grad_scaler(plan) is not None:
            return ScaledAutocast(plan, device, lab=lab)
        if plan.autocast_enabled and plan.is_mixed_precision:
            return Autocast(plan, device, lab=lab)
        return Precision(plan, device, lab=lab)

    @property
    def label(self) -> str:
        """The run label: the plan's label (``bf16``, ``bf16-true``), with " (loss-scale lab)"
        for the lab."""
        return run_label(self.plan.label, self.lab)

    # ------------------------------------------------------------------ one fit's start

    def start_fit(self, cfg: TrainConfig | None = None, attempts_done: int = 0) -> list[Event]:
        """Reset what a fresh fit must reset; returns what happened as events.

        ``cfg``: the fit's settings (default ``TrainConfig()``); ``attempts_done``: the attempts
        the trainer made before this fit (the lab's ``overflow_at_steps`` count from there).
        Checkpointed scaler state kept by :meth:`load_state_dict` is used here, once.
        """
        cfg = cfg if cfg is not None else TrainConfig()
        self.skip_nonfinite = cfg.skip_nonfinite
        self.min_loss_scale = cfg.min_loss_scale
        events = self._fresh_fit(cfg, attempts_done)
        self._pending = None
        return events

    def _fresh_fit(self, cfg: TrainConfig, attempts_done: int) -> list[Event]:
        """What this precision resets for a fit: without a scaler, only what it cannot use."""
        events = []
        if self._pending is not None:
            msg = "checkpoint grad scaler state not used: this plan has no scaler"
            events.append(Event("checkpoint", msg))
        if cfg.overflow_at_steps:
            msg = (
                f"overflow_at_steps={cfg.overflow_at_steps} ignored: plan {self.plan.mode} "
                "has no grad scaler (use fp16 on CUDA or "
                "PrecisionConfig(mode='fp16', loss_scale_lab=True))"
            )
            events.append(Event("warning", msg))
        return events

    # ------------------------------------------------------------------ one attempt

    def forward_context(self) -> Any:
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def inject_overflow(self, attempt: int, params: Sequence[nn.Parameter]) -> None:
        """Teaching: put an inf into a gradient on the lab's ``overflow_at_steps`` attempts."""

    def step(
        self,
        optimizer: torch.optim.Optimizer,
        clip: float | None = None,
        params: Sequence[nn.Parameter] = (),
        loss: torch.Tensor | None = None,
    ) -> StepOutcome:
        """Clip (if ``clip``), step, and report; ``loss`` is checked only with skip_nonfinite."""
        if self.skip_nonfinite and loss is not None and not bool(torch.isfinite(loss)):
            norm = torch.zeros((), device=self.device) if clip is not None else None
            return StepOutcome(None, None, norm, False)
        norm = nn.utils.clip_grad_norm_(params, clip) if clip is not None else None
        optimizer.step()
        return StepOutcome(None, None, norm, True)

    # ------------------------------------------------------------------ the loss scale

    def scale_tensor(self) -> torch.Tensor | None:
        """The current loss scale as a device tensor (a copy), None without a scaler."""
        return None

    def scale_value(self) -> float | None:
        """The current loss scale read on the host (for inspection, not the loop)."""
        return None

    def state_tensors(self) -> list[torch.Tensor]:
        """The device tensors the precision keeps besides the model's (a scaler's scale etc.)."""
        return []

    def outside_floor(self, scale: float) -> bool:
        """Whether ``scale`` leaves ``[min_loss_scale, inf)`` (the run must stop)."""
        return not (self.min_loss_scale <= scale < math.inf)

    def scale_below_floor(self) -> float | None:
        """Before an attempt: the loss scale when it is below the floor, else None.

        Without a scaler there is no scale: always None.
        """
        return None

    def scale_seen(self, scale: float) -> None:
        """The host learned the current scale (the logging transfer): nothing to keep here."""

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Scaler state for a checkpoint: state loaded for the next fit, else none here."""
        return dict(self._pending) if self._pending is not None else {}

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        """Keep a checkpoint's scaler state for the next fit (restored into its fresh scaler)."""
        self._pending = dict(state) if state else None


class Autocast(Precision):
    """bf16 (or fp16 without a scaler): the forward pass under ``torch.autocast``."""

    def forward_context(self) -> Any:
        return autocast_context(self.plan, self.device)


class ScaledAutocast(Autocast):
    """fp16 with a ``GradScaler``: scaled backward, unscale before clipping, skip on inf/NaN.

    A new scaler is made by every :meth:`start_fit`; ``scaler`` is None before the first fit.
    """

    scaled = True

    def __init__(self, plan: PrecisionPlan, device: Any, *, lab: bool = False) -> None:
        super().__init__(plan, device, lab=lab)
        self.scaler = None
        self._hooked: set[int] = set()
        self._steps_run = 0
        self._overflow: frozenset[int] = frozenset()
        # The floor check: the last scale the host saw, the attempts since, the backoff factor.
        self._seen, self._unseen, self._backoff = math.inf, 0, 0.5

    def _fresh_fit(self, cfg: TrainConfig, attempts_done: int) -> list[Event]:
        """A new scaler from the fit's settings, checkpointed state restored into it, and the
        attempts of this fit (numbered from 1) that get an injected overflow."""
        self.scaler = make_grad_scaler(self.plan, **cfg.scaler_settings())
        self._overflow = frozenset(attempts_done + a for a in cfg.overflow_at_steps)
        self._seen, self._unseen = cfg.init_scale, 0
        # every backoff rounds the fp32 scale by at most half an ulp: keep the bound below it
        self._backoff = cfg.backoff_factor * (1 - 2.0**-23)
        if self._pending is None:
            return []
        self.scaler.load_state_dict(dict(self._pending))
        self._seen = float(self._pending.get("scale", cfg.init_scale))
        msg = f"grad scaler state restored from checkpoint (scale {self._seen:g})"
        return [Event("checkpoint", msg, {"scale": self._seen})]

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def inject_overflow(self, attempt: int, params: Sequence[nn.Parameter]) -> None:
        if attempt in self._overflow:
            poison_gradient(params)

    def _count_steps(self, *_: Any) -> None:
        self._steps_run += 1

    def step(
        self,
        optimizer: torch.optim.Optimizer,
        clip: float | None = None,
        params: Sequence[nn.Parameter] = (),
        loss: torch.Tensor | None = None,
    ) -> StepOutcome:
        scaler = self.scaler
        if id(optimizer) not in self._hooked:  # once: tells the host when a step really ran
            optimizer.register_step_post_hook(self._count_steps)
            self._hooked.add(id(optimizer))
        used = ScalerInternals.scale(scaler).clone()  # on the device; get_scale() is a host read
        norm = None
        if clip is not None:
            scaler.unscale_(optimizer)
            norm = nn.utils.clip_grad_norm_(params, clip)
        before = self._steps_run
        scaler.step(optimizer)
        flag = ScalerInternals.found_inf(scaler, optimizer)
        scaler.update()
        self._unseen += 1
        # Without fused scaling torch decides the skip on the host, so the hook knows; a fused
        # optimizer always runs and skips on the device.
        device_decides = getattr(optimizer, "_step_supports_amp_scaling", False)
        return StepOutcome(used, flag, norm, None if device_decides else self._steps_run > before)

    def scale_tensor(self) -> torch.Tensor | None:
        scale = ScalerInternals.scale(self.scaler)
        return None if scale is None else scale.clone()

    def scale_value(self) -> float | None:
        if ScalerInternals.scale(self.scaler) is None:
            return None
        return float(self.scaler.get_scale())

    def state_tensors(self) -> list[torch.Tensor]:
        return ScalerInternals.tensors(self.scaler) if self.scaler is not None else []

    def scale_below_floor(self) -> float | None:
        """Before an attempt: the scale when it is below ``min_loss_scale``, else None.

        Each attempt can at most multiply the scale by ``backoff_factor``, so from the last
        scale the host saw the host knows the lowest it can be now. Only when that bound is
        below the floor (or where fp32 rounding could make the scale 0) is the scale read on
        the host: a run far from its floor makes no extra host read. An attempt at a scale of 0
        must never run: its gradients are 0 before unscaling, torch's inf check passes, and
        unscaling by 1/0 writes NaN into every gradient the optimizer then applies.
        """
        bound = self._seen * self._backoff**self._unseen if self._unseen else self._seen
        if bound >= self.min_loss_scale and bound >= _FP32_NORMAL_MIN:
            return None
        scale = self.scale_value()
        if scale is None:  # no attempt ran yet in this fit: the start scale
            return None if self._seen >= self.min_loss_scale else self._seen
        self.scale_seen(scale)
        return scale if scale < self.min_loss_scale else None

    def scale_seen(self, scale: float) -> None:
        self._seen, self._unseen = scale, 0

    def state_dict(self) -> dict[str, Any]:
        if self._pending is not None or self.scaler is None:
            return super().state_dict()
        return dict(self.scaler.state_dict())
