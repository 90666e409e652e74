"""The panel's Memory, Ops and Numerics views, headless: Inspect by click(), a view opened by
opening its tab (the Tab's selected_index), the plotting budget after a run, the scale window."""

from __future__ import annotations

import html
import re

import pytest

from precision_nb.engine.inspect.step import InspectionData
from precision_nb.views.panel import Panel
from precision_nb.views.panel.analysis_html import memory_chart_svg
from precision_nb.views.panel.layout import TABS

TIMEOUT = 120


@pytest.fixture(scope="module")
def inspected() -> Panel:
    panel = Panel(steps=3, log_every=1, mode="bf16")
    assert panel._controller.analysis.stale
    panel.widgets.inspect_button.click()
    assert panel.error is None, panel.error
    return panel


def test_inspect_shows_the_memory_breakdown_of_the_selected_plan(inspected: Panel) -> None:
    data = inspected._controller.analysis.shown["bf16"]
    counted = [r for r in data.memory if r["counted"] and r["bytes"]]
    svg = inspected.widgets.memory_html.value
    assert svg.count("pnb-mem-seg") == len(counted)
    for row in counted:  # every segment names its kind, dtype and measured bytes
        assert f"bf16: {row['kind']}, {row['dtype']}: {row['bytes']:,} bytes" in svg
    assert "process memory (host rss" in svg.lower()  # named, not drawn as model memory
    assert not inspected._controller.analysis.stale


def test_ops_view_shows_the_trace_summary_of_the_selected_plan(inspected: Panel) -> None:
    ops = inspected.widgets.ops_html.value
    summary = inspected.inspections["bf16"].summary
    assert "Ops of bf16" in ops
    for verdict, calls in zip(summary["verdict"], summary["calls"], strict=True):
        assert f"<td>{html.escape(verdict)}</td><td>{calls}</td>" in ops


def test_numerics_view_shows_the_window_and_the_underflow_table(inspected: Panel) -> None:
    view = inspected.widgets.numerics_html.value
    assert inspected.numerics.window_text().split(" (")[0] in view
    layers = set(inspected.numerics.gradients["layer"])
    assert all(layer in view for layer in layers)
    assert "pnb-underflow" in view


def test_a_plan_change_marks_the_views_and_opening_one_inspects_the_new_plan() -> None:
    panel = Panel(steps=3, log_every=1, mode="bf16")
    panel.inspect()
    panel.set(mode="fp32")
    assert panel._controller.analysis.stale and "plan changed" in panel.widgets.analysis_note.value
    assert list(panel.inspections) == ["bf16"]  # nothing recomputed on a control change
    panel.widgets.tabs.selected_index = TABS.index("Ops")  # the user opens the Ops tab
    assert list(panel.inspections) == ["fp32"] and "Ops of fp32" in panel.widgets.ops_html.value
    panel.close()


def test_after_a_run_inspection_runs_only_within_the_budget() -> None:
    panel = Panel(steps=3, log_every=1, mode="fp32")
    panel.run(block=True)
    analysis = panel._controller.analysis
    analysis.inspections.clear()
    analysis.numerics_cache.clear()
    analysis.shown = {}
    analysis.cost_s = 2.0
    analysis.after_run(panel.result, training_s=10.0, spent_s=0.0, budget=0.025)
    assert analysis.shown == {} and "over the budget of 2.5 %" in analysis.note.value
    assert "2 step(s) of about 2.0 s" in analysis.note.value
    analysis.after_run(panel.result, training_s=1000.0, spent_s=0.0, budget=0.025)
    assert list(analysis.shown) == ["fp32"] and analysis.numerics is not None
    panel.close()


def test_inspect_is_refused_while_a_run_goes() -> None:
    panel = Panel(steps=200, log_every=1)
    panel.run()
    with pytest.raises(RuntimeError, match="a run is going"):
        panel.inspect()
    panel.stop()
    assert panel.wait(TIMEOUT)
    panel.close()


