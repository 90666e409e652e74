"""Statistics of step times on synthetic data with known answers."""

from __future__ import annotations

import math

import numpy as np
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


# ----------------------------------------------------------------------------- interval maths


@pytest.mark.parametrize(
    ("p", "df", "expected"),  # Student's t table
    [(0.975, 1, 12.7062), (0.975, 2, 4.3027), (0.975, 5, 2.5706), (0.975, 30, 2.0423),
     (0.9875, 2, 6.2053), (0.995, 10, 3.1693), (0.025, 4, -2.7764)],
)  # fmt: skip
def test_t_quantile_matches_the_table(p, df, expected):
    assert stats.t_quantile(p, df) == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize(("p", "df"), [(0.0, 3), (1.0, 3), (0.5, 0)])
def test_t_quantile_refuses_what_has_no_quantile(p, df):
    with pytest.raises(ValueError, match="p must be in"):
        stats.t_quantile(p, df)


def test_process_interval_is_a_student_t_interval():
    m = np.array([0.1, 0.3, 0.2])
    mean, low, high = stats.process_interval(m)
    half = 4.3027 * np.std(m, ddof=1) / math.sqrt(3)
    assert float(mean) == pytest.approx(0.2)
    assert (float(low), float(high)) == pytest.approx((0.2 - half, 0.2 + half), abs=1e-5)
    assert np.isnan(stats.process_interval(np.array([0.1]))[1])


def test_first_stop_looks_from_the_minimum_number_of_processes():
    tight = np.array([0.26, 0.261, 0.259, 0.26, 0.262])
    assert int(stats.first_stop(tight, 0.05)) == stats.MIN_PROCESSES
    loose = np.array([0.0, 0.5, -0.3, 0.6, 0.1])
    assert int(stats.first_stop(loose, 0.05)) == 0  # never reached
    both = stats.first_stop(np.stack([tight, loose]), 0.05)
    assert both.tolist() == [stats.MIN_PROCESSES, 0]


def test_the_relative_half_width_is_the_shown_plus_minus():
    low, high = math.log(1.3) - 0.05, math.log(1.3) + 0.05
    hw = float(stats.relative_half_width(low, high))
    assert hw == pytest.approx((math.exp(high) - math.exp(low)) / (2 * 1.3), rel=1e-3)


# ----------------------------------------------------------------------------- speedups


def test_paired_speedup_constant_ratio_has_a_tight_interval():
    base = [[2.0, 2.0, 2.1]] * 8
    plan = [[1.0, 1.0, 1.05]] * 8
    s = stats.paired_speedup(base, plan)
    assert s.estimate == pytest.approx(2.0)
    assert s.low == pytest.approx(2.0) and s.high == pytest.approx(2.0)
    assert s.rounds == 8 and len(s.ratios) == 8 and s.level == "rounds"
    assert "one process" in s.method and "Wilcoxon" in s.method


def test_paired_ratio_cancels_a_drift_shared_by_both_plans():
    # the machine slows down 3x over the rounds; the plan is always 1.5x faster within a round
    base = [[1.5 * (1 + r / 3)] for r in range(9)]
    plan = [[1.0 * (1 + r / 3)] for r in range(9)]
    s = stats.paired_speedup(base, plan)
    assert s.estimate == pytest.approx(1.5)
    assert s.low == pytest.approx(1.5) and s.high == pytest.approx(1.5)


def test_interval_is_deterministic_and_contains_the_estimate():
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


def test_process_speedup_is_over_the_processes_estimates():
    one = ([[2.0]] * 4, [[1.0]] * 4)
    per = [one, ([[2.2]] * 4, [[1.0]] * 4), ([[1.8]] * 4, [[1.0]] * 4)]
    s = stats.process_speedup(per)
    assert s.level == "processes" and s.processes == 3 and s.rounds == 12
    assert s.process_ratios == pytest.approx((2.0, 2.2, 1.8))
    m = np.log([2.0, 2.2, 1.8])
    half = 4.3027 * np.std(m, ddof=1) / math.sqrt(3)
    assert math.log(s.low) == pytest.approx(m.mean() - half, abs=1e-4)
    seq = stats.process_speedup(per, sequential=True)  # each look at 97.5 %: wider
    assert seq.low < s.low and "97.5% t quantile" in seq.method


def test_process_speedup_with_one_usable_process_is_the_rounds_interval():
    per = [([[2.0]] * 8, [[1.0]] * 8), ([[]] * 8, [[]] * 8)]
    s = stats.process_speedup(per)
    assert s.level == "rounds" and s.rounds == 8 and s.has_interval


# ----------------------------------------------------------------------------- verdicts


