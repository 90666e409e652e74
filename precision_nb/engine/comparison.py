"""A comparison's typed result: :class:`Comparison`, with one :class:`PlanOutcome` per plan.

A plan's outcome holds everything worked out for it (its fields say what). Its :class:`Timing`
keeps the raw step-time blocks of every process; median and quartiles are computed from them on
first use, as ``torch.utils.benchmark.Measurement`` does. :func:`plan_outcomes` computes the
outcomes from a measurement; the views read these attributes and build their tables at the edge
(the summary's columns are named in :mod:`precision_nb.views.report.tables` only).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

from precision_nb.core.events import Event
from precision_nb.engine import stats, verdicts
from precision_nb.engine.measurement import Measurement, Warmup
from precision_nb.engine.metrics import PeakRatio, tf32_state
from precision_nb.engine.peaks import CLASS_WORDS, beyond_peak, flags_text, tf32_classes
from precision_nb.engine.results import RunResult
from precision_nb.engine.true_figures import LostUpdates, TrueSaving, lost_updates, true_saving

if TYPE_CHECKING:
    from precision_nb.engine.time_split import Advice, PlanDifference, TimeAnalysis, TimeSplit

__all__ = [
    "Comparison",
    "Drift",
    "PlanOutcome",
    "Rates",
    "Timing",
    "plan_outcomes",
]


@dataclass(frozen=True)
class Timing:
    """One plan's measured step times: ``blocks[p][r]`` the times of round r in process p (this
    process first), its warm-up, and the processes that measured. Statistics are computed from
    the raw blocks when first asked for, then kept."""

    blocks: tuple[tuple[tuple[float, ...], ...], ...] = ()
    warmup: Warmup | None = None
    processes: int = 1

    @classmethod
    def of(cls, measurement: Measurement, label: str) -> Timing:
        blocks = measurement.blocks_by_process(label)
        return cls(
            tuple(tuple(tuple(b) for b in proc) for proc in blocks),
            measurement.plans[label].warmup,
            measurement.process_count,
        )

    @cached_property
    def times(self) -> tuple[float, ...]:
        """Every measured step time, all processes pooled."""
        return tuple(t for proc in self.blocks for b in proc for t in b)

    @cached_property
    def spread(self) -> stats.Spread:
        """Median and quartiles of the pooled step times."""
        return stats.spread(self.times)

    @property
    def median(self) -> float:
        return self.spread.median if self.spread.n else math.nan

    @property
    def rounds(self) -> int:
        """Rounds completed in this process."""
        return sum(1 for b in self.blocks[0] if b) if self.blocks else 0


@dataclass(frozen=True)
class Rates:
    """Samples, tokens and FLOP per second from the median step time, and the MFU with the range
    its peak's calibration repeats allow (None where unknown, or an MFU above 1 left out)."""

    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    flops_per_s: float | None = None
    mfu: float | None = None
    mfu_low: float | None = None
    mfu_high: float | None = None


@dataclass(frozen=True)
class Drift:
    """How far a plan ended from the fp32 run: final-loss difference, relative L2 of weights."""

    final_loss_diff: float | None = None
    param_rel_diff: float | None = None


@dataclass(frozen=True)
class PlanOutcome:
    """Everything measured and worked out for one plan; see the module docstring."""

    label: str
    result: RunResult | None = None
    timing: Timing | None = None
    speedup: stats.Speedup | None = None
    verdict: verdicts.Verdict | None = None
    rates: Rates = field(default_factory=Rates)
    drift: Drift | None = None
    #: The TF32 flags a CUDA fp32 plan ran under (None elsewhere).
    tf32: Mapping[str, Any] | None = None
    #: The plan's ``InspectionData`` (memory by kind and dtype, op dtypes), once inspected.
    inspection: Any = None
    #: A compiled plan's ``CompiledPlanReport`` (None for an eager plan).
    compiled: Any = None
    #: Why the plan stopped part-way (it is reported with the rounds it completed).
    failure: str | None = None
    #: The plan's step time by op family (``TimeSplit``), once profiled after the timed rounds.
    time_split: TimeSplit | None = None
    #: The plan against the baseline, family by family (``PlanDifference``; None for the
    #: baseline itself).
    difference: PlanDifference | None = None
    #: What would make the plan faster (``Advice``), each with its figure.
    advice: tuple[Advice, ...] = ()
    #: A true plan's saving against the mixed plan of its dtype (once both are inspected).
    saving: TrueSaving | None = None

    @property
    def lost_updates(self) -> LostUpdates | None:
        """The run's measured lost updates at its last measured step (None when not probed:
        a true plan's run probes them by default)."""
        return lost_updates(self.result)


