"""The panel's speed figures: Compare shows the interleaved measurement (speedup with its
interval, verdict, warm-up), a single Run marks its figures as single-run. Headless, by click()."""

from __future__ import annotations

import html
import re

import pytest

from precision_nb.core.text import speedup_text
from precision_nb.views.panel import Panel
from precision_nb.views.panel.layout import tab_name
from precision_nb.views.panel.live_charts import live_charts_html

TIMEOUT = 120


@pytest.fixture(scope="module")
def compared() -> Panel:
    panel = Panel(steps=6, log_every=1, compare_plans=("fp32", "bf16"), budget=1)
    panel.widgets.compare_button.click()
    assert panel.wait(TIMEOUT)
    assert panel.error is None, panel.error
    return panel


def test_compare_table_shows_each_speedup_with_its_interval_and_verdict(compared: Panel) -> None:
    table = compared.widgets.results_html.value
    bf16 = compared.result.outcomes["bf16"]
    assert "speedup vs fp32 (95 % CI)" in table and "benchmark" in table
    low, high = bf16.speedup.low, bf16.speedup.high
    assert low is not None and high is not None  # 6 rounds: an interval exists
    est = bf16.speedup.estimate
    half = (high - low) / (2 * est)  # the "±" is left out from ±100 % on
    shown = f"{est:.2f}× ({low:.2f}–{high:.2f}" + (f", ±{half * 100:.0f} %)" if half < 1 else ")")
    assert shown in table
    assert "1.00× (baseline)" in table
    verdict = str(bf16.verdict).split(" (")[0]
    assert verdict.replace("'", "&#x27;") in table or verdict in table


def test_compare_tab_opens_with_the_engines_verdict_of_each_plan(compared: Panel) -> None:
    table = compared.widgets.results_html.value
    outcomes = compared.result.outcomes
    lines = re.findall(r"<div class='pnb-verdict' data-kind='([^']*)'[^>]*>(.*?)</div>", table)
    assert [kind for kind, _ in lines] == [outcomes[p].verdict.kind for p in ("fp32", "bf16")]
    for (_kind, line), plan in zip(lines, ("fp32", "bf16"), strict=True):
        assert html.escape(str(outcomes[plan].verdict)) in line  # the engine's words, whole
    # the verdicts come first: before how it was measured and before the table
    assert table.index("pnb-verdicts") < table.index("pnb-method") < table.index("<table")
    for key, value in compared.result.measurement.method().items():
        assert f"<b>{html.escape(key)}</b>: {html.escape(str(value))}" in table
    # the verdict is not repeated in the compact table (it used to be squashed into a column)
    compact = table[table.index("<table") : table.index("All columns")]
    assert "<th>verdict</th>" not in compact


def test_a_cpu_comparison_keeps_process_memory_out_of_its_short_table(compared: Panel) -> None:
    table = compared.widgets.results_html.value
    assert set(compared.summary["memory_kind"]) == {"host_rss"}  # a CPU: RSS is the only reading
    short = table[table.index("<table") : table.index("<summary>All columns")]
    assert "peak MiB" not in short and "pnb-memory-note" in short and "Memory tab" in short
    assert "process memory MiB (host RSS)" in short  # the comparison's memory chart
    assert "(host RSS: the whole process)" in table[table.index("<summary>All columns") :]
    assert "process memory" in compared.widgets.live_charts.value


def test_compare_ends_with_why_each_plan_is_faster_or_not(compared: Panel) -> None:
    table = compared.widgets.results_html.value
    why = table.index("Why faster or not: the step by op family")
    assert why > table.index("All columns")  # after the comparison's own figures
    outcome = compared.result.outcomes["bf16"]
    assert outcome.time_split is not None and outcome.difference is not None
    part = table[why:]
    if outcome.time_split.available:
        assert html.escape(outcome.difference.sentence) in part
    else:  # the machine's profiler could not start: the tab says why
        assert html.escape(outcome.time_split.missing) in part


def test_a_finished_comparison_shows_the_compare_tab(compared: Panel) -> None:
    assert tab_name(compared.widgets.tabs.selected_index) == "Compare"
    # the header's progress line says the comparison ended, not the last plan's progress
    label = compared.widgets.progress_label
    assert label.value.startswith("finished: 2 plan(s) compared") and "plan 2 of" not in label.value
    assert label.tooltip == label.value


