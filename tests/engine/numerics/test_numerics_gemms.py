"""GEMM shapes from the traced step, the shape rules, which layers stay in bf16, the what-if
hardware and its roofline estimate (checked against torchao's own roofline model)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("torchao", reason="the test extra installs torchao (the blocks extra)")

from torchao.prototype.mx_formats.config import ScaleCalculationMode  # noqa: E402
from torchao.prototype.mx_formats.mx_tensor import MXTensor  # noqa: E402

from precision_nb.engine.numerics import hardware as H  # noqa: E402
from precision_nb.engine.numerics.analysis import analyze  # noqa: E402
from precision_nb.engine.numerics.gemm_shapes import (  # noqa: E402
    GemmTracer,
    qualifying_share,
    shape_rows,
    untraced_layers,
)


class Conv1D(nn.Module):
    """Hugging Face's GPT-2 projection: ``addmm`` with a (K, N) weight."""

    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(k, n) * 0.1)
        self.bias = nn.Parameter(torch.zeros(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (*x.shape[:-1], self.weight.shape[1])
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(shape)


class Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(4, 8, 3, padding=1, groups=2)  # implicit GEMM 50 x 18 x 4, twice
        self.proj = Conv1D(8, 48)
        self.twice = nn.Linear(48, 48)  # called twice
        self.head = nn.Parameter(torch.randn(48, 10) * 0.1)  # x @ W

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x).flatten(2).transpose(1, 2)  # (2, 25, 8)
        h = self.twice(self.twice(torch.relu(self.proj(h))))
        return (h @ self.head).mean(1)


def test_every_gemm_kind_is_traced_with_its_shape():
    model = Mixed()
    tracer = GemmTracer(model)
    with tracer:
        model(torch.randn(2, 4, 5, 5))
    rows = {r["layer"]: r for r in shape_rows(tracer.gemms)}
    assert list(rows) == ["conv", "proj", "twice", "head"]
    got = {k: (r["op"], r["M"], r["K"], r["N"], r["groups"], r["calls"]) for k, r in rows.items()}
    assert got == {
        "conv": ("conv2d", 2 * 5 * 5, 2 * 9, 4, 2, 1),
        "proj": ("addmm", 50, 8, 48, 1, 1),
        "twice": ("linear", 100, 48, 48, 1, 2),  # M adds up over the calls
        "head": ("matmul", 50, 48, 10, 1, 1),
    }
    # a training step: forward, input gradient, weight gradient: 3 x 2 M K N per group
    flops = {"conv": 6 * 50 * 18 * 4 * 2, "proj": 6 * 50 * 8 * 48, "twice": 6 * 100 * 48 * 48,
             "head": 6 * 50 * 48 * 10}  # fmt: skip
    assert {k: r["step_flops"] for k, r in rows.items()} == flops
    # K and N multiples of 16 (fp8, NVFP4): proj (8 x 48) no, conv (18 x 4) no, head (N 10) no
    assert [k for k, r in rows.items() if r["fp8_qualifies"]] == ["twice"]
    assert rows["proj"]["fp8_pad_K"] == 8 and rows["head"]["mx_pad_N"] == 22
    assert rows["conv"]["mx_pad_K"] == 14 and rows["conv"]["mx_pad_M"] == 14
    total = sum(flops.values())
    assert qualifying_share(list(rows.values()), "fp8") == pytest.approx(flops["twice"] / total)
    assert qualifying_share(list(rows.values()), "mx") == 0  # 48 is no multiple of 32


def test_multihead_attention_projections_are_listed_as_not_traced():
    model = nn.Sequential(nn.Linear(8, 16))
    attn = nn.MultiheadAttention(16, 2, batch_first=True)
    both = nn.ModuleDict({"lin": model, "attn": attn})
    tracer = GemmTracer(both)
    with tracer:
        h = model(torch.randn(2, 3, 8))
        attn(h, h, h)
    assert list(tracer.gemms) == ["lin.0"]
    assert untraced_layers(both, tracer.gemms) == ["attn"]


def test_a_layers_cast_statistics_are_those_of_its_real_operands():
    """The input, weight and output gradient the analysis casts are the layer's own: the output
    gradient of ``sum(out * g)`` is ``g``."""
    torch.manual_seed(1)
    model = nn.Linear(64, 32)
    x = torch.randn(16, 64)
    g = torch.randn(16, 32)
    res = analyze(model, [x], loss_fn=lambda out: (out * g).sum(), formats=["mxfp8_e4m3"])

    def rel(t: torch.Tensor) -> float:
        t = t.detach()
        padded = torch.nn.functional.pad(t, (0, (-t.shape[1]) % 32))  # 16 -> 32
        mx = MXTensor.to_mx(padded.contiguous(), torch.float8_e4m3fn, 32,
                            scaling_mode=ScaleCalculationMode.RCEIL)  # fmt: skip
        back = mx.dequantize(torch.float32)[:, : t.shape[1]]
        return float((back.double() - t.double()).norm() / t.double().norm())

    rows = {(r["tensor"], r["blocks_along"]): r for r in res.blocks if r["status"] == "ok"}
    assert rows[("input", "K")]["rel_error"] == pytest.approx(rel(x), rel=1e-12)
    assert rows[("input", "M")]["rel_error"] == pytest.approx(rel(x.t()), rel=1e-12)
    assert rows[("weight", "K")]["rel_error"] == pytest.approx(rel(model.weight), rel=1e-12)
    assert rows[("weight", "N")]["rel_error"] == pytest.approx(rel(model.weight.t()), rel=1e-12)
    assert rows[("output_grad", "N")]["rel_error"] == pytest.approx(rel(g), rel=1e-12)
    assert rows[("output_grad", "M")]["rel_error"] == pytest.approx(rel(g.t()), rel=1e-12)
    bf16 = float((x.bfloat16().double() - x.double()).norm() / x.double().norm())
    assert rows[("input", "K")]["bf16_rel_error"] == pytest.approx(bf16, rel=1e-9)
    not_cast = [r for r in res.blocks if r["tensor"] == "weight_grad"]
    assert len(not_cast) == 1 and not_cast[0]["status"] == "not cast"
    assert res.gemms[0]["M"] == 16 and res.blocks_info["reason"] is None


def test_keep_in_bf16_rule_first_last_outlier_and_shape():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64),
        nn.ReLU(), nn.Linear(64, 40), nn.ReLU(), nn.Linear(40, 64), nn.ReLU(), nn.Linear(64, 3),
    )  # fmt: skip
    with torch.no_grad():  # each 32-block of layer 4's rows: one 1.0, 31 values 0.06 that fp4
        # flushes (0.06 / 2^-2 = 0.24, below e2m1's midpoint 0.25): a third of the norm lost
        w = model[4].weight
        w.copy_(0.06 * torch.sign(torch.randn_like(w)))
        w[:, ::32] = 1.0
    x = torch.randn(32, 64)
    res = analyze(model, [(x, torch.zeros(32, dtype=torch.long))], formats=["mxfp4"])
    keep = res.blocks_info["keep"]["mxfp4"]
    reasons = {k["layer"]: " ".join(k["reasons"]) for k in keep["keep"]}
    assert "first GEMM layer" in reasons["0"] and "last GEMM layer" in reasons["10"]
    assert "x median" in reasons["4"]
    assert "K=64, N=40" in reasons["6"] and "K=40" in reasons["8"]
    assert keep["low_precision_layers"] == ["2"]
    flops = {r["layer"]: r["step_flops"] for r in res.gemms}
    assert keep["low_precision_flop_share"] == pytest.approx(flops["2"] / sum(flops.values()))


