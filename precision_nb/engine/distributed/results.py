"""What a distributed run gives back: every rank's records and tables, merged per step.

:func:`read_rank_log` turns one rank's JSON lines into a :class:`RankResult` (a rank that died
keeps the lines it wrote); :class:`DistributedResult` holds them all with the global records (loss
averaged over ranks: with equal slices, the mean loss of the global batch; step time the slowest
rank's) and the per-rank communication and memory tables.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from precision_nb.engine.results import FitError


@dataclass
class RankResult:
    """One rank's share of a run."""

    rank: int
    pid: int | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    comm_setup: list[dict[str, Any]] = field(default_factory=list)
    comm: list[dict[str, Any]] = field(default_factory=list)
    memory: dict[str, dict[str, int]] = field(default_factory=dict)
    sharding: dict[str, Any] = field(default_factory=dict)
    compute: dict[str, Any] = field(default_factory=dict)
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    t_start: float | None = None
    t_fit_start: float | None = None
    finished: bool = False

    @property
    def stopped(self) -> bool:
        return bool(self.result and self.result.get("stopped"))


def read_rank_log(path: Path, rank: int, plan: str | None = None) -> RankResult:
    """Parse ``rank<R>.jsonl``; a cut last line (a killed writer) is ignored.

    ``plan``: keep only the lines of that plan (and the lines of no plan: start, error) from a
    log where one launch ran several plans.
    """
    out = RankResult(rank)
    if not path.exists():
        return out
    for item in rank_lines(path):
        if plan is not None and item.get("plan", plan) != plan:
            continue
        kind = item.get("kind")
        if kind == "start":
            out.pid, out.t_start = item.get("pid"), item.get("t")
        elif kind == "fit_start":
            out.t_fit_start, out.comm_setup = item.get("t"), item.get("comm_setup", [])
        elif kind == "record":
            out.records.append(item["record"])
            out.comm.extend(item.get("comm", []))
        elif kind == "memory":
            out.memory = item.get("memory", {})
            out.sharding, out.compute = item.get("sharding", {}), item.get("compute", {})
        elif kind == "result":
            out.result, out.finished = item.get("result"), True
        elif kind == "error":
            out.error = item
            if item.get("result"):
                out.result = item["result"]
    return out


def rank_lines(path: Path) -> list[dict[str, Any]]:
    """Every whole JSON line of a rank's log (a cut last line is left out)."""
    items = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            items.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return items


def merge_records(ranks: list[RankResult]) -> list[dict[str, Any]]:
    """One record per step logged by every rank: rank 0's fields, loss averaged over ranks,
    step time of the slowest rank, samples/s of the whole global batch."""
    by_step: dict[int, list[dict[str, Any]]] = {}
    for r in ranks:
        for rec in r.records:
            by_step.setdefault(int(rec["step"]), []).append(rec)
    merged = []
    for step in sorted(by_step):
        recs = by_step[step]
        if len(recs) != len(ranks):
            continue
        out = dict(recs[0])
        out["loss"] = statistics.fmean(float(x["loss"]) for x in recs)
        times = [x.get("step_time_s") for x in recs]
        if all(isinstance(t, (int, float)) and t > 0 for t in times):
            slowest = max(times)
            out["step_time_s"] = slowest
            samples = sum(x["samples_per_s"] * x["step_time_s"] for x in recs)
            out["samples_per_s"] = samples / slowest
        out["nproc"] = len(recs)
        out["comm_bytes_per_step"] = [x.get("comm_bytes_per_step") for x in recs]
        merged.append(out)
    return merged


