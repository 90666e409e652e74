"""Memory by kind and dtype from one instrumented step: exact against hand arithmetic."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from precision_nb.core.plan import PrecisionConfig
from precision_nb.engine.entry import fit
from precision_nb.engine.inspect import memory as mem
from precision_nb.engine.inspect import run_inspection
from precision_nb.engine.precision import ScalerInternals

LINEAR_PARAMS = 1024 * 1024 + 1024


def _by_kind(data, kind):
    return {r["dtype"]: r["bytes"] for r in data.memory if r["kind"] == kind}


def _expected(data, kind):
    return {r["dtype"]: r["expected_bytes"] for r in data.memory if r["kind"] == kind}


def _mse(out, y):
    return F.mse_loss(out, y)


def _linear_inspection(precision):
    torch.manual_seed(0)
    model = nn.Linear(1024, 1024)
    batch = (torch.randn(4, 1024), torch.randn(4, 1024))
    return run_inspection(model, [batch], precision, loss_fn=_mse, device="cpu")


def test_linear_parameters_gradients_and_adamw_state_are_exact_for_every_plan():
    requests = {
        "fp32": ("fp32", None),
        "bf16": ("bf16", torch.bfloat16),
        "fp16": ("fp32", None),  # fp16 on CPU resolves to fp32 (the spec's matrix)
        "fp16 lab": ("fp16", torch.float16),
    }
    for request, (mode, copy_dtype) in requests.items():
        cfg = PrecisionConfig("fp16", loss_scale_lab=True) if request == "fp16 lab" else request
        data = _linear_inspection(cfg)
        assert data.plan.mode == mode, request
        assert _by_kind(data, mem.PARAMS) == {"fp32": 4 * LINEAR_PARAMS}, request
        assert _by_kind(data, mem.GRADS) == {"fp32": 4 * LINEAR_PARAMS}, request
        # exp_avg + exp_avg_sq per parameter, plus one fp32 scalar step per parameter tensor
        assert _by_kind(data, mem.OPTIM) == {"fp32": 2 * 4 * LINEAR_PARAMS + 2 * 4}, request
        for kind in (mem.PARAMS, mem.GRADS, mem.OPTIM):
            assert _expected(data, kind) == _by_kind(data, kind), (request, kind)
        copies = _by_kind(data, mem.COPIES)
        if copy_dtype is None:
            assert copies == {}, request
        else:
            short = {torch.bfloat16: "bf16", torch.float16: "fp16"}[copy_dtype]
            assert copies == {short: 2 * LINEAR_PARAMS}, request
            assert _expected(data, mem.COPIES) == copies, request
        scaler = _by_kind(data, mem.SCALER)
        assert scaler == ({"fp32": 4, "int32": 4} if request == "fp16 lab" else {}), request


def test_bf16_activations_of_a_linear_stack_are_about_half_of_fp32():
    torch.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(128, 128), nn.ReLU()) for _ in range(3)]
    model = nn.Sequential(*layers, nn.Linear(128, 1))
    batch = (torch.randn(32, 128),)
    totals = {}
    for mode in ("fp32", "bf16"):
        data = run_inspection(model, [batch], mode, loss_fn=lambda o: o.float().pow(2).mean())
        acts = _by_kind(data, mem.ACTS)
        totals[mode] = sum(acts.values())
        if mode == "bf16":
            assert acts["bf16"] > acts.get("fp32", 0) * 10
    assert 0.45 < totals["bf16"] / totals["fp32"] < 0.55


def test_an_op_autocast_keeps_in_fp32_keeps_fp32_activations():
    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.hidden = nn.Sequential(nn.Linear(64, 64), nn.ReLU())
            self.lin = nn.Linear(64, 64)

        def forward(self, x, target):
            # on autocast's fp32 list on both CPU and CUDA: its inputs are cast up and saved
            return F.binary_cross_entropy_with_logits(self.lin(self.hidden(x)), target)

    batch = {"x": torch.randn(16, 64), "target": torch.rand(16, 64)}
    data = run_inspection(Head(), [batch], "bf16")
    kept = [r for r in data.ops if r["verdict"] == "kept in fp32 by autocast"]
    assert [r["op"] for r in kept] == ["binary_cross_entropy_with_logits"]
    assert all(r["output"] == "fp32" for r in kept)
    acts = _by_kind(data, mem.ACTS)
    assert acts["fp32"] >= 16 * 64 * 4  # the fp32 logits the loss saved
    assert acts["bf16"] == 16 * 64 * 2  # the ReLU output, saved in bf16


def test_views_of_one_storage_are_counted_once():
    class Halves(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 64)

        def forward(self, x):
            h = self.lin(x)
            return (h[:, :32] * h[:, 32:]).sum()  # mul saves two views of h

    data = run_inspection(Halves(), [(torch.randn(5, 8),)], "fp32")
    assert _by_kind(data, mem.ACTS) == {"fp32": 5 * 64 * 4}
    assert _by_kind(data, mem.INPUTS) == {"fp32": 5 * 8 * 4}


def test_process_memory_is_labelled_and_not_counted_on_cpu():
    data = _linear_inspection("fp32")
    rss = [r for r in data.memory if r["kind"] == mem.RSS]
    assert len(rss) == 1 and rss[0]["bytes"] > 0 and rss[0]["counted"] is False
    assert data.model_bytes() == sum(
        r["bytes"] for r in data.memory if r["kind"] != mem.RSS and r["bytes"]
    )


def test_grad_scaler_fields_read_by_the_inspection_exist_in_this_torch():
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(torch.ones(()))  # creates _scale and _growth_tracker lazily
    rows = mem.scaler_rows(ScalerInternals.tensors(scaler))
    assert {r["dtype"]: r["bytes"] for r in rows} == {"fp32": 4, "int32": 4}


def test_training_is_identical_with_and_without_inspection(make_model, batches):
    plain = make_model(0)
    inspected = make_model(0)
    before = [p.detach().clone() for p in inspected.parameters()]
    torch.manual_seed(123)
    run_inspection(inspected, batches, "bf16")
    after_rng = torch.rand(3)
    torch.manual_seed(123)
    assert torch.equal(after_rng, torch.rand(3))  # the RNG stream was not advanced
    for p, b in zip(inspected.parameters(), before, strict=True):
        assert torch.equal(p, b) and p.grad is None
    runs = [
        fit(m, batches, precision="bf16", steps=3, log_every=1, progress=False, measure_peak=False)
        for m in (plain, inspected)
    ]
    assert [r["loss"] for r in runs[0].records] == [r["loss"] for r in runs[1].records]
    for p, q in zip(plain.parameters(), inspected.parameters(), strict=True):
        assert torch.equal(p, q)


def test_cuda_allocator_rows_sit_beside_the_sum_and_name_the_gap(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 1_000 + 700)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 4_096)
    kinds = [
        mem.row(mem.PARAMS, torch.float32, 400, 400, "m"),
        mem.row(mem.ACTS, torch.bfloat16, 200, None, "m"),
    ]
    rows = {r["kind"]: r for r in mem.device_rows(torch.device("cuda"), kinds, base=1_000)}
    assert rows[mem.ALLOC_PEAK]["bytes"] == 700  # the step's peak, less the baseline
    assert rows[mem.ALLOC_RESERVED]["bytes"] == 4_096
    assert rows[mem.GAP]["bytes"] == 700 - 600
    assert not any(r["counted"] for r in rows.values())


class _Attention(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, 2, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0].float().pow(2).mean()


def test_weight_copies_expected_from_the_parameters_autocast_cast_once_each():
    data = run_inspection(_Attention(), [(torch.randn(2, 5, 16),)], "bf16")
    # in_proj_weight (3E x E) and in_proj_bias go through linear, out_proj is a Linear: all cast
    by_hand = 2 * ((3 * 16 * 16 + 3 * 16) + (16 * 16 + 16))
    assert _by_kind(data, mem.COPIES) == {"bf16": by_hand}
    assert _expected(data, mem.COPIES) == {"bf16": by_hand}


def test_a_weight_cast_twice_shows_as_more_copies_than_parameters_cast():
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
                return (self.lin(x) + self.lin(x)).float().sum()

    data = run_inspection(Twice(), [(torch.randn(2, 8),)], "bf16")
    assert _expected(data, mem.COPIES) == {"bf16": 2 * (8 * 8 + 8)}  # each parameter once
    assert _by_kind(data, mem.COPIES) == {"bf16": 2 * 2 * (8 * 8 + 8)}  # two casts of each


def test_without_a_trace_the_weight_copies_are_a_labelled_module_estimate():
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    model.append(_Attention(4))
    rows = mem.expected_rows(model, _bf16_plan(), "expected only")
    copies = [r for r in rows if r["kind"] == mem.COPIES]
    assert copies[0]["expected_bytes"] == 2 * ((4 * 4 + 4) + (3 * 4 * 4 + 3 * 4) + (4 * 4 + 4))
    assert "estimate, not a trace" in copies[0]["method"] and copies[0]["bytes"] is None


def _bf16_plan():
    from precision_nb.core.resolution import resolve_precision

    return resolve_precision("bf16", "cpu")


def test_a_copy_at_the_address_of_a_freed_copy_is_another_copy():
    # Autocast without its cache frees a weight copy after its op; the allocator may give the
    # next copy the same address (it did, now and then, depending on the heap's history).
    # Built here for certain: two storages over one buffer, the first gone before the second.
    from precision_nb.engine.inspect.op_trace import OpTracer

    weight = nn.Parameter(torch.randn(4, 4))
    tracer = OpTracer({weight.untyped_storage().data_ptr()})
    buffer = bytearray(4 * 4 * 2)
    addresses = set()
    for _ in range(2):
        copy = torch.frombuffer(buffer, dtype=torch.bfloat16).view(4, 4)
        addresses.add(copy.untyped_storage().data_ptr())
        cast = torch.ops.aten._to_copy.default
        tracer.record(cast, (weight.detach(),), {"dtype": torch.bfloat16}, copy)
        assert tracer.copy_of(copy.untyped_storage()) == "parameter"
        del copy
    assert len(addresses) == 1  # one address, two storages
    assert tracer.weight_copy_sizes() == [(torch.bfloat16, 32), (torch.bfloat16, 32)]
    unrelated = torch.frombuffer(buffer, dtype=torch.float32)  # a later storage there
    assert tracer.copy_of(unrelated.untyped_storage()) is None
