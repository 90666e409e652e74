"""The report's torch.compile section, from hand-built compile reports (nothing compiles)."""

from __future__ import annotations

import io

import pandas as pd
import torch

from precision_nb.core.compile_mode import CompilePlan
from precision_nb.engine.compile.breaks import BreakReport, GraphBreak, GraphBreaks
from precision_nb.engine.compile.record import CompileLog
from precision_nb.engine.compile.report import compile_reports
from precision_nb.engine.compile.torch_state import TorchCompilation, TorchCompilations
from precision_nb.engine.measure import MeasureConfig, Measurement, PlanTiming
from precision_nb.views.report.compiled import COLUMNS, TITLE, compiled_section


def _measurement(compiled_step: float) -> Measurement:
    m = Measurement(MeasureConfig(rounds=6), [5] * 6)
    m.plans["fp32"] = PlanTiming("fp32", blocks=[[0.020] * 5 for _ in range(6)])
    m.plans["fp32+compile"] = PlanTiming(
        "fp32+compile", blocks=[[compiled_step] * 5 for _ in range(6)]
    )
    return m


def _reports(compiled_step: float):
    log = CompileLog("fp32+compile", CompilePlan("default", "default", codegen="C++ (g++)"))
    log.compile_step(lambda: None)
    log.first = TorchCompilations((TorchCompilation("0/0", "forward", 2.0, None, 0, 0, 2),))
    log.compile_s = 2.5
    item = GraphBreak("Tensor.item() call", "", "m.py:3", "model")
    breaks = GraphBreaks("fp32+compile", BreakReport("MLP.forward", 2, 5, (item,)))
    plans = {"fp32+compile": (log.plan, "fp32")}
    return compile_reports(
        _measurement(compiled_step), {"fp32+compile": log.record()}, {"fp32+compile": "fp32"},
        {"fp32": [2.0, 1.9], "fp32+compile": [2.0, 1.9]}, {"fp32+compile": torch.float32},
        breaks={"fp32+compile": breaks}, plans=plans,
    )  # fmt: skip


def test_the_section_tables_each_compiled_plan_and_writes_its_csvs():
    section = compiled_section(_reports(0.010))
    assert section.key == "compile" and section.title == TITLE
    assert "fp32+compile" in section.html and "compile step (s)" in section.html
    assert "2.00× (" in section.html  # the speed against eager with its interval
    assert "Tensor.item() call" in section.html and "m.py:3" in section.html
    assert "EAGER fp32 step" in section.html  # what the inspection cannot see
    files = {f.name: f.data for f in section.files}
    frame = pd.read_csv(io.BytesIO(files["compile.csv"]))
    assert tuple(frame.columns) == COLUMNS
    assert frame.loc[0, "pays_back_after_steps"] == 250  # 2.5 s / 10 ms saved per step
    breaks = pd.read_csv(io.BytesIO(files["graph_breaks.csv"]))
    assert breaks.loc[0, "reason"] == "Tensor.item() call"


def test_a_plan_slower_than_eager_never_pays_back_and_the_cell_says_so():
    section = compiled_section(_reports(0.030))
    assert "<td>never</td>" in section.html
    assert "never pays back at this step time" in section.html


def test_a_compiled_plans_card_leads_with_its_verdict_against_eager():
    from precision_nb.views.report.answer import _compile_lines

    lines = _compile_lines(_reports(0.010)["fp32+compile"])
    assert lines[0].startswith("fp32+compile is 2.00× the fp32 speed")
    assert lines[1] == "compile step 2.50 s (cache miss), not timed"
    assert lines[2].startswith("pays back after 250 steps at this step time")
    assert _compile_lines(None) == ()
