"""The exact signed-rank distribution and the interval that inverts it, against SciPy's."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sp

from precision_nb.engine import signed_rank as sr


def _with_statistic(n: int, t: int) -> np.ndarray:
    """n values with distinct ranks 1..n whose positive ranks sum to ``t`` (greedy from the top:
    the ranks 1..n reach every sum from 0 to n(n+1)/2)."""
    signs, left = [], t
    for rank in range(n, 0, -1):
        signs.append(1.0 if rank <= left else -1.0)
        left -= rank if rank <= left else 0
    assert left == 0
    return np.array([s * r for s, r in zip(signs, range(n, 0, -1), strict=True)])


@pytest.mark.parametrize("n", [1, 2, 5, 6, 9, 14, 20])
def test_the_cdf_is_scipys_exact_distribution(n):
    cdf = sr.signed_rank_cdf(n)
    assert cdf.shape == (n * (n + 1) // 2 + 1,) and cdf[-1] == pytest.approx(1.0)
    for t in range(len(cdf)):
        d = _with_statistic(n, t)
        expected = sp.wilcoxon(d, alternative="less", method="exact").pvalue  # P(T <= t)
        assert cdf[t] == pytest.approx(expected, rel=1e-12, abs=1e-15), (n, t)


@pytest.mark.parametrize("n", [6, 7, 8, 10, 12, 20, 30, 50])
@pytest.mark.parametrize("confidence", [0.90, 0.95, 0.99])
def test_the_critical_value_is_the_last_one_scipys_test_rejects_at(n, confidence):
    alpha = (1 - confidence) / 2
    c = sr.signed_rank_critical(n, confidence)

    def p_at(t: int) -> float:
        return sp.wilcoxon(_with_statistic(n, t), alternative="less", method="exact").pvalue

    if c is None:
        assert p_at(0) > alpha
        return
    assert p_at(c) <= alpha < p_at(c + 1)


@pytest.mark.parametrize(
    ("n", "critical"),  # two-sided 5 % critical values of the Wilcoxon signed-rank statistic
    [(5, None), (6, 0), (7, 2), (8, 3), (10, 8), (12, 13), (20, 52), (30, 137)],
)
def test_critical_values_match_the_table(n, critical):
    assert sr.signed_rank_critical(n, 0.95) == critical


@pytest.mark.parametrize("n", [sr.EXACT_UP_TO + 1, 520, 700])
@pytest.mark.parametrize("confidence", [0.90, 0.95, 0.99])
def test_above_the_exact_range_the_approximation_misses_each_tail_by_under_1e_4(n, confidence):
    # the exact distribution (cheap enough here to check) at the normal approximation's value
    c = sr.signed_rank_critical(n, confidence)
    tail = sr.signed_rank_cdf(n)[c]
    assert tail == pytest.approx((1 - confidence) / 2, abs=1e-4)


def test_hodges_lehmann_is_the_median_of_walsh_averages():
    d = np.array([0.0, 1.0, 5.0])  # Walsh averages 0, .5, 2.5, 1, 3, 5
    assert float(sr.hodges_lehmann(d)) == pytest.approx(1.75)


def test_six_rounds_give_the_range_and_five_give_no_interval():
    d = np.array([0.3, 0.1, 0.2, 0.5, 0.4, 0.6])
    est, low, high = sr.signed_rank_interval(d, 0.95)
    assert (float(low), float(high)) == (0.1, 0.6)  # coverage 1 - 2/64 = 96.9 %
    _, low5, high5 = sr.signed_rank_interval(d[:5], 0.95)
    assert np.isnan(low5) and np.isnan(high5)


def test_the_interval_holds_exactly_what_scipys_test_does_not_reject():
    # a shift m is inside the interval iff the two-sided exact test of d - m does not reject
    rng = np.random.default_rng(3)
    d = rng.normal(0.2, 1.0, 12)
    _, low, high = sr.signed_rank_interval(d, 0.95)
    walsh = np.sort((d[:, None] + d[None, :])[np.triu_indices(12)] / 2)
    mids = (walsh[:-1] + walsh[1:]) / 2  # one shift between each pair of Walsh averages
    for m in mids:
        p = sp.wilcoxon(d - m, method="exact").pvalue
        assert (low <= m <= high) == (p > 0.05), m
