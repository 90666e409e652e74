"""Verify the real CUDA rows of the resolution matrix on a CUDA machine and print JSON.

    python benchmarks/gpu_check.py

Checks: auto -> bf16 where ``torch.cuda.is_bf16_supported()`` (else fp16 with a scaler), explicit
bf16 and fp16 rows, a real GradScaler step for fp16, the dtype autocast really computes in
(``verify_autocast``), the spec's fused probe and a fused AdamW built and stepped on the model's
real CUDA parameters, and the "cuda:N" beyond the device count error. True plans: bf16-true and
fp16-true resolved and trained a few steps on CUDA (bf16 / fp16 parameters, finite losses, fused
AdamW), the fp16-true rule's torch facts on CUDA (GradScaler refuses fp16 gradients; plain AdamW
on fp16 state writes NaN/inf where fused does not), and both remedies' optimizers stepping there.
When ``benchmarks/gpu_check_engine.py`` exists, its ``run_checks()`` result is included under
"engine". Without CUDA it prints JSON saying it was skipped and exits 0. Exit code 1 when a
check fails.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import traceback
from pathlib import Path
from typing import Any

import torch

from precision_nb import (
    OptimizerConfig,
    PrecisionConfig,
    autocast_context,
    build_optimizer,
    explain_precision,
    make_grad_scaler,
    read_capabilities,
    resolve_device,
    resolve_precision,
    supports_fused_adamw,
    verify_autocast,
)

HERE = Path(__file__).resolve().parent


class Checks:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def add(self, name: str, ok: bool, detail: Any) -> None:
        self.items.append({"name": name, "ok": bool(ok), "detail": detail})

    @property
    def ok(self) -> bool:
        return all(item["ok"] for item in self.items)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)
    )


def _train_steps(model: torch.nn.Module, optimizer: Any, plan: Any, steps: int = 10) -> list[float]:
    scaler = make_grad_scaler(plan)
    x = torch.randn(64, 256, device="cuda")
    y = torch.randn(64, 256, device="cuda")
    losses = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        with autocast_context(plan, "cuda"):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def check_rows(checks: Checks) -> None:
    supported = bool(torch.cuda.is_bf16_supported())
    caps = read_capabilities()
    checks.add(
        "capabilities",
        caps.cuda_available and caps.cuda_bf16 == ("supported" if supported else "unsupported"),
        caps.to_dict(),
    )
    auto = resolve_precision(PrecisionConfig(), "cuda")
    want = ("bf16", False) if supported else ("fp16", True)
    checks.add("auto row", (auto.mode, auto.use_scaler) == want, auto.to_dict())
    bf16 = resolve_precision(PrecisionConfig("bf16"), "cuda")
    checks.add("explicit bf16 row", bf16.mode == ("bf16" if supported else "fp32"), bf16.to_dict())
    fp16 = resolve_precision(PrecisionConfig("fp16"), "cuda")
    scaler = make_grad_scaler(fp16)
    checks.add(
        "explicit fp16 row -> GradScaler",
        fp16.mode == "fp16"
        and fp16.use_scaler
        and isinstance(scaler, torch.amp.GradScaler)
        and scaler.is_enabled(),
        {"plan": fp16.to_dict(), "scaler": type(scaler).__name__},
    )
    fp32 = resolve_precision(PrecisionConfig("fp32"), "cuda")
    checks.add("explicit fp32 (implied row)", fp32.mode == "fp32", fp32.to_dict())
    for plan in (auto, bf16, fp16, fp32):
        result = verify_autocast(plan, "cuda")
        checks.add(f"verify_autocast {plan.mode}", result.ok, result.to_dict())
    count = torch.cuda.device_count()
    try:
        resolve_device(f"cuda:{count}")
        checks.add("cuda:N beyond count raises", False, "no error")
    except RuntimeError as exc:
        checks.add("cuda:N beyond count raises", True, str(exc))
    explanation = explain_precision(PrecisionConfig(), "cuda")
    checks.add("explanation", explanation.plan == auto, str(explanation))


def check_fused(checks: Checks) -> None:
    probe = supports_fused_adamw("cuda")
    checks.add("supports_fused_adamw('cuda')", probe, probe)
    plan = resolve_precision(PrecisionConfig(), "cuda")
    for fused in (None, True, False):
        model = _model()  # built on CPU, as a user would; build_optimizer moves it first
        optimizer = build_optimizer(model, OptimizerConfig(fused=fused), "cuda")
        outcome = optimizer.precision_nb_fused
        on_cuda = all(p.device.type == "cuda" for p in model.parameters())
        is_fused = bool(optimizer.defaults.get("fused"))
        losses = _train_steps(model, optimizer, plan)
        expected_fused = fused is not False
        checks.add(
            f"build_optimizer fused={fused}",
            on_cuda
            and is_fused == expected_fused
            and outcome.used == expected_fused
            and losses[-1] < losses[0],
            {"outcome": outcome.to_dict(), "fused": is_fused, "losses": losses},
        )


def check_true(checks: Checks) -> None:
    """True plans on CUDA (docs/plans.md#mixed-or-true)."""
    import precision_nb as pnb

    plans = ["fp16-true"] + (["bf16-true"] if torch.cuda.is_bf16_supported() else [])
    plans += [p + r for p in plans if p == "bf16-true" for r in ("+kahan", "+stochastic")]
    for request in plans:
        try:
            result = pnb.fit("mlp", preset="tiny", device="cuda", precision=request, steps=4,
                             log_every=2, progress=False, measure_peak=False)  # fmt: skip
            model_dtype = {r["dtype"] for r in result.records}
            ok = result.plan.true_weights and all(
                torch.isfinite(torch.tensor(r["loss"])) for r in result.records
            )
            detail = {"label": result.label, "dtype": sorted(model_dtype),
                      "fused": result.optimizer_outcome.used,
                      "never_moved": result.records[-1]["weights_never_moved"]}  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - recorded in the JSON, and it fails the run
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        checks.add(f"true plan {request} trains on CUDA", ok, detail)
    x = torch.nn.Parameter(torch.ones(2, dtype=torch.float16, device="cuda"))
    scaler = torch.amp.GradScaler("cuda")
    scaler.scale((x * x).sum()).backward()
    try:
        scaler.unscale_(torch.optim.AdamW([x]))
        refused = False
    except ValueError:
        refused = True
    checks.add("fp16-true: GradScaler('cuda') refuses fp16 gradients", refused, None)
    finite = {}
    for fused in (False, True):
        p = torch.nn.Parameter(torch.ones(4, dtype=torch.float16, device="cuda"))
        p.grad = torch.tensor([0.0, 1e-3, 0.0, 1.0], dtype=torch.float16, device="cuda")
        torch.optim.AdamW([p], lr=1e-3, fused=fused).step()
        finite[fused] = bool(torch.isfinite(p).all())
    checks.add(
        "fp16-true: plain AdamW on fp16 state gives NaN/inf, fused does not",
        finite == {False: False, True: True},
        finite,
    )


def run_engine_checks(path: Path = HERE / "gpu_check_engine.py") -> Any:
    """``run_checks()`` of the engine's GPU check file, or why it was not run."""
    if not path.exists():
        return {"skipped": True, "reason": f"{path.name} not found"}
    spec = importlib.util.spec_from_file_location("gpu_check_engine", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        return module.run_checks()
    except Exception as exc:  # noqa: BLE001 - recorded in the JSON, and it fails the run
        return {
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(),
        }


def main() -> int:
    report: dict[str, Any] = {"torch": torch.__version__}
    if not torch.cuda.is_available():
        report.update(
            skipped=True,
            reason="no CUDA device: torch.cuda.is_available() is False",
            engine={"skipped": True, "reason": "no CUDA device"},
        )
        print(json.dumps(report, indent=2))
        return 0
    report["device"] = torch.cuda.get_device_name(0)
    checks = Checks()
    check_rows(checks)
    check_fused(checks)
    check_true(checks)
    engine = run_engine_checks()
    engine_ok = not isinstance(engine, dict) or engine.get("ok", True) is not False
    report.update(skipped=False, ok=checks.ok and engine_ok, checks=checks.items, engine=engine)
    print(json.dumps(report, indent=2, default=str))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
