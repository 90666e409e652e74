"""A comparison's time split pooled over the processes that measured it.

The calibrated speedup pools the rounds of every process that measured, and one process's
speedup differs from the next by more than that interval is wide; a split of one process's few
profiled steps differs more still (mlp/small on one 2-core CPU: single processes' reconstructions
from 1.02x to 1.90x in groups of eight whose calibrated speedups were 1.55x to 1.61x). So every
fresh process profiles a few steps of each plan after its rounds (:data:`PROCESS_SPLIT`, by the
same :func:`~precision_nb.engine.time_split.split_plans`) and sends its split back with its step
times, and :func:`pooled` makes one split per plan of this process's and theirs: each family the
mean over the processes of that process's family (a median over its profiled steps), the
profiler's cost taken out once against the mean of the processes' timed medians
(:func:`~precision_nb.engine.time_split.schedule.without_profiler`: pooled over the plans as a
cost per event). The reconstruction is then over the same processes as the calibrated speedup and
is held against its interval. :func:`by_process` gives each process's own reconstruction (the
report states their range). Casts' bytes, matmul shapes and ops are this process's.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from precision_nb.engine.time_split.families import FAMILIES
from precision_nb.engine.time_split.profiling import TimeSplit
from precision_nb.engine.time_split.ranks import from_json
from precision_nb.engine.time_split.schedule import SplitConfig, without_profiler

__all__ = ["PROCESS_SPLIT", "Sample", "by_process", "complete", "from_processes", "pooled"]

#: What each fresh process profiles after its rounds: six steps per plan in one block (after its
#: settling step), no unprofiled steps (its timed rounds are the reference), the profiler's cost
#: left in (it is taken out once, pooled).
PROCESS_SPLIT = SplitConfig(steps=6, unprofiled=0, block=6, take_out=False)

#: One process's split of one plan and that process's timed median step (seconds).
Sample = tuple[TimeSplit, float]


def from_processes(measurement: Any) -> tuple[list[dict[str, Sample]], list[str]]:
    """Per fresh process of ``measurement``: label -> (its split, its timed median) of every
    plan it split and timed (empty for a process that sent no split); and why a process has no
    split of a plan it sent one for, one line per plan."""
    out, unsent = [], []
    for process in getattr(measurement, "processes", ()) or ():
        found = {}
        for label, item in (process.time_split or {}).items():
            split, _ = from_json(item)
            timing = process.plans.get(label)
            if not split.available:
                unsent.append(f"fresh process {process.index}, {label}: {split.missing}")
            elif timing is not None and timing.times:
                found[label] = (split, timing.spread.median)
        out.append(found)
    return out, unsent


def _mean(samples: Sequence[Sample], label: str) -> TimeSplit:
    """The samples' splits of one plan as one: family times and events averaged, the timed
    medians' mean as the step without the profiler (``unprofiled_s``)."""
    first = samples[0][0]
    traced = {f: statistics.fmean(s.traced.get(f, 0.0) for s, _ in samples) for f in FAMILIES}
    events = {
        f: statistics.fmean(s.family_events.get(f, 0.0) for s, _ in samples) for f in FAMILIES
    }
    return dataclasses.replace(
        first, label=label, families=traced, step_s=sum(traced.values()), traced=traced,
        traced_s=sum(traced.values()), family_events=events,
        timer_s=statistics.fmean(s.timer_s for s, _ in samples),
        unprofiled_s=statistics.fmean(m for _, m in samples),
        events=round(statistics.fmean(s.events for s, _ in samples)),
        steps=sum(s.steps for s, _ in samples), processes=len(samples), notes=(),
    )  # fmt: skip


def complete(labels: Iterable[str], others: Sequence[Mapping[str, Sample]]) -> list:
    """The fresh processes that sent a split of every plan of ``labels`` (the plans' pooled
    splits then come from the same processes)."""
    wanted = list(labels)
    return [o for o in others if all(k in o for k in wanted)]


def _complete(here: Mapping[str, Sample], others: Sequence[Mapping[str, Sample]]) -> list:
    """This process and every fresh process that sent a split of each of its plans."""
    return [here, *complete(here, others)]


def _kernels(split: TimeSplit) -> bool:
    return split.view.startswith("kernel time")


def pooled(here: Mapping[str, Sample], others: Sequence[Mapping[str, Sample]]) -> dict:
    """Label -> the plan's split pooled over this process (``here``: label -> its split and its
    timed median) and the fresh processes (``others``, :func:`from_processes`), the profiler's
    cost taken out once; casts, matmul shapes, ops and the measured median are this process's,
    the cost (``seconds``) every pooled process's."""
    processes = _complete(here, others)
    left = len(others) + 1 - len(processes)
    means = {k: _mean([p[k] for p in processes], k) for k in here}
    first = next(iter(here.values()))[0]
    taken = without_profiler(means, kernels=_kernels(first))
    fresh = processes[1:]
    out = {}
    for k, (own, _) in here.items():
        each = f", {fresh[0][k][0].steps} in each fresh process" if fresh else ""
        note = (
            f"pooled over {len(processes)} processes: each family is the mean over them of "
            f"the process's own (a median over its profiled steps: {own.steps} here{each}), the "
            "profiler's cost taken out against the mean of their timed medians"
        )
        if left:
            who = "1 fresh process is" if left == 1 else f"{left} fresh processes are"
            note += f"; {who} not pooled (no split of every plan came back)"
        out[k] = dataclasses.replace(
            taken[k], casts=own.casts, matmuls=own.matmuls, ops=own.ops,
            notes=(*own.notes, *taken[k].notes, note), measured_s=own.measured_s,
            overlap_s=own.overlap_s, skipped=own.skipped,
            seconds=own.seconds + sum(p[k][0].seconds for p in fresh),
        )  # fmt: skip
    return out


def by_process(
    here: Mapping[str, Sample], others: Sequence[Mapping[str, Sample]], baseline: str
) -> dict[str, tuple[float, ...]]:
    """Label -> each pooled process's own reconstructed speedup over ``baseline`` (this process
    first), its profiler's cost taken out against its own timed medians; the baseline has none."""
    out: dict[str, list[float]] = {k: [] for k in here if k != baseline}
    for process in _complete(here, others):
        splits = {k: _mean([s], k) for k, s in process.items() if k in here}
        splits = without_profiler(splits, kernels=_kernels(splits[baseline]))
        for k in out:
            if splits[k].step_s > 0:
                out[k].append(splits[baseline].step_s / splits[k].step_s)
    return {k: tuple(v) for k, v in out.items()}
