"""Hints appear where the numbers show them, and each names its measurement."""

from __future__ import annotations

from types import SimpleNamespace

from typed_outcomes import with_outcomes

from precision_nb.core.capabilities import Capabilities
from precision_nb.core.plan import PrecisionPlan
from precision_nb.engine.compare import Comparison
from precision_nb.engine.metrics import PeakRatio
from precision_nb.engine.results import RunResult
from precision_nb.views.report.hints import (
    Hint,
    hints,
    hints_by_run,
    matmul_dims_not_multiple_of_8,
    what_to_try_next,
)


def _result(records, *, workload=None, explanation=None, outcome=None, history=None):
    last = records[-1]
    return RunResult(
        label=last["run"],
        plan=PrecisionPlan.from_dict(last),
        explanation=explanation,
        optimizer_outcome=outcome,
        device=last["device"],
        records=records,
        workload=workload or {},
        scale_history=history or [],
    )


def _comparison(**results):
    return Comparison(results=results)


def _by_topic(found: list[Hint]) -> dict[str, list[Hint]]:
    out: dict[str, list[Hint]] = {}
    for hint in found:
        out.setdefault(hint.topic, []).append(hint)
    return out


def test_single_run_speedups_claim_nothing(make_records):
    records = (
        make_records("fp32", "fp32", step_time_s=0.010)
        + make_records("bf16", "bf16", step_time_s=0.005)
        + make_records("fp16", "fp16", step_time_s=0.020)
    )
    payoff = {h.run: h for h in _by_topic(hints(records))["payoff"]}
    assert "single-run figure: bf16 ran at 2.00×" in payoff["bf16"].message
    assert "0.50×" in payoff["fp16"].message
    assert all("pay" not in h.message for h in payoff.values())
    assert "fp32" not in payoff
    assert all("speedup_vs_fp32" in h.measurement for h in payoff.values())
    assert all(h.figure == "throughput.png" for h in payoff.values())


def test_measured_verdicts_are_the_hints_and_lead_to_next_steps(make_records):
    source = with_outcomes(
        Comparison(
            results={
                "fp32": _result(make_records("fp32", "fp32")),
                "bf16": _result(make_records("bf16", "bf16")),
            },
            peak_ratios={"bfloat16": PeakRatio(2.5, 2.5, 2.5, "measured")},
        ),
        {
            "fp32": {"verdict": "fp32 is the baseline.", "verdict_kind": "baseline"},
            "bf16": {
                "verdict": "bf16 vs fp32: no difference this machine can resolve (±12 %)",
                "verdict_kind": "unresolved",
                "median_step_time_s": 1.0,
                "step_time_iqr_s": 0.5,
            },
        },
    )
    found = _by_topic(hints(source))
    (payoff,) = found["payoff"]
    assert payoff.message.startswith("bf16 vs fp32: no difference") and payoff.next_step
    (peak,) = found["peak"]
    assert "2.50× the fp32 peak" in peak.message
    (noise,) = found["noise"]
    assert "IQR 50%" in noise.message
    steps = what_to_try_next([payoff, peak, noise])
    assert len(steps) == 2 and steps[0].startswith("Run more rounds") and "(bf16)" in steps[0]


def test_the_peak_hint_carries_the_range_of_the_calibration_repeats(make_records):
    from precision_nb.engine.metrics import PeakRatio

    source = _comparison(
        fp32=_result(make_records("fp32", "fp32")), bf16=_result(make_records("bf16", "bf16"))
    )
    source.peak_ratios = {"bfloat16": PeakRatio(2.33, 1.88, 4.11, "measured")}
    (peak,) = _by_topic(hints(source))["peak"]
    assert (
        "2.33× the fp32 peak on this device (measured peaks; range 1.88–4.11 over the "
        "calibration repeats" in peak.message
    )
    assert "as loaded while they ran" in peak.message  # a reading of this machine, not a fact


