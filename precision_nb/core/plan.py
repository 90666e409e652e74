"""The precision request (``PrecisionConfig``) and its resolved form (``PrecisionPlan``).

Both are frozen values. ``PrecisionConfig`` normalises what a user types ("BF16 ", "float16",
``torch.float16``, "half") on construction and rejects anything else with a ``ValueError`` that
names the field, the bad value and the allowed values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from precision_nb.core.names import MODES, PRECISIONS, precision_name
from precision_nb.core.validate import short_repr

__all__ = [
    "MODES",
    "PRECISIONS",
    "TORCH_DTYPES",
    "PrecisionConfig",
    "PrecisionPlan",
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


@dataclass(frozen=True)
class PrecisionPlan:
    """The resolved precision: what the trainer will actually do.

    Parameters and buffers are not cast to ``dtype``; mixed precision happens inside
    ``autocast_context(plan)``.
    """

    mode: str
    dtype: Any
    use_scaler: bool
    autocast_enabled: bool
    device_type: str

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
        )


@dataclass(frozen=True)
class PrecisionConfig:
    """A precision request.

    ``mode`` is "auto", "fp32", "bf16" or "fp16". ``dtype`` only matters when ``mode == "auto"``:
    ``PrecisionConfig(mode="auto", dtype="fp16")`` requests fp16, while with ``mode="fp32"`` a
    ``dtype`` is ignored (see ``docs/plans.md#resolution-rules``). ``loss_scale_lab=True`` opts in
    to a CPU fp16 plan with autocast and a CPU GradScaler, outside the resolution rules, for
    studying loss scaling.
    """

    mode: str = "auto"
    dtype: Any = None
    loss_scale_lab: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", normalize_precision(self.mode, "precision.mode"))
        if self.dtype is not None:
            dtype = normalize_precision(self.dtype, "precision.dtype", allow_auto=False)
            object.__setattr__(self, "dtype", dtype)
        if not isinstance(self.loss_scale_lab, bool):
            raise ValueError(
                f"precision.loss_scale_lab: invalid value {short_repr(self.loss_scale_lab)} "
                f"({type(self.loss_scale_lab).__name__}); allowed: true, false"
            )

    @property
    def requested(self) -> str:
        """The effective request: ``dtype`` when ``mode == "auto"`` and a dtype is set."""
        if self.mode == "auto" and self.dtype is not None:
            return self.dtype
        return self.mode

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "dtype": self.dtype, "loss_scale_lab": self.loss_scale_lab}
