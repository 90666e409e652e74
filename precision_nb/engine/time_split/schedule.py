"""The short fit's steps and the profiler's cost: which plan's steps run when around the
profiler (:func:`schedule`), and what the profiler added, taken out of the splits afterwards
(:func:`without_profiler`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from precision_nb.core import validate

if TYPE_CHECKING:
    from precision_nb.engine.time_split.profiling import TimeSplit

__all__ = ["MOST_TAKEN", "SplitConfig", "schedule", "without_profiler"]


@dataclass(frozen=True)
class SplitConfig:
    """How many steps each plan's split profiles (``steps``) and times without the profiler
    around them (``unprofiled``, half before and half after), in blocks of ``block`` steps per
    plan, each block after one settling step that is not counted (as the timed rounds run
    blocks: a step right after another plan's finds the caches holding that plan's tensors);
    the tolerance (a fraction) within which the reconstructed speedup must meet the timed
    one; whether the profiler's cost is taken out of the families (``take_out``,
    :func:`without_profiler`); and the bytes of heap faulted in ahead of the short fit on a CPU
    (``heap_ahead``, :func:`~precision_nb.engine.allocator.reserved`; 0: none; a comparison
    whose allocator is settled sets it)."""

    steps: int = 12
    unprofiled: int = 6
    block: int = 3
    tolerance: float = 0.10
    take_out: bool = True
    heap_ahead: int = 0

    def __post_init__(self) -> None:
        validate.positive_int("steps", self.steps)
        validate.integer("unprofiled", self.unprofiled, 0)
        validate.positive_int("block", self.block)
        validate.number("tolerance", self.tolerance, minimum=0.0)
        validate.boolean("take_out", self.take_out)
        validate.integer("heap_ahead", self.heap_ahead, 0)


def _rounds(labels: list[str], count: int, kind: str, block: int, offset: int) -> list[Any]:
    """``count`` steps of ``kind`` per plan in blocks of ``block``, each block after one
    settling step, the plans' order rotated by one each round (starting at ``offset``)."""
    out: list[tuple[str, str]] = []
    for r, start in enumerate(range(0, count, block)):
        k = (r + offset) % len(labels)
        for label in labels[k:] + labels[:k]:
            out += [(label, "settle")] + [(label, kind)] * min(block, count - start)
    return out


def schedule(labels: list[str], cfg: SplitConfig) -> list[tuple[str, str]]:
    """The short fit's steps in the order they run, as (label, kind): a warm step per plan, the
    unprofiled blocks before, the profiled ones, the unprofiled ones after, and last one step per
    plan that records the ops' input shapes (:mod:`~precision_nb.engine.time_split.shapes`; its
    time is not used) (kinds "warm", "settle", "unprofiled", "profiled", "shapes")."""
    before, after = (cfg.unprofiled + 1) // 2, cfg.unprofiled // 2
    out, offset = [(label, "warm") for label in labels], 0
    for count, kind in ((before, "unprofiled"), (cfg.steps, "profiled"), (after, "unprofiled")):
        out += _rounds(labels, count, kind, cfg.block, offset)
        offset += -(-count // cfg.block)  # the rounds so far: the rotation goes on from there
    return out + [(label, "shapes") for label in labels]


#: The largest part of a plan's traced step (outside casts) the profiler's cost may take; an
#: estimate above it is left in, and the split says so.
MOST_TAKEN = 0.75


def without_profiler(splits: dict[str, TimeSplit], *, kernels: bool) -> dict[str, TimeSplit]:
    """``splits`` (profiled together) with the profiler's cost taken out. The cost is pooled
    over the plans as a cost per recorded event outside casts: the sum of their traced steps less
    their unprofiled medians over the sum of those events (never below 0); each plan is charged
    that times its events, and each family by its own. Casts are left out of the count: on the
    default workload fp32 and bf16 paid the same (4.4 and 4.5 ms per step) though bf16 recorded
    a fifth more events, all of them autocast's casts. Pooling holds the estimate steadier than
    one plan's few unprofiled steps. Without unprofiled steps nothing is taken."""
    if any(s.unprofiled_s is None for s in splits.values()):
        return splits
    counted = {
        k: {f: n for f, n in s.family_events.items() if f != "casts"} for k, s in splits.items()
    }
    events = sum(sum(c.values()) for c in counted.values())
    extra = sum(s.traced_s - (s.unprofiled_s or 0.0) for s in splits.values())
    per_event = max(extra, 0.0) / events if events else 0.0
    costs = {k: per_event * sum(counted[k].values()) for k in splits}
    rooms = {k: s.traced_s - s.traced.get("casts", 0.0) for k, s in splits.items()}
    over = [k for k in splits if costs[k] > MOST_TAKEN * rooms[k]]
    if over:  # an estimate this large is the unprofiled steps' noise: every plan keeps its cost
        k = over[0]
        note = (
            f"the profiler's cost estimated for {k} ({costs[k] * 1e3:.2f} ms per step) is over "
            f"{MOST_TAKEN * 100:.0f} % of its traced step outside casts ({rooms[k] * 1e3:.2f} ms): "
            "not taken out of any plan, the families keep it"
        )
        return {k: dataclasses.replace(s, notes=(*s.notes, note)) for k, s in splits.items()}
    out = {}
    for label, split in splits.items():
        families = _without_profiler(dict(split.traced), costs[label], counted[label], kernels)
        out[label] = dataclasses.replace(
            split, families=families, step_s=sum(families.values()),
            profiler_s=split.traced_s - sum(families.values()),
        )  # fmt: skip
    return out


def _without_profiler(
    traced: dict[str, float], cost: float, events: Mapping[str, float], kernels: bool
) -> dict[str, float]:
    """``traced`` less the profiler's ``cost`` per step: on a GPU out of the idle time ("other":
    the host's cost delays kernels, it does not lengthen them), else charged to the families by
    their ``events`` (the profiler's cost is per event, so work two plans share, such as the
    optimizer step, keeps its time in both), none taken below 0: what a family cannot give goes
    to the others by the same rule."""
    out = dict(traced)
    if kernels:
        out["other"] = max(out["other"] - cost, 0.0)
        return out
    left = cost
    while left > 1e-12:
        open_ = {f: events.get(f, 0.0) for f in out if events.get(f, 0.0) > 0 and out[f] > 0}
        total = sum(open_.values())
        if not total:
            break
        taken = 0.0
        for f, n in open_.items():
            cut = min(left * n / total, out[f])
            out[f] -= cut
            taken += cut
        left -= taken
    return out
