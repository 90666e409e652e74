"""Engine checks on a CUDA machine; ``run_checks()`` is called by ``benchmarks/gpu_check.py``.

    python benchmarks/gpu_check_engine.py      # prints the JSON on its own

- No per-microbatch host sync: short fits (bf16, and fp16 with the grad scaler and fused AdamW)
  run with ``torch.cuda.set_sync_debug_mode("error")`` on for every attempt and off only at
  logging time (``TrainConfig(cuda_sync_debug="error")``); any hidden sync raises.
- fp16: a provoked overflow is skipped by the real CUDA GradScaler and backs the scale off.
- Records on CUDA: allocator memory, MFU against the datasheet peak, tokens/s for the LM.
- Comparison fp32 / bf16 / fp16 with drift; checkpoint round trip of the CUDA scaler state.
- A real out-of-memory (memory fraction capped) becomes a clear error and memory is released.
- What torch itself does: GradScaler.step with plain (non-fused) AdamW reads found_inf on the host
  once per optimizer step; reported, not counted as a failure of the engine.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from precision_nb.core.optim import OptimizerConfig
from precision_nb.engine.compare import compare
from precision_nb.engine.entry import fit
from precision_nb.engine.results import RECORD_KEYS, DeviceOutOfMemoryError
from precision_nb.engine.trainer import TrainConfig, Trainer
from precision_nb.engine.workloads import get_workload

FUSED = OptimizerConfig(fused=True)


def _cfg(**kw: Any) -> TrainConfig:
    kw.setdefault("progress", False)
    kw.setdefault("log_every", 10)
    return TrainConfig(**kw)


def _summary(result: Any) -> dict[str, Any]:
    last = result.records[-1]
    skip = {"run", "dtype", "use_scaler", "autocast_enabled", "device_type", "device"}
    keys = [k for k in RECORD_KEYS if k not in skip]
    return {k: last[k] for k in keys} | {"steps": result.steps, "attempts": result.attempts}


def _run(name: str, preset: str, device: str, mode: str, **train: Any) -> Any:
    opt = train.pop("optimizer", FUSED)
    return fit(
        name, preset=preset, device=device, precision=mode, optimizer=opt, train=_cfg(**train)
    )


def check_sync_free_bf16(device: str) -> dict[str, Any]:
    r = _run(
        "mlp",
        "small",
        device,
        "bf16",
        steps=30,
        accumulation=4,
        grad_clip=1.0,
        cuda_sync_debug="error",
    )
    s = _summary(r)
    ok = r.steps == 30 and s["memory_kind"] == "cuda_allocated" and s["mfu"] is not None
    return {"ok": ok, **s}


def check_sync_free_fp16_scaler(device: str) -> dict[str, Any]:
    r = _run(
        "mlp",
        "small",
        device,
        "fp16",
        steps=30,
        accumulation=2,
        grad_clip=1.0,
        overflow_at_steps=(5,),
        cuda_sync_debug="error",
    )
    hist = r.scale_history
    skip = [h for h in hist if h["skipped"]]
    backoff = len(skip) == 1 and hist[skip[0]["attempt"]]["loss_scale"] == skip[0]["loss_scale"] / 2
    ok = r.steps == 30 and r.attempts == 31 and backoff and r.records[-1]["fused_adamw"]
    return {
        "ok": ok,
        "skipped_attempts": [h["attempt"] for h in skip],
        "backoff": backoff,
        **_summary(r),
    }


def check_plain_adamw_scaler_sync(device: str) -> dict[str, Any]:
    """torch's GradScaler.step with non-fused AdamW syncs (found_inf.item()) once per step."""
    try:
        _run(
            "mlp",
            "tiny",
            device,
            "fp16",
            optimizer=OptimizerConfig(fused=False),
            steps=3,
            cuda_sync_debug="error",
        )
        return {"ok": True, "syncs_per_step": False}
    except RuntimeError as exc:
        return {"ok": True, "syncs_per_step": True, "torch_says": str(exc).splitlines()[0]}


