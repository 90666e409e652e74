"""Attention FLOPs against the analytic formula; peak calibration, peak ratios, TF32 state."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from precision_nb.engine import metrics


def _attention_flops(b, h, lq, lk, d, causal, hkv=None):
    q = torch.randn(b, h, lq, d, requires_grad=True)
    k = torch.randn(b, hkv or h, lk, d, requires_grad=True)
    v = torch.randn(b, hkv or h, lk, d, requires_grad=True)
    counter = metrics.flop_counter()
    with counter:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hkv is not None)
        out.sum().backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("causal", [False, True])
def test_attention_flops_follow_the_analytic_formula(causal):
    b, h, length, d = 2, 4, 16, 8
    forward = 4 * b * h * length * length * d  # Q K^T and P V
    # backward: grads of V, of the scores, of Q and of K (twice the forward); the causal half is
    # counted, as the usual MFU convention does
    assert _attention_flops(b, h, length, length, d, causal) == 3 * forward


def test_attention_with_grouped_heads_counts_every_query_head():
    b, h, length, d = 1, 4, 8, 8
    assert _attention_flops(b, h, length, length, d, False, hkv=2) == 3 * 4 * b * h * 8 * 8 * d


def test_fused_cpu_kernel_counts_what_the_math_path_counts():
    q = torch.randn(2, 2, 12, 8, requires_grad=True)
    counts = []
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.MATH):
        counter = metrics.flop_counter()
        with sdpa_kernel(backend), counter:
            F.scaled_dot_product_attention(q, q, q).sum().backward()
        counts.append(counter.get_total_flops())
    assert counts[0] == counts[1] > 0


def test_peak_ratios_divide_by_the_fp32_peak(monkeypatch):
    peaks = {torch.float32: 10.0, torch.bfloat16: 25.0}

    def fake(device, dtype, calibrate=True):
        rate = peaks.get(dtype)
        return None if rate is None else metrics.Peak(rate, "fake")

    monkeypatch.setattr(metrics, "peak_flops", fake)
    got = metrics.peak_ratios(torch.device("cpu"), (torch.bfloat16, torch.float16))
    assert set(got) == {"bfloat16"} and got["bfloat16"].ratio == 2.5
    assert got["bfloat16"].low == got["bfloat16"].high == 2.5  # no repeats: no range


def test_peak_ratios_carry_the_range_of_the_calibration_repeats(monkeypatch):
    peaks = {
        torch.float32: metrics.Peak(10.0, "m", low=8.0, high=11.0, repeats=5),
        torch.bfloat16: metrics.Peak(25.0, "m", low=20.0, high=30.0, repeats=5),
    }
    monkeypatch.setattr(metrics, "peak_flops", lambda device, dtype, calibrate=True: peaks[dtype])
    got = metrics.peak_ratios(torch.device("cpu"), (torch.bfloat16,))["bfloat16"]
    assert (got.ratio, got.low, got.high) == pytest.approx((2.5, 20 / 11, 30 / 8))
    assert "2.50×, range 1.82–3.75" in str(got) and "5+ calibration repeats" in str(got)


def test_a_measured_peak_is_the_median_of_its_repeats_with_their_range(monkeypatch):
    monkeypatch.setattr(metrics, "_CPU_PEAKS", {})
    peak = metrics.calibrate_cpu_peak(torch.float32, seconds=1e-4, repeats=4)
    assert peak.repeats == 4 and peak.low <= peak.flops_per_s <= peak.high
    assert "median of 4" in peak.source and "GFLOP/s" in peak.source


def test_calibration_skips_sizes_too_slow_for_the_budget(monkeypatch):
    monkeypatch.setattr(metrics, "_CPU_PEAKS", {})
    peak = metrics.calibrate_cpu_peak(torch.float16, seconds=1e-6)
    assert peak.flops_per_s > 0
    assert "best 256" in peak.source and "blocked_autorange" in peak.source


def test_tf32_state_is_read_from_torch(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    state = metrics.tf32_state()
    assert state["cudnn_allow_tf32"] is False
    assert state["cudnn_conv_fp32_precision"] == "ieee"  # "none" all the way up: IEEE fp32
    assert state["float32_matmul_precision"] == torch.get_float32_matmul_precision()
    assert set(state) == {
        "cudnn_conv_fp32_precision",
        "cuda_matmul_fp32_precision",
        "cuda_matmul_allow_tf32",
        "float32_matmul_precision",
        "cudnn_allow_tf32",
    }


def test_tf32_state_survives_flags_set_with_torch_s_per_op_api():
    # Once conv and RNN differ, torch refuses to answer the legacy cudnn.allow_tf32 (it raises)
    cudnn = torch.backends.cudnn
    before = cudnn.conv.fp32_precision, cudnn.rnn.fp32_precision
    try:
        cudnn.conv.fp32_precision = "ieee"
        with pytest.raises(RuntimeError):
            _ = cudnn.allow_tf32
        state = metrics.tf32_state()
        assert state["cudnn_allow_tf32"] is None and state["cudnn_conv_fp32_precision"] == "ieee"
    finally:
        cudnn.conv.fp32_precision, cudnn.rnn.fp32_precision = before
    assert metrics.tf32_state()["cudnn_conv_fp32_precision"] == "tf32"  # torch 2.13's default


def test_the_op_trace_counts_the_flops_a_run_counts_cpu_flash_attention_included():
    from precision_nb.engine.inspect.op_trace import OpTracer

    q = torch.randn(2, 2, 12, 8, requires_grad=True)
    w = torch.randn(8, 8, requires_grad=True)

    def step():
        return F.scaled_dot_product_attention(q @ w, q, q).sum()

    counter = metrics.flop_counter()
    with counter:
        step().backward()
    tracer = OpTracer(set())
    with tracer:
        loss = step()
        tracer.phase = "backward"
        loss.backward()
    by_op = {}
    for (_phase, _api, op, *_rest), flops in tracer.flops.items():
        by_op[op] = by_op.get(op, 0) + flops
    assert by_op["_scaled_dot_product_flash_attention_for_cpu"] == 4 * 2 * 2 * 12 * 12 * 8
    assert sum(by_op.values()) == counter.get_total_flops()