@dataclass
class Comparison:
    """Results per label, one typed outcome per plan, merged requests and events (run order)."""

    results: dict[str, RunResult] = field(default_factory=dict)
    outcomes: dict[str, PlanOutcome] = field(default_factory=dict)
    merged: dict[str, str] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    stopped: bool = False
    #: The interleaved measurement (per-round step times, warm-ups, round orders).
    measurement: Measurement | None = None
    #: The label every speedup is measured against (None without an fp32 plan).
    baseline: str | None = None
    #: How the figures were measured (warm-up rule, rounds, steps per block).
    method: dict[str, Any] = field(default_factory=dict)
    #: The model measured: ``class`` (qualified name) and ``params`` (parameter count).
    model_info: dict[str, Any] = field(default_factory=dict)
    #: dtype name -> its peak FLOP/s over the fp32 peak here: an estimate of the gain, not a bound.
    peak_ratios: dict[str, PeakRatio] = field(default_factory=dict)
    #: Each plan's step time by op family and its difference from the baseline, profiled after
    #: the timed rounds (``TimeAnalysis``; None when not asked for). Per plan also on its outcome.
    time_split: TimeAnalysis | None = None

    def outcome(self, label: str) -> PlanOutcome:
        """The outcome of ``label`` (an empty one, holding only its run, when not measured)."""
        found = self.outcomes.get(label)
        return found if found is not None else PlanOutcome(label, self.results.get(label))

    def attach_inspections(self, inspections: Mapping[str, Any]) -> None:
        """Set each plan's inspection (label -> ``InspectionData``) on its outcome, and each
        true plan's :class:`TrueSaving` against its mixed twin from them."""
        for label, data in inspections.items():
            self.outcomes[label] = replace(self.outcome(label), inspection=data)
        every = self.inspections
        for label in self.results:
            saving = true_saving(label, self.results, every)
            if saving is not None:
                self.outcomes[label] = replace(self.outcome(label), saving=saving)

    @property
    def drift(self) -> dict[str, dict[str, float | None]]:
        """Label -> ``final_loss_diff`` and ``param_rel_diff`` against the fp32 run."""
        return {k: asdict(o.drift) for k, o in self.outcomes.items() if o.drift is not None}

    @property
    def failures(self) -> dict[str, str]:
        """Label -> why a plan stopped part-way."""
        return {k: o.failure for k, o in self.outcomes.items() if o.failure}

    @property
    def compiled(self) -> dict[str, Any]:
        """Compiled label -> its ``CompiledPlanReport`` (compile step, speed, pay-back...)."""
        return {k: o.compiled for k, o in self.outcomes.items() if o.compiled is not None}

    @property
    def inspections(self) -> dict[str, Any]:
        """Label -> the plan's inspection, for the plans inspected."""
        return {k: o.inspection for k, o in self.outcomes.items() if o.inspection is not None}

    @property
    def load_note(self) -> str:
        """The measurement's busy-machine note ("" when quiet or not measured)."""
        return self.measurement.load_note if self.measurement is not None else ""

    @property
    def records(self) -> list[dict[str, Any]]:
        """Every record of every run, in run order (the ``run`` key tells them apart)."""
        return [r for res in self.results.values() for r in res.records]