def test_a_model_without_gemm_layers_gets_an_empty_table_and_the_reason():
    class Scale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x * self.w).sum()

    res = analyze(Scale(), [torch.randn(3, 4)], formats=["nvfp4", "fp16"])
    assert res.blocks == [] and res.gemms == []
    assert "no linear or convolution layer" in res.blocks_info["reason"]
    assert any(f.data.get("finding") == "no_gemm" for f in res.findings)
    assert res.gradients  # the rest of the analysis ran


def test_which_gpu_runs_which_format_natively():
    assert H.runs_natively("fp8_e4m3", (9, 0)) and not H.runs_natively("mxfp8_e4m3", (9, 0))
    assert H.runs_natively("nvfp4", (10, 0)) and H.runs_natively("mxfp4", (10, 0))
    assert not H.runs_natively("fp8_e5m2", (8, 0)) and not H.runs_natively("fp8_e4m3", None)
    rows = H.support_rows([H.whatif_gpu("H100"), H.whatif_gpu("b200")], ["fp8_e4m3", "nvfp4"])
    runs = {(r["hardware"], r["format"]): (r["runs"], r["datasheet_tflops"]) for r in rows}
    assert runs == {
        ("h100", "fp8_e4m3"): ("native", 1979.0),
        ("h100", "nvfp4"): ("emulated", None),
        ("b200", "fp8_e4m3"): ("native", 4500.0),
        ("b200", "nvfp4"): ("native", 9000.0),
    }
    with pytest.raises(ValueError, match="hardware: invalid value 'b100'; allowed: 'h100'"):
        H.whatif_gpu("b100")
    here = H.this_machine()  # read from torch
    if not torch.cuda.is_available():
        assert here["compute_capability"] is None and here["text"] == "no CUDA GPU here"
    else:
        assert here["compute_capability"] == tuple(torch.cuda.get_device_capability(0))


