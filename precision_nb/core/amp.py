"""Autocast contexts, grad scalers, and a check of the dtype autocast really computes in."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import torch

from precision_nb.core import validate
from precision_nb.core.plan import PrecisionPlan

logger = logging.getLogger(__name__)


def _legacy_autocast(plan: PrecisionPlan) -> Any:
    """Device-specific autocast of older torch (before ``torch.autocast(device_type, dtype)``)."""
    if plan.device_type == "cuda":
        return torch.cuda.amp.autocast(dtype=plan.dtype)
    if plan.device_type == "cpu":
        return torch.cpu.amp.autocast(dtype=plan.dtype)
    raise RuntimeError(
        f"autocast: this torch has no torch.autocast(device_type, dtype) and no legacy autocast "
        f"for device type {plan.device_type!r}"
    )


def autocast_context(plan: PrecisionPlan, device: Any = None) -> Any:
    """``nullcontext()`` for fp32; ``torch.autocast(plan.device_type, dtype=plan.dtype)`` else.

    ``device`` is accepted but not consulted (the plan's ``device_type`` controls the context, as
    the resolution rules say). Older torch whose ``torch.autocast`` is missing or rejects this
    signature gets the legacy ``torch.cuda.amp.autocast`` / ``torch.cpu.amp.autocast``; the
    fallback is logged.
    """
    if not plan.autocast_enabled or not plan.is_mixed_precision:
        return contextlib.nullcontext()
    autocast = getattr(torch, "autocast", None)
    if autocast is not None:
        try:
            return autocast(device_type=plan.device_type, dtype=plan.dtype)
        except TypeError as exc:
            logger.warning(
                "autocast_context: torch.autocast(device_type=%r, dtype=%s) not supported by "
                "this torch (%s); using the legacy device-specific autocast",
                plan.device_type,
                plan.dtype,
                exc,
            )
    else:
        logger.warning("autocast_context: torch.autocast missing; using the legacy autocast")
    return _legacy_autocast(plan)


def make_grad_scaler(plan: PrecisionPlan, **scaler_kwargs: Any) -> Any:
    """A GradScaler for fp16 on CUDA (the resolution rules) or a loss-scale-lab CPU fp16 plan.

    CUDA prefers ``torch.amp.GradScaler("cuda")`` and falls back to
    ``torch.cuda.amp.GradScaler()`` for older torch (logged). A CPU plan with ``use_scaler``
    only comes from ``PrecisionConfig(loss_scale_lab=True)`` and gets
    ``torch.amp.GradScaler("cpu")``. Everything else returns ``None``. ``scaler_kwargs``
    (``init_scale``, ``growth_interval``, ...) are checked (finite, in range) and passed on.
    """
    if not isinstance(plan, PrecisionPlan):
        raise ValueError(
            f"plan: invalid value {validate.short_repr(plan)} ({type(plan).__name__}); allowed: "
            "a PrecisionPlan (from resolve_precision or explain_precision(...).plan)"
        )
    check_scaler_settings(scaler_kwargs)
    if not plan.use_scaler:
        return None
    if plan.mode != "fp16":
        logger.warning("make_grad_scaler: a %s plan asks for a scaler; none is made", plan.mode)
        return None
    if plan.device_type == "cuda":
        scaler_cls = getattr(getattr(torch, "amp", None), "GradScaler", None)
        if scaler_cls is not None:
            try:
                return scaler_cls("cuda", **scaler_kwargs)
            except TypeError as exc:
                logger.warning(
                    "make_grad_scaler: torch.amp.GradScaler('cuda') not supported by this torch "
                    "(%s); using torch.cuda.amp.GradScaler()",
                    exc,
                )
        else:
            logger.warning("make_grad_scaler: torch.amp.GradScaler missing; using torch.cuda.amp")
        return torch.cuda.amp.GradScaler(**scaler_kwargs)
    if plan.device_type == "cpu":
        return torch.amp.GradScaler("cpu", **scaler_kwargs)
    logger.warning(
        "make_grad_scaler: no scaler for fp16 on %r (not in the resolution matrix)",
        plan.device_type,
    )
    return None


_SCALER_CHECKS = {
    "init_scale": dict(minimum=0.0, strict=True),
    "growth_factor": dict(minimum=1.0, strict=True),
    "backoff_factor": dict(minimum=0.0, strict=True, maximum=1.0),
}


def check_scaler_settings(settings: dict[str, Any]) -> None:
    """Refuse non-finite or out-of-range GradScaler settings (torch accepts and misbehaves)."""
    for name, value in settings.items():
        if name in _SCALER_CHECKS:
            number = validate.number(f"scaler.{name}", value, **_SCALER_CHECKS[name])
            if name == "backoff_factor" and number == 1.0:
                raise ValueError(f"scaler.backoff_factor: invalid value {value!r}; allowed: (0, 1)")
        elif name == "growth_interval":
            validate.positive_int("scaler.growth_interval", value)


@dataclass(frozen=True)
class AutocastCheck:
    """The dtype a matmul really computed in under a plan's autocast context."""

    requested_dtype: Any
    computed_dtype: Any
    ok: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "requested_dtype": str(self.requested_dtype),
            "computed_dtype": None if self.computed_dtype is None else str(self.computed_dtype),
            "ok": self.ok,
            "detail": self.detail,
        }


def verify_autocast(plan: PrecisionPlan, device: Any = None) -> AutocastCheck:
    """Run one small matmul under ``autocast_context(plan)`` on ``device`` and report its dtype.

    ``device`` defaults to the plan's device type. A true plan (``bf16-true``) has no autocast:
    its matmul runs on tensors of the plan's dtype, as its model does. Raises ``RuntimeError``
    when tensors cannot be placed on the device (absent hardware); a matmul that fails under
    autocast is reported as ``ok=False`` with the error.
    """
    dev = torch.device(device if device is not None else plan.device_type)
    low = plan.dtype if getattr(plan, "true_weights", False) else torch.float32
    try:  # no random numbers: the probe must not move the global RNG a run is seeded with
        ones = torch.ones(16, 16, device=dev, dtype=low)
    except (RuntimeError, AssertionError) as exc:
        raise RuntimeError(f"verify_autocast: cannot place tensors on {dev}: {exc}") from exc
    try:
        with autocast_context(plan, dev):
            out = ones @ ones
    except RuntimeError as exc:
        return AutocastCheck(
            plan.dtype, None, False, f"matmul on {dev} under {plan.mode} autocast raised: {exc}"
        )
    computed = out.dtype
    ok = computed == plan.dtype
    what = "autocast" if plan.autocast_enabled else "no autocast"
    if low != torch.float32:
        what = f"no autocast, {low} operands"
    detail = f"a 16x16 matmul on {dev} ({what}) computed in {computed}"
    if ok:
        detail += ", as planned"
    else:
        detail += f", but the plan says {plan.dtype}: the requested precision is not what runs"
    return AutocastCheck(plan.dtype, computed, ok, detail)
