"""What a run records before its first step: the plan's fallbacks and the autocast probe.

Every fallback of the plan (the explanation's decisions with ``fallback=True``) and of fused AdamW
(what ``build_optimizer`` really built) becomes an ``Event("fallback", ...)`` of the run and a
``logging`` warning. ``verify_autocast`` runs one small matmul under the plan's autocast and is
recorded as an ``Event("verify", ...)``; a dtype other than the plan's is also a warning.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from precision_nb.core.amp import verify_autocast
from precision_nb.core.events import Event

log = logging.getLogger(__name__)

_FUSED_FIELD = "fused AdamW"


def _requested(explanation: Any, field: str) -> Any:
    config = getattr(explanation, "config", None)
    value = getattr(config, field, None) if config is not None else None
    return None if value is None else str(value)


def fallback_events(explanation: Any, optimizer_outcome: Any) -> list[Event]:
    """One ``fallback`` event per decision not honoured as asked, each logged as a warning."""
    events = []
    for decision in getattr(explanation, "fallbacks", ()):
        if decision.field == _FUSED_FIELD:
            continue  # the optimizer's real outcome below says what was built
        events.append(
            Event(
                "fallback",
                f"{decision.field}: {decision.outcome}. {decision.reason}",
                {
                    "field": decision.field,
                    "requested": _requested(explanation, decision.field),
                    "used": decision.outcome,
                },
            )
        )
    outcome = optimizer_outcome
    # fused was asked for (True), or left to the probe on CUDA, where it is expected
    attempted = outcome is not None and (
        outcome.requested is True
        or (outcome.requested is None and str(outcome.device).startswith("cuda"))
    )
    if attempted and not outcome.used:
        events.append(
            Event(
                "fallback",
                f"fused AdamW: plain AdamW. {outcome.reason}",
                {"field": _FUSED_FIELD, "requested": outcome.requested, "used": "plain AdamW"},
            )
        )
    for event in events:
        log.warning("%s", event.message)
    return events


def verify_event(plan: Any, device: torch.device) -> Event:
    """Run ``verify_autocast`` on the training device and record what it found."""
    check = verify_autocast(plan, device)
    data = {
        "requested": str(check.requested_dtype),
        "computed": None if check.computed_dtype is None else str(check.computed_dtype),
        "ok": check.ok,
    }
    if not check.ok:
        log.warning("autocast check: %s", check.detail)
    return Event("verify", f"autocast check: {check.detail}", data)
