"""Simulated step times that check the speedup intervals: false verdicts, power, coverage.

:func:`simulate` draws the per-step times of many comparisons at once (numpy), shaped as the
measurement produces them: processes x rounds x a block of steps per plan, the two plans' blocks
back to back in each round with the order alternated (as the measurement rotates it). Scenarios
(:data:`SCENARIOS`) are the step-time shapes a shared machine produces: lognormal noise,
heavy tails, a slow drift over the run, occasional outliers; ``process_sd`` adds a per-process,
per-plan slow-down (memory layout, allocator state, kernel choice drawn once per process).
:func:`verdict_rates` runs the statistics of :mod:`precision_nb.engine.stats` and
:mod:`precision_nb.engine.signed_rank` on them, for one process, a fixed number of processes or
the target-driven procedure, and returns how often each verdict came out. With ``effect=1``
(identical plans) every "faster"/"slower" is false; with ``effect=1.3`` "faster" is the power.
The tests assert the false rate, the benchmark prints both.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from precision_nb.engine import stats
from precision_nb.engine.signed_rank import hodges_lehmann, signed_rank_interval

__all__ = ["SCENARIOS", "Rates", "simulate", "verdict_rates"]

#: Step-time shapes: name -> what it models.
SCENARIOS = {
    "lognormal": "lognormal step times, 10 % spread",
    "heavy_tailed": "1 + 5 % x |Cauchy|: rare steps many times slower",
    "drift": "the machine slows by 50 % over the run, 5 % lognormal noise",
    "outliers": "5 % of the steps 3-10x slower, 5 % lognormal noise",
}


def simulate(
    scenario: str,
    trials: int,
    processes: int,
    rounds: int,
    steps: int,
    effect: float = 1.0,
    process_sd: float = 0.0,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """(baseline, plan) step times, each ``[trials, processes, rounds, steps]``; the plan's
    times are the baseline's distribution divided by ``effect`` (>1: the plan is faster)."""
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario: invalid value {scenario!r}; allowed: {', '.join(SCENARIOS)}")
    rng = np.random.default_rng(seed)
    shape = (trials, processes, rounds, 2, steps)  # slot 0 runs first in its round
    if scenario == "lognormal":
        t = np.exp(0.10 * rng.standard_normal(shape))
    elif scenario == "heavy_tailed":
        t = 1.0 + 0.05 * np.abs(rng.standard_cauchy(shape))
    elif scenario == "drift":
        position = np.arange(rounds * 2 * steps).reshape(rounds, 2, steps) / (rounds * 2 * steps)
        t = np.exp(0.05 * rng.standard_normal(shape)) * (1.0 + 0.5 * position)
    else:
        t = np.exp(0.05 * rng.standard_normal(shape))
        hit = rng.random(shape) < 0.05
        t = np.where(hit, t * rng.uniform(3.0, 10.0, shape), t)
    t = t * np.exp(0.3 * rng.standard_normal((trials, processes, 1, 1, 1)))  # shared by both
    # which plan ran first in each round: alternated over rounds, and over processes
    first_is_base = (np.arange(rounds)[None, :] + np.arange(processes)[:, None]) % 2 == 0
    first = first_is_base[None, :, :, None]
    base = np.where(first, t[:, :, :, 0], t[:, :, :, 1])
    plan = np.where(first, t[:, :, :, 1], t[:, :, :, 0]) / effect
    if process_sd > 0:  # each plan gets its own per-process slow-down
        size = (2, trials, processes, 1, 1)
        base_fx, plan_fx = np.exp(process_sd * rng.standard_normal(size))
        base, plan = base * base_fx, plan * plan_fx
    return base, plan


@dataclass(frozen=True)
class Rates:
    """How often each verdict came out over ``trials`` simulated comparisons."""

    faster: float
    slower: float
    unresolved: float
    trials: int
    #: mean number of processes measured (the target-driven procedure stops early)
    processes: float

    @property
    def resolved(self) -> float:
        return self.faster + self.slower


def verdict_rates(
    base: np.ndarray,
    plan: np.ndarray,
    mode: str = "fixed",
    target: float = 0.05,
    confidence: float = stats.CONFIDENCE,
) -> Rates:
    """Verdict frequencies of the statistics on simulated blocks ``[trials, processes, rounds,
    steps]``. ``mode``: "rounds" (one process: the signed-rank interval over its rounds; uses
    process 0), "fixed" (a t interval over all the processes) or "target" (the target-driven
    procedure: looks from :data:`~precision_nb.engine.stats.MIN_PROCESSES` on, stopping at
    ``target``, else after all the processes as a time budget would)."""
    d = np.log(np.median(base, axis=-1) / np.median(plan, axis=-1))  # [trials, P, R]
    trials, processes = d.shape[0], d.shape[1]
    used = np.full(trials, float(processes))
    if mode == "rounds":
        _, low, high = signed_rank_interval(d[:, 0, :], confidence)
        used[:] = 1
    elif mode == "fixed":
        _, low, high = stats.process_interval(hodges_lehmann(d), confidence)
    elif mode == "target":
        m = hodges_lehmann(d)
        stop = stats.first_stop(m, target)
        stop = np.where(stop == 0, processes, stop)
        low, high = np.full(trials, np.nan), np.full(trials, np.nan)
        for p in np.unique(stop):
            rows = stop == p
            _, lo, hi = stats.process_interval(m[rows, :p], stats.LOOK_CONFIDENCE)
            low[rows], high[rows] = lo, hi
        used = stop.astype(float)
    else:
        raise ValueError(f"mode: invalid value {mode!r}; allowed: rounds, fixed, target")
    kind = stats.classify(low, high)
    faster, slower, unresolved = (float(np.mean(kind == k)) for k in (1, -1, 0))
    return Rates(faster, slower, unresolved, trials, float(used.mean()))
