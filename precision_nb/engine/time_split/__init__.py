"""Why a plan is (not) faster: each plan's step time split by op family, plan against baseline.

After the timed rounds, :func:`analyse_time` profiles a few steps of every plan on its own trainer
(:mod:`~precision_nb.engine.time_split.profiling`), groups their time into families
(:mod:`~precision_nb.engine.time_split.families`), sets each plan against the baseline with the
reconstructed speedup held against the calibrated one
(:mod:`~precision_nb.engine.time_split.reconcile`), and says what would make each plan faster,
each advice with its figure (:mod:`~precision_nb.engine.time_split.advice`). A distributed run's
ranks each profile their own steps (:func:`rank_split`), and the launcher keeps the slowest
rank's split per plan (:func:`split_distributed`, :mod:`~precision_nb.engine.time_split.ranks`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from precision_nb.core.cpu_features import read_cpu_features
from precision_nb.core.events import Event
from precision_nb.engine import allocator
from precision_nb.engine.adamw_timing import time_adamw
from precision_nb.engine.stats import paired_speedup
from precision_nb.engine.time_split import pool, ranks
from precision_nb.engine.time_split.advice import Advice, PlanFacts, advise, wants_adamw_timing
from precision_nb.engine.time_split.families import FAMILIES, STEP_MARK
from precision_nb.engine.time_split.profiling import (
    SplitConfig,
    TimeSplit,
    missing,
    profiler_busy,
    split_plans,
    split_trainer,
)
from precision_nb.engine.time_split.reconcile import PlanDifference, difference

__all__ = [
    "DISTRIBUTED",
    "FAMILIES",
    "STEP_MARK",
    "Advice",
    "PlanDifference",
    "SplitConfig",
    "TimeAnalysis",
    "TimeSplit",
    "advise",
    "analyse_splits",
    "analyse_time",
    "difference",
    "missing",
    "plan_facts",
    "profiler_busy",
    "rank_split",
    "split_comparison",
    "split_distributed",
    "split_missing",
    "split_plans",
    "split_trainer",
    "this_process",
]


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TimeAnalysis:
    """Label -> :class:`TimeSplit`, label -> :class:`PlanDifference` against ``baseline`` (the
    baseline has none), label -> its advice, and the seconds the analysis took in all."""

    splits: Mapping[str, TimeSplit] = field(default_factory=dict)
    differences: Mapping[str, PlanDifference] = field(default_factory=dict)
    advice: Mapping[str, tuple[Advice, ...]] = field(default_factory=dict)
    baseline: str | None = None
    config: SplitConfig = field(default_factory=SplitConfig)
    seconds: float = 0.0

    def rows(self) -> list[dict[str, Any]]:
        """One row per plan and family (``time_by_family.csv``); a plan without a split has one
        row saying why."""
        out = []
        for label, split in self.splits.items():
            diff = self.differences.get(label)
            common = {
                "run": label,
                "baseline": self.baseline,
                "view": split.view,
                "profiled_steps": split.steps,
                "processes": split.processes,
                "events_per_step": split.events,
                "step_ms": split.step_s * 1e3,
                "traced_step_ms": split.traced_s * 1e3,
                "profiler_ms": split.profiler_s * 1e3,
                "measured_median_ms": split.measured_s * 1e3 if split.measured_s else None,
                "profiler_overhead": split.overhead,
                "reconstructed_speedup": diff.reconstructed if diff else None,
                "calibrated_speedup": diff.calibrated if diff else None,
                "calibrated_low": diff.low if diff else None,
                "calibrated_high": diff.high if diff else None,
                "tolerance": diff.tolerance if diff else None,
                "agrees": diff.agrees if diff else None,
                "missing": split.missing or (diff.missing if diff else None),
            }
            if not split.available:
                out.append({"family": None, "family_title": None, **common})
                continue
            for family, title in FAMILIES.items():
                change = diff.change(family) if diff else None
                out.append(
                    {
                        "family": family,
                        "family_title": title,
                        "ms_per_step": split.families.get(family, 0.0) * 1e3,
                        "share": split.share(family),
                        "baseline_ms": change.baseline_s * 1e3 if change else None,
                        "change_ms": change.change_s * 1e3 if change else None,
                        "times_faster_there": change.times_faster if change else None,
                        **common,
                    }
                )
        return out


def emulated_bf16(trainer: Any) -> str | None:
    """Why bf16 is emulated for ``trainer``'s plan, or None (not bf16, native, or unknown)."""
    if getattr(trainer.plan, "mode", "") != "bf16":
        return None
    if trainer.device.type == "cuda":
        caps = trainer.explanation.capabilities
        if caps is not None and caps.cuda_bf16_native is False:
            return f"{caps.device_name or 'this GPU'}: no native bf16 (capabilities)"
    elif trainer.device.type == "cpu":
        cpu = read_cpu_features()
        if cpu.native_bf16 is False:
            return f"this CPU has neither AVX512-BF16 nor AMX-BF16 ({cpu.source})"
    return None


