"""Shared fixtures: torch's hardware queries patched to pose as other machines, and hand-built
run records that follow the engine's record schema (docs/architecture.md).

The test extras' set-up (torchvision's C ops beside a CPU build of torch, no model-hub downloads)
is :mod:`thirdparty_setup`, imported first.
"""

from __future__ import annotations

import math
import os
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import thirdparty_setup  # noqa: F401  (first: lets transformers and torchvision import)
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Patch torch.cuda.is_available, torch.cuda.is_bf16_supported, torch.backends.mps.

    ``bf16`` is True, False or an exception instance that the BF16 query raises.
    """

    def apply(cuda: bool = False, bf16: bool | BaseException = False, mps: bool = False) -> None:
        def is_bf16_supported(including_emulation: bool = True) -> bool:
            if isinstance(bf16, BaseException):
                raise bf16
            return bool(bf16)

        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)

    return apply


def build_records(
    label: str,
    mode: str,
    *,
    steps: int = 10,
    step_time_s: float = 0.01,
    batch_size: int = 32,
    tokens: int | None = None,
    loss0: float = 2.0,
    use_scaler: bool = False,
    skipped_at: tuple[int, ...] = (),
    memory_kind: str = "host_rss",
    peak_bytes: int = 100 * 2**20,
    mfu: float | None = 0.02,
    fused: bool = True,
    device: str = "cpu",
) -> list[dict[str, Any]]:
    """One record per step; loss decays, the scale halves at each skipped step."""
    records = []
    scale = 2.0**16 if use_scaler else None
    skipped_total = 0
    for step in range(1, steps + 1):
        skipped = 1 if step in skipped_at else 0
        skipped_total += skipped
        if scale is not None and skipped:
            scale /= 2
        dtype = {"fp32": "torch.float32", "bf16": "torch.bfloat16", "fp16": "torch.float16"}[mode]
        flops = 1e9 / step_time_s
        records.append(
            {
                "run": label,
                "step": step,
                "loss": loss0 * math.exp(-0.1 * step),
                "loss_scale": scale,
                "skipped": skipped,
                "skipped_total": skipped_total,
                "lr": 1e-3,
                "step_time_s": step_time_s * (3.0 if step == 1 else 1.0),
                "samples_per_s": batch_size / step_time_s,
                "tokens_per_s": None if tokens is None else tokens / step_time_s,
                "flops_per_s": flops,
                "mfu": mfu,
                "mfu_peak_source": None if mfu is None else "measured CPU matmul peak",
                "memory_kind": memory_kind,
                "memory_bytes": peak_bytes - 2**20,
                "memory_peak_bytes": peak_bytes - (steps - step) * 2**10,
                "memory_reserved_bytes": None,
                "elapsed_s": step * step_time_s,
                "mode": mode,
                "dtype": dtype,
                "use_scaler": use_scaler,
                "autocast_enabled": mode != "fp32",
                "device_type": device.split(":")[0],
                "device": device,
                "fused_adamw": fused,
                "loss_scale_lab": False,
            }
        )
    return records


@pytest.fixture
def make_records() -> Callable[..., list[dict[str, Any]]]:
    return build_records


@pytest.fixture
def three_plans() -> list[dict[str, Any]]:
    """fp32 at 10 ms/step, bf16 at 5 ms/step, fp16 (scaled, two skips) at 8 ms/step."""
    return (
        build_records("fp32", "fp32", step_time_s=0.010, peak_bytes=120 * 2**20)
        + build_records("bf16", "bf16", step_time_s=0.005, loss0=2.1, peak_bytes=80 * 2**20)
        + build_records(
            "fp16",
            "fp16",
            step_time_s=0.008,
            loss0=2.2,
            use_scaler=True,
            skipped_at=(3, 7),
            peak_bytes=90 * 2**20,
        )
    )


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """``full_disk(".png")``: every ``Path.write_bytes`` of a file with that suffix fails with
    ENOSPC, as on a full disk (other writes go through)."""
    import errno

    real = Path.write_bytes

    def apply(suffix: str) -> None:
        def full(self: Path, data: bytes) -> int:
            if self.suffix == suffix:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(self, data)

        monkeypatch.setattr(Path, "write_bytes", full)

    return apply


def build_result(label: str, mode: str, **kwargs: Any) -> Any:
    """A ``RunResult`` for ``label`` whose records are :func:`build_records`'s (keyword arguments
    of both are accepted: ``explanation``, ``optimizer_outcome``, ``scale_history``, ``events``,
    ``workload`` go to the result, the rest to the records)."""
    from precision_nb.core.plan import PrecisionPlan
    from precision_nb.engine.results import RunResult

    fields = {"explanation", "optimizer_outcome", "scale_history", "events", "workload"}
    own = {k: kwargs.pop(k) for k in list(kwargs) if k in fields}
    records = build_records(label, mode, **kwargs)
    last = records[-1]
    return RunResult(
        label=label,
        plan=PrecisionPlan.from_dict(last),
        explanation=own.pop("explanation", None),
        optimizer_outcome=own.pop("optimizer_outcome", None),
        device=last["device"],
        records=records,
        steps=last["step"],
        skipped_total=last["skipped_total"],
        final_loss=last["loss"],
        **own,
    )


@pytest.fixture
def make_result() -> Callable[..., Any]:
    return build_result


@pytest.fixture
def make_comparison() -> Callable[..., Any]:
    """``make_comparison(fp32=result, bf16=result, drift=..., figures=..., ...)``: a
    ``Comparison`` of the given results (keyword names that are Comparison fields set those;
    ``figures`` / ``drift`` / ``failures``: label -> what the measurement found, see
    :func:`typed_outcomes.typed_outcome`)."""
    from dataclasses import fields

    from typed_outcomes import typed_outcome

    from precision_nb.engine.compare import Comparison

    names = {f.name for f in fields(Comparison)}

    def make(**kwargs: Any) -> Any:
        found = kwargs.pop("figures", None) or {}
        drift = kwargs.pop("drift", None) or {}
        failed = kwargs.pop("failures", None) or {}
        own = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
        out = Comparison(results=dict(kwargs), **own)
        for label in dict.fromkeys([*found, *drift, *failed]):
            row = {**found.get(label, {}), "drift": drift.get(label), "failed": failed.get(label)}
            out.outcomes[label] = typed_outcome(label, out.results.get(label), row)
        return out

    return make


@pytest.fixture
def setup_dry_run() -> Callable[..., tuple[list[list[str]], str]]:
    """Run ``scripts/setup.sh ARGS`` with ``PRECISION_NB_DRY_RUN=1`` and extra environment.

    Returns the commands it would run (argument lists) and its stderr, or ``"exit N"`` when it
    failed.
    """

    def run(*args: str, **env: str) -> tuple[list[list[str]], str]:
        done = subprocess.run(
            ["bash", "scripts/setup.sh", *args],
            cwd=ROOT,
            env={**os.environ, "PRECISION_NB_DRY_RUN": "1", **env},
            capture_output=True,
            text=True,
            check=False,
        )
        lines = done.stdout.splitlines()
        commands = [shlex.split(line[2:]) for line in lines if line.startswith("+ ")]
        return commands, done.stderr if done.returncode == 0 else f"exit {done.returncode}"

    return run


def rows_against_policy(rows: list[dict[str, Any]], device_type: str = "cpu") -> list[dict]:
    """The forward rows of an op trace whose output dtype is not the one autocast's policy (read
    from torch: ``policy_of``) says: low precision -> the low dtype, fp32 -> fp32, widest input ->
    fp32 when an input is fp32, no kernel -> one of its inputs' dtypes. Empty when all agree."""
    from precision_nb.engine.inspect.policy import policy_of

    wrong = []
    for r in rows:
        if not r["phase"].startswith("forward") or r["kind"] not in ("compute", "in-place"):
            continue
        if r["output"] not in ("fp32", "bf16", "fp16"):
            continue
        listed = policy_of(device_type, r["call"], r["op"])
        inputs = set(r["inputs"].split("+")) & {"fp32", "bf16", "fp16"} or {"fp32"}
        low = inputs - {"fp32"} or {"bf16", "fp16"}
        allowed = {
            "lower precision": low,
            "float32": {"fp32"},
            "widest input type": {"fp32"} if "fp32" in inputs else inputs,
        }.get(listed, inputs)
        if r["output"] not in allowed or r.get("autocast_list", listed) != listed:
            wrong.append(r)
    return wrong


@pytest.fixture
def against_policy() -> Callable[..., list[dict]]:
    return rows_against_policy
