"""What-if hardware for the low-precision formats: native or emulated, datasheet peaks, roofline.

Which GPU runs which format natively, and a roofline estimate of what each GEMM layer could gain
there. Estimates, never measurements.

Presets (:data:`WHATIF_GPUS`): H100 and H200 (compute capability 9.0: per-tensor fp8 GEMMs,
no block-scaled ones) and B200 and GB200 (10.0: fp8, MXFP8, MXFP4 and NVFP4 GEMMs, the
block-scaled MMA instructions of Blackwell). The compute-capability rule is
:func:`runs_natively`; the peaks and bandwidths are NVIDIA's datasheet figures
(``engine.metrics.GPU_PEAK_TFLOPS`` and ``GPU_MEMORY_TB_PER_S``), labelled as such. A format a GPU
lacks is emulated (torchao dequantises to bf16 and runs a bf16 GEMM): slower, never faster, so it
gets no speedup estimate.

The roofline model (:func:`layer_estimate`) follows torchao's float8/MX roofline
(``torchao/testing/training/roofline_utils.py``, unfused): a linear layer's training step runs
three GEMMs (forward M x K x N, input gradient M x N x K, weight gradient K x M x N), each taking
the longer of its FLOPs at the datasheet peak and its bytes (inputs in the format, 1-byte scales
per block for MX / NVFP4, a bf16 output) at the datasheet bandwidth, at least a kernel launch
(2 us); casting adds memory-bound kernels per cast tensor (:func:`cast_s`).
Assumed: the datasheet peaks are reached (torchao additionally scales by achievable fractions,
0.78 of the FLOP peak and 0.92 of the bandwidth, measured on an H100, which changes both sides),
nothing is fused, the rest of the step (attention, norms, the optimizer) is not counted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch

from precision_nb.core.capabilities import FP8_MIN_COMPUTE_CAPABILITY
from precision_nb.core.validate import short_repr
from precision_nb.engine.metrics import GPU_MEMORY_TB_PER_S, GPU_PEAK_TFLOPS, gpu_table_key
from precision_nb.engine.numerics.gemm_shapes import SHAPE_RULES, family_of, padding

#: Block-scaled GEMMs (MXFP8, MXFP4, NVFP4): Blackwell's block-scaled MMA, compute capability 10.0.
BLOCK_MIN_COMPUTE_CAPABILITY = (10, 0)
#: torchao's roofline floor per kernel (KERNEL_LAUNCH_OVERHEAD_SEC).
LAUNCH_S = 2e-6

ASSUMPTIONS = (
    "roofline estimate from the GEMM shapes, not measured: the three GEMMs of a training step "
    "at the datasheet FLOP peak or datasheet memory bandwidth, whichever is slower (at least "
    f"{LAUNCH_S * 1e6:g} us per kernel), plus unfused memory-bound cast kernels, as torchao's "
    "float8/MX roofline models them; datasheet peaks assumed reached; attention, norms and the "
    "optimizer not counted"
)


@dataclass(frozen=True)
class WhatIfGpu:
    """A GPU to explore without having it (every figure a datasheet value)."""

    name: str
    device_name: str
    compute_capability: tuple[int, int]

    @property
    def row(self) -> str:
        key = gpu_table_key(self.device_name)
        assert key is not None, self.device_name
        return key


WHATIF_GPUS: Mapping[str, WhatIfGpu] = MappingProxyType(
    {
        "h100": WhatIfGpu("h100", "NVIDIA H100 80GB HBM3", (9, 0)),
        "h200": WhatIfGpu("h200", "NVIDIA H200", (9, 0)),
        "b200": WhatIfGpu("b200", "NVIDIA B200", (10, 0)),
        "gb200": WhatIfGpu("gb200", "NVIDIA GB200", (10, 0)),
    }
)


def whatif_gpu(value: Any, field: str = "hardware") -> WhatIfGpu:
    """A preset by name (any case)."""
    key = value.strip().lower() if isinstance(value, str) else None
    if key not in WHATIF_GPUS:
        raise ValueError(
            f"{field}: invalid value {short_repr(value)}; allowed: "
            + ", ".join(repr(n) for n in WHATIF_GPUS)
        )
    return WHATIF_GPUS[key]


def runs_natively(fmt: str, compute_capability: tuple[int, int] | None) -> bool:
    """Whether a GPU of this compute capability has GEMMs for ``fmt`` (fp8_*: 8.9, Ada and
    Hopper; MX and NVFP4: 10.0, Blackwell). ``None`` (no CUDA GPU): nothing does."""
    if compute_capability is None:
        return False
    need = FP8_MIN_COMPUTE_CAPABILITY if family_of(fmt) == "fp8" else BLOCK_MIN_COMPUTE_CAPABILITY
    return tuple(compute_capability) >= tuple(need)


def _dtype_key(fmt: str) -> str:
    if fmt in ("mxfp4", "nvfp4"):
        return "float4_e2m1fn_x2"
    return "float8_e5m2" if fmt.endswith("e5m2") else "float8_e4m3fn"


def support_rows(gpus: Sequence[WhatIfGpu], formats: Sequence[str]) -> list[dict[str, Any]]:
    """Per GPU and format: native or emulated, with the datasheet peaks it would run at."""
    rows = []
    for gpu in gpus:
        peaks = GPU_PEAK_TFLOPS.get(gpu.row, {})
        for fmt in formats:
            native = runs_natively(fmt, gpu.compute_capability)
            cc = ".".join(map(str, gpu.compute_capability))
            rows.append(
                {
                    "hardware": gpu.name,
                    "device_name": gpu.device_name,
                    "compute_capability": cc,
                    "format": fmt,
                    "runs": "native" if native else "emulated",
                    "datasheet_tflops": peaks.get(_dtype_key(fmt)) if native else None,
                    "datasheet_bf16_tflops": peaks.get("bfloat16"),
                    "datasheet_memory_tb_s": GPU_MEMORY_TB_PER_S.get(gpu.row),
                }
            )
    return rows


def this_machine() -> dict[str, Any]:
    """This machine's GPU as torch reports it (or that there is none)."""
    if not torch.cuda.is_available():
        return {"device_name": None, "compute_capability": None, "text": "no CUDA GPU here"}
    name = torch.cuda.get_device_name(0)
    cc = tuple(torch.cuda.get_device_capability(0))
    return {"device_name": name, "compute_capability": cc, "text": f"{name}, cc {cc[0]}.{cc[1]}"}


