"""A distributed run's time split: every rank profiles its own steps, the launcher keeps one.

The plans of a distributed profile train inside torchrun's ranks, and a step's collectives need
every rank, so every rank profiles the same few steps of each plan, one plan after another, after
the timed rounds, with the same :func:`~precision_nb.engine.time_split.profiling.split_trainer`
as one process (collectives land in the communication family). Each rank writes its split and
the plan's :class:`~precision_nb.engine.time_split.advice.PlanFacts` as JSON data
(:func:`to_json`) into its log; the launcher reads them back (:func:`from_json`) and keeps, per
plan, the split of the rank whose profiled step was the slowest (:func:`slowest`): a distributed
step takes as long as its slowest rank, as the measured step time does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from precision_nb.engine.adamw_timing import AdamWTiming
from precision_nb.engine.time_split.advice import PlanFacts
from precision_nb.engine.time_split.profiling import CastSummary, MatmulShape, TimeSplit, missing

__all__ = ["ELSEWHERE", "from_json", "profiled_seconds", "slowest", "to_json"]

#: Why a rank that could profile did not: another rank could not (the collectives need all).
ELSEWHERE = "another rank could not profile this plan, and the ranks' steps run together"


def to_json(split: TimeSplit, facts: PlanFacts | None = None) -> dict[str, Any]:
    """``split`` and ``facts`` as JSON data (a rank's ``time_split`` line)."""
    return {
        "split": split.to_dict(),
        "facts": dataclasses.asdict(facts) if facts is not None else None,
    }


def from_json(data: Mapping[str, Any]) -> tuple[TimeSplit, PlanFacts | None]:
    """What :func:`to_json` wrote, as the typed split and facts again."""
    raw = dict(data["split"])
    split = TimeSplit(
        **{
            **raw,
            "casts": CastSummary(**raw.get("casts") or {}),
            "matmuls": tuple(MatmulShape(**m) for m in raw.get("matmuls") or ()),
            "ops": {f: tuple((str(n), float(s)) for n, s in v) for f, v in raw["ops"].items()},
            "notes": tuple(raw.get("notes") or ()),
        }
    )
    facts = data.get("facts")
    if facts is None:
        return split, None
    timing = facts.get("adamw")
    return split, PlanFacts(**{**facts, "adamw": AdamWTiming(**timing) if timing else None})


def slowest(label: str, items: Sequence[Mapping[str, Any] | None]) -> tuple[TimeSplit, Any]:
    """The plan's split from its ranks' ``time_split`` data (rank order; None: that rank wrote
    none): the slowest rank's with every rank's profiled step in its notes, or a missing split
    naming the rank that could not profile and why; and that rank's facts (None if missing)."""
    if not items:
        return missing(label, "no rank wrote a time split for this plan"), None
    gone = [r for r, item in enumerate(items) if item is None]
    if gone:
        why = f"rank {gone[0]} wrote no time split (it stopped or failed before its profiled steps)"
        return missing(label, why), None
    found = [from_json(item) for item in items if item is not None]
    lost = [(r, s.missing) for r, (s, _) in enumerate(found) if not s.available]
    if lost:  # the rank that said why first, before the ranks that only followed it
        rank, why = next(((r, w) for r, w in lost if w != ELSEWHERE), lost[0])
        return missing(label, f"rank {rank}: {why}"), None
    rank = max(range(len(found)), key=lambda r: found[r][0].step_s)
    split, facts = found[rank]
    steps = ", ".join(f"rank {r}: {s.step_s * 1e3:.3f} ms" for r, (s, _) in enumerate(found))
    note = (
        f"rank {rank}'s profiled steps, the slowest of the {len(found)} ranks' ({steps}): a "
        "distributed step takes as long as its slowest rank; communication is the time the "
        "profiler recorded inside the collectives' own ops on that rank (c10d::, gloo, nccl); "
        "waiting for an asynchronous collective outside them (DDP waits for its all-reduces at "
        "the end of the backward) is in outside ops"
    )
    return dataclasses.replace(split, notes=(*split.notes, note)), facts


def profiled_seconds(per_rank: Mapping[str, Sequence[Mapping[str, Any] | None]]) -> float:
    """The seconds the splits took: per rank, the sum over its plans; the longest rank's."""
    totals: dict[int, float] = {}
    for items in per_rank.values():
        for rank, item in enumerate(items):
            if item is not None:
                totals[rank] = totals.get(rank, 0.0) + float(item["split"].get("seconds") or 0.0)
    return max(totals.values(), default=0.0)
