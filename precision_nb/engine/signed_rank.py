"""The exact Wilcoxon signed-rank interval of one process's rounds (Hodges-Lehmann estimate).

SciPy tests with the exact signed-rank distribution (``scipy.stats.wilcoxon(...,
method="exact")``) but keeps the distribution itself private and offers no interval that inverts
the test, so both are here: :func:`signed_rank_cdf` counts the subsets of the ranks 1..n by their
sum (tests/engine/test_engine_signed_rank.py checks it against SciPy's exact p-values), and
:func:`signed_rank_interval` takes the order statistics of the Walsh averages at the critical
value. Above :data:`EXACT_UP_TO` values the critical value comes from the normal approximation
(``scipy.stats.norm``, imported on first use: a process that only measures never loads SciPy).

The functions take numpy arrays with the values on the last axis, so the calibration simulation
(thousands of comparisons at once) runs exactly this code.
"""

from __future__ import annotations

import functools
import math

import numpy as np

__all__ = ["EXACT_UP_TO", "hodges_lehmann", "signed_rank_cdf", "signed_rank_critical",
           "signed_rank_interval"]  # fmt: skip

#: The exact distribution up to this many values; the normal approximation above.
EXACT_UP_TO = 400


def _walsh_averages(d: np.ndarray) -> np.ndarray:
    """The n(n+1)/2 pairwise averages (d_i + d_j) / 2, i <= j, along the last axis."""
    i, j = np.triu_indices(d.shape[-1])
    return (d[..., i] + d[..., j]) / 2


def hodges_lehmann(d: np.ndarray) -> np.ndarray:
    """The Hodges-Lehmann estimate along the last axis: the median of the Walsh averages."""
    d = np.asarray(d, dtype=float)
    return np.median(_walsh_averages(d), axis=-1)


def signed_rank_cdf(n: int) -> np.ndarray:
    """``P(T <= t)`` for t = 0 .. n(n+1)/2, T the signed-rank statistic (the sum of the ranks of
    the positive values) of n values under the null (each rank positive with probability 1/2)."""
    counts = np.zeros(n * (n + 1) // 2 + 1)
    counts[0] = 1.0
    for k in range(1, n + 1):  # subsets of {1..k}: each rank is in T or not
        counts[k:] = counts[k:] + counts[:-k].copy()
    return np.cumsum(counts) / 2.0**n


@functools.lru_cache(maxsize=512)
def signed_rank_critical(n: int, confidence: float) -> int | None:
    """The largest c with P(T <= c) <= (1 - confidence) / 2 for n values (exact up to
    :data:`EXACT_UP_TO`); None when even c = 0 fails (too few values for ``confidence``)."""
    alpha = (1 - confidence) / 2
    if n > EXACT_UP_TO:
        from scipy.stats import norm

        mean, sd = n * (n + 1) / 4, math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
        return int(math.floor(mean - float(norm.ppf(1 - alpha)) * sd - 0.5))
    ok = np.nonzero(signed_rank_cdf(n) <= alpha * (1 + 1e-12))[0]
    return int(ok[-1]) if ok.size else None


def signed_rank_interval(
    d: np.ndarray, confidence: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(estimate, low, high) along the last axis: the Hodges-Lehmann estimate and the interval
    that inverts the exact Wilcoxon signed-rank test at ``confidence`` (NaN bounds where too few
    values give no such interval)."""
    d = np.asarray(d, dtype=float)
    walsh = np.sort(_walsh_averages(d), axis=-1)
    estimate = np.median(walsh, axis=-1)
    c = signed_rank_critical(d.shape[-1], confidence)
    if c is None:
        nan = np.full(estimate.shape, np.nan)
        return estimate, nan, nan.copy()
    return estimate, walsh[..., c], walsh[..., walsh.shape[-1] - 1 - c]
