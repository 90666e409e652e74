"""Statistics of step times: spread per plan, paired speedups with intervals that hold.

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
- :mod:`precision_nb.engine.verdicts` words the speedups.

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
from precision_nb.core.text import confidence_text
from precision_nb.engine.signed_rank import hodges_lehmann, signed_rank_interval

__all__ = [
    "CONFIDENCE",
    "LOOK_CONFIDENCE",
    "MIN_PROCESSES",
    "MIN_ROUNDS",
    "MEASURED_HERE",
    "ONE_LAUNCH",
    "Speedup",
    "Spread",
    "classify",
    "first_stop",
    "log_ratios",
    "paired_speedup",
    "process_estimates",
    "process_interval",
    "process_speedup",
    "spread",
    "t_quantile",
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


def round_method(rounds: int, confidence: float = CONFIDENCE, stopped_by: str = "") -> str:
    """The single-process (or single-launch) method in words."""
    launch = stopped_by == ONE_LAUNCH
    one, unit = ("one torchrun launch", "launch") if launch else ("one process", "process")
    return (
        f"Hodges-Lehmann estimate of {rounds} paired per-round log ratios (baseline block median "
        f"/ plan block median) in {one}; exact Wilcoxon signed-rank "
        f"{confidence_text(confidence)} interval (distribution-free; needs at least {MIN_ROUNDS} "
        f"rounds); it covers the rounds of this {unit}, not the variation from one {unit} to the "
        "next"
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
            f"{confidence_text(LOOK_CONFIDENCE)} t quantile, which keeps the coverage of the "
            f"whole procedure at {confidence_text(confidence)} or more"
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
    method = round_method(len(d), confidence, stopped_by)
    return Speedup(
        math.exp(float(est)), *bounds, len(d), ratios, confidence, method, stopped_by=stopped_by
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
    ratios = [log_ratios(b, p) for b, p in per_process]
    paired = [pair for pair, d in zip(per_process, ratios, strict=True) if d]
    if len(paired) < 2:
        base, plan = paired[0] if paired else ([], [])
        return paired_speedup(base, plan, confidence, stopped_by)
    rounds = [d for d in ratios if d]
    m = process_estimates(paired)
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
