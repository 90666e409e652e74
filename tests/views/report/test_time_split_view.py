"""The time split in the report, the notebook and the panel: cards from a hand-built analysis,
time_by_family.csv's rows, and a plan without a split saying why."""

from __future__ import annotations

import csv
import html
import io

import pytest

from precision_nb.engine.time_split import FAMILIES, TimeAnalysis, TimeSplit, advise, difference
from precision_nb.views.report.time_split import (
    COLUMNS,
    CSV_NAME,
    outcomes_html,
    time_split_lines,
    time_split_section,
)


def _split(label: str, **families: float) -> TimeSplit:
    fam = {f: families.get(f, 0.0) for f in FAMILIES}
    total = sum(fam.values())
    traced = {f: v * 1.1 for f, v in fam.items()}  # the profiler's cost: 10 % more per family
    return TimeSplit(label, fam, step_s=total, traced=traced, traced_s=total * 1.1,
                     profiler_s=total * 0.1, timer_s=total * 1.1, measured_s=total / 1.2, steps=3,
                     unprofiled_s=total, view="host self time per op (CPU)",
                     device="cpu")  # fmt: skip


class Speed:
    estimate, low, high = 1.4, 1.3, 1.5


def _analysis() -> TimeAnalysis:
    base = _split("fp32", matmul=6e-3, optimizer=2e-3, other=4e-3)
    bf16 = _split("bf16", matmul=2e-3, casts=1e-3, optimizer=2e-3, other=4e-3)
    gone = TimeSplit("fp16", missing="the plan failed, so it has no split: out of memory")
    diffs = {"bf16": difference(base, bf16, Speed()), "fp16": difference(base, gone, Speed())}
    advice = {"bf16": advise(bf16, diffs["bf16"]), "fp32": advise(base)}
    return TimeAnalysis({"fp32": base, "bf16": bf16, "fp16": gone}, diffs, advice, "fp32")


def test_the_section_shows_each_plans_sentence_reconciliation_and_advice() -> None:
    analysis = _analysis()
    section = time_split_section(analysis)
    page = section.html
    assert section.key == "time-split" and [f.name for f in section.files] == [CSV_NAME]
    sentence = analysis.differences["bf16"].sentence
    assert sentence.startswith("bf16 saved 4.0 ms in matmuls (3× faster there), added 1.0 ms")
    assert html.escape(sentence) in page
    assert "Reconciliation (agrees)" in page  # 12/9 = 1.33x, inside [1.3, 1.5] ±10 %
    assert "Profiled step 13.2 ms against the timed rounds&#x27; median 10.0 ms" in page
    assert "the profiler&#x27;s cost is +32%" in page  # the traced step, 1.1 x 1.2
    assert (  # fp32: 12 ms unprofiled, 13.2 ms traced
        "The unprofiled steps between the profiled ones took 12.0 ms: the profiler&#x27;s 1.2 ms "
        "per step (its cost per event outside casts, pooled over the plans profiled together) are "
        "taken out of the families by their events." in page
    )
    assert html.escape(analysis.advice["bf16"][0].message) in page  # 44 % outside ops
    assert "No split: the plan failed, so it has no split: out of memory" in page
    assert "The baseline." in page


def test_a_split_that_kept_the_profilers_cost_says_nothing_was_taken_out() -> None:
    import dataclasses

    kept = dataclasses.replace(_split("fp32", matmul=6e-3), profiler_s=0.0)
    page = time_split_section(TimeAnalysis({"fp32": kept}, {}, {}, "fp32")).html
    assert (
        "The unprofiled steps between the profiled ones took 6.0 ms: no profiler cost is taken "
        "out of the families." in page
    )
    assert "are taken out of" not in page


def test_a_pooled_split_says_its_reference_is_the_processes_timed_rounds() -> None:
    import dataclasses

    pooled = dataclasses.replace(_split("fp32", matmul=6e-3), processes=3, profiler_s=1e-3)
    page = time_split_section(TimeAnalysis({"fp32": pooled}, {}, {}, "fp32")).html
    assert (
        "The timed rounds&#x27; medians, averaged over the 3 processes, were 6.0 ms: the "
        "profiler&#x27;s 1.0 ms per step (its cost per event outside casts, pooled over the plans "
        "and the processes) are taken out of the families by their events." in page
    )
    assert "unprofiled steps between" not in page


def test_time_by_family_csv_has_one_row_per_plan_and_family() -> None:
    analysis = _analysis()
    (data,) = time_split_section(analysis).files
    rows = list(csv.DictReader(io.StringIO(data.data.decode())))
    assert list(rows[0]) == list(COLUMNS)
    assert [r["run"] for r in rows] == ["fp32"] * 8 + ["bf16"] * 8 + ["fp16"]
    bf16 = {r["family"]: r for r in rows if r["run"] == "bf16"}
    assert float(bf16["matmul"]["change_ms"]) == -4.0
    assert float(bf16["matmul"]["times_faster_there"]) == 3.0
    total = sum(float(r["ms_per_step"]) for r in bf16.values())
    assert total == pytest.approx(float(bf16["matmul"]["step_ms"]))
    assert rows[-1]["family"] == "" and "out of memory" in rows[-1]["missing"]


def test_text_lines_and_the_panels_cards_from_outcomes() -> None:
    analysis = _analysis()
    lines = time_split_lines(analysis)
    assert analysis.differences["bf16"].sentence in lines
    assert "fp16: no time split: the plan failed, so it has no split: out of memory" in lines

    class Outcome:
        def __init__(self, label: str) -> None:
            self.time_split = analysis.splits[label]
            self.difference = analysis.differences.get(label)
            self.advice = analysis.advice.get(label, ())

    cards = outcomes_html({k: Outcome(k) for k in ("fp32", "bf16")})
    assert "Why faster or not" in cards and "The baseline." in cards
    assert outcomes_html({}) == ""
