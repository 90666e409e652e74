"""compare() measures like a benchmark without changing what each plan trains."""

from __future__ import annotations

import copy

import pytest
import torch
from engine_helpers import quiet

from precision_nb.core.plan import PrecisionConfig
from precision_nb.engine.batches import BatchesExhausted
from precision_nb.engine.compare import Comparison, compare
from precision_nb.engine.comparison import plan_outcomes
from precision_nb.engine.measure import MeasureConfig, Measurement, PlanTiming, Warmup
from precision_nb.engine.results import RunResult, partial_result
from precision_nb.engine.trainer import Trainer

FAST = MeasureConfig(rounds=6, warmup_min=2, warmup_max=3)


def _params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_interleaved_training_equals_a_sequential_fit_of_each_plan(make_model, batches):
    model = make_model()
    lab = PrecisionConfig(mode="fp16", loss_scale_lab=True)
    out = compare(
        ["fp32", "bf16", lab],
        model=copy.deepcopy(model),
        batches=batches,
        train=quiet(steps=10, log_every=3, overflow_at_steps=(4,)),
        measure=MeasureConfig(rounds=4, warmup_min=2, warmup_max=3),
    )
    assert out.measurement is not None and len(out.measurement.orders) == 4
    for label, request in (("fp32", "fp32"), ("bf16", "bf16"), ("fp16 (loss-scale lab)", lab)):
        alone = copy.deepcopy(model)
        trainer = Trainer(
            alone,
            batches,
            precision=request,
            train=quiet(steps=10, log_every=3, overflow_at_steps=(4,), label=label),
        )
        single = trainer.fit()
        measured = out.results[label]
        assert [r["loss"] for r in measured.records] == [r["loss"] for r in single.records]
        assert measured.scale_history == single.scale_history
        assert measured.steps == single.steps == 10
        assert len(measured.step_times_s) == len(measured.scale_history)
    assert out.results["fp16 (loss-scale lab)"].skipped_total == 1


def test_figures_derive_every_rate_from_one_median(batches, make_model):
    out = compare(
        ["fp32", "bf16"], model=make_model(), batches=batches, train=quiet(steps=12), measure=FAST
    )
    for label, outcome in out.outcomes.items():
        result, timing = out.results[label], outcome.timing
        median = timing.median  # computed from the raw blocks on first use
        assert median == pytest.approx(out.measurement.plans[label].spread.median)
        assert outcome.rates.samples_per_s == pytest.approx(result.workload["batch_size"] / median)
        assert outcome.rates.flops_per_s == pytest.approx(
            result.workload["flops_per_step"] / median
        )
        assert timing.rounds == 6 and timing.spread.n == 12 and timing.processes == 1
        assert timing.warmup.steps >= 2 and timing.warmup.rule
    assert out.outcomes["fp32"].verdict.kind == "baseline" and out.baseline == "fp32"
    bf16 = out.outcomes["bf16"]
    assert bf16.speedup.low <= bf16.speedup.estimate <= bf16.speedup.high
    assert bf16.verdict.kind in ("faster", "slower", "unresolved")
    assert "rounds" in out.method and "steps per block" in out.method
    detail = bf16.verdict  # the one verdict object the views render
    assert (detail.low, detail.high) == (bf16.speedup.low, bf16.speedup.high)
    assert detail.level == "rounds" and "one process" in detail.method
    # a model object cannot be rebuilt in a fresh process: measured here only, and said so
    assert detail.stopped_by == "one process, as asked (processes=1)"
    assert out.measurement.load is not None and "machine load" in out.method