def test_nothing_to_try_next_is_said_plainly():
    assert what_to_try_next([]) == ["No measurement here points to a change of plan or workload."]


def test_no_payoff_hint_without_a_fp32_baseline(make_records):
    assert "payoff" not in _by_topic(hints(make_records("bf16", "bf16")))


def test_overhead_hint_from_low_mfu_names_the_numbers(make_records):
    records = make_records("fp32", "fp32", mfu=0.02) + make_records("bf16", "bf16", mfu=0.01)
    (hint,) = _by_topic(hints(records))["overhead"]
    assert hint.run == "all"
    assert "2.0%" in hint.message and "1.0%" in hint.message
    assert "measured CPU matmul peak" in hint.message
    assert hint.measurement.startswith("mfu")


def test_overhead_hint_keeps_a_small_mfu_readable(make_records):
    # a bf16 step at 0.026 % of a fast bf16 peak must not read as 0.0 %
    records = make_records("fp32", "fp32", mfu=0.0023) + make_records("bf16", "bf16", mfu=0.00026)
    (hint,) = _by_topic(hints(records))["overhead"]
    assert "= 0.23%" in hint.message and "= 0.026%" in hint.message
    assert "0.0%" not in hint.message


def test_no_overhead_hint_when_mfu_is_high(make_records):
    records = make_records("fp32", "fp32", mfu=0.6)
    assert "overhead" not in _by_topic(hints(records))


def test_overhead_without_peak_uses_flops_per_step(make_records):
    records = make_records("fp32", "fp32", mfu=None, step_time_s=1.0)  # 1 GFLOP/s
    comparison = _comparison(fp32=_result(records, workload={"flops_per_step": 2e6}))
    (hint,) = _by_topic(hints(comparison))["overhead"]
    assert "2.0 MFLOP per step" in hint.message
    assert "no peak" in hint.measurement


def test_dims_not_multiple_of_8():
    dims = {"in_dim": 64, "hidden": 100, "classes": 10, "channels": [16, 20], "depth": 3}
    assert matmul_dims_not_multiple_of_8(dims) == {"hidden": 100, "classes": 10, "channels[1]": 20}
    assert matmul_dims_not_multiple_of_8({"d_model": 192, "heads": 6}) == {}
    assert matmul_dims_not_multiple_of_8({"d_model": 60, "heads": 4}) == {
        "d_model": 60,
        "head_dim": 15,
    }


def test_dims_hint_only_for_mixed_plans(make_records):
    dims = {"hidden": 100, "batch_size": 32}
    only_fp32 = _comparison(fp32=_result(make_records("fp32", "fp32"), workload={"dims": dims}))
    assert "dims" not in _by_topic(hints(only_fp32))
    mixed = _comparison(
        fp32=_result(make_records("fp32", "fp32"), workload={"dims": dims}),
        bf16=_result(make_records("bf16", "bf16"), workload={"dims": dims}),
    )
    (hint,) = _by_topic(hints(mixed))["dims"]
    assert hint.run == "bf16"
    assert "hidden=100" in hint.message
    assert hint.measurement == "workload dims"


def test_bf16_emulated_from_capabilities(make_records):
    caps = Capabilities(
        "a T4", True, True, "supported", False, device_name="Tesla T4", compute_capability=(7, 5)
    )
    records = make_records("bf16", "bf16", device="cuda:0", memory_kind="cuda_allocated")
    comparison = _comparison(bf16=_result(records, explanation=SimpleNamespace(capabilities=caps)))
    (hint,) = _by_topic(hints(comparison))["bf16_emulated"]
    assert "Tesla T4" in hint.message and "7.5" in hint.message
    assert hint.measurement == "capabilities.cuda_bf16_native"
    native = Capabilities(
        "an A100", True, True, "supported", True, device_name="A100", compute_capability=(8, 0)
    )
    comparison = _comparison(
        bf16=_result(records, explanation=SimpleNamespace(capabilities=native))
    )
    assert "bf16_emulated" not in _by_topic(hints(comparison))


