"""compare() with compile as a plan dimension: eager and compiled plans in the same rounds, the
compile report per compiled plan, a model dynamo cannot trace, and a compile that fails.

One real inductor compile (a tiny model, module-scoped); the other tests compile nothing or use
a backend that fails at once."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import precision_nb as pnb
from precision_nb.engine import allocator
from precision_nb.engine import trainer as trainer_module
from precision_nb.engine.compile.record import reset_compiled
from precision_nb.engine.measure import MeasureConfig
from precision_nb.engine.time_split.profiling import HEAP_AHEAD

MEASURE = MeasureConfig(rounds=6, warmup_max=3, warmup_min=2)


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))


def batches(i: int):
    gen = torch.Generator().manual_seed(i % 4)
    return torch.randn(8, 16, generator=gen), torch.randint(0, 4, (8,), generator=gen)


class Untraceable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 4)

    @torch.compiler.disable
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x)


@pytest.fixture(scope="module")
def compared():
    reset_compiled()
    out = pnb.compare(
        ("bf16",), model=make_model(), batches=batches, device="cpu", compile=("off", "default"),
        steps=12, log_every=2, progress=False, measure=MEASURE, measure_peak=False,
        time_split=True,
    )  # fmt: skip
    yield out
    reset_compiled()


def test_eager_and_compiled_plans_are_measured_in_the_same_rounds(compared):
    assert list(compared.results) == ["bf16", "bf16+compile"]
    for order in compared.measurement.orders:
        assert sorted(order) == ["bf16", "bf16+compile"]
    assert compared.results["bf16+compile"].compile is not None
    assert compared.results["bf16"].compile is None


def test_the_time_split_says_what_it_cannot_attribute_in_a_compiled_plan(compared):
    eager, compiled = (compared.outcomes[k].time_split for k in ("bf16", "bf16+compile"))
    assert eager.available and compiled.available, (eager.missing, compiled.missing)
    # a comparison whose allocator is settled faults heap in ahead of the short fit, and says so
    ahead = (HEAP_AHEAD,) if allocator.settle("settled")[0] else ()
    assert eager.families["compiled"] == 0 and eager.notes == ahead
    # the compiled graph's own time, as traced: the profiler's cost taken out afterwards is an
    # estimate charged by events, and on a loaded machine it can take a small family down to 0
    assert compiled.traced["compiled"] > 0 and compiled.families["compiled"] >= 0
    *first, note = compiled.notes
    assert tuple(first) == ahead
    assert "not the fused kernels inside it" in note and "not seen as casts" in note
    assert compared.time_split.differences == {}  # no fp32 plan: no baseline to set them against


def test_the_compiled_plan_is_reported_against_its_eager_twin(compared):
    report = compared.compiled["bf16+compile"]
    assert report.eager_label == "bf16"
    expected = compared.measurement.speedup("bf16+compile", "bf16")
    assert report.speedup.estimate == expected.estimate  # the method every speedup uses
    assert report.record.compile_s > 0 and report.record.recompiles == ()
    assert report.pay_back is not None and report.pay_back.compile_s == report.record.compile_s
    assert report.agreement is not None and report.agreement.agrees, report.agreement.message()
    assert report.breaks is not None and report.breaks.forward.breaks == ()
    messages = [e.message for e in compared.events if e.kind == "compile"]
    assert any("pays back" in m for m in messages)
    assert any(m.startswith("bf16+compile: graph breaks:") for m in messages)
    row = report.row()
    assert row["eager_plan"] == "bf16" and row["compile_cache"] in ("hit", "miss", "partial")


def test_compile_time_is_not_in_any_measured_step(compared):
    record = compared.compiled["bf16+compile"].record
    times = [t for block in compared.measurement.plans["bf16+compile"].blocks for t in block]
    assert times and max(times) < record.compile_s


def test_a_model_dynamo_cannot_trace_is_not_compiled_and_its_eager_plan_is_reported():
    out = pnb.compare(
        ("fp32",), model=Untraceable(), batches=batches, device="cpu",
        compile=("off", "default"), steps=4, log_every=2, progress=False,
        measure=MeasureConfig(rounds=2, warmup_max=0), measure_peak=False,
    )  # fmt: skip
    assert list(out.results) == ["fp32"] and out.compiled == {}
    dropped = [e.message for e in out.events if e.kind == "compile" and "not run" in e.message]
    assert dropped and "cannot trace it at all" in dropped[0]
    assert "torch.compiler.disable" in dropped[0]


def test_a_compile_that_fails_is_shown_and_the_other_plans_are_measured(monkeypatch):
    def failing_backend(gm, example_inputs):
        raise RuntimeError("simulated inductor failure")

    def compile_with_failing_backend(model, plan):
        return torch.compile(model, backend=failing_backend) if plan.enabled else model

    monkeypatch.setattr(trainer_module, "compile_model", compile_with_failing_backend)
    monkeypatch.setattr("precision_nb.engine.session.compile_model", compile_with_failing_backend)
    # torch's own error of the compile, as torch raised it, with the comparison on it
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as err:
        pnb.compare(
            ("fp32",), model=make_model(), batches=batches, device="cpu",
            compile=("off", "default"), steps=4, log_every=2, progress=False,
            measure=MeasureConfig(rounds=2, warmup_max=2, warmup_min=1), measure_peak=False,
        )  # fmt: skip
    torch._dynamo.reset()
    out = err.value.result
    assert "fp32" in out.results and out.results["fp32"].steps == 4
    assert "simulated inductor failure" in out.failures["fp32+compile"]
    assert "simulated inductor failure" in str(err.value)
    (line,) = out.compiled["fp32+compile"].lines()
    assert line.startswith("fp32+compile: compile failed:") and "simulated inductor" in line


def test_a_profiles_inspection_of_the_compiled_plan_is_the_eager_step_said_so(compared):
    from precision_nb.engine.analyses import ModelSource, inspect_targets, targets_of

    source = ModelSource(make_model(), batches)
    data = inspect_targets(source, targets_of(compared.results, compared.failures))
    first = data["bf16+compile"].flags[0]
    assert first.kind == "compiled" and "EAGER bf16 step" in first.message
    assert data["bf16+compile"].label == "bf16+compile"
    assert all(flag.kind != "compiled" for flag in data["bf16"].flags)
    assert data["bf16"].ops == data["bf16+compile"].ops  # one eager inspection, shared
