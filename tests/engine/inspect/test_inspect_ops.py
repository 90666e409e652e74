"""The op dtype trace: verdicts, flags, awkward models that must not crash it, simulated devices."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from precision_nb.engine.inspect import autocast_probe, op_trace, policy, run_inspection
from precision_nb.engine.results import DeviceOutOfMemoryError


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))


def _batch():
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(16, 32, generator=gen), torch.randint(0, 4, (16,), generator=gen))


def _rows(data, **match):
    return [r for r in data.ops if all(r[k] == v for k, v in match.items())]


def test_bf16_plan_runs_matmuls_in_bf16_and_records_the_casts():
    data = run_inspection(_mlp(), [_batch()], "bf16")
    fwd = _rows(data, phase="forward", op="addmm")
    assert fwd and all(r["output"] == "bf16" and r["verdict"] == "ran in bf16" for r in fwd)
    assert sum(r["count"] for r in fwd) == 2
    weights = _rows(data, phase="forward", kind="weight cast", call="linear")
    assert sum(r["count"] for r in weights) == 4  # two weights, two biases
    assert sum(r["cast_bytes"] for r in weights) == 2 * (32 * 64 + 64 + 64 * 4 + 4)
    inputs = _rows(data, phase="forward", kind="cast", call="linear")
    assert sum(r["count"] for r in inputs) == 1  # the first layer's fp32 input
    assert sum(r["cast_bytes"] for r in inputs) == 2 * 16 * 32
    matmul_share = sum(r["flops_share"] for r in data.ops if r["op"] in op_trace.MATMUL_OPS)
    assert matmul_share == pytest.approx(1.0)
    verdicts = {s["verdict"] for s in data.summary}
    assert {"ran in bf16", "cast inserted", "kept in fp32 by autocast"} <= verdicts
    assert not [f for f in data.flags if f.kind == "fp32_matmul"]


def test_fp32_plan_has_no_casts_and_says_why_ops_are_fp32():
    data = run_inspection(_mlp(), [_batch()], "fp32")
    assert not _rows(data, kind="weight cast") and not _rows(data, kind="cast", call="linear")
    assert {r["verdict"] for r in _rows(data, phase="forward", kind="compute")} == {
        op_trace.NO_AUTOCAST
    }
    assert data.flags == []


def test_a_large_matmul_kept_in_fp32_inside_a_bf16_plan_is_flagged():
    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.small = nn.Linear(32, 8)
            self.big = nn.Linear(32, 256)

        def forward(self, x):
            with torch.autocast("cpu", enabled=False):
                y = self.big(x.float())  # the heavy matmul, forced to fp32
            return self.small(x).float().sum() + y.sum()

    data = run_inspection(Mixed(), [(torch.randn(16, 32),)], "bf16")
    found = [f for f in data.flags if f.kind == "fp32_matmul"]
    assert found and found[0].data["op"] == "addmm" and found[0].data["flops_share"] > 0.4
    assert "ran in fp32 under the bf16 plan" in found[0].message
    big = _rows(data, phase="forward", op="addmm", output="fp32")
    assert big[0]["verdict"] == op_trace.FP32_LISTED_LOW  # autocast was switched off there


def test_many_casts_are_flagged():
    class Flipper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            h = self.lin(x)
            for _ in range(12):
                h = h.float().bfloat16()
            return h.float().sum()

    data = run_inspection(Flipper(), [(torch.randn(4, 8),)], "bf16")
    flag = [f for f in data.flags if f.kind == "many_casts"]
    assert flag and flag[0].data["casts"] >= 24


def test_an_op_whose_policy_differs_between_cuda_and_cpu_is_flagged():
    model = nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.Linear(16, 2))
    data = run_inspection(model, [(torch.randn(4, 16), torch.tensor([0, 1, 0, 1]))], "bf16")
    flag = [f for f in data.flags if f.kind == "cross_device_policy"]
    assert [f.data["call"] for f in flag] == ["layer_norm"]
    assert flag[0].data["other"] == "cuda: float32"
    ln = _rows(data, phase="forward", call="layer_norm", op="native_layer_norm")
    assert ln[0]["output"] == "bf16"  # on CPU layer_norm runs in its input's dtype


def test_a_call_on_integers_gets_no_cross_device_flag():
    class Count(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x, mask):
            return self.lin(x).float().mean() + mask.sum() * 0  # sum: fp32 on CUDA, int64 here

    batch = {"x": torch.randn(2, 4), "mask": torch.ones(2, 4, dtype=torch.long)}
    data = run_inspection(Count(), [batch], "bf16")
    assert _rows(data, phase="forward", call="sum", output="int64")
    assert not [f for f in data.flags if f.kind == "cross_device_policy"]


class _Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, sparse):
        ctx.save_for_backward(x, sparse)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        x, _sparse = ctx.saved_tensors
        return 2 * x * grad, None


class _Awkward(nn.Module):
    """Custom autograd Function (saving a sparse tensor), in-place ops, views and no_grad."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        h = _Square.apply(self.lin(x), torch.eye(8).to_sparse())
        h.relu_()
        with torch.no_grad():
            scale = h.detach().abs().mean()
        v = h.view(-1)[:16]
        return (v * v).sum() + 0 * scale


