"""Statistics of step times: spread per plan, paired speedups with an interval, verdicts.

Method (docs/profiling.md):

- :func:`spread`: the median step time of a plan and its interquartile range (IQR).
- :func:`paired_speedup`: plans run in rounds, a block of steps each; in round ``r`` the ratio
  ``median(baseline block r) / median(plan block r)`` compares two blocks measured close together,
  so a slow drift of a shared machine cancels. The speedup is the median of those per-round
  ratios and its confidence interval a percentile bootstrap over rounds (the rounds are resampled
  with a fixed seed, so the same times always give the same interval).
- :func:`verdict`: "faster" or "slower" only where the interval excludes 1; otherwise "no
  difference this machine can resolve (±x %)" with what would resolve it. Fewer than
  :data:`MIN_ROUNDS` rounds give no interval, a message saying so, and the raw times.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "CONFIDENCE",
    "MIN_ROUNDS",
    "Speedup",
    "Spread",
    "Verdict",
    "paired_speedup",
    "spread",
    "verdict",
]

#: Fewer rounds than this give no interval (a bootstrap over 3 values says next to nothing).
MIN_ROUNDS = 4
#: Coverage of every interval shown.
CONFIDENCE = 0.95
#: Bootstrap resamples and their seed (fixed: the same times always give the same interval).
RESAMPLES = 2000
SEED = 0
#: Beyond this many rounds the advice stops suggesting more rounds (the spread must shrink).
PRACTICAL_ROUNDS = 200
#: A spread (IQR / median) above this makes "a larger model or batch" part of the advice.
NOISY_IQR = 0.25


@dataclass(frozen=True)
class Spread:
    """Median of ``n`` step times with the quartiles around it (seconds)."""

    median: float
    q1: float
    q3: float
    n: int

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def relative_iqr(self) -> float:
        """IQR as a fraction of the median (NaN for an empty or zero median)."""
        return self.iqr / self.median if self.median > 0 else math.nan


def spread(times: Sequence[float]) -> Spread:
    """Median and quartiles (inclusive method) of ``times``; NaNs for no times."""
    values = sorted(float(t) for t in times if math.isfinite(t))
    if not values:
        return Spread(math.nan, math.nan, math.nan, 0)
    if len(values) == 1:
        return Spread(values[0], values[0], values[0], 1)
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return Spread(statistics.median(values), q1, q3, len(values))


@dataclass(frozen=True)
class Speedup:
    """Speedup of a plan over the baseline: median of per-round ratios, its interval (or none).

    ``low`` / ``high`` are None when there were fewer than :data:`MIN_ROUNDS` rounds;
    ``ratios`` keeps the per-round values so the raw data is always available.
    """

    estimate: float
    low: float | None
    high: float | None
    rounds: int
    ratios: tuple[float, ...]
    confidence: float = CONFIDENCE
    method: str = (
        "median of per-round paired ratios (baseline block median / plan block median); "
        f"{CONFIDENCE:.0%} percentile bootstrap over rounds, {RESAMPLES} resamples, seed {SEED}"
    )

    @property
    def has_interval(self) -> bool:
        return self.low is not None and self.high is not None

    @property
    def half_width(self) -> float | None:
        """Half the interval's width as a fraction (0.05 = ±5 %), None without an interval."""
        if self.low is None or self.high is None:
            return None
        return (self.high - self.low) / 2


def _bootstrap_median(values: Sequence[float], confidence: float) -> tuple[float, float]:
    rng = random.Random(SEED)
    n = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(RESAMPLES))
    tail = (1 - confidence) / 2
    lo = medians[max(0, math.floor(tail * RESAMPLES))]
    hi = medians[min(RESAMPLES - 1, math.ceil((1 - tail) * RESAMPLES) - 1)]
    return lo, hi