def plan_facts(trainer: Any, split: TimeSplit, *, adamw: bool = True) -> PlanFacts:
    """:class:`PlanFacts` of ``trainer`` (its split decides whether AdamW is timed; never with
    ``adamw=False``)."""
    fused = bool(getattr(trainer.optimizer_outcome, "used", False))
    first = next((p for p in trainer.model.parameters() if p.requires_grad), None)
    dtype = str(first.dtype).replace("torch.", "") if first is not None else "?"
    words = f"{'fused' if fused else 'plain'} AdamW on {dtype} weights"
    timing = None
    if adamw and wants_adamw_timing(split, fused):
        # short: 5 paired rounds of at least 10 ms each (its quartiles ride on the advice)
        timing = time_adamw(
            trainer.model, trainer.device, trainer.optimizer_config, rounds=5, seconds=0.01
        )
    return PlanFacts(words, emulated_bf16(trainer), fused, timing)


def analyse_splits(
    splits: Mapping[str, TimeSplit],
    facts: Mapping[str, PlanFacts],
    speedups: Mapping[str, Any],
    baseline: str | None,
    config: SplitConfig,
    seconds: float,
    here: Mapping[str, Any] | None = None,
    spreads: Mapping[str, tuple[float, ...]] | None = None,
) -> TimeAnalysis:
    """Every plan's split against the baseline's, and its advice (``facts``: label -> its
    :class:`PlanFacts`; a plan without facts, one that failed, gets none; ``here``: label -> the
    speedup of the process the splits ran in, when other processes measured too and the splits
    are not pooled over them; ``spreads``: label -> each pooled process's own reconstruction)."""
    base = splits.get(baseline) if baseline is not None else None
    diffs: dict[str, PlanDifference] = {}
    advice: dict[str, tuple[Advice, ...]] = dict.fromkeys(splits, ())
    for label, split in splits.items():
        fact = facts.get(label)
        if base is not None and label != baseline:
            diffs[label] = difference(
                base, split, speedups.get(label), tolerance=config.tolerance,
                optimizer=fact.optimizer if fact is not None else None,
                here=(here or {}).get(label), by_process=(spreads or {}).get(label, ()),
            )  # fmt: skip
        if fact is not None and split.available:
            advice[label] = advise(
                split, diffs.get(label), emulated=fact.emulated, fused=fact.fused, adamw=fact.adamw
            )
    return TimeAnalysis(splits, diffs, advice, baseline, config, seconds)


def analyse_time(
    trainers: Mapping[str, Any],
    measured_s: Mapping[str, float | None],
    speedups: Mapping[str, Any],
    baseline: str | None,
    *,
    failures: Mapping[str, str] | None = None,
    config: SplitConfig | None = None,
    here: Mapping[str, Any] | None = None,
    others: Sequence[Mapping[str, pool.Sample]] = (),
    own: Mapping[str, float] | None = None,
) -> TimeAnalysis:
    """Split, compare and advise for every plan (see the module docstring).

    ``trainers``: label -> the plan's trainer, its timed rounds done; ``measured_s``: label ->
    the timed rounds' median step time; ``speedups``: label -> its calibrated
    :class:`~precision_nb.engine.stats.Speedup` over ``baseline``; ``failures``: label -> why
    a plan failed (no split for it); ``here``: label -> the speedup of this process over its
    rounds, when other processes measured too (the splits run here); ``others``: the splits the
    fresh processes sent (:func:`~precision_nb.engine.time_split.pool.from_processes`) and
    ``own``: label -> this process's timed median: with both, every plan's split is pooled over
    this process and the fresh ones that split every plan (:mod:`~.pool`), and held against the
    calibrated speedup rather than this process's.
    """
    t0 = time.perf_counter()
    cfg = config if config is not None else SplitConfig()
    splits = split_plans(trainers, measured_s, failures=failures, config=cfg)
    facts = {  # a plan that failed before it had a trainer has no facts
        label: plan_facts(trainers[label], split)
        for label, split in splits.items()
        if label in trainers and split.available
    }
    seconds = time.perf_counter() - t0
    mine = own or {}
    samples = {k: (s, mine[k]) for k, s in splits.items() if s.available and k in mine}
    fresh = pool.complete(samples, others) if samples else []
    spreads: dict[str, tuple[float, ...]] = {}
    if fresh and baseline in samples:
        spreads = pool.by_process(samples, others, baseline)
        splits = {**splits, **pool.pooled(samples, others)}
        seconds += sum(s.seconds for process in others for s, _ in process.values())
        here = {k: v for k, v in (here or {}).items() if k not in samples}
    return analyse_splits(splits, facts, speedups, baseline, cfg, seconds, here, spreads)


