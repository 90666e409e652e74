"""The precision request (``PrecisionConfig``) and its resolved form (``PrecisionPlan``).

Both are frozen values. ``PrecisionConfig`` normalises what a user types ("BF16 ", "float16",
``torch.float16``, "half") on construction and rejects anything else with a ``ValueError`` that
names the field, the bad value and the allowed values.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from precision_nb.core.names import (
    MODES,
    REMEDIES,
    WEIGHTS,
    check_weights,
    plan_label,
    plan_request,
    precision_name,
)
from precision_nb.core.validate import short_repr

__all__ = [
    "MODES",
    "TORCH_DTYPES",
    "PrecisionConfig",
    "PrecisionPlan",
    "normalize_plan",
    "normalize_precision",
]

#: torch dtype of each concrete precision.
TORCH_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}
_DTYPE_OBJECTS: dict[torch.dtype, str] = {v: k for k, v in TORCH_DTYPES.items()}


def normalize_precision(value: Any, field: str = "precision.mode", allow_auto: bool = True) -> str:
    """Return the canonical name ("auto", "fp32", "bf16", "fp16") of a user-typed precision.

    Accepts case and surrounding space, the ``torch`` names ("float16", "bfloat16",
    "float32"), "half" and torch dtype objects. Raises ``ValueError`` naming ``field`` otherwise.
    """
    if isinstance(value, torch.dtype) and value in _DTYPE_OBJECTS:
        return _DTYPE_OBJECTS[value]
    return precision_name(value, field, allow_auto)


def normalize_plan(value: Any, field: str = "precision.mode") -> str:
    """The canonical spelling of a plan request: a precision (:func:`normalize_precision`) or a
    true plan's ``bf16-true+kahan``; ``ValueError`` naming ``field`` otherwise."""
    if isinstance(value, str) and ("-" in value or "+" in value):
        return plan_label(*plan_request(value, field))
    return normalize_precision(value, field)


@dataclass(frozen=True)
class PrecisionPlan:
    """The resolved precision: what the trainer will actually do.

    ``weights="mixed"`` (the default, every plan of the resolution rules' base table): parameters
    and buffers are not cast to ``dtype``; mixed precision happens inside
    ``autocast_context(plan)``. ``weights="true"``: the model's floating-point parameters and
    buffers, its gradients and the optimizer state are in ``dtype`` and no autocast runs;
    ``remedy`` names what wins back the updates the low-precision weights round away ("none",
    "stochastic", "kahan").
    """

    mode: str
    dtype: Any
    use_scaler: bool
    autocast_enabled: bool
    device_type: str
    weights: str = "mixed"
    remedy: str = "none"

    @property
    def label(self) -> str:
        """The plan's one spelling: ``bf16``, ``bf16-true``, ``bf16-true+kahan``."""
        return plan_label(self.mode, self.weights, self.remedy)

    @property
    def true_weights(self) -> bool:
        """True when the weights themselves are low precision (a ``true`` plan)."""
        return self.weights == "true"

    @property
    def is_mixed_precision(self) -> bool:
        """True for bf16 and fp16."""
        return self.mode in ("bf16", "fp16")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able mapping (the dtype as its torch name, e.g. "torch.bfloat16")."""
        return {
            "mode": self.mode,
            "dtype": str(self.dtype),
            "use_scaler": bool(self.use_scaler),
            "autocast_enabled": bool(self.autocast_enabled),
            "device_type": self.device_type,
            "is_mixed_precision": self.is_mixed_precision,
            "weights": self.weights,
            "remedy": self.remedy,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrecisionPlan:
        """Rebuild a plan from :meth:`to_dict` output (e.g. a checkpoint)."""
        mode = normalize_precision(data["mode"], field="plan.mode", allow_auto=False)
        return cls(
            mode=mode,
            dtype=TORCH_DTYPES[mode],
            use_scaler=bool(data["use_scaler"]),
            autocast_enabled=bool(data["autocast_enabled"]),
            device_type=str(data["device_type"]),
            weights=str(data.get("weights", "mixed")),  # checkpoints from before true plans
            remedy=str(data.get("remedy", "none")),
        )


@dataclass(frozen=True)
class PrecisionConfig:
    """A precision request.

    ``mode`` is "auto", "fp32", "bf16" or "fp16". ``dtype`` only matters when ``mode == "auto"``:
    ``PrecisionConfig(mode="auto", dtype="fp16")`` requests fp16, while with ``mode="fp32"`` a
    ``dtype`` is ignored (see ``docs/plans.md#resolution-rules``). ``loss_scale_lab=True`` opts in
    to a CPU fp16 plan with autocast and a CPU GradScaler, outside the resolution rules, for
    studying loss scaling. ``weights``: "mixed" (default) or "true" (bf16/fp16 weights, gradients
    and optimizer state); ``remedy`` ("none", "stochastic", "kahan") for a true plan. The mode
    string may carry both: ``PrecisionConfig("bf16-true+kahan")``.
    """

    mode: str = "auto"
    dtype: Any = None
    loss_scale_lab: bool = False
    weights: str = "mixed"
    remedy: str = "none"

    def __post_init__(self) -> None:
        for name, allowed in (("weights", WEIGHTS), ("remedy", REMEDIES)):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(
                    f"precision.{name}: invalid value {short_repr(value)}; allowed: "
                    + ", ".join(repr(a) for a in allowed)
                )
        if isinstance(self.mode, str):
            mode, weights, remedy = plan_request(self.mode, "precision.mode")
            if weights == "true":
                object.__setattr__(self, "weights", weights)
            if remedy != "none":
                if self.remedy not in ("none", remedy):
                    raise ValueError(
                        f"precision.remedy: invalid value {self.remedy!r}: the mode "
                        f"{self.mode!r} names remedy {remedy!r}; allowed: one of them"
                    )
                object.__setattr__(self, "remedy", remedy)
            object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "mode", normalize_precision(self.mode, "precision.mode"))
        if self.dtype is not None:
            dtype = normalize_precision(self.dtype, "precision.dtype", allow_auto=False)
            object.__setattr__(self, "dtype", dtype)
        if not isinstance(self.loss_scale_lab, bool):
            raise ValueError(
                f"precision.loss_scale_lab: invalid value {short_repr(self.loss_scale_lab)} "
                f"({type(self.loss_scale_lab).__name__}); allowed: true, false"
            )
        check_weights(self.requested, self.weights, self.remedy, "precision", self.label)

    @property
    def requested(self) -> str:
        """The effective request: ``dtype`` when ``mode == "auto"`` and a dtype is set."""
        if self.mode == "auto" and self.dtype is not None:
            return self.dtype
        return self.mode

    @property
    def label(self) -> str:
        """The request's one spelling: ``bf16``, ``bf16-true``, ``bf16-true+stochastic``."""
        return plan_label(self.requested, self.weights, self.remedy)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