def check_lm(device: str) -> dict[str, Any]:
    r = _run("transformer", "small", device, "bf16", steps=20, cuda_sync_debug="error")
    s = _summary(r)
    return {"ok": r.steps == 20 and (s["tokens_per_s"] or 0) > 0, **s}


def check_compare(device: str) -> dict[str, Any]:
    c = compare(
        ("fp32", "bf16", "fp16"),
        "mlp",
        "small",
        device=device,
        optimizer=FUSED,
        train=_cfg(steps=20),
    )
    ok = set(c.results) == {"fp32", "bf16", "fp16"} and c.drift["fp32"]["param_rel_diff"] == 0
    return {
        "ok": ok,
        "drift": c.drift,
        "merged": c.merged,
        "step_time_s": {k: r.records[-1]["step_time_s"] for k, r in c.results.items()},
    }


def check_checkpoint(device: str) -> dict[str, Any]:
    wl = get_workload("mlp", "tiny")
    batches = wl.make_batches(device)
    cfg = _cfg(steps=6, init_scale=1024.0, overflow_at_steps=(2,))
    t = Trainer(wl.make_model(), batches, device=device, precision="fp16", train=cfg)
    t.fit()
    scale = t.scale_value()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.pt"
        t.save_checkpoint(path)
        fresh = Trainer(
            wl.make_model(), batches, device=device, precision="fp16", train=_cfg(steps=2)
        )
        fresh.load_checkpoint(path)
        r = fresh.fit()
    first = r.scale_history[0]["loss_scale"]
    return {
        "ok": first == scale and fresh.steps_done == 8,
        "saved_scale": scale,
        "restored_scale": first,
    }


def check_oom(device: str) -> dict[str, Any]:
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.set_per_process_memory_fraction(0.002)  # ~280 MB on a 141 GB card
    try:
        fit("mlp", preset="large", device=device, train=_cfg(steps=2))
        return {"ok": False, "detail": "no OOM with the memory fraction capped"}
    except DeviceOutOfMemoryError as exc:
        after = torch.cuda.memory_allocated()
        ok = "batch size" in str(exc) and exc.result is not None
        return {"ok": ok, "message": str(exc), "allocated_before": before, "allocated_after": after}
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()


CHECKS = {
    "sync_free_bf16": check_sync_free_bf16,
    "sync_free_fp16_scaler": check_sync_free_fp16_scaler,
    "plain_adamw_scaler_sync": check_plain_adamw_scaler_sync,
    "lm_small_bf16": check_lm,
    "compare_mlp_small": check_compare,
    "checkpoint_scaler": check_checkpoint,
    "oom": check_oom,
}


def run_checks(device: str = "cuda") -> dict[str, Any]:
    """Run every check; returns ``{"ok": bool, "checks": {name: {...}}, "seconds": float}``."""
    if device == "cuda" and not torch.cuda.is_available():
        return {"ok": True, "skipped": True, "reason": "no CUDA device"}
    t0 = time.perf_counter()
    out: dict[str, Any] = {}
    for name, check in CHECKS.items():
        if name == "oom" and device != "cuda":
            continue
        try:
            out[name] = check(device)
        except Exception as exc:  # noqa: BLE001 - every failure is reported in the JSON
            out[name] = {"ok": False, "error": repr(exc), "trace": traceback.format_exc()[-2000:]}
    return {
        "ok": all(v.get("ok") for v in out.values()),
        "device": torch.cuda.get_device_name() if device == "cuda" else device,
        "checks": out,
        "seconds": round(time.perf_counter() - t0, 1),
    }


if __name__ == "__main__":
    report = run_checks(sys.argv[1] if len(sys.argv) > 1 else "cuda")
    print(json.dumps(report, indent=2, default=str))
    sys.exit(0 if report.get("ok") else 1)
