"""The peak a CUDA fp32 run's MFU divides by: the TF32 column for the FLOPs the flags send to TF32,
the fp32 column for the rest; and what an MFU above 1 says, by the peak's source."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from precision_nb.core.resolution import resolve_precision
from precision_nb.engine import peaks
from precision_nb.engine.run_setup import describe_run
from precision_nb.engine.train_config import TrainConfig

A100 = "NVIDIA A100-SXM4-80GB"


def _describe(model, x, monkeypatch, name=A100):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: name)
    plan = resolve_precision("fp32", "cpu")  # the plan's fields; the peak is the CUDA device's
    loss = lambda batch: (model(batch[0]).float().pow(2).mean(), None)  # noqa: E731
    return describe_run(model, torch.device("cuda"), plan, TrainConfig(), {}, (x,), loss)


def test_an_fp32_cnn_on_an_a100_is_measured_against_its_tf32_and_fp32_mix(monkeypatch):
    torch.manual_seed(0)
    cnn = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 14 * 14, 10))
    shape = _describe(cnn, torch.randn(4, 3, 16, 16), monkeypatch)
    by_class = shape.workload["flops_by_class"]
    conv, rest = by_class["convolution"], by_class["matmul"]
    assert conv > 0 and rest > 0 and sum(by_class.values()) == shape.flops_per_step
    # torch 2.13's defaults: convolutions as TF32 (156 TFLOP/s on an A100), matmuls in fp32 (19.5)
    by_hand = (conv + rest) / (conv / 156e12 + rest / 19.5e12)
    assert shape.peak.flops_per_s == pytest.approx(by_hand)
    assert 19.5e12 < shape.peak.flops_per_s < 156e12
    assert shape.peak.source.startswith("datasheet: a100 fp32 plan")
    assert "convolutions" in shape.peak.source and "TF32 peak 156 TFLOP/s" in shape.peak.source
    assert shape.workload["tf32"]["cudnn_conv_fp32_precision"] == "tf32"


def test_an_fp32_mlp_runs_nothing_as_tf32_and_keeps_the_fp32_column(monkeypatch):
    mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    shape = _describe(mlp, torch.randn(8, 32), monkeypatch)
    assert shape.peak.flops_per_s == 19.5e12
    assert "no counted FLOPs are convolutions" in shape.peak.source


def test_matmul_tf32_flags_send_an_mlp_to_the_tf32_column(monkeypatch):
    mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        shape = _describe(mlp, torch.randn(8, 32), monkeypatch)
    finally:
        torch.set_float32_matmul_precision(before)
    assert shape.peak.flops_per_s == pytest.approx(156e12)  # every counted FLOP a matmul


def test_a_gpu_without_tf32_keeps_the_fp32_column_and_says_why(monkeypatch):
    cnn = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 1))
    shape = _describe(cnn, torch.randn(2, 3, 8, 8), monkeypatch, name="Tesla T4")
    assert shape.peak.flops_per_s == 8.1e12 and "this GPU has no TF32" in shape.peak.source


def test_an_mfu_above_one_is_worded_by_the_peak_s_source():
    datasheet = peaks.beyond_peak("datasheet: a100 fp32 plan, dense")
    assert "datasheet peak cannot be beaten" in datasheet and "busy" not in datasheet
    measured = peaks.beyond_peak("measured: CPU float32 matmul")
    assert "measured while the machine was busy" in measured
