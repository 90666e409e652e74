"""Precision in the training loop: one :class:`AmpStep` per plan, like a precision plugin.

``AmpStep.for_plan(plan, device, scaler_settings)`` returns

- :class:`AmpStep` (fp32): no autocast, plain ``backward`` and ``optimizer.step``;
- :class:`AutocastStep` (bf16, or fp16 without a scaler): the forward under ``torch.autocast``;
- :class:`ScaledStep` (fp16 on CUDA, the CPU loss-scale lab): autocast plus a ``GradScaler``.

All three have ``forward_context()``, ``backward(loss)``, ``step(optimizer, clip, params)``,
``state_dict()`` / ``load_state_dict()``, so the loop has no precision branches. ``step`` returns a
:class:`StepOutcome` of device tensors (the scale the attempt used, the scaler's own found-inf
flag, the pre-clip grad norm) and never reads them on the host.

Skips come from the scaler's own found-inf result, never from the scale going down (a scale of 0
or inf cannot go down). torch keeps that result per optimizer in the private
``scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"]`` until ``update()``;
:func:`found_inf` reads it there, and a test pins that layout against the installed torch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn

from precision_nb.core.amp import autocast_context, make_grad_scaler
from precision_nb.core.plan import PrecisionPlan


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


def found_inf(scaler: Any, optimizer: torch.optim.Optimizer) -> torch.Tensor:
    """The scaler's found-inf flag for ``optimizer`` after ``scaler.step``, before ``update()``.

    A device tensor (> 0: the step was skipped). Reads torch's private per-optimizer state; raises
    ``RuntimeError`` if this torch keeps it elsewhere.
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


class AmpStep:
    """fp32: no autocast, no scaler. The base of the other precision steps.

    ``skip_nonfinite`` (no scaler only): skip the step when the loss is NaN/inf, at the cost of
    one host read per step.
    """

    scaler: Any = None

    def __init__(
        self, plan: PrecisionPlan, device: torch.device, *, skip_nonfinite: bool = False
    ) -> None:
        self.plan = plan
        self.device = torch.device(device)
        self.skip_nonfinite = skip_nonfinite

    @staticmethod
    def for_plan(
        plan: PrecisionPlan,
        device: Any,
        scaler_settings: Mapping[str, Any] | None = None,
        *,
        skip_nonfinite: bool = False,
    ) -> AmpStep:
        """The precision step for ``plan``; ``scaler_settings`` go to ``make_grad_scaler``."""
        if plan.use_scaler:
            scaler = make_grad_scaler(plan, **dict(scaler_settings or {}))
            if scaler is not None:
                return ScaledStep(plan, device, scaler)
        if plan.autocast_enabled and plan.is_mixed_precision:
            return AutocastStep(plan, device, skip_nonfinite=skip_nonfinite)
        return AmpStep(plan, device, skip_nonfinite=skip_nonfinite)

    def forward_context(self) -> Any:
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

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

    def scale_tensor(self) -> torch.Tensor | None:
        """The current loss scale as a device tensor (a copy), None without a scaler."""
        return None

    def scale_value(self) -> float | None:
        """The current loss scale read on the host (for inspection, not the loop)."""
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Nothing to restore without a scaler."""


class AutocastStep(AmpStep):
    """bf16 (or fp16 without a scaler): the forward pass under ``torch.autocast``."""

    def forward_context(self) -> Any:
        return autocast_context(self.plan, self.device)


class ScaledStep(AutocastStep):
    """fp16 with a ``GradScaler``: scaled backward, unscale before clipping, skip on inf/NaN."""

    def __init__(self, plan: PrecisionPlan, device: Any, scaler: Any) -> None:
        super().__init__(plan, device)
        self.scaler = scaler
        self._hooked: set[int] = set()
        self._steps_run = 0

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

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
        used = scaler._scale.clone()  # on the device; get_scale() would be a host read
        norm = None
        if clip is not None:
            scaler.unscale_(optimizer)
            norm = nn.utils.clip_grad_norm_(params, clip)
        before = self._steps_run
        scaler.step(optimizer)
        flag = found_inf(scaler, optimizer)
        scaler.update()
        # Without fused scaling torch decides the skip on the host, so the hook knows; a fused
        # optimizer always runs and skips on the device.
        device_decides = getattr(optimizer, "_step_supports_amp_scaling", False)
        return StepOutcome(used, flag, norm, None if device_decides else self._steps_run > before)

    def scale_tensor(self) -> torch.Tensor | None:
        scale = getattr(self.scaler, "_scale", None)
        return None if scale is None else scale.clone()

    def scale_value(self) -> float | None:
        if getattr(self.scaler, "_scale", None) is None:
            return None
        return float(self.scaler.get_scale())

    def state_dict(self) -> dict[str, Any]:
        return dict(self.scaler.state_dict())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.scaler.load_state_dict(dict(state))