def test_custom_functions_in_place_views_and_no_grad_do_not_crash_the_trace():
    data = run_inspection(_Awkward(), [(torch.randn(4, 8),)], "bf16")
    kinds = {r["kind"] for r in data.ops}
    assert {"compute", "in-place", "view", "weight cast"} <= kinds
    assert _rows(data, op="relu_", kind="in-place")
    assert _rows(data, phase="forward (no_grad)", op="abs")
    assert _rows(data, phase="forward", call="mul", op="mul")  # inside the custom Function
    assert _rows(data, phase="backward", op="mul")  # its Python backward
    assert data.unattributed == [
        {
            "what": "saved tensor",
            "reason": "saved torch.sparse_coo: no ordinary storage to measure",
            "count": 1,
        }
    ]
    assert any(f.kind == "unattributed" for f in data.flags)


def test_a_model_too_big_gets_the_run_out_of_memory_message():
    class Boom(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")

    with pytest.raises(DeviceOutOfMemoryError, match=r"out of memory on cpu with plan bf16"):
        run_inspection(Boom(), [(torch.randn(2, 4),)], "bf16")


def test_a_simulated_device_shows_the_policy_read_from_torch_and_expected_memory_only():
    model = nn.Linear(16, 16)
    data = run_inspection(model, [(torch.randn(2, 16),)], "auto", capabilities="cuda-bf16")
    assert data.simulated and data.plan.mode == "bf16" and data.ops == []
    assert data.flags[0].kind == "simulated" and "not a trace" in data.flags[0].message
    assert all(r["bytes"] is None for r in data.memory)
    params = [r for r in data.memory if r["kind"] == "parameters"]
    assert params[0]["expected_bytes"] == 4 * (16 * 16 + 16)
    assert {r["source"] for r in data.policy} == {policy.SOURCE}
    assert "not a trace: measured" in policy.SOURCE
    rows = {r["op"]: r for r in data.policy}
    assert set(rows) == {q.removeprefix("aten::") for q in autocast_probe.registrations("cuda")}
    assert rows["softmax.int"]["policy"] == policy.FP32
    assert rows["softmax.int"]["documented"] == policy.FP32
    assert rows["linear"]["dtype"] == "bfloat16"
    assert rows["rms_norm"]["policy"] == policy.FP32 and rows["rms_norm"]["documented"] is None
    copies = [r for r in data.memory if r["kind"] == "autocast weight copies"]
    assert copies[0]["expected_bytes"] == 2 * (16 * 16 + 16)
    assert "estimate, not a trace" in copies[0]["method"]


def test_workload_names_are_inspected_like_fit_builds_them():
    torch.manual_seed(7)
    data = run_inspection("mlp", preset="tiny", precision="bf16")
    assert torch.rand(1).item() == pytest.approx(torch.manual_seed(7) and torch.rand(1).item())
    assert data.label == "bf16" and not data.simulated and data.loss is not None


def test_a_model_that_cannot_be_copied_is_refused_and_never_trained_itself():
    import threading

    model = nn.Linear(4, 2)
    model.lock = threading.Lock()  # deepcopy cannot copy a lock
    before = model.weight.detach().clone()
    with pytest.raises(ValueError, match="cannot be copied for inspection"):
        run_inspection(model, [(torch.randn(2, 4), torch.tensor([0, 1]))], "bf16")
    assert torch.equal(model.weight, before) and model.weight.grad is None


def test_views_and_copies_are_not_said_to_have_run_in_low_precision():
    class Heads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            q = self.lin(x).view(2, 3, 2, 4).transpose(1, 2)  # (b, heads, t, d)
            y = (q @ q.transpose(-2, -1)).reshape(2, -1)  # matmul's _unsafe_view, a clone
            return y.float().sum()

    data = run_inspection(Heads(), [(torch.randn(2, 3, 8),)], "bf16")
    moved = [r for r in data.ops if r["op"] in ("_unsafe_view", "clone", "view", "transpose")]
    assert {r["op"] for r in moved} >= {"_unsafe_view", "clone", "view"}
    assert {r["verdict"] for r in moved} == {op_trace.VIEW}
    assert {r["kind"] for r in moved} == {"view", "copy"}
    ran_low = {r["op"] for r in data.ops if r["verdict"] == "ran in bf16"}
    assert {"bmm", "addmm"} <= ran_low and not ran_low & {"_unsafe_view", "clone", "view"}
