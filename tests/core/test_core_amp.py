"""autocast_context, make_grad_scaler (with their older-torch fallbacks) and verify_autocast."""

from __future__ import annotations

import contextlib
import logging

import pytest
import torch

from precision_nb import (
    PrecisionConfig,
    PrecisionPlan,
    autocast_context,
    make_grad_scaler,
    resolve_precision,
    verify_autocast,
)

FP32_CPU = PrecisionPlan("fp32", torch.float32, False, False, "cpu")
BF16_CPU = PrecisionPlan("bf16", torch.bfloat16, False, True, "cpu")
BF16_CUDA = PrecisionPlan("bf16", torch.bfloat16, False, True, "cuda")
FP16_CUDA = PrecisionPlan("fp16", torch.float16, True, True, "cuda")
LAB = PrecisionPlan("fp16", torch.float16, True, True, "cpu")


class Recorder:
    """Stands in for a torch class or function and remembers how it was called."""

    calls: list[tuple[tuple, dict]]

    def __init__(self) -> None:
        self.calls = []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return contextlib.nullcontext("legacy")


def test_fp32_gets_a_null_context():
    assert isinstance(autocast_context(FP32_CPU, "cpu"), contextlib.nullcontext)


def test_mixed_gets_torch_autocast_for_the_plan_device_type():
    ctx = autocast_context(BF16_CPU, device="cuda")  # device is accepted, not consulted
    assert isinstance(ctx, torch.autocast)
    assert ctx.device == "cpu" and ctx.fast_dtype == torch.bfloat16
    with ctx:
        assert (torch.ones(4, 4) @ torch.ones(4, 4)).dtype == torch.bfloat16


def test_autocast_falls_back_when_signature_is_older(monkeypatch, caplog):
    def old_autocast(device_type, **kwargs):
        if "dtype" in kwargs:
            raise TypeError("__init__() got an unexpected keyword argument 'dtype'")
        raise AssertionError("not reached")

    legacy = Recorder()
    monkeypatch.setattr(torch, "autocast", old_autocast)
    monkeypatch.setattr(torch.cpu.amp, "autocast", legacy)
    with caplog.at_level(logging.WARNING, logger="precision_nb"):
        ctx = autocast_context(BF16_CPU)
    assert legacy.calls == [((), {"dtype": torch.bfloat16})]
    assert isinstance(ctx, contextlib.nullcontext)
    assert "legacy" in caplog.text


def test_autocast_falls_back_when_torch_autocast_is_missing(monkeypatch):
    legacy = Recorder()
    monkeypatch.delattr(torch, "autocast")
    monkeypatch.setattr(torch.cuda.amp, "autocast", legacy)
    autocast_context(BF16_CUDA)
    assert legacy.calls == [((), {"dtype": torch.bfloat16})]


@pytest.mark.parametrize(
    "plan",
    [
        FP32_CPU,
        BF16_CPU,
        BF16_CUDA,
        PrecisionPlan("fp32", torch.float32, False, False, "cuda"),
        PrecisionPlan("fp32", torch.float32, False, False, "mps"),
    ],
)
def test_no_scaler_outside_fp16(plan):
    assert make_grad_scaler(plan) is None


def test_spec_cpu_fp16_request_gets_no_scaler():
    plan = resolve_precision(PrecisionConfig("fp16"), "cpu")
    assert make_grad_scaler(plan) is None


def test_cuda_fp16_prefers_torch_amp_grad_scaler(monkeypatch):
    scaler = Recorder()
    monkeypatch.setattr(torch.amp, "GradScaler", scaler)
    make_grad_scaler(FP16_CUDA, init_scale=1024.0)
    assert scaler.calls == [(("cuda",), {"init_scale": 1024.0})]


def test_cuda_fp16_falls_back_to_torch_cuda_amp(monkeypatch, caplog):
    def old_scaler(*args, **kwargs):
        raise TypeError("__init__() takes 1 positional argument but 2 were given")

    legacy = Recorder()
    monkeypatch.setattr(torch.amp, "GradScaler", old_scaler)
    monkeypatch.setattr(torch.cuda.amp, "GradScaler", legacy)
    with caplog.at_level(logging.WARNING, logger="precision_nb"):
        make_grad_scaler(FP16_CUDA)
    assert legacy.calls == [((), {})]
    assert "torch.cuda.amp.GradScaler" in caplog.text


def test_cuda_fp16_falls_back_when_torch_amp_has_no_grad_scaler(monkeypatch):
    legacy = Recorder()
    monkeypatch.delattr(torch.amp, "GradScaler")
    monkeypatch.setattr(torch.cuda.amp, "GradScaler", legacy)
    make_grad_scaler(FP16_CUDA)
    assert len(legacy.calls) == 1


def test_loss_scale_lab_gets_a_cpu_scaler_with_kwargs():
    plan = resolve_precision(PrecisionConfig("fp16", loss_scale_lab=True), "cpu")
    scaler = make_grad_scaler(plan, init_scale=256.0, growth_interval=3)
    assert isinstance(scaler, torch.amp.GradScaler)
    assert scaler.is_enabled() and scaler.get_scale() == 256.0


def test_scaler_flag_on_other_devices_is_refused_loudly(caplog):
    plan = PrecisionPlan("fp16", torch.float16, True, True, "mps")
    with caplog.at_level(logging.WARNING, logger="precision_nb"):
        assert make_grad_scaler(plan) is None
    assert "no scaler" in caplog.text


@pytest.mark.parametrize(
    "plan,dtype", [(FP32_CPU, torch.float32), (BF16_CPU, torch.bfloat16), (LAB, torch.float16)]
)
def test_verify_autocast_reports_the_computed_dtype(plan, dtype):
    check = verify_autocast(plan, "cpu")
    assert check.computed_dtype == dtype and check.ok
    assert check.to_dict()["computed_dtype"] == str(dtype)


def test_verify_autocast_catches_requested_but_not_running():
    liar = PrecisionPlan("bf16", torch.bfloat16, False, False, "cpu")  # mixed, autocast off
    check = verify_autocast(liar)
    assert not check.ok
    assert check.computed_dtype == torch.float32 and "not what runs" in check.detail


def test_verify_autocast_reports_a_failing_matmul(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no kernel for this dtype")

    monkeypatch.setattr(torch.Tensor, "__matmul__", broken)
    check = verify_autocast(BF16_CPU)
    assert not check.ok and check.computed_dtype is None and "no kernel" in check.detail


def test_verify_autocast_on_absent_hardware_raises(fake_torch):
    fake_torch(cuda=False)
    if torch.cuda.device_count():
        pytest.skip("a real CUDA device is present")
    with pytest.raises(RuntimeError, match="cannot place tensors on cuda"):
        verify_autocast(FP16_CUDA)