def test_verdict_faster_names_the_interval_and_what_it_covers():
    s = stats.paired_speedup([[1.31]] * 8, [[1.0]] * 8, stopped_by="one process, as asked")
    v = stats.verdict("bf16", s)
    assert v.kind == "faster"
    assert v.text.startswith("bf16 is 1.31× the fp32 speed: faster (95 % interval 1.31–1.31")
    assert "8 rounds in one process" in v.text
    assert (v.low, v.high, v.estimate) == pytest.approx((1.31, 1.31, 1.31))
    assert v.stopped_by == "one process, as asked" and v.level == "rounds" and v.method


def test_verdict_slower():
    v = stats.verdict("fp16", stats.paired_speedup([[1.0]] * 6, [[1.25]] * 6))
    assert v.kind == "slower" and "0.80×" in v.text and "slower" in v.text


def test_unresolved_shows_the_half_width_not_the_distance_from_one():
    ratios = [0.9, 1.1, 1.0, 1.2, 0.95, 1.05, 1.15, 0.85]
    s = stats.paired_speedup([[r] for r in ratios], [[1.0]] * 8)
    v = stats.verdict("bf16", s, spread_of_plan=stats.spread([1.0, 2.0, 1.0, 2.0]))
    assert v.kind == "unresolved"
    hw = (s.high - s.low) / (2 * s.estimate)
    assert v.half_width == pytest.approx(hw)
    assert f"±{hw * 100:.0f} %" in v.text and "no difference this measurement can resolve" in v.text
    # the observed difference (2 %) would need hundreds of rounds: no rounds advice then
    assert "about" not in v.advice and "larger model or batch (step times spread" in v.advice
    assert "several fresh processes (processes >= 2)" in v.advice


def test_unresolved_over_processes_estimates_the_processes_needed():
    per = [([[b]] * 4, [[1.0]] * 4) for b in (1.5, 0.95, 1.4, 1.1)]
    s = stats.process_speedup(per)
    v = stats.verdict("bf16", s)
    assert v.kind == "unresolved" and s.processes == 4
    needed = math.ceil(4 * (math.asinh(s.half_width) / math.log(s.estimate)) ** 2) + 1
    assert f"about {needed} processes" in v.advice and "over 4 processes" in v.text


def test_a_very_wide_interval_drops_the_plus_minus():
    s = stats.paired_speedup([[r] for r in [0.1, 5.0, 0.2, 4.0, 3.0, 0.3]], [[1.0]] * 6)
    v = stats.verdict("bf16", s)
    assert v.kind == "unresolved" and "±" not in v.text and "interval 0.10–5.00;" in v.text


def test_too_few_rounds_give_a_message_and_the_raw_ratios():
    s = stats.paired_speedup([[2.0], [3.0]], [[1.0], [1.0]])
    assert s.low is None and s.high is None and s.half_width is None
    v = stats.verdict("bf16", s)
    assert v.kind == "too_few"
    assert "2.00, 3.00" in v.text and str(stats.MIN_ROUNDS) in v.advice
    five = stats.verdict("bf16", stats.paired_speedup([[2.0]] * 5, [[1.0]] * 5))
    assert five.kind == "too_few"  # no narrower interval than 95 % is ever shown


def test_a_busy_machine_is_said_in_the_verdict():
    s = stats.paired_speedup([[1.31]] * 8, [[1.0]] * 8)
    v = stats.verdict("bf16", s, busy="The machine was busy ...")
    assert v.busy and "busy machine" in v.text
    assert "busy" not in stats.verdict("bf16", s).text


def test_no_times_gives_no_verdict():
    v = stats.verdict("bf16", stats.paired_speedup([], []))
    assert v.kind == "none"


@pytest.mark.parametrize(
    ("stopped_by", "said", "not_said"),
    [
        (stats.ONE_LAUNCH, "several launches compared", "processes"),
        (
            f"one process, {stats.MEASURED_HERE}it cannot be pickled",
            "can travel",
            "(processes >= 2)",
        ),
        (
            "one process, as asked (processes=1)",
            "several fresh processes (processes >= 2)",
            "travel",
        ),
    ],
)
def test_the_advice_follows_what_happened_to_the_measurement(stopped_by, said, not_said):
    ratios = [0.9, 1.1, 1.0, 1.2, 0.95, 1.05, 1.15, 0.85]
    s = stats.paired_speedup([[r] for r in ratios], [[1.0]] * 8, stopped_by=stopped_by)
    v = stats.verdict("bf16", s)
    assert v.kind == "unresolved" and said in v.advice and not_said not in v.advice
    few = stats.verdict(
        "bf16", stats.paired_speedup([[1.0]] * 2, [[1.0]] * 2, stopped_by=stopped_by)
    )
    assert few.kind == "too_few" and said in few.advice
    if stopped_by == stats.ONE_LAUNCH:
        assert "8 rounds in one torchrun launch" in v.text and "one process" not in v.text