def test_frequent_fp16_skips(make_records):
    often = make_records("fp16", "fp16", use_scaler=True, skipped_at=(2, 4, 6))
    (hint,) = _by_topic(hints(often))["skips"]
    assert "3 of 13 optimizer attempts were skipped (23%)" in hint.message
    assert hint.measurement == "skipped_total"
    rare = make_records("fp16", "fp16", steps=100, use_scaler=True, skipped_at=(2,))
    assert "skips" not in _by_topic(hints(rare))


def test_fused_adamw_not_used_gives_the_outcome_reason(make_records):
    outcome = SimpleNamespace(
        requested=True, probed=False, used=False, reason="fused AdamW needs floating CUDA params"
    )
    comparison = _comparison(
        fp32=_result(make_records("fp32", "fp32", fused=False), outcome=outcome),
        bf16=_result(make_records("bf16", "bf16", fused=True)),
    )
    (hint,) = _by_topic(hints(comparison))["fused_adamw"]
    assert hint.run == "fp32"
    assert "fused requested" in hint.message
    assert "floating CUDA params" in hint.message
    assert "FusedOutcome" in hint.measurement
    assert str(hint).startswith("[fp32] Fused AdamW was not used")


def test_fused_hint_from_bare_records(make_records):
    (hint,) = _by_topic(hints(make_records("fp32", "fp32", fused=False)))["fused_adamw"]
    assert hint.measurement == "fused_adamw record field"


def test_no_records_no_hints():
    assert hints([]) == []


def test_fused_hint_names_every_run_with_the_same_reason_once(make_records):
    outcome = SimpleNamespace(requested=None, probed=False, used=False, reason="probe false on cpu")
    comparison = _comparison(
        fp32=_result(make_records("fp32", "fp32", fused=False), outcome=outcome),
        bf16=_result(make_records("bf16", "bf16", fused=False), outcome=outcome),
    )
    (hint,) = _by_topic(hints(comparison))["fused_adamw"]
    assert hint.run == "all"
    assert "left to the probe" in hint.message


def test_noisy_step_times_are_flagged(make_records):
    steady = make_records("fp32", "fp32", steps=10)
    assert "noise" not in _by_topic(hints(steady))
    noisy = make_records("fp32", "fp32", steps=10)
    for record in noisy[::2]:
        record["step_time_s"] *= 30
    (hint,) = _by_topic(hints(noisy))["noise"]
    assert hint.run == "fp32"  # a single run is named, not "all"
    assert "(p90 - p10) / median" in hint.measurement


def test_overhead_rate_is_written_in_a_readable_unit(make_records):
    records = make_records("fp32", "fp32", step_time_s=1000.0, mfu=0.001)  # 1 MFLOP/s
    (hint,) = _by_topic(hints(records))["overhead"]
    assert "1.0 MFLOP/s" in hint.message


def test_hints_by_run_lists_shared_hints_under_each_run():
    shared = Hint("bf16, fp16 (loss-scale lab)", "dims", "m1", "workload dims")
    everyone = Hint("all", "fused_adamw", "m2", "optimizer_outcome")
    own = Hint("fp32", "noise", "m3", "step_time_s")
    grouped = hints_by_run([shared, everyone, own], ["fp32", "bf16", "fp16 (loss-scale lab)"])
    assert grouped == {
        "fp32": [everyone, own],
        "bf16": [shared, everyone],
        "fp16 (loss-scale lab)": [shared, everyone],
    }


