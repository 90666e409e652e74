"""Statistics of step times on synthetic data with known answers."""

from __future__ import annotations

import math

import pytest

from precision_nb.engine import stats


def test_spread_median_and_quartiles():
    s = stats.spread([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.median, s.q1, s.q3, s.n) == (3.0, 2.0, 4.0, 5)
    assert s.iqr == 2.0
    assert s.relative_iqr == pytest.approx(2 / 3)


def test_spread_of_nothing_is_nan():
    s = stats.spread([])
    assert s.n == 0 and math.isnan(s.median)


def test_paired_speedup_constant_ratio_has_a_tight_interval():
    base = [[2.0, 2.0, 2.1]] * 8
    plan = [[1.0, 1.0, 1.05]] * 8
    s = stats.paired_speedup(base, plan)
    assert s.estimate == pytest.approx(2.0)
    assert s.low == pytest.approx(2.0) and s.high == pytest.approx(2.0)
    assert s.rounds == 8 and len(s.ratios) == 8


def test_paired_ratio_cancels_a_drift_shared_by_both_plans():
    # the machine slows down 3x over the rounds; the plan is always 1.5x faster within a round
    base = [[1.5 * (1 + r / 3)] for r in range(9)]
    plan = [[1.0 * (1 + r / 3)] for r in range(9)]
    s = stats.paired_speedup(base, plan)
    assert s.estimate == pytest.approx(1.5)
    assert s.low == pytest.approx(1.5) and s.high == pytest.approx(1.5)


def test_bootstrap_interval_is_deterministic_and_contains_the_estimate():
    ratios = [0.9, 1.1, 1.0, 1.2, 0.95, 1.05, 1.15, 0.85]
    base = [[r] for r in ratios]
    plan = [[1.0]] * len(ratios)
    a = stats.paired_speedup(base, plan)
    b = stats.paired_speedup(base, plan)
    assert (a.low, a.high) == (b.low, b.high)
    assert a.low <= a.estimate <= a.high
    assert a.low >= min(ratios) and a.high <= max(ratios)
    assert a.low < 1 < a.high


def test_failed_rounds_are_left_out():
    s = stats.paired_speedup([[1.0]] * 5, [[0.5], [0.5], [], [], []])
    assert s.rounds == 2 and s.estimate == pytest.approx(2.0)


def test_verdict_faster_names_the_interval():
    s = stats.paired_speedup([[1.31]] * 8, [[1.0]] * 8)
    v = stats.verdict("bf16", s)
    assert v.kind == "faster"
    assert "1.31x the fp32 speed" in v.text and "95 % CI 1.31-1.31, 8 rounds" in v.text


def test_verdict_slower():
    v = stats.verdict("fp16", stats.paired_speedup([[1.0]] * 6, [[1.25]] * 6))
    assert v.kind == "slower" and "0.80x" in v.text


def test_verdict_unresolved_says_what_would_resolve_it():
    ratios = [0.9, 1.1, 1.0, 1.2, 0.95, 1.05, 1.15, 0.85]
    s = stats.paired_speedup([[r] for r in ratios], [[1.0]] * 8)
    v = stats.verdict("bf16", s, spread_of_plan=stats.spread([1.0, 2.0, 1.0, 2.0]))
    assert v.kind == "unresolved"
    assert "no difference this machine can resolve (±" in v.text
    # the observed difference (2 %) would need hundreds of rounds: no rounds advice then
    assert "rounds" not in v.advice and "larger model or batch (step times spread" in v.advice
    assert "paid off" not in str(v)


def test_unresolved_verdict_estimates_the_rounds_that_would_resolve_it():
    ratios = [0.9, 1.4, 1.0, 1.5, 1.2, 0.95, 1.3, 1.1]
    s = stats.paired_speedup([[r] for r in ratios], [[1.0]] * 8)
    v = stats.verdict("bf16", s)
    assert v.kind == "unresolved"
    hw, diff = s.half_width, abs(s.estimate - 1)
    needed = int(-(-8 * (hw / diff) ** 2 // 1)) + 1
    assert f"about {needed} rounds" in v.advice


def test_a_very_wide_interval_is_shown_as_its_range():
    s = stats.paired_speedup([[r] for r in [0.1, 5.0, 0.2, 4.0, 3.0]], [[1.0]] * 5)
    v = stats.verdict("bf16", s)
    assert v.kind == "unresolved" and "the interval spans" in v.text


def test_too_few_rounds_give_a_message_and_the_raw_ratios():
    s = stats.paired_speedup([[2.0], [3.0]], [[1.0], [1.0]])
    assert s.low is None and s.high is None and s.half_width is None
    v = stats.verdict("bf16", s)
    assert v.kind == "too_few"
    assert "2.00, 3.00" in v.text and str(stats.MIN_ROUNDS) in v.advice


def test_no_times_gives_no_verdict():
    v = stats.verdict("bf16", stats.paired_speedup([], []))
    assert v.kind == "none"