def test_loss_scale_chart_shows_the_safe_window_once_numerics_exist() -> None:
    panel = Panel(steps=3, log_every=1, mode="fp16", loss_scale_lab=True)
    panel.run(block=True)
    panel.inspect()
    window = panel.numerics.window
    assert window["lo"] is not None and window["run"]["attempts"] >= 3
    charts = panel.widgets.live_charts.value
    assert charts.count("pnb-band") == 1
    assert f"safe fp16 window 2^{window['lo']}-2^{window['hi']}" in charts
    panel.close()


def _data(rows: list[dict], simulated: bool = False) -> InspectionData:
    return InspectionData(label="x", plan=None, device="cuda", simulated=simulated, memory=rows)


def test_memory_chart_marks_the_allocator_peak_and_labels_hand_arithmetic() -> None:
    measured = _data(
        [
            {"kind": "parameters", "dtype": "fp32", "bytes": 600, "expected_bytes": 600,
             "counted": True},
            {"kind": "gradients", "dtype": "fp32", "bytes": 400, "expected_bytes": 400,
             "counted": True},
            {"kind": "allocator peak (this step)", "dtype": None, "bytes": 2000,
             "expected_bytes": None, "counted": False},
        ]
    )  # fmt: skip
    expected = _data(
        [{"kind": "parameters", "dtype": "fp32", "bytes": None, "expected_bytes": 500,
          "counted": True}],
        simulated=True,
    )  # fmt: skip
    svg = memory_chart_svg({"fp32": measured, "sim": expected})
    assert svg.count("pnb-allocator-peak") == 1 and "sim (expected)" in svg
    widths = [
        float(w)
        for w in re.findall(r"class='pnb-mem-seg' x='[\d.]+' y='\d+' width='([\d.]+)'", svg)
    ]
    # the peak (2000 bytes) sets the scale: 600, 400 and 500 bytes in proportion
    assert widths == pytest.approx([600 / 2000 * 420, 400 / 2000 * 420, 500 / 2000 * 420], abs=0.1)


def test_a_simulated_device_shows_hand_arithmetic_and_the_policy_read_from_torch() -> None:
    panel = Panel(device="sim:cuda-bf16", mode="bf16")
    panel.inspect()
    data = panel._controller.analysis.shown["bf16"]
    assert data.simulated and "bf16 (expected)" in panel.widgets.memory_html.value
    ops = panel.widgets.ops_html.value
    assert "autocast's policy in this torch, not a trace" in ops
    assert all(row["op"] in ops for row in data.policy)
    panel.close()


def test_numerics_tab_takes_block_formats_and_shows_a_bad_one_in_the_panel() -> None:
    pytest.importorskip("torchao", reason="the test extra installs torchao (the blocks extra)")
    panel = Panel(steps=3, log_every=1, mode="fp32", workload="mlp", preset="tiny")
    panel.widgets.tabs.selected_index = TABS.index("Numerics")  # the user opens the tab
    assert "Block-scaled" not in panel.widgets.numerics_html.value  # default formats: none
    panel.widgets.numerics_formats.value = "bf16, mxfp8, nvfp4"  # typed, then Enter
    assert panel.error is None, panel.error
    assert list(panel.numerics.blocks["format"].unique()) == ["mxfp8_e4m3", "nvfp4"]
    view = panel.widgets.numerics_html.value
    assert "Block-scaled formats" in view and "What-if hardware" in view
    for layer in panel.numerics.gemms["layer"]:
        assert f"<td>{layer}</td>" in view
    panel.widgets.numerics_formats.value = "bf16, mxfp6"
    box = panel.widgets.error_box
    assert box.layout.display != "none"
    assert "formats: invalid value &#x27;mxfp6&#x27;" in box.value or "'mxfp6'" in box.value
    assert "nvfp4" in box.value and "Traceback" not in box.value
    panel.close()


def test_numerics_tab_says_which_extra_a_block_format_needs(monkeypatch) -> None:
    from precision_nb.engine.numerics import blocks

    monkeypatch.setattr(blocks, "_import", lambda: (None, "ModuleNotFoundError: torchao"))
    panel = Panel(steps=3, log_every=1, mode="fp32", workload="mlp", preset="tiny")
    panel.widgets.numerics_formats.value = "mxfp4"
    box = panel.widgets.error_box
    assert box.layout.display != "none" and "blocks" in box.value
    assert "precision-nb[blocks]" in html.unescape(box.value)
    panel.close()
