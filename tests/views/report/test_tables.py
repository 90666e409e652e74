"""Records -> DataFrame and the per-plan summary, checked against the records themselves."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from precision_nb.views.report import tables as T
from precision_nb.views.report.source import as_comparison


def test_to_frame_keeps_every_record_and_key(three_plans):
    frame = T.to_frame(three_plans)
    assert len(frame) == len(three_plans)
    assert set(three_plans[0]) <= set(frame.columns)
    assert frame.loc[12, "loss"] == three_plans[12]["loss"]


def test_sources_are_normalised_once_and_anything_else_is_refused(three_plans, make_result):
    with pytest.raises(
        ValueError, match="source: invalid value of type int; allowed: a Comparison"
    ):
        T.to_frame(42)
    with pytest.raises(ValueError, match="mapping whose values are not all RunResults"):
        T.summary({"fp32": object()})
    partial = [{"run": "x", "step": 1, "loss": 1.0}]
    with pytest.raises(ValueError, match="records of run 'x' lack mode, use_scaler"):
        T.summary(partial)
    # Records, a RunResult and a mapping of them all become the same comparison.
    result = make_result("bf16", "bf16")
    from_records = as_comparison(result.records).results["bf16"]
    assert from_records.plan == result.plan and from_records.records == result.records
    assert as_comparison(result).results == {"bf16": result}
    assert as_comparison({"b": result}).results == {"b": result}
    comparison = as_comparison(three_plans)
    assert as_comparison(comparison) is comparison
    assert list(comparison.results) == ["fp32", "bf16", "fp16"]


def test_summary_has_one_row_per_plan_and_the_documented_columns(three_plans):
    table = T.summary(three_plans)
    assert list(table.columns) == list(T.SUMMARY_COLUMNS)
    assert table["run"].tolist() == ["fp32", "bf16", "fp16"]


def test_summary_values_come_from_the_records(three_plans):
    frame = pd.DataFrame(three_plans)
    table = T.summary(three_plans).set_index("run")
    for label in ("fp32", "bf16", "fp16"):
        rows = frame[frame["run"] == label]
        assert table.loc[label, "final_loss"] == rows["loss"].iloc[-1]
        assert table.loc[label, "median_step_time_s"] == rows["step_time_s"].median()
        assert table.loc[label, "samples_per_s"] == rows["samples_per_s"].median()
        assert table.loc[label, "peak_memory_mib"] == rows["memory_peak_bytes"].max() / 2**20
        assert table.loc[label, "skipped_steps"] == rows["skipped_total"].iloc[-1]
        assert table.loc[label, "mode"] == label
    fp32_loss = frame[frame["run"] == "fp32"]["loss"].iloc[-1]
    assert table.loc["bf16", "final_loss_diff_vs_fp32"] == pytest.approx(
        table.loc["bf16", "final_loss"] - fp32_loss
    )
    # Speedup: fp32 median step time 10 ms / bf16 5 ms; the slow first step does not count.
    assert table.loc["bf16", "speedup_vs_fp32"] == pytest.approx(2.0)
    assert table.loc["fp16", "speedup_vs_fp32"] == pytest.approx(1.25)
    assert table.loc["fp32", "speedup_vs_fp32"] == pytest.approx(1.0)
    assert table.loc["fp16", "skipped_steps"] == 2
    assert table.loc["fp16", "use_scaler"]
    assert table.loc["bf16", "dtype"] == "torch.bfloat16"
    assert table.loc["fp32", "memory_kind"] == "host_rss"
    assert math.isnan(table.loc["fp32", "tokens_per_s"])


def test_summary_uses_the_comparison_drift_and_merged_requests(make_result, make_comparison):
    comparison = make_comparison(
        fp32=make_result("fp32", "fp32"),
        bf16=make_result("bf16", "bf16"),
        drift={"bf16": {"final_loss_diff": 0.125, "param_rel_diff": 0.003}},
        merged={"fp16": "fp32"},
    )
    table = T.summary(comparison).set_index("run")
    assert table.loc["bf16", "final_loss_diff_vs_fp32"] == 0.125
    assert table.loc["bf16", "param_rel_diff_vs_fp32"] == 0.003
    assert table.loc["fp32", "final_loss_diff_vs_fp32"] == 0.0
    assert table.loc["fp32", "also_requested_as"] == "fp16"
    assert table.loc["bf16", "also_requested_as"] == ""


def test_summary_without_fp32_leaves_speedup_and_drift_empty(make_records):
    table = T.summary(make_records("bf16", "bf16")).set_index("run")
    assert math.isnan(table.loc["bf16", "speedup_vs_fp32"])
    assert math.isnan(table.loc["bf16", "final_loss_diff_vs_fp32"])


def test_summary_of_no_records_is_empty_with_columns():
    table = T.summary([])
    assert table.empty
    assert list(table.columns) == list(T.SUMMARY_COLUMNS)


def test_summary_does_not_show_an_mfu_above_one_as_utilisation(make_records):
    records = make_records("bf16", "bf16")
    for i, record in enumerate(records):
        record.update(mfu=1.5 + i * 0.01, mfu_peak_source="measured: CPU matmul")
    fp32 = make_records("fp32", "fp32")
    for record in fp32:
        record.update(mfu=0.25, mfu_peak_source="measured: CPU matmul")
    table = T.summary(records + fp32).set_index("run")
    assert math.isnan(table.loc["bf16", "mfu"])
    assert table.loc["bf16", "mfu_peak_source"] == f"measured: CPU matmul; {T.MFU_NOTE}"
    assert table.loc["fp32", "mfu"] == 0.25
    assert table.loc["fp32", "mfu_peak_source"] == "measured: CPU matmul"