@pytest.mark.parametrize(
    ("fmt", "dtype", "f8", "mx"),
    [
        ("fp8_e4m3", torch.float8_e4m3fn, "tensorwise", None),
        ("mxfp8_e4m3", torch.float8_e4m3fn, None, "mxfp8_cublas"),
        ("mxfp4", torch.float4_e2m1fn_x2, None, "mxfp4_cutlass"),
    ],
)
@pytest.mark.parametrize("shape", [(8192, 4096, 4096), (512, 768, 3072), (64, 256, 16)])
def test_roofline_equals_torchaos_roofline_model_with_the_same_figures(fmt, dtype, f8, mx, shape):
    roof = pytest.importorskip("torchao.testing.training.roofline_utils")
    gpu = H.whatif_gpu("b200")
    peaks = H.GPU_PEAK_TFLOPS[gpu.row]
    name = "precision_nb datasheet B200"
    specs = {
        "bf16_peak_tops": peaks["bfloat16"] * 1e12,
        "fp8_peak_tops": peaks["float8_e4m3fn"] * 1e12,
        "fp4_peak_tops": peaks["float4_e2m1fn_x2"] * 1e12,
        "peak_mem_bw_bytes_sec": H.GPU_MEMORY_TB_PER_S[gpu.row] * 1e12,
        "pct_achievable_gemm_tops": 1.0,  # the estimate assumes the datasheet peaks
        "pct_achievable_mem_bw": 1.0,
    }
    m, k, n = shape
    try:
        roof.gpu_name_to_specs[name] = specs
        bf16 = float(roof.get_gemm_time_sympy(m, k, n, torch.bfloat16, None, None, name))
        low = float(roof.get_gemm_time_sympy(m, k, n, dtype, f8, mx, name))
        cast = float(roof.get_float8_mem_sympy(m, k, n, f8, mx, False, name))
    finally:
        del roof.gpu_name_to_specs[name]
    est = H.layer_estimate(m, k, n, fmt, gpu)
    assert est["bf16_s"] == pytest.approx(bf16, rel=1e-12)
    assert est["gemm_s"] == pytest.approx(low, rel=1e-12)
    assert est["cast_s"] == pytest.approx(cast, rel=1e-12)
    assert est["speedup_estimate"] == pytest.approx(bf16 / (low + cast), rel=1e-12)


def test_roofline_pads_what_needs_it_and_gives_no_speedup_for_emulation():
    b200, h100 = H.whatif_gpu("b200"), H.whatif_gpu("h100")
    est = H.layer_estimate(4096, 4096, 1000, "mxfp8_e4m3", b200)
    assert est["note"] == "padded to 4096 x 4096 x 1024" and est["speedup_estimate"] > 1
    assert H.layer_estimate(4096, 4096, 4096, "mxfp8_e4m3", h100)["speedup_estimate"] is None
    tiny = H.layer_estimate(16, 16, 16, "fp8_e4m3", h100)  # launch-bound: casts only add time
    assert tiny["speedup_estimate"] < 1
    rows = H.estimate_rows(
        [{"layer": "a", "M": 8192, "K": 8192, "N": 8192, "groups": 1}], ["nvfp4"], [b200, h100]
    )
    assert [r["runs"] for r in rows] == ["native", "emulated"]
    assert H.total_speedup(rows) == pytest.approx(rows[0]["speedup_estimate"])
