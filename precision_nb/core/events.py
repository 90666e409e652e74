"""Typed events: what happened in resolution or a run, for people (``message``) and code (``kind``).

Every layer records events as :class:`Event` values; views decide what to show by ``kind`` and
``data``, never by reading ``message``. ``str(event)`` is the message, so printing a list of events
reads as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: The kinds of event, and what each means.
KINDS: Mapping[str, str] = {
    "fallback": "the plan or optimizer got less than requested (data: field, requested, used)",
    "merged": "two requests resolved to the same plan and ran once (data: label, into)",
    "scaler": "the grad scaler: restored state, skipped steps, a scale at its floor",
    "stop": "the run stopped before its last step (data: reason, steps, of)",
    "oom": "the device ran out of memory (data: peak_bytes, memory_kind)",
    "calibration": "a peak FLOP/s or timing calibration (data: source, value)",
    "verify": "the autocast probe: the dtype really computed (data: requested, computed, ok)",
    "checkpoint": "checkpoint state restored or not used",
    "measurement": "how a speed figure was measured or why it could not be",
    "compile": "torch.compile: the compile step, recompilations, graph breaks, pay-back (data: "
    "the compile record)",
    "precision": "a true plan cast the model's parameters and buffers (data: dtype, cast, kept)",
    "warning": "anything else a user should know",
}


@dataclass(frozen=True)
class Event:
    """One event: ``kind`` (a key of :data:`KINDS`), a readable ``message``, structured ``data``."""

    kind: str
    message: str
    data: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"event kind {self.kind!r} is unknown; allowed: {', '.join(KINDS)}")
        object.__setattr__(self, "data", dict(self.data))

    def __str__(self) -> str:
        return self.message

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "data": dict(self.data)}

    def prefixed(self, label: str) -> Event:
        """The same event for a comparison's list: the message starts with the run's label."""
        return Event(self.kind, f"{label}: {self.message}", {**self.data, "run": label})


def of_kind(events: Any, *kinds: str) -> list[Event]:
    """The events among ``events`` whose kind is one of ``kinds``."""
    return [e for e in events or () if isinstance(e, Event) and e.kind in kinds]
