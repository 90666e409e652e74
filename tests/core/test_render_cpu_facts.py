"""A bf16/fp16 plan on a CPU names what the CPU has for it, with the source that answered."""

from __future__ import annotations

import pytest
import torch

from precision_nb.cli.main import main
from precision_nb.core import cpu_features as cf
from precision_nb.core.resolution import explain_precision

NONE = {"avx512_bf16": False, "amx_bf16": False, "avx512_fp16": False, "amx_fp16": False}


@pytest.fixture
def cpu_reports(monkeypatch):
    """Make torch's CPU query answer ``flags``; the cache is read again before and after."""

    def install(**flags: bool) -> None:
        answer = {**NONE, **flags, "cpu_name": "Test CPU"}
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: answer)
        cf.read_cpu_features(refresh=True)

    yield install
    monkeypatch.undo()
    cf.read_cpu_features(refresh=True)


def test_bf16_plan_names_the_native_instructions_and_the_source(cpu_reports):
    cpu_reports(amx_bf16=True)
    e = explain_precision("bf16", "cpu")
    text = str(e)
    assert (
        "CPU low-precision features: AVX512-BF16 no, AMX-BF16 yes, AVX512-FP16 no, AMX-FP16 no "
        "(source: torch.cpu.get_capabilities())"
    ) in text
    assert "bf16: this CPU reports native instructions (AVX512-BF16 / AMX-BF16)" in text
    html = e._repr_html_()
    assert '<ul class="pnb-cpu-facts">' in html and "AMX-BF16 yes" in html


def test_bf16_without_native_instructions_says_so(cpu_reports):
    cpu_reports()
    text = str(explain_precision("bf16", "cpu"))
    assert "bf16: this CPU reports no native instructions" in text
    assert "measure before expecting a speedup" in text


def test_fp16_request_that_fell_back_states_the_fact_only(cpu_reports):
    cpu_reports(avx512_fp16=True)
    text = str(explain_precision("fp16", "cpu"))
    assert "fp16 (requested; the plan is fp32): this CPU reports native instructions" in text


def test_fp32_plan_shows_no_cpu_facts(cpu_reports):
    cpu_reports(amx_bf16=True)
    assert "CPU low-precision features" not in str(explain_precision("fp32", "cpu"))


def test_precision_nb_plan_prints_the_cpu_facts(cpu_reports, capsys):
    cpu_reports(avx512_bf16=True)
    assert main(["plan", "--mode", "bf16", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "AVX512-BF16 yes, AMX-BF16 no" in out
    assert "(source: torch.cpu.get_capabilities())" in out
