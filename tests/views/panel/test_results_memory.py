"""Memory in the Compare tab, the live charts and the live numbers: a plan's memory is shown only
where the device's allocator measured it (CUDA, MPS); host RSS, the whole process's memory, is
named as such and kept out of the short table, which points to the Memory tab."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest
from typed_outcomes import typed_outcome

from precision_nb.views.panel.live_charts import PROCESS_MEMORY_NOTE, live_charts_html
from precision_nb.views.panel.results import (
    PROCESS_MEMORY_COLUMN,
    allocator_kinds,
    results_html,
)
from precision_nb.views.panel.run import metrics_text

PLANS = ("fp32", "bf16")


def _summary(kind: str) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"run": plan, "final_loss": 2.0, "peak_memory_mib": mib, "memory_kind": kind}
            for plan, mib in zip(PLANS, (436.125, 398.5), strict=True)
        ]
    )


def _figures() -> dict[str, Any]:
    """Each plan's typed outcome, as a comparison would give it."""
    found = {
        "fp32": {"verdict": "fp32 is the baseline.", "verdict_kind": "baseline",
                 "speedup_vs_fp32": 1.0},
        "bf16": {"verdict": "bf16 is 1.31x the fp32 speed (95 % CI 1.22-1.40, 8 rounds).",
                 "verdict_kind": "faster", "speedup_vs_fp32": 1.31, "speedup_ci_low": 1.22,
                 "speedup_ci_high": 1.4},
    }  # fmt: skip
    return {label: typed_outcome(label, None, row) for label, row in found.items()}


def _records(kind: str) -> list[dict]:
    return [
        {"run": plan, "step": step, "loss": 1.0, "memory_kind": kind,
         "memory_peak_bytes": (400 + step) * 2**20}
        for plan in PLANS
        for step in (1, 2, 3)
    ]  # fmt: skip


def _parts(page: str) -> tuple[str, str]:
    """(the short table with what follows it up to All columns, All columns)."""
    start, split = page.index("<table"), page.index("<summary>All columns")
    return page[start:split], page[split:]


def test_host_rss_is_left_out_of_the_short_table_and_named_under_all_columns() -> None:
    charts = live_charts_html(_records("host_rss"), memory_note=False)
    page = results_html(_summary("host_rss"), _figures(), measured=True, charts=charts)
    short, rest = _parts(page)
    assert "peak MiB" not in short and "436.1" not in short and "398.5" not in short
    assert short.count("pnb-memory-note") == 1  # one note for the table and the chart
    assert "whole Python process" in short and "Memory tab" in short
    assert "process memory chart below" in short
    assert "process memory MiB (host RSS)" in short  # the chart, titled as the process's
    assert PROCESS_MEMORY_COLUMN in rest and "436.1" in rest


def test_a_single_runs_note_does_not_point_to_a_chart_it_lacks() -> None:
    page = results_html(_summary("host_rss"), {}, measured=False)
    short, _rest = _parts(page)
    assert "pnb-memory-note" in short and "chart" not in short


@pytest.mark.parametrize("kind", ["cuda_allocated", "mps_allocated"])
def test_an_allocator_peak_stays_in_the_short_table(kind: str) -> None:
    page = results_html(_summary(kind), _figures(), measured=True)
    short, rest = _parts(page)
    assert f"peak MiB ({kind})" in short and "436.1" in short and "398.5" in short
    assert "pnb-memory-note" not in page and "host RSS" not in page
    assert PROCESS_MEMORY_COLUMN not in rest and "peak_memory_mib" in rest


def test_a_plan_measured_only_by_rss_beside_an_allocator_plan_gets_no_figure() -> None:
    summary = _summary("cuda_allocated")
    summary.loc[1, "memory_kind"] = "host_rss"
    page = results_html(summary, _figures(), measured=True)
    short, _rest = _parts(page)
    assert "peak MiB (cuda_allocated)" in short and "436.1" in short and "398.5" not in short
    assert "only memory reading of bf16" in short
    assert allocator_kinds(summary.to_dict("records")) == ["cuda_allocated"]


def test_the_live_memory_chart_is_process_memory_where_rss_is_the_only_reading() -> None:
    cpu = live_charts_html(_records("host_rss"))
    assert "process memory MiB (host RSS)" in cpu and "peak memory" not in cpu
    assert cpu.count("pnb-memory-note") == 1 and PROCESS_MEMORY_NOTE.split(",")[0] in cpu
    assert "pnb-memory-note" not in live_charts_html(_records("host_rss"), memory_note=False)
    cuda = live_charts_html(_records("cuda_allocated"))
    assert "peak memory MiB (cuda_allocated)" in cuda
    assert "pnb-memory-note" not in cuda and "process memory" not in cuda


def test_live_numbers_name_rss_as_process_memory() -> None:
    record = {"run": "bf16", "loss": 1.0, "memory_bytes": 437 * 2**20}
    assert "process memory 437 MiB (host RSS)" in metrics_text(
        {**record, "memory_kind": "host_rss"}
    )
    cuda = metrics_text({**record, "memory_kind": "cuda_allocated"})
    assert "437 MiB cuda_allocated" in cuda and "process" not in cuda


def test_a_busy_machines_load_note_comes_before_the_verdicts_it_explains() -> None:
    note = "The machine was busy while this was measured: other processes used 60% ..."
    page = results_html(_summary("host_rss"), _figures(), measured=True, load_note=note)
    assert "The machine was busy" in page
    assert page.index("The machine was busy") < page.index("bf16 is 1.31x")
    quiet = results_html(_summary("host_rss"), _figures(), measured=True)
    assert "pnb-load-note" not in quiet
