"""Statistics of step times: spread per plan, paired speedups with intervals that hold, verdicts.

Method (docs/profiling.md, "How speed is measured"):

- :func:`spread`: the median step time of a plan and its interquartile range (IQR).
- Every comparison is paired: in round ``r`` of a process, ``d = log(baseline block median /
  plan block median)`` compares two blocks measured close together, so a slow drift of a shared
  machine cancels.
- **One process** (:func:`paired_speedup`): the estimate is the Hodges-Lehmann estimate of the
  rounds' ``d`` (the median of their pairwise averages) and the interval inverts the exact
  Wilcoxon signed-rank test (:mod:`precision_nb.engine.signed_rank`): distribution-free for ``d``
  symmetric about its centre, which "no difference" guarantees (the plans are exchangeable
  within a round). Below :data:`MIN_ROUNDS` rounds no 95 % interval of this kind exists; the
  verdict says so and gives the raw ratios instead of a narrower interval. It covers the rounds
  of that one process, not the variation from one process to the next.
- **Several processes** (:func:`process_speedup`): each process contributes one value, its own
  Hodges-Lehmann estimate, and the interval is a Student-t interval over processes
  (:func:`process_interval`, its quantile from ``scipy.stats.t``), the level that varies (memory
  layout, allocator state and kernel choice are drawn once per process). When the number of
  processes is chosen by looking at the interval (a precision target, :func:`first_stop`), every
  look uses :data:`LOOK_CONFIDENCE`: stopping when an interval happens to be narrow would
  otherwise favour samples whose spread came out small, and the whole procedure would cover less
  than it says.
- :func:`verdict`: "faster" / "slower" only where the interval excludes 1, with the interval, its
  half-width, what it covers and how the measurement stopped.

The interval functions take numpy arrays with the values on the last axis, so the calibration
simulation in the tests (thousands of comparisons at once) runs exactly this code.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Coverage of every interval shown (CONFIDENCE); fewer paired rounds than MIN_ROUNDS in one
# process give no interval (below 6 values the exact Wilcoxon signed-rank test cannot reach 95 %:
# its most extreme outcome has probability 2/2^n); an interval over processes chosen by a
# precision target starts looking at MIN_PROCESSES.
from precision_nb.core.defaults import CONFIDENCE, MIN_PROCESSES, MIN_ROUNDS
from precision_nb.core.text import confidence_text, interval_text, times_text
from precision_nb.engine.signed_rank import hodges_lehmann, signed_rank_interval

__all__ = [
    "CONFIDENCE",
    "LOOK_CONFIDENCE",
    "MIN_PROCESSES",
    "MIN_ROUNDS",
    "Speedup",
    "Spread",
    "Verdict",
    "classify",
    "first_stop",
    "log_ratios",
    "paired_speedup",
    "process_estimates",
    "process_interval",
    "process_speedup",
    "spread",
    "t_quantile",
    "verdict",
]

#: The level of each look of the sequential (target-driven) procedure; the simulation in
#: tests/engine/test_engine_calibration.py shows the whole procedure keeps >= 95 % coverage.
LOOK_CONFIDENCE = 0.975
#: How a measurement's ``stopped_by`` says why it measured in this process only, though fresh
#: processes were asked for (the reason follows it; verdicts repeat it).
MEASURED_HERE = "measured here: "
#: A distributed profile's ``stopped_by``: all its plans in one torchrun launch.
ONE_LAUNCH = (
    "one torchrun launch: the interval covers the rounds of this launch, not the variation from "
    "one launch to the next"
)
#: Beyond this many rounds or processes the advice stops suggesting more of them.
PRACTICAL_ROUNDS = 200
PRACTICAL_PROCESSES = 60
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


# ----------------------------------------------------------------------------- interval maths


@functools.lru_cache(maxsize=512)
def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (``scipy.stats.t``,
    imported on first use: a process that only measures never loads SciPy)."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"t_quantile: p must be in (0, 1) and df > 0, got p={p!r}, df={df!r}")
    from scipy.stats import t

    return float(t.ppf(p, df))


def process_interval(
    m: np.ndarray, confidence: float = CONFIDENCE
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, low, high) along the last axis: a Student-t interval over the processes' values
    (NaN bounds with fewer than 2 processes)."""
    m = np.asarray(m, dtype=float)
    n = m.shape[-1]
    mean = m.mean(axis=-1)
    if n < 2:
        nan = np.full(mean.shape, np.nan)
        return mean, nan, nan.copy()
    half = t_quantile(1 - (1 - confidence) / 2, n - 1) * m.std(axis=-1, ddof=1) / math.sqrt(n)
    return mean, mean - half, mean + half