def paired_speedup(
    baseline_blocks: Sequence[Sequence[float]],
    plan_blocks: Sequence[Sequence[float]],
    confidence: float = CONFIDENCE,
) -> Speedup:
    """Speedup (>1: the plan is faster) from step times per round, baseline and plan paired.

    Rounds where either side has no time (a plan that failed part-way) are left out, so a plan
    is compared over the rounds it completed.
    """
    ratios: list[float] = []
    for base, plan in zip(baseline_blocks, plan_blocks, strict=False):
        b, p = spread(base).median, spread(plan).median
        if math.isfinite(b) and math.isfinite(p) and p > 0:
            ratios.append(b / p)
    if not ratios:
        return Speedup(math.nan, None, None, 0, ())
    estimate = statistics.median(ratios)
    if len(ratios) < MIN_ROUNDS:
        return Speedup(estimate, None, None, len(ratios), tuple(ratios), confidence)
    low, high = _bootstrap_median(ratios, confidence)
    return Speedup(estimate, low, high, len(ratios), tuple(ratios), confidence)


@dataclass(frozen=True)
class Verdict:
    """What a speedup says, in words that stay true whatever the numbers are.

    ``kind``: "faster" / "slower" (the interval excludes 1), "unresolved" (it includes 1),
    "too_few" (no interval: fewer than :data:`MIN_ROUNDS` rounds) or "none" (no times).
    ``advice``: what would resolve an unresolved or too-few verdict ("" otherwise).
    """

    kind: str
    text: str
    advice: str = ""

    def __str__(self) -> str:
        return f"{self.text} {self.advice}".strip()


def _rounds_needed(s: Speedup) -> int | None:
    """Rounds that would shrink the interval below the observed difference (1/sqrt(n) scaling)."""
    hw, diff = s.half_width, abs(s.estimate - 1)
    if hw is None or diff < 0.01:
        return None
    return math.ceil(s.rounds * (hw / diff) ** 2) + 1


def verdict(
    label: str, s: Speedup, baseline: str = "fp32", spread_of_plan: Spread | None = None
) -> Verdict:
    """Words for ``s``: e.g. "bf16 is 1.31x the fp32 speed (95 % CI 1.22-1.40, 8 rounds)"."""
    if s.rounds == 0 or not math.isfinite(s.estimate):
        return Verdict("none", f"{label}: no paired step times against {baseline}; no speedup.")
    ci_pct = f"{s.confidence:.0%}".replace("%", " %")
    if not s.has_interval:
        raw = ", ".join(f"{r:.2f}" for r in s.ratios)
        return Verdict(
            "too_few",
            f"{label}: {s.rounds} round(s) are too few for an interval (at least {MIN_ROUNDS} "
            f"needed); per-round speed ratios vs {baseline}: {raw}.",
            f"Run at least {MIN_ROUNDS} rounds to get an interval.",
        )
    assert s.low is not None and s.high is not None
    ci = f"({ci_pct} CI {s.low:.2f}-{s.high:.2f}, {s.rounds} rounds)"
    if s.low > 1:
        return Verdict("faster", f"{label} is {s.estimate:.2f}x the {baseline} speed {ci}.")
    if s.high < 1:
        return Verdict("slower", f"{label} is {s.estimate:.2f}x the {baseline} speed {ci}: slower.")
    reach = max(s.high - 1, 1 - s.low) * 100
    pm = f"±{reach:.0f} %" if reach <= 100 else f"the interval spans {s.low:.2f}-{s.high:.2f}x"
    advice = []
    needed = _rounds_needed(s)
    if needed is not None and s.rounds < needed <= PRACTICAL_ROUNDS:
        advice.append(f"about {needed} rounds")
    elif needed is not None and needed <= s.rounds:
        advice.append("a few more rounds")
    noisy = spread_of_plan is not None and spread_of_plan.relative_iqr > NOISY_IQR
    advice.append(
        "a larger model or batch (step times spread widely)" if noisy else "a larger model or batch"
    )
    return Verdict(
        "unresolved",
        f"{label} vs {baseline}: no difference this machine can resolve ({pm}); "
        f"median ratio {s.estimate:.2f}x {ci}.",
        "What would resolve it: " + " or ".join(advice) + ".",
    )
