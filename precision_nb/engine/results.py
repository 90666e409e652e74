"""What a run produces: :class:`RunResult`, and errors that carry what was recorded.

Records are flat dicts with the stable keys listed in docs/architecture.md (``RECORD_KEYS``).
A failure carries its partial result one way: as ``exc.result``. An error raised by your code
(model, batches, loss, callback) or by torch inside a run reaches you as itself, its type and
traceback intact, with the partial result set on it by :func:`attach_result` (and a note saying
so); the product's own failures are :class:`FitError` subclasses built with it.
:func:`partial_result` reads it back.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from precision_nb.core.events import Event
from precision_nb.core.svg_chart import chart_svg

if TYPE_CHECKING:
    from precision_nb.core.optim import FusedOutcome
    from precision_nb.core.plan import PrecisionPlan
    from precision_nb.core.resolution import Explanation
    from precision_nb.engine.compile.record import CompileRecord
    from precision_nb.engine.inspect.step import InspectionData

RECORD_KEYS: tuple[str, ...] = (
    "run",
    "step",
    "loss",
    "loss_scale",
    "skipped",
    "skipped_total",
    "lr",
    "grad_norm",
    "grad_underflow",
    "grad_underflow_worst",
    "grad_underflow_worst_param",
    "grad_overflow",
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


@dataclass(repr=False)
class RunResult:
    """Everything one ``fit()`` call recorded. Mutable while running (callbacks see it grow).

    ``step_times_s``: seconds of every optimizer attempt, in order, aligned with
    ``scale_history`` (skipped attempts included; logging work excluded).
    ``grad_stats``: one entry per attempt whose gradient underflow was measured
    (``TrainConfig.grad_stats_every``): the record's ``grad_*`` values plus ``step``, ``attempt``
    and ``loss_scale``. ``inspection``: the ``InspectionData`` of ``TrainConfig(inspect=True)``.
    """

    label: str
    plan: PrecisionPlan
    explanation: Explanation | None
    optimizer_outcome: FusedOutcome | None
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
    step_times_s: list[float] = field(default_factory=list)
    grad_stats: list[dict[str, Any]] = field(default_factory=list)
    inspection: InspectionData | None = None
    #: A compiled plan's :class:`~precision_nb.engine.compile.record.CompileRecord` (None: eager).
    compile: CompileRecord | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary (records and history included; plan as plain values)."""
        return {
            "label": self.label,
            "plan": self.plan.to_dict() if hasattr(self.plan, "to_dict") else str(self.plan),
            "device": self.device,
            "optimizer_outcome": (
                self.optimizer_outcome.to_dict() if self.optimizer_outcome is not None else None
            ),
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
            "step_times_s": list(self.step_times_s),
            "grad_stats": [dict(g) for g in self.grad_stats],
            "inspection": self.inspection.to_dict() if self.inspection is not None else None,
            "compile": self.compile.to_dict() if self.compile is not None else None,
        }

    def summary(self) -> str:
        """One line: label, plan, device, steps (skips), final loss, seconds."""
        mode = getattr(self.plan, "mode", self.plan)
        loss = "n/a" if self.final_loss is None else f"{self.final_loss:.4g}"
        stopped = ", stopped early" if self.stopped else ""
        return (
            f"{self.label}: {mode} on {self.device}, {self.steps} steps "
            f"({self.skipped_total} skipped attempts{stopped}), final loss {loss}, "
            f"{self.seconds:.2f} s"
        )

    def __repr__(self) -> str:
        return (
            f"<RunResult {self.summary()}; {len(self.records)} records, {len(self.events)} events>"
        )

    def _repr_html_(self) -> str:
        esc = html.escape
        items = "".join(
            f"<li><code>{esc(e.kind)}</code> {esc(e.message)}</li>" for e in self.events
        )
        events = f"<ul>{items}</ul>" if items else "<p>No events.</p>"
        loss = self.final_loss
        loss_txt = "n/a" if loss is None or not math.isfinite(loss) else f"{loss:.6g}"
        points = [
            (float(r["step"]), float(r["loss"]))
            for r in self.records
            if isinstance(r.get("loss"), (int, float)) and isinstance(r.get("step"), (int, float))
        ]
        chart = chart_svg(
            {self.label: points},
            {self.label: "#1f77b4"},
            title="loss (mean per logging interval)",
            empty="no logged step",
        )
        return (
            f"<div><p><b>RunResult</b> {esc(self.summary())}</p>"
            f"<p>final loss: {esc(loss_txt)} (mean over the last logging interval)</p>"
            f"{chart}<p>events:</p>{events}</div>"
        )


