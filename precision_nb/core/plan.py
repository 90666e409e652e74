"""The precision request (``PrecisionConfig``) and its resolved form (``PrecisionPlan``).

Both are frozen values. ``PrecisionConfig`` normalises what a user types ("BF16 ", "float16",
``torch.float16``, "half") on construction and rejects anything else with a ``ValueError`` that
names the field, the bad value and the allowed values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

#: The precision modes a request may name ("auto" lets the device decide).
MODES: tuple[str, ...] = ("auto", "fp32", "bf16", "fp16")
#: The concrete precisions a plan can resolve to.
PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")

#: torch dtype of each concrete precision.
TORCH_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}

_ALIASES: dict[str, str] = {
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "single": "fp32",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
}
_DTYPE_OBJECTS: dict[torch.dtype, str] = {v: k for k, v in TORCH_DTYPES.items()}

_SPELLINGS = "'float32', 'bfloat16', 'float16', 'half', torch.float32/bfloat16/float16"


def normalize_precision(value: Any, field: str = "precision.mode", allow_auto: bool = True) -> str:
    """Return the canonical name ("auto", "fp32", "bf16", "fp16") of a user-typed precision.

    Accepts case and surrounding space, the ``torch`` names ("float16", "bfloat16",
    "float32"), "half" and torch dtype objects. Raises ``ValueError`` naming ``field`` otherwise.
    """
    allowed = MODES if allow_auto else PRECISIONS
    if isinstance(value, torch.dtype):
        name = _DTYPE_OBJECTS.get(value)
        if name is not None:
            return name
    elif isinstance(value, str):
        key = value.strip().lower()
        if key.startswith("torch."):
            key = key[len("torch.") :]
        if allow_auto and key == "auto":
            return "auto"
        name = _ALIASES.get(key)
        if name is not None:
            return name
    allowed_text = ", ".join(repr(a) for a in allowed)
    raise ValueError(
        f"{field}: invalid value {value!r} ({type(value).__name__}); "
        f"allowed: {allowed_text} (also spelled {_SPELLINGS})"
    )


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
                f"precision.loss_scale_lab: invalid value {self.loss_scale_lab!r} "
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