def this_process(measurement: Any, baseline: str | None) -> dict[str, Any]:
    """Label -> the speedup over ``baseline`` of this process alone, over its rounds, when fresh
    processes measured too ({} when this process is the whole measurement)."""
    if measurement is None or measurement.process_count < 2 or baseline not in measurement.plans:
        return {}
    plans = measurement.plans
    return {
        label: paired_speedup(plans[baseline].blocks, p.blocks)
        for label, p in plans.items()
        if label != baseline
    }


def split_comparison(
    comparison: Any,
    trainers: Mapping[str, Any],
    failures: Mapping[str, Any] | None = None,
    config: SplitConfig | None = None,
) -> list[Event]:
    """:func:`analyse_time` for a comparison whose timed rounds are over: sets
    ``comparison.time_split`` and each outcome's ``time_split``, ``difference`` and ``advice``;
    returns the events to add (the split's cost; a ``warning`` when it was left out, the
    measurement kept either way). Where the measurement settled the allocator, heap is faulted
    in ahead of the short fit (``SplitConfig.heap_ahead``, :func:`allocator.reserved`). Where
    fresh processes sent splits, this process profiles as many steps as each of them did, without
    unprofiled steps, and the splits are pooled (:mod:`~precision_nb.engine.time_split.pool`)."""
    outcomes = comparison.outcomes
    config = config if config is not None else SplitConfig()
    measured = comparison.measurement
    if measured is not None and allocator.settle(measured.config.allocator)[0]:
        config = dataclasses.replace(config, heap_ahead=allocator.RESERVE)
    others, unsent = pool.from_processes(measured)
    labels = [k for k in trainers if k in comparison.results and k not in (failures or {})]
    if pool.complete(labels, others):  # pooled: this process profiles as
        # they did, its timed medians its reference
        config = dataclasses.replace(
            config, steps=pool.PROCESS_SPLIT.steps, unprofiled=0, block=pool.PROCESS_SPLIT.block
        )
    medians = {k: o.timing.median if o.timing else None for k, o in outcomes.items()}
    speedups = {k: o.speedup for k, o in outcomes.items()}
    failed = {k: str(v) for k, v in (failures or {}).items()}
    try:
        found = analyse_time(
            {k: t for k, t in trainers.items() if k in comparison.results}, medians, speedups,
            comparison.baseline, failures=failed, config=config,
            here=this_process(measured, comparison.baseline),
            others=others, own=_own_medians(measured),
        )  # fmt: skip
    except (RuntimeError, ValueError) as exc:
        message = f"the time split was left out: {type(exc).__name__}: {exc}"
        log.warning(message)
        return [Event("warning", message, {"section": "time_split"})]
    _attach(comparison, found)
    return _events(found) + [
        Event("warning", f"time split not pooled from {why}", {"section": "time_split"})
        for why in unsent
    ]


def _own_medians(measurement: Any) -> dict[str, float]:
    """Label -> this process's timed median step (its rounds only)."""
    plans = getattr(measurement, "plans", None) or {}
    return {label: t.spread.median for label, t in plans.items() if t.times}