def test_a_plan_failing_part_way_is_kept_with_its_rounds(make_model, batches):
    calls = {"bf16": 0}

    def loss_fn(out, labels):
        if out.dtype == torch.bfloat16:
            calls["bf16"] += 1
            if calls["bf16"] > 3 + 4:  # warm-up (3 steps), then 2 rounds of 2 steps
                raise RuntimeError("bf16 kernel failed")
        return torch.nn.functional.cross_entropy(out.float(), labels)

    with pytest.raises(RuntimeError, match="bf16 kernel failed") as info:
        compare(
            ["fp32", "bf16"],
            model=make_model(),
            batches=batches,
            loss_fn=loss_fn,
            train=quiet(steps=8),
            measure=MeasureConfig(rounds=4, warmup_min=3, warmup_max=3),
        )
    # the loss function's own error, as it was raised (not wrapped), after fp32 finished
    assert type(info.value) is RuntimeError and str(info.value) == "bf16 kernel failed"
    assert info.traceback[-1].name == "loss_fn"  # its traceback reaches the line that raised it
    (note,) = info.value.__notes__
    assert "plan bf16 of the comparison failed" in note and "Comparison" in note
    out = info.value.result  # the whole comparison rides on it
    assert isinstance(out, Comparison) and partial_result(info.value) is out
    assert set(out.failures) == {"bf16"} and "round 3" in out.failures["bf16"]
    assert out.outcomes["bf16"].timing.rounds == 2 and out.outcomes["fp32"].timing.rounds == 4
    assert out.results["bf16"].steps == 4 and out.results["fp32"].steps == 8
    assert out.outcomes["bf16"].verdict.kind == "too_few"


def test_batches_running_out_in_the_warm_up_name_what_ran_out(make_model, batches):
    def short(index):
        if index >= 2:
            raise BatchesExhausted
        return batches(index)

    with pytest.raises(ValueError, match="batches ran out during the warm-up of plan fp32 after 2"):
        compare(["fp32"], model=make_model(), batches=short, train=quiet(steps=6), measure=FAST)


def test_more_rounds_than_steps_are_refused_with_both_numbers(make_model, batches):
    with pytest.raises(ValueError) as info:  # never quietly measured as fewer rounds
        compare(["fp32"], model=make_model(), batches=batches, train=quiet(steps=4), measure=FAST)
    message = str(info.value)
    assert message.startswith("rounds: invalid value 6 with steps=4")
    assert "rounds at most 4, or steps of at least 6" in message


def _fake_result(label, peak):
    result = RunResult(label, None, None, None, "cpu")
    result.workload = {
        "batch_size": 4,
        "accumulation": 1,
        "flops_per_step": 1e9,
        "peak_flops_per_s": peak,
        "peak_source": "test peak",
    }
    return result


def test_mfu_above_one_is_a_calibration_event_not_a_utilisation():
    m = Measurement(MeasureConfig(), [2] * 6)
    m.plans["fp32"] = PlanTiming("fp32", Warmup(3, 0.1, "stable"), [[0.5, 0.5]] * 6)
    m.plans["bf16"] = PlanTiming("bf16", Warmup(3, 0.1, "stable"), [[0.25, 0.25]] * 6)
    results = {"fp32": _fake_result("fp32", 4e9), "bf16": _fake_result("bf16", 1e9)}
    results["fp32"].workload.update(peak_flops_low=3e9, peak_flops_high=5e9)
    outcomes, events = plan_outcomes(m, results, "fp32")
    fp32, bf16 = outcomes["fp32"].rates, outcomes["bf16"].rates
    assert fp32.mfu == pytest.approx(0.5)  # 2 GFLOP/s of 4
    # its range: 2 GFLOP/s over the fastest and the slowest calibration repeat of the peak
    assert (fp32.mfu_low, fp32.mfu_high) == pytest.approx((0.4, 2 / 3))
    assert bf16.mfu is None  # 4 GFLOP/s of a 1 GFLOP/s peak: impossible
    assert [e.kind for e in events] == ["calibration"] and events[0].data["run"] == "bf16"
    assert outcomes["bf16"].speedup.estimate == pytest.approx(2.0)
    assert bf16.samples_per_s == pytest.approx(16.0)
    assert str(outcomes["bf16"].verdict).startswith("bf16 is 2.00× the fp32 speed")


def test_fp32_on_cuda_records_the_tf32_state(monkeypatch):
    from types import SimpleNamespace

    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    m = Measurement(MeasureConfig(), [1])
    m.plans["fp32"] = PlanTiming("fp32", None, [[0.5]])
    result = _fake_result("fp32", None)
    result.device, result.plan = "cuda:0", SimpleNamespace(mode="fp32")
    outcomes, events = plan_outcomes(m, {"fp32": result}, "fp32")
    assert outcomes["fp32"].tf32["cudnn_allow_tf32"] is True
    (event,) = [e for e in events if e.kind == "measurement"]
    assert "may run its convolutions as TF32" in event.message
    assert event.data["cudnn_conv_fp32_precision"] == "tf32"