def test_cpu_without_native_bf16_is_said_with_its_source(make_records):
    from precision_nb.core.cpu_features import CpuFeatures

    cpu = CpuFeatures(avx512_bf16=False, amx_bf16=False, source="/proc/cpuinfo flags")
    explanation = SimpleNamespace(capabilities=Capabilities("a CPU", False, False, cpu=cpu))
    source = _comparison(
        fp32=_result(make_records("fp32", "fp32")),
        bf16=_result(make_records("bf16", "bf16"), explanation=explanation),
    )
    (hint,) = _by_topic(hints(source))["cpu_features"]
    assert hint.run == "bf16" and "no native bf16 instructions" in hint.message
    assert "source: /proc/cpuinfo flags" in hint.message
    native_cpu = CpuFeatures(avx512_bf16=True)
    native = SimpleNamespace(capabilities=Capabilities("a CPU", False, False, cpu=native_cpu))
    source.results["bf16"].explanation = native
    assert "cpu_features" not in _by_topic(hints(source))


def _peak_source(make_records, *, device, source, tf32=None, cc=None, name=None, flops=None):
    records = {
        mode: [
            {**r, "mfu_peak_source": source}
            for r in make_records(mode, mode, device=device, memory_kind="cuda_allocated")
        ]
        for mode in ("fp32", "bf16")
    }
    caps = Capabilities("a GPU", True, True, "supported", device_name=name, compute_capability=cc)
    explanation = SimpleNamespace(capabilities=caps)
    workload = {"flops_by_class": flops} if flops else None
    return with_outcomes(
        Comparison(
            results={
                m: _result(r, explanation=explanation, workload=workload)
                for m, r in records.items()
            },
            peak_ratios={"bfloat16": PeakRatio(14.77, 14.77, 14.77, "datasheet")},
        ),
        {"fp32": {"tf32": tf32}} if tf32 is not None else {},
    )


def test_peak_ratio_is_an_estimate_labelled_with_its_source(make_records):
    gpu = _peak_source(make_records, device="cuda:0", source="datasheet: h100 sxm bfloat16 dense")
    (peak,) = _by_topic(hints(gpu))["peak"]
    assert peak.message.startswith("Estimate: the bf16 matmul peak is 14.77× the fp32 peak")
    assert "(datasheet peaks)" in peak.message and "no upper bound" in peak.message
    assert "measured" not in peak.message and "calibrated" not in peak.measurement
    assert peak.measurement.startswith("peak_ratios from datasheet peaks")
    cpu = _peak_source(make_records, device="cpu", source="measured: CPU bfloat16 matmul")
    (peak,) = _by_topic(hints(cpu))["peak"]
    assert "(measured peaks)" in peak.message and "TF32" not in peak.message


#: torch 2.13's defaults: cuDNN convolutions as TF32, matmuls in full fp32.
DEFAULT_TF32 = {"cudnn_conv_fp32_precision": "tf32", "cuda_matmul_fp32_precision": "ieee"}


def test_the_tf32_note_follows_the_ops_that_ran_with_the_table_s_ratio(make_records):
    a100, h100 = "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"
    cnn = {"convolution": 80, "matmul": 20}
    gpu = _peak_source(
        make_records, device="cuda:0", source="datasheet: a100", tf32=DEFAULT_TF32, name=a100,
        flops=cnn,
    )  # fmt: skip
    (peak,) = _by_topic(hints(gpu))["peak"]
    assert "ran its convolutions (80% of its counted FLOPs) as TF32" in peak.message
    assert "bf16 peak is 2.0× the TF32 peak (datasheet a100: 312 / 156 TFLOP/s)" in peak.message
    mix = 100 / (80 / 156 + 20 / 19.5)  # TFLOP/s: each class at its own peak, by hand
    assert f"over its whole FLOP mix ({mix:.1f} TFLOP/s) {312 / mix:.1f}×" in peak.message
    # a transformer has no convolutions: with the default flags nothing ran as TF32, and the
    # fp32 column's ratio (989.5 / 67 on an H100) is the one that holds
    transformer = {"matmul": 90, "attention": 6, "other": 4}
    gpu = _peak_source(
        make_records, device="cuda:0", source="datasheet: h100 sxm", tf32=DEFAULT_TF32,
        name=h100, flops=transformer,
    )  # fmt: skip
    (peak,) = _by_topic(hints(gpu))["peak"]
    assert "TF32" not in peak.message and "14.77× the fp32 peak" in peak.message
    high = {**DEFAULT_TF32, "cuda_matmul_fp32_precision": "tf32"}  # set_float32_matmul_precision
    gpu = _peak_source(
        make_records, device="cuda:0", source="datasheet: h100 sxm", tf32=high, name=h100,
        flops=transformer,
    )  # fmt: skip
    (peak,) = _by_topic(hints(gpu))["peak"]
    assert "ran its matmuls (90% of its counted FLOPs) as TF32" in peak.message
    assert f"{989.5 / 494.7:.1f}× the TF32 peak" in peak.message
    turing = _peak_source(
        make_records, device="cuda:0", source="datasheet: t4", tf32=DEFAULT_TF32, cc=(7, 5),
        name="Tesla T4", flops=cnn,
    )  # fmt: skip
    (peak,) = _by_topic(hints(turing))["peak"]
    assert "TF32" not in peak.message  # no TF32 before Ampere: the table has none for a T4