def test_compare_charts_note_each_plans_warm_up_from_the_measurement(compared: Panel) -> None:
    charts = compared.widgets.live_charts.value
    assert "pnb-warmup" in charts
    for label in ("fp32", "bf16"):
        warm = compared.result.measurement.plans[label].warmup
        assert f"{label}: {warm.steps} step(s), {warm.seconds:.2f} s" in charts
    assert "single-run" not in compared.widgets.live_metrics.value
    assert "interleaved rounds" in compared.widgets.live_metrics.value


def test_a_single_run_marks_its_figures_as_single_run() -> None:
    panel = Panel(steps=3, log_every=1)
    panel.widgets.run_button.click()
    assert panel.wait(TIMEOUT)
    assert "single-run figures" in panel.widgets.live_metrics.value
    table = panel.widgets.results_html.value
    assert "single-run figures" in table and "95 % CI" not in table
    assert "pnb-warmup" not in panel.widgets.live_charts.value
    panel.close()


@pytest.mark.parametrize(
    ("speed", "kind", "text"),
    [
        ((1.31, 1.22, 1.4), "faster", "1.31× (1.22–1.40, ±7 %)"),
        ((0.9, None, None), "too_few", "0.90× (no interval)"),
        ((1.0, None, None), "baseline", "1.00× (baseline)"),
        # the baseline is told by the verdict's kind, never by its words
        ((1.0, None, None), "", "1.00× (no interval)"),
        (None, "", ""),
    ],
)  # fmt: skip
def test_speedup_text(speed, kind: str, text: str) -> None:
    from precision_nb.engine.comparison import PlanOutcome
    from precision_nb.engine.stats import Speedup, Verdict

    speedup = None if speed is None else Speedup(*speed, rounds=8, ratios=())
    verdict = Verdict(kind, "fp32 is the baseline.") if kind or speed else None
    assert speedup_text(PlanOutcome("x", speedup=speedup, verdict=verdict)) == text


def test_loss_scale_chart_shades_the_safe_window_when_given() -> None:
    records = [{"run": "fp16", "step": s, "loss": 1.0, "loss_scale": 2.0**s} for s in range(1, 5)]
    plain = live_charts_html(records)
    banded = live_charts_html(records, scale_window=(0, 20))
    assert "pnb-band" not in plain and banded.count("pnb-band") == 1
    # the band's range widens the axis to show it whole: top label 2^20
    assert re.search(r">2\^20<", banded) and not re.search(r">2\^20<", plain)


def test_a_comparison_on_a_busy_machine_says_so_before_its_verdicts(monkeypatch) -> None:
    from precision_nb.engine import load

    monkeypatch.setattr(load.Load, "busy", property(lambda self: True))
    panel = Panel(steps=6, log_every=1, compare_plans=("fp32", "bf16"), budget=1)
    panel.widgets.compare_button.click()
    assert panel.wait(TIMEOUT) and panel.error is None, panel.error
    table = panel.widgets.results_html.value
    note = panel.result.measurement.load.note()
    assert note.startswith("The machine was busy")
    assert html.escape(note) in table
    assert table.index("pnb-load-note") < table.index("pnb-verdicts")
    panel.close()


def test_a_true_plans_saving_and_lost_updates_reach_the_compare_tab_from_its_outcome() -> None:
    panel = Panel(steps=4, log_every=2, compare_plans=("bf16", "bf16-true"), budget=1)
    try:
        panel.widgets.compare_button.click()
        assert panel.wait(TIMEOUT)
        assert panel.error is None, panel.error
        panel.inspect()  # both plans inspected: the true plan's outcome gets its saving
        outcome = panel.result.outcome("bf16-true")
        saving, lost = outcome.saving, outcome.lost_updates
        assert saving is not None and saving.mixed == "bf16" and saving.cast_ratio == 0.5
        assert lost is not None and panel.result.outcome("bf16").saving is None
        table = html.unescape(panel.widgets.results_html.value)
        assert "params+grads+optimizer bytes vs mixed" in table
        assert f"{saving.ratio:.3f}x bf16" in table
        assert f"{lost.updates_rounded_away:.1%} ({lost.step})" in table
    finally:
        panel.close()