def _events(found: TimeAnalysis) -> list[Event]:
    gone = [f"{k}: {s.missing}" for k, s in found.splits.items() if not s.available]
    n = max((s.processes for s in found.splits.values() if s.available), default=1)
    where = "after the timed rounds"
    if n > 1:
        each = "the fresh process" if n == 2 else f"each of {n - 1} fresh processes"
        where += f" here, and {pool.PROCESS_SPLIT.steps} in {each}"
    events = [
        Event(
            "measurement",
            f"time split: {found.config.steps} profiled steps per plan {where}, "
            f"{found.seconds:.1f} s in all",
            {"seconds": found.seconds, "steps": found.config.steps, "processes": n},
        )
    ]
    events += [Event("warning", f"no time split for {g}", {"section": "time_split"}) for g in gone]
    return events


def rank_split(trainer: Any, label: str, config: SplitConfig) -> dict[str, Any]:
    """One plan's split and facts on a rank of a distributed run, as JSON data for the launcher
    (:mod:`~precision_nb.engine.time_split.ranks`); every rank calls it for the same plans in the
    same order, after the timed rounds (the profiled steps' collectives need every rank). The
    profiler's cost stays in the families, for the reason the note gives (taken out, it left a
    2-rank DDP split with casts only)."""
    split = split_trainer(trainer, label, config=dataclasses.replace(config, take_out=False))
    if not split.available:
        return ranks.to_json(split)
    note = (
        "the profiler's cost is not taken out on a distributed run: a rank's steps wait on "
        "the other ranks' collectives, and its unprofiled steps are no steady measure of the "
        "step without the profiler"
    )
    split = dataclasses.replace(split, notes=(*split.notes, note))
    try:
        facts = plan_facts(trainer, split)
    except (RuntimeError, ValueError, TypeError) as exc:  # e.g. sharded parameters: said
        note = (
            "no optimizer advice: timing plain against fused AdamW on this rank's parameters "
            f"failed: {type(exc).__name__}: {exc}"
        )
        split = dataclasses.replace(split, notes=(*split.notes, note))
        facts = plan_facts(trainer, split, adamw=False)
    return ranks.to_json(split, facts)


def split_distributed(
    comparison: Any,
    per_rank: Mapping[str, Sequence[Mapping[str, Any] | None]],
    config: SplitConfig | None = None,
) -> list[Event]:
    """The time split of a distributed comparison from its ranks' ``time_split`` data (label ->
    one item per rank, None where a rank wrote none): per plan the slowest rank's split
    (:func:`~precision_nb.engine.time_split.ranks.slowest`), its profiler cost against the
    distributed median step time, reconciled with the distributed verdict's calibrated interval;
    attached as :func:`split_comparison` attaches one; returns the same events."""
    cfg = config if config is not None else SplitConfig()
    outcomes = comparison.outcomes
    splits: dict[str, TimeSplit] = {}
    facts: dict[str, PlanFacts] = {}
    for label in comparison.results:
        split, fact = ranks.slowest(label, per_rank.get(label, ()))
        if not split.available:
            split = missing(label, f"{DISTRIBUTED}: {split.missing}")
        timing = outcomes[label].timing if label in outcomes else None
        splits[label] = dataclasses.replace(split, measured_s=timing.median if timing else None)
        if fact is not None:
            facts[label] = fact
    speedups = {k: o.speedup for k, o in outcomes.items()}
    seconds = ranks.profiled_seconds(per_rank)
    found = analyse_splits(splits, facts, speedups, comparison.baseline, cfg, seconds)
    _attach(comparison, found)
    return _events(found)


#: Why a plan of a distributed run has no split (said in its section, followed by the rank's
#: own reason): every rank profiles the same steps, so one rank that cannot leaves the plan none.
DISTRIBUTED = (
    "not profiled for a distributed run: the plans train inside torchrun's ranks, every rank "
    "profiles the same steps (their collectives need all ranks), and one could not"
)


def _attach(comparison: Any, found: TimeAnalysis) -> None:
    comparison.time_split = found
    outcomes = comparison.outcomes
    for label, split in found.splits.items():
        if label in outcomes:
            outcomes[label] = dataclasses.replace(
                outcomes[label], time_split=split, difference=found.differences.get(label),
                advice=found.advice.get(label, ()),
            )  # fmt: skip


def split_missing(comparison: Any, why: str) -> None:
    """Every plan of ``comparison`` without a split, saying ``why`` (e.g. :data:`DISTRIBUTED`)."""
    splits = {label: missing(label, why) for label in comparison.results}
    _attach(comparison, TimeAnalysis(splits, baseline=comparison.baseline))