@dataclass
class DistributedResult:
    """Everything a distributed fit recorded, per rank and merged."""

    plan: Any
    ranks: list[RankResult]
    records: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    startup_s: float | None = None
    stopped: bool = False
    error: str | None = None
    log_tail: str = ""
    run_dir: str = ""
    #: Rank -> its step times of the measured rounds (a distributed profile); empty for a fit.
    timed_steps: dict[int, list[float]] = field(default_factory=dict)

    @property
    def rank0(self) -> dict[str, Any]:
        """Rank 0's own result (``RunResult.to_dict``), empty when it left none."""
        return (self.ranks[0].result or {}) if self.ranks else {}

    def run_result(self, **fields: Any) -> Any:
        """The rank-merged records as a ``RunResult``: the plan and its explanation, rank 0's
        fused AdamW outcome, scale history, steps and workload, the merged records and final
        loss; ``fields`` replace any of them (a label, the device, rank 0's events, ...)."""
        from precision_nb.engine.results import RunResult

        precision, rank0 = self.plan.precision, self.rank0
        values: dict[str, Any] = {
            "label": str(self.records[0]["run"]) if self.records else precision.plan.mode,
            "plan": precision.plan,
            "explanation": precision,
            "optimizer_outcome": rank0_optimizer_outcome(self),
            "device": str(precision.device),
            "records": list(self.records),
            "scale_history": list(rank0.get("scale_history", [])),
            "workload": dict(rank0.get("workload", {})),
            "stopped": self.stopped,
            "steps": int(rank0.get("steps", 0)),
            "seconds": self.seconds,
            "final_loss": self.final_loss,
        }
        return RunResult(**{**values, **fields})

    @property
    def final_loss(self) -> float | None:
        return self.records[-1]["loss"] if self.records else None

    def comm_table(self) -> list[dict[str, Any]]:
        """Per rank, op and dtype over the logged steps (setup excluded): mean bytes per step,
        calls per step, and the mean seconds in flight per step (call to completion, summed over
        the collectives; they overlap compute) with the share of calls that were timed.

        The means are over every logged step of the rank, including the intervals in which an op
        was not issued (DDP's one-time bucket rebuild after its first step, say)."""
        rows: dict[tuple[int, str, str], dict[str, float]] = {}
        steps: dict[int, float] = {}
        for r in self.ranks:
            intervals = {row.get("step", i): row["steps"] for i, row in enumerate(r.comm)}
            steps[r.rank] = sum(intervals.values())
            for row in r.comm:
                key = (r.rank, row["op"], row["dtype"])
                acc = rows.setdefault(key, dict.fromkeys(("bytes", "calls", "s", "t"), 0))
                acc["bytes"] += row["bytes_per_step"] * row["steps"]
                acc["calls"] += row.get("calls", 0)
                acc["s"] += row.get("seconds", 0.0)
                acc["t"] += row.get("timed_calls", 0)
        return [
            {
                "rank": k[0],
                "op": k[1],
                "dtype": k[2],
                "bytes_per_step": a["bytes"] / steps[k[0]],
                "calls_per_step": a["calls"] / steps[k[0]],
                "in_flight_s_per_step": a["s"] / steps[k[0]] if a["t"] else None,
                "timed_share": a["t"] / a["calls"] if a["calls"] else None,
            }
            for k, a in sorted(rows.items())
        ]

    def memory_table(self) -> list[dict[str, Any]]:
        """Bytes each rank holds by kind (parameters, gradients, optimizer_state) and dtype."""
        return [
            {"rank": r.rank, "kind": kind, "dtype": dtype, "bytes": nbytes}
            for r in self.ranks
            for kind, by_dtype in sorted(r.memory.items())
            for dtype, nbytes in sorted(by_dtype.items())
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan.to_dict() if hasattr(self.plan, "to_dict") else None,
            "records": [dict(r) for r in self.records],
            "ranks": [r.__dict__ for r in self.ranks],
            "seconds": self.seconds,
            "startup_s": self.startup_s,
            "stopped": self.stopped,
            "error": self.error,
        }


class DistributedError(FitError):
    """A distributed run failed: ``.rank`` is the failing rank, ``.result`` keeps every rank's
    records (a :class:`DistributedResult`)."""

    def __init__(self, message: str, result: DistributedResult, rank: int | None) -> None:
        super().__init__(message, None)
        self.result = result  # type: ignore[assignment]
        self.rank = rank


def rank0_optimizer_outcome(result: DistributedResult) -> Any:
    """Rank 0's fused AdamW outcome (a ``FusedOutcome``; every rank builds its optimizer the same
    way), or None when rank 0 left no result."""
    from precision_nb.core.optim import FusedOutcome

    data = result.rank0.get("optimizer_outcome")
    return FusedOutcome(**data) if isinstance(data, dict) else None