# ----------------------------------------------------------------------------------- roofline


def _gemm_s(m: int, k: int, n: int, peak: float, bw: float, in_bytes: float, block: int) -> float:
    reads = m * k + k * n
    if block:
        reads += reads // block  # one 1-byte scale per block of each input
    bytes_rw = reads * in_bytes + m * n * 2  # bf16 output
    return max(2 * m * k * n / peak, bytes_rw / bw, LAUNCH_S)


def step_gemm_s(
    m: int, k: int, n: int, peak: float, bw: float, in_bytes: float = 2, block: int = 0
) -> float:
    """Seconds of the forward, input-gradient and weight-gradient GEMMs of one layer."""
    gemms = ((m, k, n), (m, n, k), (k, m, n))
    return sum(_gemm_s(*mkn, peak, bw, in_bytes, block) for mkn in gemms)


def cast_s(m: int, k: int, n: int, fmt: str, bw: float) -> float:
    """Seconds of the memory-bound cast kernels of one layer's step (unfused, as torchao's
    roofline: per-tensor fp8 reads each tensor for its amax, then casts it; the weight twice,
    the others once to both layouts; MX / NVFP4 cast each tensor twice, once per dimension)."""

    def kernel(nbytes: float) -> float:
        return max(nbytes / bw, LAUNCH_S)

    if family_of(fmt) == "fp8":
        total = 0.0
        for numel, role in ((m * k, "input"), (k * n, "weight"), (m * n, "grad_output")):
            total += kernel(2 * numel) + kernel(0)  # amax read; the amax reduction's 2nd stage
            if role == "weight":
                total += 2 * kernel(3 * numel)  # bf16 read, fp8 write, once per layout
            else:
                total += kernel(4 * numel)  # bf16 read, fp8 written in both layouts
        return total
    elem = 0.5 if fmt in ("mxfp4", "nvfp4") else 1.0
    return sum(2 * kernel((2 + elem) * numel) for numel in (m * k, k * n, m * n))


def layer_estimate(m: int, k: int, n: int, fmt: str, gpu: WhatIfGpu) -> dict[str, Any]:
    """The roofline estimate of one layer's GEMMs in ``fmt`` on ``gpu`` against bf16 (shapes
    padded to the format's multiple when they need it; none when the GPU emulates ``fmt``)."""
    peaks = GPU_PEAK_TFLOPS[gpu.row]
    bw = GPU_MEMORY_TB_PER_S[gpu.row] * 1e12
    bf16 = step_gemm_s(m, k, n, peaks["bfloat16"] * 1e12, bw)
    out: dict[str, Any] = {"hardware": gpu.name, "format": fmt, "bf16_s": bf16}
    if not runs_natively(fmt, gpu.compute_capability):
        reason = "emulated: no such GEMM on this GPU (dequantised to bf16, not faster)"
        return out | {"runs": "emulated", "speedup_estimate": None, "note": reason}
    family = family_of(fmt)
    b = SHAPE_RULES[family]
    mp, kp, np_ = m + padding(m, b), k + padding(k, b), n + padding(n, b)
    in_bytes = 0.5 if fmt in ("mxfp4", "nvfp4") else 1.0
    block = 0 if family == "fp8" else b
    gemm = step_gemm_s(mp, kp, np_, peaks[_dtype_key(fmt)] * 1e12, bw, in_bytes, block)
    cast = cast_s(mp, kp, np_, fmt, bw)
    padded = (mp, kp, np_) != (m, k, n)
    return out | {
        "runs": "native",
        "gemm_s": gemm,
        "cast_s": cast,
        "speedup_estimate": bf16 / (gemm + cast),
        "note": f"padded to {mp} x {kp} x {np_}" if padded else "",
    }


def estimate_rows(
    shapes: Sequence[Mapping[str, Any]], formats: Sequence[str], gpus: Sequence[WhatIfGpu]
) -> list[dict[str, Any]]:
    """Per traced GEMM layer, format and GPU: :func:`layer_estimate` (grouped convolutions
    counted as ``groups`` GEMMs of their per-group shape)."""
    rows = []
    for s in shapes:
        for gpu in gpus:
            for fmt in formats:
                est = layer_estimate(s["M"], s["K"], s["N"], fmt, gpu)
                for key in ("bf16_s", "gemm_s", "cast_s"):
                    if key in est:
                        est[key] *= s["groups"]
                rows.append({"layer": s["layer"], "M": s["M"], "K": s["K"], "N": s["N"], **est})
    return rows


def total_speedup(rows: Sequence[Mapping[str, Any]], layers: Sequence[str] | None = None) -> Any:
    """The estimate over several layers (``layers``: those in the format; default all native
    rows): their bf16 GEMM time over their time in the format; None when none runs natively."""
    chosen = [
        r for r in rows if r.get("runs") == "native" and (layers is None or r["layer"] in layers)
    ]
    spent = sum(r["gemm_s"] + r["cast_s"] for r in chosen)
    return sum(r["bf16_s"] for r in chosen) / spent if spent else None
