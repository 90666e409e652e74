"""A plan's time split against the baseline's: per family the time gained or lost, one sentence
that says it, and the reconstructed speedup held against the calibrated one.

The families are the profiled steps' with the profiler's own cost taken out (the profiled steps
against the unprofiled ones interleaved with them, pooled over the plans:
:func:`~precision_nb.engine.time_split.schedule.without_profiler`). The reconstruction is a product
of per-family changes: starting from the baseline's step, each family's change is applied in
turn (in :data:`~precision_nb.engine.time_split.families.FAMILIES` order) and multiplies the step
time by a factor; the product of the factors is the plan's step over the baseline's, and its
inverse the **reconstructed speedup**. When fresh processes measured and sent their own splits,
the families are pooled over the processes (:mod:`~precision_nb.engine.time_split.pool`) and the
reconstruction is held against the calibrated speedup over the same processes, its interval
widened by a stated tolerance on either side, with the range of the single processes'
reconstructions. Otherwise the split's steps are one process's, after its timed rounds: the
reconstruction is held against that process's own timed speedup (its interval over the process's
rounds) widened by the tolerance, and the calibrated speedup over every process is given beside
it with the range of the single processes' speedups. When there was one process, that process's
speedup is the calibrated one. When the reconstruction lies outside, the difference says so, with
both plans' steps, rather than leaving the split to explain a number it does not add up to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from precision_nb.core.text import interval_text, plus_minus_text, times_text
from precision_nb.engine.time_split.families import FAMILIES
from precision_nb.engine.time_split.profiling import TimeSplit

#: A family's change counts in the sentence from this fraction of the baseline's step on.
NOTABLE = 0.02
#: A speedup's estimate and interval, read from whatever carries them (None where absent).
_ENDS = ("estimate", "low", "high")
#: Each family in the generated sentence: where time went ("in matmuls") and what was added.
WHERE = {
    "matmul": "in matmuls",
    "casts": "in casts",
    "elementwise": "in normalisation, softmax and elementwise ops",
    "optimizer": "in the optimizer step",
    "data": "in data movement",
    "communication": "in communication",
    "compiled": "in compiled kernels",
    "other": "outside ops",
}
WHAT = {
    **{family: where.removeprefix("in ") for family, where in WHERE.items()},
    "optimizer": "optimizer step",
    "other": "time outside ops",
}


def ms(seconds: float) -> str:
    """Seconds as milliseconds with two significant digits or more (``3.1 ms``, ``0.42 ms``)."""
    value = seconds * 1e3
    if abs(value) >= 100:
        return f"{value:.0f} ms"
    if abs(value) >= 1:
        return f"{value:.1f} ms"
    return f"{value:.2g} ms"


def times(ratio: float) -> str:
    """A ratio as ``2.6×``, ``14×`` or ``470×`` (never in scientific notation)."""
    return times_text(ratio, ".2g" if ratio < 10 else ".0f")


@dataclass(frozen=True)
class FamilyChange:
    """One family, baseline against plan: seconds per step in each, the change (plan minus
    baseline: negative is time saved) and the factor it applies to the running step time."""

    family: str
    baseline_s: float
    plan_s: float
    factor: float

    @property
    def change_s(self) -> float:
        return self.plan_s - self.baseline_s

    @property
    def times_faster(self) -> float | None:
        """Baseline over plan in this family (>1: faster here); None where either is 0."""
        return self.baseline_s / self.plan_s if self.plan_s > 0 and self.baseline_s > 0 else None


@dataclass(frozen=True)
class PlanDifference:
    """A plan's split against the baseline's (see module docstring).

    ``calibrated``: the calibrated speedup's estimate, ``low`` and ``high`` (None where there
    is no interval); ``process``, ``process_low``, ``process_high``: the timed speedup of the
    process the split ran in, over its rounds (None when the calibrated one is that process's);
    ``agrees``: whether the reconstruction lies in the process's interval (else the calibrated
    one) widened by ``tolerance`` (None when there is nothing to hold it against); ``missing``:
    why there is no difference (the plan's or the baseline's split is missing).
    """

    label: str
    baseline: str
    changes: tuple[FamilyChange, ...] = ()
    reconstructed: float | None = None
    calibrated: float | None = None
    low: float | None = None
    high: float | None = None
    tolerance: float = 0.0
    agrees: bool | None = None
    sentence: str = ""
    reconcile: str = ""
    missing: str | None = None
    process: float | None = None
    process_low: float | None = None
    process_high: float | None = None
    #: Each pooled process's own reconstruction (this one first) when the splits are pooled
    #: over processes (:mod:`~precision_nb.engine.time_split.pool`), else empty.
    by_process: tuple[float, ...] = ()

    def change(self, family: str) -> FamilyChange | None:
        return next((c for c in self.changes if c.family == family), None)


def changes(base: TimeSplit, plan: TimeSplit) -> tuple[FamilyChange, ...]:
    """Per family: both times and the factor the change applies to the running step time."""
    running = sum(base.families.values())
    out = []
    for family in FAMILIES:
        b, p = base.families.get(family, 0.0), plan.families.get(family, 0.0)
        after = running + (p - b)
        factor = after / running if running > 0 else math.nan
        out.append(FamilyChange(family, b, p, factor))
        running = after
    return tuple(out)


def sentence(
    label: str, found: tuple[FamilyChange, ...], speedup: float, optimizer: str | None = None
) -> str:
    """What the plan changed, in one sentence, true whatever the numbers: the families whose time
    moved by at least :data:`NOTABLE` of the baseline's step (losses first when the plan is
    slower), the optimizer step when it did not move, and the speedup of the profiled steps."""
    step = sum(c.baseline_s for c in found)
    notable = [c for c in found if step > 0 and abs(c.change_s) >= NOTABLE * step]
    gains = sorted((c for c in notable if c.change_s < 0), key=lambda c: c.change_s)
    losses = sorted((c for c in notable if c.change_s > 0), key=lambda c: -c.change_s)
    saved, lost = [_gain(c) for c in gains], [_loss(c) for c in losses]
    parts = lost + saved if speedup < 1 else saved + lost
    opt = next((c for c in found if c.family == "optimizer"), None)
    if opt is not None and opt not in notable and opt.baseline_s >= 5 * NOTABLE * step > 0:
        why = f" ({optimizer})" if optimizer else ""
        parts.append(f"left the {ms(opt.plan_s)} optimizer step about the same{why}")
    if not parts:
        parts.append(f"moved no family by {NOTABLE:.0%} of the step or more")
    overall = "faster" if speedup > 1 else "slower" if speedup < 1 else "the same"
    said = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return (
        f"{label} {said}: {times_text(speedup, '.3g')} overall in the profiled steps ({overall})."
    )


def _gain(c: FamilyChange) -> str:
    text = f"saved {ms(-c.change_s)} {WHERE[c.family]}"
    if c.times_faster is not None:
        text += f" ({times(c.times_faster)} faster there)"
    return text


def _loss(c: FamilyChange) -> str:
    if c.baseline_s <= 0:
        return f"added {ms(c.change_s)} of {WHAT[c.family]}"
    ratio = c.times_faster
    slower = f" ({times(1 / ratio)} slower there)" if ratio else ""
    return f"spent {ms(c.change_s)} more {WHERE[c.family]}{slower}"


def difference(
    base: TimeSplit,
    plan: TimeSplit,
    calibrated: Any = None,
    *,
    tolerance: float = 0.10,
    optimizer: str | None = None,
    here: Any = None,
    by_process: tuple[float, ...] = (),
) -> PlanDifference:
    """``plan`` against ``base``. ``calibrated``: the plan's
    :class:`~precision_nb.engine.stats.Speedup` over the baseline (``estimate``, ``low``,
    ``high``, ``processes``, ``process_ratios``), or None; ``here``: the speedup of the process
    the split ran in, over its rounds, when other processes measured too and the splits are not
    pooled over them (else None); ``by_process``: each process's own reconstruction, when they
    are. ``optimizer``: words on the optimizer the plan ran (the sentence gives it where the
    optimizer step did not move)."""
    for split, who in ((plan, "the plan"), (base, "the baseline")):
        if not split.available:
            return PlanDifference(
                plan.label, base.label, missing=f"{who} ({split.label}) has no split: "
                f"{split.missing}", tolerance=tolerance,
            )  # fmt: skip
    found = changes(base, plan)
    total_b, total_p = sum(base.families.values()), sum(plan.families.values())
    reconstructed = total_b / total_p if total_p > 0 else math.nan
    cal, own = ([getattr(s, k, None) for k in _ENDS] for s in (calibrated, here))
    agrees, words = _reconcile(base, plan, reconstructed, calibrated, here, tolerance, by_process)
    return PlanDifference(
        plan.label, base.label, found, reconstructed, *cal, tolerance, agrees,
        sentence(plan.label, found, reconstructed, optimizer), words, None, *own, by_process,
    )  # fmt: skip


def _against(
    speedup: Any, tol: float, what: str, scope: str = ""
) -> tuple[float, float, str] | None:
    """The range ``speedup`` gives widened by ``tol``, and its words (``scope``: what its
    interval is over); None without an estimate."""
    est, low, high = (getattr(speedup, k, None) for k in _ENDS)
    if est is None:
        return None
    if low is not None and high is not None:
        words = f"{what} {times_text(est, '.3f')} ({interval_text(low, high, spec='.3f')}{scope})"
        return low / (1 + tol), high * (1 + tol), words
    return est / (1 + tol), est * (1 + tol), f"{what} {times_text(est, '.3f')} (no interval)"


def _reconcile(
    base: TimeSplit,
    plan: TimeSplit,
    got: float,
    calibrated: Any,
    here: Any,
    tol: float,
    by_process: tuple[float, ...] = (),
) -> tuple[bool | None, str]:
    head = f"reconstructed from the families: {times_text(got, '.3f')}"
    if len(by_process) > 1:
        low_high = interval_text(min(by_process), max(by_process), spec=".2f")
        head = (
            f"reconstructed from the families pooled over {len(by_process)} processes: "
            f"{times_text(got, '.3f')} (single processes {low_high})"
        )
    own = _against(here, tol, "this process's timed", " over its rounds")
    cal = _against(calibrated, tol, "the calibrated")
    held = own or cal
    if held is None or not math.isfinite(got):
        return None, f"{head}; no calibrated speedup to hold it against"
    lo, hi, against = held
    against += f" widened by {plus_minus_text(tol)}"
    beside = ""
    if own is not None and cal is not None:
        ratios = getattr(calibrated, "process_ratios", ()) or ()
        spread = ""
        if len(ratios) > 1:
            spread = f", single processes {interval_text(min(ratios), max(ratios), spec='.2f')}"
        n = getattr(calibrated, "processes", None)
        beside = f"; {cal[2]} is over {n} processes, this one among them{spread}"
    if lo <= got <= hi:
        return True, f"{head}, within {against}{beside}"
    steps = [
        f"{s.label} {ms(s.step_s)} (profiled {ms(s.traced_s)}, {s.events} events)"
        for s in (base, plan)
    ]
    return False, (
        f"{head}, outside {against}{beside}: the split does not add up to the measured speedup "
        f"(the split's steps, the profiler's cost taken out: {', '.join(steps)}); read its "
        "milliseconds as these few steps' of one process, not the timed rounds'"
    )