#: The first words of the note :func:`attach_result` adds to an exception.
NOTE_PREFIX = "precision_nb:"
#: How that note ends when the partial result was attached.
_ATTACHED = "is `.result` on this exception"


class FitError(RuntimeError):
    """A run failed for a reason of the product's own (a non-finite loss, the loss scale at its
    floor, out of memory, a failed rank); ``.result`` holds everything recorded before it.

    A :class:`RunResult` here; a comparison's (raised by ``compare``) the partial ``Comparison``
    and a distributed run's (``DistributedError``) its ``DistributedResult``. An error of your own
    code is not wrapped in one: see :func:`attach_result`.
    """

    def __init__(self, message: str, result: Any = None) -> None:
        super().__init__(message)
        self.result = result


def _ours(exc: BaseException) -> bool:
    """Whether ``exc.result`` was set by precision_nb (a FitError's, or :func:`attach_result`'s
    with its note)."""
    notes = [str(n) for n in getattr(exc, "__notes__", None) or ()]
    attached = any(n.startswith(NOTE_PREFIX) and n.endswith(_ATTACHED) for n in notes)
    return isinstance(exc, FitError) or attached


def attach_result(exc: BaseException, result: Any, where: str = "") -> BaseException:
    """Set the partial ``result`` on ``exc`` as ``exc.result`` and say so in a note (replacing
    an earlier note of this kind: a comparison attaches its ``Comparison`` over the plan's
    ``RunResult``); returns ``exc``, to be re-raised as it is (its type and traceback intact).
    ``where``: what failed, for the note ("plan bf16 failed ...").

    An exception with a ``result`` attribute of its own keeps it: the note then says the partial
    result was not attached.
    """
    kind = type(result).__name__
    if hasattr(exc, "result") and not _ours(exc):
        text = (
            f"{NOTE_PREFIX} {where}this exception has a `.result` of its own, left as it was: "
            f"the partial {kind} is not attached"
        )
    else:
        # object.__setattr__: an exception class that refuses attributes (a frozen dataclass)
        # still carries the result
        object.__setattr__(exc, "result", result)
        text = f"{NOTE_PREFIX} {where}the partial {kind} recorded so far {_ATTACHED}"
    notes = [n for n in getattr(exc, "__notes__", None) or () if not str(n).startswith(NOTE_PREFIX)]
    object.__setattr__(exc, "__notes__", [*notes, text])
    return exc


def partial_result(exc: BaseException | None) -> Any:
    """The partial result a failed run left on ``exc`` (``exc.result`` when precision_nb set it),
    else None."""
    return getattr(exc, "result", None) if exc is not None and _ours(exc) else None


class NonFiniteLossError(FitError):
    """The loss became NaN/inf at ``.step`` (a plan without a grad scaler to skip the step)."""

    def __init__(self, message: str, result: RunResult | None = None, step: int = 0) -> None:
        super().__init__(message, result)
        self.step = step


class DeviceOutOfMemoryError(FitError):
    """The accelerator ran out of memory; the message names plan, batch size and peak memory."""


class LossScaleFloorError(FitError):
    """The loss scale left ``[train.min_loss_scale, inf)`` at ``.step`` (its value: ``.scale``)."""

    def __init__(
        self, message: str, result: RunResult | None = None, step: int = 0, scale: float = 0.0
    ) -> None:
        super().__init__(message, result)
        self.step = step
        self.scale = scale