def _tokens_per_sample(result: RunResult | None) -> float:
    """Tokens per sample from the records (both rates share one interval, so this is exact);
    0.0 where no record has a token rate."""
    for record in result.records if result is not None else ():
        tokens, samples = record.get("tokens_per_s"), record.get("samples_per_s")
        if tokens and samples:
            return float(tokens) / float(samples)
    return 0.0


def _per_s(amount: float | None, median: float) -> float | None:
    return float(amount) / median if amount and median > 0 else None


def _rates(label: str, result: RunResult | None, median: float, events: list[Event]) -> Rates:
    """Rates from the median step time; an MFU above 1 becomes a ``calibration`` event."""
    info = result.workload if result is not None else {}
    per_step = (info.get("batch_size") or 0) * (info.get("accumulation") or 1)
    tps = _tokens_per_sample(result)
    flops_per_s = _per_s(info.get("flops_per_step"), median)
    peak = info.get("peak_flops_per_s")
    mfu = flops_per_s / peak if flops_per_s and peak else None
    low, high = info.get("peak_flops_low"), info.get("peak_flops_high")
    mfu_range = (
        (flops_per_s / high, flops_per_s / low) if flops_per_s and low and high else (mfu, mfu)
    )
    if mfu is not None and mfu > 1:
        source = info.get("peak_source")
        text = (
            f"{label}: achieved {flops_per_s / 1e9:.1f} GFLOP/s beats the peak "  # type: ignore[operator]
            f"({source}): {beyond_peak(source)}; MFU is not shown"
        )
        events.append(Event("calibration", text, {"run": label, "mfu": mfu, "source": source}))
        mfu, mfu_range = None, (None, None)
    return Rates(
        _per_s(per_step, median), _per_s(per_step * tps, median), flops_per_s, mfu, *mfu_range
    )


def _tf32(label: str, result: RunResult | None, events: list[Event]) -> dict[str, Any] | None:
    """The TF32 flags of a CUDA fp32 plan (an event when they let it run as TF32)."""
    cuda = str(getattr(result, "device", "")).startswith("cuda")
    if result is None or not cuda or getattr(result.plan, "mode", "") != "fp32":
        return None
    tf32 = result.workload.get("tf32") or tf32_state()
    if classes := tf32_classes(tf32):
        words = " and ".join(CLASS_WORDS[c] for c in classes)
        text = (
            f"{label}: the fp32 baseline may run its {words} "
            f"as TF32 on tensor cores ({flags_text(tf32)}: convolutions default to TF32 on Ampere "
            "and newer); speedups are against that baseline"
        )
        events.append(Event("measurement", text, {"run": label, **tf32}))
    return tf32


def plan_outcomes(
    measurement: Measurement,
    results: Mapping[str, RunResult],
    baseline: str | None,
    *,
    drift: Mapping[str, Drift] | None = None,
    compiled: Mapping[str, Any] | None = None,
) -> tuple[dict[str, PlanOutcome], list[Event]]:
    """Per plan: its timing, rates, speedup with interval and verdict, drift, compile report.

    Samples/s, tokens/s, FLOP/s and MFU all divide by the same steady-state median step time
    (all processes pooled), so they cannot disagree with the speedup. An MFU above 1 is recorded
    as a ``calibration`` event that says what it means for that peak's source
    (:func:`~precision_nb.engine.peaks.beyond_peak`) and left out, not shown as utilisation.
    """
    events: list[Event] = []
    out: dict[str, PlanOutcome] = {}
    busy = measurement.load_note
    for label, timing in measurement.plans.items():
        result = results.get(label)
        t = Timing.of(measurement, label)
        speed = verdict = None
        if baseline is not None and baseline in measurement.plans:
            speed = measurement.speedup(label, baseline)
            verdict = verdicts.verdict(
                label, speed, baseline=baseline, spread_of_plan=t.spread, busy=busy
            )
        out[label] = PlanOutcome(
            label,
            result,
            t,
            speed,
            verdict,
            _rates(label, result, t.median, events),
            (drift or {}).get(label),
            _tf32(label, result, events),
            compiled=(compiled or {}).get(label),
            failure=timing.failed,
        )
    return out, events
