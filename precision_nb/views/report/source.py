"""What the report shows, normalised once: every public entry turns its source into a
``Comparison``, so the code behind it reads typed attributes instead of guessing.

Accepted sources: a ``Comparison``; a ``RunResult`` (one plan); a mapping label -> ``RunResult``;
run records (a list of the engine's flat record dicts, or a DataFrame of them), each record
naming its plan (``mode``, ``use_scaler``, ``autocast_enabled``, ``device_type``). Anything else is
a ``ValueError`` that names the type and what is allowed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from precision_nb.core.plan import PrecisionPlan
from precision_nb.engine.compare import Comparison
from precision_nb.engine.results import RunResult

__all__ = ["PLAN_KEYS", "as_comparison"]

#: The record keys a plan is rebuilt from when the source is bare records.
PLAN_KEYS = ("mode", "use_scaler", "autocast_enabled", "device_type")

ALLOWED = (
    "a Comparison, a RunResult, a mapping of label -> RunResult, or run records (a list of "
    "record dicts or a DataFrame of them)"
)


def as_comparison(source: Any, *, field: str = "source") -> Comparison:
    """``source`` as a ``Comparison`` (itself when it is one; ``ValueError`` when not accepted).

    A ``RunResult`` or a mapping of them becomes a comparison of those runs, with no
    measurement, drift or merged requests; records become one ``RunResult`` per ``run`` label.
    """
    if isinstance(source, Comparison):
        return source
    if isinstance(source, RunResult):
        return Comparison(results={source.label or source.plan.mode: source})
    if isinstance(source, Mapping):
        if all(isinstance(v, RunResult) for v in source.values()):
            return Comparison(results={str(k): v for k, v in source.items()})
        raise ValueError(
            f"{field}: a mapping whose values are not all RunResults; allowed: {ALLOWED}"
        )
    records = _records(source)
    if records is None:
        raise ValueError(
            f"{field}: invalid value of type {type(source).__name__}; allowed: {ALLOWED}"
        )
    return Comparison(results=_results_from_records(records, field))


def _records(source: Any) -> list[Mapping[str, Any]] | None:
    """The records of a list / tuple of dicts or of a DataFrame; None for anything else."""
    if hasattr(source, "to_dict") and hasattr(source, "columns"):  # a pandas DataFrame
        return [{k: v for k, v in r.items() if v == v} for r in source.to_dict("records")]
    if isinstance(source, Sequence) and not isinstance(source, (str, bytes)):
        if all(isinstance(r, Mapping) for r in source):
            return list(source)
    return None


def _results_from_records(records: Sequence[Mapping[str, Any]], field: str) -> dict[str, RunResult]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        label = str(record.get("run") or record.get("mode") or "run")
        groups.setdefault(label, []).append({**record, "run": label})
    out: dict[str, RunResult] = {}
    for label, rows in groups.items():
        last = rows[-1]
        missing = [k for k in PLAN_KEYS if last.get(k) is None]
        if missing:
            raise ValueError(
                f"{field}: the records of run {label!r} lack {', '.join(missing)}; allowed: "
                f"records that name their plan ({', '.join(PLAN_KEYS)}), or {ALLOWED}"
            )
        loss = last.get("loss")
        out[label] = RunResult(
            label=label,
            plan=PrecisionPlan.from_dict(dict(last)),
            explanation=None,
            optimizer_outcome=None,
            device=str(last.get("device") or last["device_type"]),
            records=rows,
            steps=int(last.get("step") or 0),
            skipped_total=int(last.get("skipped_total") or 0),
            final_loss=None if loss is None else float(loss),
        )
    return out
