"""Pay-back, agreement with eager and the per-plan compile report, from hand-built numbers (no
compile runs here)."""

from __future__ import annotations

import math

import pytest
import torch

from precision_nb.core.compile_mode import CompilePlan
from precision_nb.engine.compile.agreement import agreement, tolerance
from precision_nb.engine.compile.payback import pay_back
from precision_nb.engine.compile.record import CompileLog, CompileRecord
from precision_nb.engine.compile.report import compile_reports
from precision_nb.engine.compile.torch_state import TorchCompilation, TorchCompilations
from precision_nb.engine.measure import MeasureConfig, Measurement, PlanTiming, Warmup

# ------------------------------------------------------------------------------- pay-back


def test_pay_back_is_the_break_even_step_with_a_range_from_the_interval():
    # 10 s of compile, 10 ms compiled steps, 2x: 10 ms saved per step -> 1000 steps
    pb = pay_back(10.0, 0.01, 2.0, 1.5, 3.0)
    assert pb.steps == 1000
    assert (pb.steps_low, pb.steps_high) == (500, 2000)
    assert pb.text.startswith("pays back after 1000 steps at this step time")
    assert "within the interval: after 500 to 2000 steps" in pb.text
    assert "compiling cost 10.00 s (one measurement)" in pb.text


def test_pay_back_never_when_compiled_is_not_faster():
    pb = pay_back(10.0, 0.01, 0.9, 0.8, 1.2)
    assert pb.steps is None
    assert pb.text.startswith("never pays back at this step time")
    assert "at the interval's upper end it would pay back after 5000 steps" in pb.text
    assert pay_back(10.0, 0.01, 1.0).steps is None


def test_pay_back_says_it_may_never_when_the_interval_includes_no_gain():
    pb = pay_back(2.0, 0.01, 1.1, 0.95, 1.3)
    assert pb.steps == 2000 and pb.steps_high is None
    assert "may never pay back" in pb.text


def test_pay_back_of_a_compile_that_cost_nothing_is_the_first_step():
    assert pay_back(0.0, 0.01, 1.5, 1.2, 1.8).steps == 1


def test_pay_back_without_interval_or_times_says_so():
    assert "no range for the steps" in pay_back(3.0, 0.01, 2.0).text
    unknown = pay_back(3.0, math.nan, 2.0)
    assert unknown.steps is None and "not known" in unknown.text


# ------------------------------------------------------------------------------- agreement


def test_tolerance_follows_the_dtype_epsilon_and_grows_like_a_random_walk():
    tol = tolerance([2.0, 2.0, 2.0, 2.0], torch.bfloat16)
    eps = torch.finfo(torch.bfloat16).eps
    assert tol[0] == pytest.approx(eps * 2.0)
    assert tol[3] == pytest.approx(eps * 2.0 * 2)  # sqrt(4)
    fp32 = tolerance([0.5], torch.float32)
    assert fp32[0] == pytest.approx(torch.finfo(torch.float32).eps)  # max(1, |L|)


def test_tolerance_widens_to_the_plans_own_drift_from_fp32():
    eager = [2.0, 1.9, 1.8]
    fp32 = [2.0, 1.8, 1.8]  # the plan moved the trajectory by 0.1 at step 1
    tol = tolerance(eager, torch.float32, fp32)
    assert tol[0] < 1e-5 and tol[1] == pytest.approx(0.1) and tol[2] == pytest.approx(0.1)


def test_identical_and_nearly_identical_trajectories_agree():
    eager = [2.3, 2.1, 1.9, 1.7]
    same = agreement("bf16+compile", eager, "bf16", eager, torch.bfloat16)
    assert same.agrees and same.worst_ratio == 0 and "trains what bf16 trains" in same.message()
    near = [v + 1e-3 for v in eager]  # below bf16's eps * |L|
    assert agreement("bf16+compile", near, "bf16", eager, torch.bfloat16).agrees


def test_a_departing_trajectory_is_named_with_its_first_step():
    eager = [2.3, 2.1, 1.9, 1.7]
    off = [2.3, 2.1, 2.4, 2.5]
    result = agreement("fp32+compile", off, "fp32", eager, torch.float32)
    assert not result.agrees and result.first_bad == 2
    assert result.max_abs_diff == pytest.approx(0.8)
    assert "departs from fp32 at step 2" in result.message()


def test_one_side_non_finite_is_a_disagreement_both_is_the_same_outcome():
    eager = [2.0, math.inf, 1.9]
    assert agreement("a", [2.0, math.inf, 1.9], "b", eager, torch.float16).agrees
    assert not agreement("a", [2.0, 1.0, 1.9], "b", eager, torch.float16).agrees


# ------------------------------------------------------------------------------- the report


def _compilations(seconds: float, hits: int, misses: int, reason: str | None = None):
    return TorchCompilations(
        (
            TorchCompilation("0/0", "forward", seconds, reason, 0, hits, misses),
            TorchCompilation("0/0", "backward", seconds / 2, None, 0, 0, 0),
        )
    )


