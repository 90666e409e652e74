"""What a run produces: :class:`RunResult`, callbacks, errors that carry records.

Records are flat dicts with the stable keys listed in docs/architecture.md (``RECORD_KEYS``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from precision_nb.core.events import Event

RECORD_KEYS: tuple[str, ...] = (
    "run",
    "step",
    "loss",
    "loss_scale",
    "skipped",
    "skipped_total",
    "lr",
    "grad_norm",
    "step_time_s",
    "samples_per_s",
    "tokens_per_s",
    "flops_per_s",
    "mfu",
    "mfu_peak_source",
    "memory_kind",
    "memory_bytes",
    "memory_peak_bytes",
    "memory_reserved_bytes",
    "elapsed_s",
    "mode",
    "dtype",
    "use_scaler",
    "autocast_enabled",
    "device_type",
    "device",
    "fused_adamw",
    "loss_scale_lab",
)


@dataclass
class RunResult:
    """Everything one ``fit()`` call recorded. Mutable while running (callbacks see it grow)."""

    label: str
    plan: Any
    explanation: Any
    optimizer_outcome: Any
    device: str
    records: list[dict[str, Any]] = field(default_factory=list)
    scale_history: list[dict[str, Any]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    workload: dict[str, Any] = field(default_factory=dict)
    stopped: bool = False
    steps: int = 0
    attempts: int = 0
    skipped_total: int = 0
    seconds: float = 0.0
    final_loss: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary (records and history included; plan as plain values)."""
        return {
            "label": self.label,
            "plan": self.plan.to_dict() if hasattr(self.plan, "to_dict") else str(self.plan),
            "device": self.device,
            "records": [dict(r) for r in self.records],
            "scale_history": [dict(h) for h in self.scale_history],
            "events": [e.to_dict() for e in self.events],
            "workload": dict(self.workload),
            "stopped": self.stopped,
            "steps": self.steps,
            "attempts": self.attempts,
            "skipped_total": self.skipped_total,
            "seconds": self.seconds,
            "final_loss": self.final_loss,
        }


@runtime_checkable
class Callback(Protocol):
    """Progress hooks; implement any subset (missing methods are skipped)."""

    def on_fit_start(self, result: RunResult) -> None: ...

    def on_log(self, record: dict[str, Any]) -> None: ...

    def on_fit_end(self, result: RunResult) -> None: ...


class FitError(RuntimeError):
    """A run failed; ``.result`` holds every record made before the failure."""

    def __init__(self, message: str, result: RunResult | None = None) -> None:
        super().__init__(message)
        self.result = result


class NonFiniteLossError(FitError):
    """The loss became NaN/inf at ``.step`` (a plan without a grad scaler to skip the step)."""

    def __init__(self, message: str, result: RunResult | None = None, step: int = 0) -> None:
        super().__init__(message, result)
        self.step = step


class DeviceOutOfMemoryError(FitError):
    """The accelerator ran out of memory; the message names plan, batch size and peak memory."""
