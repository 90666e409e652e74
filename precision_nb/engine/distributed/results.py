"""What a distributed run gives back: every rank's records and tables, merged per step.

:func:`read_rank_log` turns one rank's JSON lines into a :class:`RankResult` (a rank that died
keeps the lines it wrote); :class:`DistributedResult` holds them all with the global records (loss
averaged over ranks: with equal slices, the mean loss of the global batch; step time the slowest
rank's), each node's records merged over its ranks, and the per-rank communication and memory
tables (each row with its node).
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from precision_nb.engine.results import FitError


@dataclass
class RankResult:
    """One rank's share of a run."""

    rank: int
    pid: int | None = None
    #: The node rank the rank's torchrun agent was started with (None: not recorded).
    node: int | None = None
    host: str | None = None
    local_rank: int | None = None
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
            where = item.get("node") or {}
            out.node, out.host = where.get("node"), where.get("host")
            out.local_rank = where.get("local_rank")
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

    @property
    def world_size(self) -> int:
        """The ranks the run was planned with (nnodes x nproc), else the ranks recorded."""
        planned = getattr(self.plan, "world_size", None)
        return int(planned) if isinstance(planned, int) else len(self.ranks)

    @property
    def missing_ranks(self) -> list[int]:
        """Ranks of the planned world that left no log here (another node's, or none started)."""
        seen = {r.rank for r in self.ranks}
        return [r for r in range(self.world_size) if r not in seen]

    def nodes(self) -> dict[int, list[RankResult]]:
        """Node rank -> its ranks (a run that recorded no node: node 0)."""
        out: dict[int, list[RankResult]] = {}
        for r in self.ranks:
            out.setdefault(r.node if r.node is not None else 0, []).append(r)
        return dict(sorted(out.items()))

    def node_records(self, node: int) -> list[dict[str, Any]]:
        """The records of one node's ranks merged per step, as :attr:`records` merges all."""
        return merge_records(self.nodes().get(node, []))

    def node_table(self) -> list[dict[str, Any]]:
        """Per node: host, ranks, steps logged, its final loss (over its ranks), the median of
        its slowest rank's logged step times, and ``ready_s``: when its last rank entered its
        fit loop, in seconds after the first rank of the run started (host clocks)."""
        first = [r.t_start for r in self.ranks if r.t_start is not None]
        rows = []
        for node, ranks in self.nodes().items():
            merged = merge_records(ranks)
            times = [float(r["step_time_s"]) for r in merged if r.get("step_time_s")]
            ready = [r.t_fit_start for r in ranks]
            known = first and all(t is not None for t in ready)
            rows.append(
                {
                    "node": node,
                    "host": ranks[0].host,
                    "ranks": [r.rank for r in ranks],
                    "steps_logged": len(merged),
                    "final_loss": merged[-1]["loss"] if merged else None,
                    "median_step_time_s": statistics.median(times) if times else None,
                    "ready_s": max(ready) - min(first) if known else None,  # type: ignore[type-var]
                }
            )
        return rows

    def _node_column(self) -> dict[int, dict[str, Any]]:
        """Rank -> ``{"node": K}`` when the ranks ran on several nodes (else no column)."""
        if len({r.node for r in self.ranks}) < 2:
            return {}
        return {r.rank: {"node": r.node} for r in self.ranks}

    def comm_table(self) -> list[dict[str, Any]]:
        """Per rank, op and dtype over the logged steps (setup excluded): mean bytes per step,
        calls per step, and the mean seconds in flight per step (call to completion, summed over
        the collectives; they overlap compute) with the share of calls that were timed. A run
        over several nodes adds each rank's ``node``.

        The means are over every logged step of the rank, including the intervals in which an op
        was not issued (DDP's one-time bucket rebuild after its first step, say)."""
        rows: dict[tuple[int, str, str], Counter[str]] = {}
        steps: dict[int, float] = {}
        node = self._node_column()
        for r in self.ranks:
            intervals = {row.get("step", i): row["steps"] for i, row in enumerate(r.comm)}
            steps[r.rank] = sum(intervals.values())
            for row in r.comm:
                key = (r.rank, row["op"], row["dtype"])
                acc = rows.setdefault(key, Counter())
                acc["bytes"] += row["bytes_per_step"] * row["steps"]
                acc.update({k: row.get(k, 0) for k in ("calls", "seconds", "timed_calls")})
        return [
            {
                "rank": k[0],
                **node.get(k[0], {}),
                "op": k[1],
                "dtype": k[2],
                "bytes_per_step": a["bytes"] / steps[k[0]],
                "calls_per_step": a["calls"] / steps[k[0]],
                "in_flight_s_per_step": a["seconds"] / steps[k[0]] if a["timed_calls"] else None,
                "timed_share": a["timed_calls"] / a["calls"] if a["calls"] else None,
            }
            for k, a in sorted(rows.items())
        ]

    def memory_table(self) -> list[dict[str, Any]]:
        """Bytes each rank holds by kind (parameters, gradients, optimizer_state) and dtype."""
        node = self._node_column()
        return [
            {"rank": r.rank, **node.get(r.rank, {}), "kind": kind, "dtype": dtype, "bytes": nbytes}
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
            "nodes": self.node_table(),
        }


class DistributedError(FitError):
    """A distributed run failed: ``.rank`` is the failing rank, ``.node`` its node (or the node
    whose torchrun agent failed), ``.result`` keeps every rank's records (a
    :class:`DistributedResult`)."""

    def __init__(
        self, message: str, result: DistributedResult, rank: int | None, node: int | None = None
    ) -> None:
        super().__init__(message, None)
        self.result = result  # type: ignore[assignment]
        self.rank = rank
        self.node = node


def rank0_optimizer_outcome(result: DistributedResult) -> Any:
    """Rank 0's fused AdamW outcome (a ``FusedOutcome``; every rank builds its optimizer the same
    way), or None when rank 0 left no result."""
    from precision_nb.core.optim import FusedOutcome

    data = result.rank0.get("optimizer_outcome")
    return FusedOutcome(**data) if isinstance(data, dict) else None
