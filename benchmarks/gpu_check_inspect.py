"""Inspection checks on a CUDA machine (prints one JSON object; exit 1 when a check fails).

    python benchmarks/gpu_check_inspect.py

- mlp/small under bf16 and fp16: parameter, gradient and AdamW bytes equal the hand arithmetic;
  autocast weight copies in the plan's dtype; allocator peak, reserved and gap rows present;
  fp16 has the CUDA grad scaler's 8 bytes; the inspection time.
- transformer/tiny under bf16: ``layer_norm`` and ``cross_entropy`` are kept in fp32 by CUDA
  autocast and the matmuls ran in bf16; every forward row's ``autocast_list`` is the policy
  measured on fake CUDA tensors.
- The policy measured on fake CUDA tensors against real CUDA kernels: calls whose policy the
  documented lists got wrong (rms_norm, logsumexp, huber_loss, vector_norm, nearest interpolate,
  SDPA, einsum) and a few they got right, each run under CUDA autocast from fp32 and from bf16
  inputs; the output dtype must be what the measured policy says.
- A model too big for a capped memory fraction raises DeviceOutOfMemoryError with the run's
  message, and memory is released.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from typing import Any

import torch
from torch import nn

from precision_nb.core.resolution import resolve_precision
from precision_nb.engine.inspect import memory as mem
from precision_nb.engine.inspect import run_inspection
from precision_nb.engine.results import DeviceOutOfMemoryError


def _bytes(data: Any, kind: str) -> dict[str, int]:
    return {r["dtype"]: r["bytes"] for r in data.memory if r["kind"] == kind}


def check_memory(mode: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    data = run_inspection("mlp", preset="small", precision=mode, device="cuda")
    seconds = time.perf_counter() - t0
    exact = all(
        r["bytes"] == r["expected_bytes"]
        for r in data.memory
        if r["kind"] in (mem.PARAMS, mem.GRADS, mem.OPTIM, mem.COPIES, mem.SCALER)
    )
    kinds = {r["kind"] for r in data.memory}
    short = {"bf16": "bf16", "fp16": "fp16"}[mode]
    ok = (
        exact
        and short in _bytes(data, mem.COPIES)
        and {mem.ALLOC_PEAK, mem.ALLOC_RESERVED, mem.GAP} <= kinds
        and (mode != "fp16" or sum(_bytes(data, mem.SCALER).values()) == 8)
    )
    return {
        "ok": ok,
        "seconds": seconds,
        "memory": data.memory,
        "flags": [str(f) for f in data.flags],
    }


def check_policy() -> dict[str, Any]:
    data = run_inspection("transformer", preset="tiny", precision="bf16", device="cuda")
    verdicts = {(r["call"], r["verdict"]) for r in data.ops if r["phase"] == "forward"}
    ok = ("layer_norm", "kept in fp32 by autocast") in verdicts and (
        "linear",
        "ran in bf16",
    ) in verdicts
    return {"ok": ok, "verdicts": sorted(verdicts), "summary": data.summary}


def _policy_cases() -> dict[str, tuple[Any, tuple[Any, ...]]]:
    import torch.nn.functional as F

    def x(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda")

    return {
        "rms_norm": (lambda a: F.rms_norm(a, (8,)), (x(4, 8),)),
        "logsumexp": (lambda a: torch.logsumexp(a, -1), (x(4, 8),)),
        "huber_loss": (F.huber_loss, (x(4, 3), x(4, 3))),
        "linalg_vector_norm": (torch.linalg.vector_norm, (x(4, 8),)),
        "interpolate": (
            lambda a: F.interpolate(a, scale_factor=2.0, mode="nearest"),
            (x(1, 2, 3, 3),),
        ),
        "scaled_dot_product_attention": (
            F.scaled_dot_product_attention,
            (x(1, 2, 8, 16), x(1, 2, 8, 16), x(1, 2, 8, 16)),
        ),
        "einsum": (lambda a, b: torch.einsum("ij,jk->ik", a, b), (x(4, 8), x(8, 4))),
        "layer_norm": (lambda a: F.layer_norm(a, (8,)), (x(4, 8),)),
        "softmax": (lambda a: F.softmax(a, -1), (x(4, 8),)),
        "linear": (F.linear, (x(4, 8), x(3, 8))),
        "gelu": (F.gelu, (x(4, 8),)),
    }


def check_measured_policy() -> dict[str, Any]:
    """Each call traced under real CUDA autocast: every computing row's output dtype must be the
    one its measured policy (the trace's ``autocast_list``) says, from fp32 and from bf16 inputs."""
    from precision_nb.engine.inspect.op_trace import OpTracer

    plan = resolve_precision("bf16", "cuda")
    allowed = {"lower precision": {"bf16"}, "float32": {"fp32"}}
    rows, ok = [], True
    for call, (fn, args) in _policy_cases().items():
        for dtype in (torch.float32, torch.bfloat16):
            tracer = OpTracer(set())
            with tracer, torch.autocast("cuda", dtype=torch.bfloat16):
                fn(*(a.to(dtype) for a in args))
            for r in tracer.rows(plan):
                if r["kind"] not in ("compute", "in-place") or r["output"] not in ("fp32", "bf16"):
                    continue
                inputs = set(r["inputs"].split("+")) & {"fp32", "bf16"}
                good = r["output"] in allowed.get(r["autocast_list"], inputs)
                ok = ok and good
                rows.append({"call": call, **{k: r[k] for k in ("op", "inputs", "output")},
                             "policy": r["autocast_list"], "ok": good})  # fmt: skip
    data = run_inspection("transformer", preset="tiny", precision="bf16", device="cuda")
    wrong = [
        r
        for r in data.ops
        if r["phase"] == "forward"
        and r["kind"] in ("compute", "in-place")
        and r["output"] in ("fp32", "bf16")
        and r["output"] not in allowed.get(r["autocast_list"], set(r["inputs"].split("+")))
    ]
    return {"ok": ok and not wrong, "rows": rows, "transformer_rows_against_policy": wrong}


def check_oom() -> dict[str, Any]:
    torch.cuda.set_per_process_memory_fraction(0.02)
    try:
        model = nn.Sequential(*(nn.Linear(8192, 8192) for _ in range(8)))
        run_inspection(
            model,
            [(torch.randn(64, 8192),)],
            "bf16",
            device="cuda",
            loss_fn=lambda o: o.float().sum(),
        )
        return {"ok": False, "detail": "no OOM"}
    except DeviceOutOfMemoryError as exc:
        return {"ok": "out of memory on cuda" in str(exc), "message": str(exc)}
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()


def main() -> int:
    results: dict[str, Any] = {}
    for name, fn in (
        ("bf16", lambda: check_memory("bf16")),
        ("fp16", lambda: check_memory("fp16")),
        ("policy", check_policy),
        ("measured policy", check_measured_policy),
        ("oom", check_oom),
    ):
        try:
            results[name] = fn()
        except Exception:  # noqa: BLE001 - a crashing check is reported failed, with its traceback
            results[name] = {"ok": False, "error": traceback.format_exc()}
    print(json.dumps(results, indent=1, default=str))
    return 0 if all(r.get("ok") for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