def relative_half_width(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Half the width of a log-scale interval as a fraction of its centre: the "±x %" shown
    (exactly (high - low) / (2 * centre) on the ratio scale for a symmetric log interval)."""
    return np.sinh((np.asarray(high) - np.asarray(low)) / 2)


def first_stop(
    m: np.ndarray,
    target: float,
    min_processes: int = MIN_PROCESSES,
    confidence: float = LOOK_CONFIDENCE,
) -> np.ndarray:
    """How many processes the target-driven procedure measures, along the last axis of ``m``:
    the first ``p >= min_processes`` whose interval (at ``confidence``) has a relative half-width
    within ``target``; 0 where none of the available processes reaches it."""
    m = np.asarray(m, dtype=float)
    out = np.zeros(m.shape[:-1], dtype=int)
    for p in range(max(2, min_processes), m.shape[-1] + 1):
        _, low, high = process_interval(m[..., :p], confidence)
        reached = (out == 0) & (relative_half_width(low, high) <= target)
        out[reached] = p
    return out


def classify(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """+1 "faster" (the log interval is above 0), -1 "slower" (below 0), 0 otherwise."""
    low, high = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
    return np.where(low > 0, 1, np.where(high < 0, -1, 0))


# ----------------------------------------------------------------------------- speedups


def log_ratios(
    baseline_blocks: Sequence[Sequence[float]], plan_blocks: Sequence[Sequence[float]]
) -> list[float]:
    """Per round, log(baseline block median / plan block median); rounds where either side has
    no time (a plan that failed or stopped part-way) are left out."""
    out: list[float] = []
    for base, plan in zip(baseline_blocks, plan_blocks, strict=False):
        b, p = spread(base).median, spread(plan).median
        if math.isfinite(b) and math.isfinite(p) and b > 0 and p > 0:
            out.append(math.log(b / p))
    return out


@dataclass(frozen=True)
class Speedup:
    """Speedup of a plan over the baseline (>1: the plan is faster), its interval (or none).

    ``low`` / ``high`` are None when no interval of the stated confidence exists (too few
    rounds in one process). ``ratios`` keeps every paired per-round ratio (all processes, in
    order) so the raw data is always available; ``process_ratios`` each process's estimate.
    ``level``: what the interval covers, "processes" or "rounds" (of one process).
    ``method``: the method in words; ``stopped_by``: how the measurement ended.
    """

    estimate: float
    low: float | None
    high: float | None
    rounds: int
    ratios: tuple[float, ...]
    confidence: float = CONFIDENCE
    method: str = ""
    processes: int = 1
    process_ratios: tuple[float, ...] = ()
    level: str = "rounds"
    stopped_by: str = ""

    @property
    def has_interval(self) -> bool:
        return self.low is not None and self.high is not None

    @property
    def half_width(self) -> float | None:
        """Half the interval's width relative to the estimate (0.05 = ±5 %); None without one."""
        if self.low is None or self.high is None or not self.estimate > 0:
            return None
        return (self.high - self.low) / (2 * self.estimate)


def round_method(rounds: int, confidence: float = CONFIDENCE) -> str:
    """The single-process method in words."""
    return (
        f"Hodges-Lehmann estimate of {rounds} paired per-round log ratios (baseline block median "
        f"/ plan block median) in one process; exact Wilcoxon signed-rank {confidence:.0%} "
        f"interval (distribution-free; needs at least {MIN_ROUNDS} rounds); it covers the rounds "
        "of this process, not the variation from one process to the next"
    )


def process_method(processes: int, confidence: float, sequential: bool) -> str:
    """The several-process method in words."""
    text = (
        "per process, the Hodges-Lehmann estimate of its paired per-round log ratios (baseline "
        f"block median / plan block median); Student-t interval over the {processes} processes "
        "(the level that varies)"
    )
    if sequential:
        text += (
            f"; the number of processes was chosen by a precision target, so each look used a "
            f"{LOOK_CONFIDENCE:.1%} t quantile, which keeps the coverage of the whole procedure "
            f"at {confidence:.0%} or more"
        )
    return text


def paired_speedup(
    baseline_blocks: Sequence[Sequence[float]],
    plan_blocks: Sequence[Sequence[float]],
    confidence: float = CONFIDENCE,
    stopped_by: str = "",
) -> Speedup:
    """The speedup from one process's rounds, baseline and plan paired (see the module doc)."""
    d = log_ratios(baseline_blocks, plan_blocks)
    ratios = tuple(math.exp(x) for x in d)
    if not d:
        return Speedup(math.nan, None, None, 0, (), confidence, "", stopped_by=stopped_by)
    est, low, high = signed_rank_interval(np.array(d), confidence)
    bounds = (None, None) if np.isnan(low) else (math.exp(float(low)), math.exp(float(high)))
    return Speedup(
        math.exp(float(est)),
        *bounds,
        len(d),
        ratios,
        confidence,
        round_method(len(d), confidence),
        stopped_by=stopped_by,
    )


def process_estimates(
    per_process: Sequence[tuple[Sequence[Sequence[float]], Sequence[Sequence[float]]]],
) -> np.ndarray:
    """Each process's Hodges-Lehmann estimate of its paired log ratios (processes without a
    paired round left out): the values the interval over processes is built from."""
    rounds = [d for d in (log_ratios(base, plan) for base, plan in per_process) if d]
    return np.array([float(hodges_lehmann(np.array(d))) for d in rounds])


def process_speedup(
    per_process: Sequence[tuple[Sequence[Sequence[float]], Sequence[Sequence[float]]]],
    confidence: float = CONFIDENCE,
    *,
    sequential: bool = False,
    stopped_by: str = "",
) -> Speedup:
    """The speedup over several processes: ``per_process`` holds each process's (baseline
    blocks, plan blocks). A process without a paired round is left out; with fewer than two
    processes left this is the one-process speedup. ``sequential``: the number of processes was
    chosen by looking at the interval, so the interval is taken at :data:`LOOK_CONFIDENCE`."""
    rounds = [d for d in (log_ratios(base, plan) for base, plan in per_process) if d]
    if len(rounds) < 2:
        only = [(b, p) for b, p in per_process if log_ratios(b, p)]
        base, plan = only[0] if only else ([], [])
        return paired_speedup(base, plan, confidence, stopped_by)
    m = process_estimates(per_process)
    est, low, high = process_interval(m, LOOK_CONFIDENCE if sequential else confidence)
    return Speedup(
        math.exp(float(est)),
        math.exp(float(low)),
        math.exp(float(high)),
        sum(len(d) for d in rounds),
        tuple(math.exp(x) for d in rounds for x in d),
        confidence,
        process_method(len(rounds), confidence, sequential),
        processes=len(rounds),
        process_ratios=tuple(math.exp(x) for x in m),
        level="processes",
        stopped_by=stopped_by,
    )


# ----------------------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class Verdict:
    """What a speedup says, in words that stay true whatever the numbers are.

    ``kind``: "faster" / "slower" (the interval excludes 1), "unresolved" (it includes 1),
    "too_few" (no interval: too few rounds in one process), "none" (no times) or "baseline".
    ``text``: the one line to show first; ``advice``: what would resolve an unresolved or
    too-few verdict ("" otherwise). The other fields carry the numbers for tables: ``estimate``,
    ``low`` / ``high`` (None without an interval), ``half_width`` (fraction, ±), ``confidence``,
    ``method`` (the interval's method in words), ``level`` ("processes" or "rounds": what the
    interval covers), ``processes``, ``rounds``, ``stopped_by`` (how the measurement ended) and
    ``busy`` (the machine-load note when other processes competed, "" on a quiet machine).
    """

    kind: str
    text: str
    advice: str = ""
    label: str = ""
    baseline: str = ""
    estimate: float = math.nan
    low: float | None = None
    high: float | None = None
    half_width: float | None = None
    confidence: float = CONFIDENCE
    method: str = ""
    level: str = ""
    processes: int = 0
    rounds: int = 0
    stopped_by: str = ""
    busy: str = ""

    def __str__(self) -> str:
        return f"{self.text} {self.advice}".strip()


def _scope(s: Speedup) -> str:
    if s.level == "processes":
        return f"over {s.processes} processes, {s.rounds} paired rounds in all"
    if s.stopped_by == ONE_LAUNCH:
        return f"{s.rounds} rounds in {ONE_LAUNCH}"
    here = s.stopped_by[s.stopped_by.find(MEASURED_HERE) :] if MEASURED_HERE in s.stopped_by else ""
    why = f"; {here}" if here else ""
    return (
        f"{s.rounds} rounds in one process, which does not cover process-to-process variation{why}"
    )


def _processes_advice(s: Speedup) -> str:
    """What measuring over processes would take, by what happened to this measurement."""
    if s.stopped_by == ONE_LAUNCH:
        return "several launches compared (one launch is one sample of their variation)"
    if MEASURED_HERE in s.stopped_by:
        return "a model and batches that can travel to fresh processes (see why they did not)"
    return "several fresh processes (processes >= 2)"


def _needed(s: Speedup) -> int | None:
    """Processes (or rounds) that would shrink the interval below the observed difference, with
    the usual 1/sqrt(n) scaling; None when the difference is too small to chase."""
    hw, diff = s.half_width, abs(math.log(s.estimate)) if s.estimate > 0 else 0.0
    if hw is None or diff < 0.01:
        return None
    n = s.processes if s.level == "processes" else s.rounds
    return math.ceil(n * (math.asinh(hw) / diff) ** 2) + 1


def verdict(
    label: str,
    s: Speedup,
    baseline: str = "fp32",
    spread_of_plan: Spread | None = None,
    busy: str = "",
) -> Verdict:
    """Words for ``s``, worded by :mod:`precision_nb.core.text`: e.g. "bf16 is 1.31× the fp32
    speed: faster (95 % interval 1.22–1.40, ±7 %; over 5 processes, 40 paired rounds in all)".
    ``busy``: the machine-load note; when set, the line says the machine was busy."""
    common = dict(
        label=label,
        baseline=baseline,
        estimate=s.estimate,
        confidence=s.confidence,
        method=s.method,
        level=s.level,
        processes=s.processes,
        rounds=s.rounds,
        stopped_by=s.stopped_by,
        busy=busy,
    )
    tail = " Measured on a busy machine (see the load note)." if busy else ""
    if s.rounds == 0 or not math.isfinite(s.estimate):
        return Verdict(
            "none", f"{label}: no paired step times against {baseline}; no speedup.", **common
        )
    pct = confidence_text(s.confidence)
    if not s.has_interval:
        raw = ", ".join(f"{r:.2f}" for r in s.ratios)
        return Verdict(
            "too_few",
            f"{label} vs {baseline}: {s.rounds} round(s) in one process are too few for a {pct} "
            f"interval (at least {MIN_ROUNDS} are needed); per-round speed ratios: {raw}.{tail}",
            f"Run at least {MIN_ROUNDS} rounds, or use {_processes_advice(s)}.",
            **common,
        )
    assert s.low is not None and s.high is not None
    common.update(low=s.low, high=s.high, half_width=s.half_width or 0.0)
    ci = f"({pct} interval {interval_text(s.low, s.high, s.estimate)}; {_scope(s)})"
    if s.low > 1:
        text = f"{label} is {times_text(s.estimate)} the {baseline} speed: faster {ci}.{tail}"
        return Verdict("faster", text, **common)
    if s.high < 1:
        text = f"{label} is {times_text(s.estimate)} the {baseline} speed: slower {ci}.{tail}"
        return Verdict("slower", text, **common)
    advice = []
    needed = _needed(s)
    unit = "processes" if s.level == "processes" else "rounds"
    practical = PRACTICAL_PROCESSES if s.level == "processes" else PRACTICAL_ROUNDS
    current = s.processes if s.level == "processes" else s.rounds
    if needed is not None and current < needed <= practical:
        more = " (a larger time budget)" if unit == "processes" else ""
        advice.append(f"about {needed} {unit}{more}")
    elif needed is not None and needed <= current:
        advice.append(f"a few more {unit}")
    if s.level != "processes":
        advice.append(_processes_advice(s))
    noisy = spread_of_plan is not None and spread_of_plan.relative_iqr > NOISY_IQR
    advice.append(
        "a larger model or batch (step times spread widely)" if noisy else "a larger model or batch"
    )
    return Verdict(
        "unresolved",
        f"{label} vs {baseline}: no difference this measurement can resolve: "
        f"{times_text(s.estimate)} {ci}.{tail}",
        "What would resolve it: " + " or ".join(advice) + ".",
        **common,
    )
