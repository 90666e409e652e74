"""Graph breaks with their reasons, from ``torch._dynamo.explain`` (dynamo's capture only: no
inductor compile runs here), including the breaks autocast and the GradScaler cause."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import precision_nb as pnb
from precision_nb.engine.compile.breaks import graph_breaks


class ItemModel(nn.Module):
    """A model with a data-dependent ``.item()`` in its forward (a classic break)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x).relu()
        scale = 2.0 if h.sum().item() > 0 else 1.0
        return self.b(h * scale)


class Untraceable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 2)

    @torch.compiler.disable
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x)


class Clean(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x).relu())


@pytest.fixture
def batch():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(4, 8, generator=gen), torch.tensor([0, 1, 0, 1])


@pytest.fixture(autouse=True)
def fresh_dynamo():
    yield
    torch._dynamo.reset()


def test_an_item_call_is_listed_with_its_reason_and_line(batch):
    found = graph_breaks(ItemModel(), batch, pnb.plan("fp32", "cpu").plan, probes=False)
    breaks = found.forward.breaks
    assert len(breaks) == 1 and found.forward.traceable
    assert "Tensor.item()" in breaks[0].reason
    assert breaks[0].where.startswith("test_compile_breaks.py:") and "in forward" in breaks[0].where
    assert breaks[0].cause == "model"
    assert found.rows()[0]["reason"] == breaks[0].reason
    assert "1 graph break(s)" in found.forward.message()


def test_a_model_dynamo_cannot_trace_at_all_gets_the_first_reason(batch):
    found = graph_breaks(Untraceable(), batch, pnb.plan("bf16", "cpu").plan)
    assert not found.forward.traceable and found.forward.ops == 0
    message = found.forward.message()
    assert "cannot trace it at all" in message and "torch.compiler.disable" in message
    assert "the plan runs eager" in message
    assert found.probes == ()  # nothing to probe in a region dynamo cannot capture


def test_autocast_inside_or_outside_is_compared_for_a_mixed_plan(batch):
    found = graph_breaks(Clean(), batch, pnb.plan("bf16", "cpu").plan)
    assert found.forward.breaks == () and found.forward.ops > 0
    (probe,) = found.probes
    assert probe.name == "autocast inside the compiled region"
    assert probe.report.traceable
    # Pinned for the installed torch (docs/profiling.md says what it found): dynamo traces
    # autocast entered inside the compiled function as it does autocast entered outside.
    assert [b for b in probe.report.breaks if b.cause == "autocast"] == []
    assert probe.finding.startswith("no break caused by autocast in torch")


def test_the_grad_scaler_inside_a_compiled_step_is_probed_and_its_breaks_attributed(batch):
    lab = pnb.plan("fp16", "cpu", loss_scale_lab=True).plan
    model = Clean()
    before = [p.detach().clone() for p in model.parameters()]
    found = graph_breaks(model, batch, lab)
    names = [p.name for p in found.probes]
    assert names == ["autocast inside the compiled region", "GradScaler inside the compiled step"]
    scaler = found.probes[1]
    # Pinned for the installed torch (docs/profiling.md says what it found): dynamo does not
    # trace GradScaler.scale, so a compiled step holding the scaler breaks there.
    by_scaler = [b for b in scaler.report.breaks if b.cause == "scaler"]
    assert by_scaler and "GradScaler" in by_scaler[0].detail
    assert "the GradScaler inside the compiled region breaks the graph" in scaler.finding
    assert any(r["cause"] == "scaler" for r in found.rows())
    for p, q in zip(model.parameters(), before, strict=True):  # probes ran on copies
        assert torch.equal(p, q)


def test_a_plan_without_scaler_or_autocast_has_no_precision_probe(batch):
    found = graph_breaks(Clean(), batch, pnb.plan("fp32", "cpu").plan)
    assert found.probes == () and found.forward.region == "Clean.forward"


def test_random_ops_are_named_for_the_agreement_check(batch):
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.2), nn.Linear(8, 2))
    found = graph_breaks(model, batch, pnb.plan("fp32", "cpu").plan, probes=False)
    assert found.forward.random_ops == ("dropout",)
    assert graph_breaks(Clean(), batch, pnb.plan("fp32", "cpu").plan).forward.random_ops == ()


def test_dynamo_noise_while_explaining_is_recorded_not_printed(capfd):
    """Dynamo warns (through torch's own log handler, which writes to stderr) that it ignores a
    profiler record function; explaining a region keeps that out of the output, in ``notes``."""
    from torch._logging._internal import warning_once

    from precision_nb.engine.compile.breaks import explain

    warning_once.cache_clear()  # torch warns once per process: make this test see it

    def region(x: torch.Tensor) -> torch.Tensor:
        with torch.autograd.profiler.record_function("step"):
            return x * 2

    report = explain("step", region, torch.ones(3))
    said = capfd.readouterr()
    assert "will be ignored" not in said.err + said.out
    assert any("record function" in note and "will be ignored" in note for note in report.notes)
    assert report.to_dict()["notes"] == list(report.notes)