def _measurement() -> Measurement:
    m = Measurement(MeasureConfig(rounds=6), [5] * 6)
    eager_blocks = [[0.020] * 5 for _ in range(6)]
    compiled_blocks = [[0.010 + 0.0001 * r] * 5 for r in range(6)]
    m.plans["bf16"] = PlanTiming("bf16", Warmup(3, 0.1, "stable", (0.05, 0.02, 0.02)))
    m.plans["bf16"].blocks = eager_blocks
    m.plans["bf16+compile"] = PlanTiming(
        "bf16+compile", Warmup(3, 5.0, "stable", (4.05, 0.01, 0.01))
    )
    m.plans["bf16+compile"].blocks = compiled_blocks
    return m


def _record(label: str) -> CompileRecord:
    log = CompileLog(label, CompilePlan(requested="default", mode="default"))
    log.compile_step(lambda: None)
    log.first = _compilations(3.0, 0, 2)  # what torch would have compiled in that step
    log.compile_s = 4.0
    log.add("steps 5-8", _compilations(1.0, 2, 0, "0/0: tensor 'x' size mismatch"))
    return log.record()


def test_a_compiled_plan_is_reported_against_its_eager_twin():
    m = _measurement()
    losses = {"bf16": [2.0, 1.9, 1.8], "bf16+compile": [2.0, 1.9, 1.8], "fp32": [2.0, 1.9, 1.79]}
    reports = compile_reports(
        m,
        {"bf16+compile": _record("bf16+compile")},
        {"bf16+compile": "bf16"},
        losses,
        {"bf16+compile": torch.bfloat16},
        fp32_label="fp32",
    )
    r = reports["bf16+compile"]
    assert r.speedup is not None and r.speedup.estimate == pytest.approx(m.speedup(
        "bf16+compile", "bf16").estimate)  # fmt: skip
    assert r.speedup.estimate > 1.9
    assert "bf16+compile is" in r.verdict
    steady = m.plans["bf16+compile"].spread.median
    saving = steady * (r.speedup.estimate - 1)
    assert r.pay_back is not None and r.pay_back.steps == math.ceil(4.0 / saving)
    assert r.record.cache == "miss"
    assert r.record.recompiles == (("steps 5-8", "0/0: tensor 'x' size mismatch"),)
    assert r.agreement is not None and r.agreement.agrees
    row = r.row()
    assert row["recompiles"] == 1 and row["compile_cache"] == "miss"
    text = "\n".join(r.lines())
    assert "cold compile" in text and "1 recompilation(s)" in text and "pays back after" in text
    assert "not in any step time" in text


def test_a_compiled_plan_without_eager_twin_says_what_would_measure_its_gain():
    m = _measurement()
    reports = compile_reports(m, {"bf16+compile": _record("bf16+compile")}, {"bf16+compile": None})
    r = reports["bf16+compile"]
    assert r.speedup is None and r.pay_back is None and r.agreement is None
    assert any("measure compile off too" in line for line in r.lines())


def test_a_cache_hit_is_said_not_hidden():
    log = CompileLog("fp32+compile", CompilePlan(requested="default", mode="default"))
    log.compile_step(lambda: None)
    log.first = _compilations(0.4, 2, 0)
    record = log.record()
    assert record.cache == "hit"
    assert "cache hit" in record.lines()[0] and "shorter than a cold one" in record.lines()[0]


def test_a_failed_compile_is_shown_with_its_error():
    log = CompileLog("bf16+compile", CompilePlan(requested="default", mode="default"))

    def fails() -> None:
        raise RuntimeError("InductorError: boom")

    with pytest.raises(RuntimeError, match="boom"):
        log.compile_step(fails)
    reports = compile_reports(
        _measurement(), {"bf16+compile": log.record()}, {"bf16+compile": "bf16"}
    )
    r = reports["bf16+compile"]
    assert r.lines() == ["bf16+compile: compile failed: RuntimeError: InductorError: boom"]
    assert r.speedup is None and r.row()["compile_failed"].endswith("boom")


def test_a_departure_with_random_ops_names_them_and_the_setting_that_compares_step_by_step():
    eager = [2.3, 2.1, 1.9]
    result = agreement("a", [2.3, 2.2, 2.0], "b", eager, torch.float32, random_ops=("dropout",))
    assert not result.agrees
    assert "draws random numbers (dropout)" in result.message()
    assert "torch._inductor.config.fallback_random = True" in result.message()


@pytest.mark.parametrize(
    ("hits", "misses", "backward", "said"),
    [
        (0, 2, True, "1 forward and 1 backward graph(s)"),
        (2, 0, False, "1 forward graph(s), their backward graphs reused from the local caches"),
        (0, 2, False, "1 forward graph(s); no backward graph recorded"),
    ],
)
def test_the_compile_step_says_which_graphs_torch_listed(hits, misses, backward, said):
    """A cache hit lists no backward graph of its own: never "0 backward graph(s)"."""
    log = CompileLog("bf16+compile", CompilePlan(requested="default", mode="default"))
    log.compile_step(lambda: None)
    entries = [TorchCompilation("0/0", "forward", 1.0, None, 0, hits, misses)]
    if backward:
        entries.append(TorchCompilation("0/0", "backward", 0.5, None, 0, 0, 0))
    log.first = TorchCompilations(tuple(entries))
    log.compile_s = 2.0
    text = log.record().lines()[0]
    assert said in text and "0 backward" not in text