def test_skips_are_said_to_come_from_inf_or_nan(make_records):
    often = make_records("fp16", "fp16", use_scaler=True, skipped_at=(2, 4, 6))
    (hint,) = _by_topic(hints(often))["skips"]
    assert "an inf or a NaN" in hint.message


def test_fused_hint_says_what_plain_adamw_costs_once(make_records):
    from precision_nb.core.optim import PLAIN_ADAMW_COST

    outcome = SimpleNamespace(requested=None, probed=False, used=False, reason="probe false")
    comparison = _comparison(
        fp32=_result(make_records("fp32", "fp32", fused=False), outcome=outcome)
    )
    (hint,) = _by_topic(hints(comparison))["fused_adamw"]
    assert hint.message.count(PLAIN_ADAMW_COST) == 1
    already = SimpleNamespace(
        requested=None, probed=False, used=False, reason=f"cpu: {PLAIN_ADAMW_COST}"
    )
    comparison = _comparison(
        fp32=_result(make_records("fp32", "fp32", fused=False), outcome=already)
    )
    (hint,) = _by_topic(hints(comparison))["fused_adamw"]
    assert hint.message.count(PLAIN_ADAMW_COST) == 1


def test_the_noise_hint_says_busy_only_when_the_measured_load_says_so(make_records):
    from precision_nb.engine.load import Load, LoadSample
    from precision_nb.engine.measure import MeasureConfig, Measurement

    def comparison(others_cpu_s):
        start = LoadSample(0.0, (0.5, 0.5, 0.5), 2, busy_s=0.0, steal_s=0.0, own_s=0.0)
        end = LoadSample(10.0, (0.5, 0.5, 0.5), 2, busy_s=others_cpu_s, steal_s=0.0, own_s=0.0)
        measurement = Measurement(MeasureConfig(), [1], load=Load(start, end))
        return with_outcomes(
            Comparison(
                results={"fp32": _result(make_records("fp32", "fp32"))}, measurement=measurement
            ),
            {"fp32": {"median_step_time_s": 1.0, "step_time_iqr_s": 0.5}},
        )

    (quiet,) = _by_topic(hints(comparison(others_cpu_s=0.2)))["noise"]  # 1 % of 20 CPU-s
    assert "busy" not in quiet.message.replace("not busy", "")
    assert "the machine was not busy (other processes used 1%" in quiet.message
    (busy,) = _by_topic(hints(comparison(others_cpu_s=10.0)))["noise"]  # 50 %
    assert "the machine was busy while they were measured (other processes used 50%" in (
        busy.message
    )
    unmeasured = with_outcomes(
        Comparison(results={"fp32": _result(make_records("fp32", "fp32"))}),
        {"fp32": {"median_step_time_s": 1.0, "step_time_iqr_s": 0.5}},
    )
    (plain,) = _by_topic(hints(unmeasured))["noise"]
    assert "how busy the machine was is not measured here" in plain.message
