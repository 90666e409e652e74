"""``profile()``: validate a request, run the comparison, write the report folder atomically.

What ``precision-nb profile`` runs; the folder's files come from
:mod:`precision_nb.views.report.html`.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from precision_nb.views.report.hints import Hint, hints
from precision_nb.views.report.html import OUTPUT_FILES, write_report
from precision_nb.views.report.tables import results_of, summary

__all__ = [
    "DEFAULT_STEPS",
    "PROFILE_POINTS",
    "ProfileOutput",
    "ProfileRequest",
    "parse_modes",
    "profile",
    "run_profile",
    "validate_request",
]

log = logging.getLogger(__name__)

#: Optimizer steps per plan when ``profile`` is not given ``steps``.
DEFAULT_STEPS = 10
#: About this many logged points per plan in a profile.
PROFILE_POINTS = 25


@dataclass(frozen=True)
class ProfileRequest:
    """A validated ``profile`` request (every field checked before anything runs)."""

    workload: str
    preset: str
    modes: tuple[str, ...]
    device: str
    steps: int | None
    accumulation: int
    fused: bool | None
    loss_scale_lab: bool
    out: Path


@dataclass(frozen=True)
class ProfileOutput:
    """What :func:`profile` produced: the folder, its files, the comparison, summary and hints."""

    out_dir: Path
    files: dict[str, Path]
    comparison: Any
    summary: Any
    hints: tuple[Hint, ...]


def parse_modes(value: str | Sequence[str]) -> tuple[str, ...]:
    """``"fp32,bf16"`` or a sequence -> normalised, de-duplicated modes (ValueError if empty)."""
    from precision_nb.core.plan import normalize_precision

    items = value.split(",") if isinstance(value, str) else list(value)
    names = [str(item).strip() for item in items if str(item).strip()]
    if not names:
        raise ValueError(
            f"compare: invalid value {value!r}: give at least one precision request, "
            "comma-separated; allowed: auto, fp32, bf16, fp16"
        )
    modes = [normalize_precision(name, field="compare", allow_auto=True) for name in names]
    return tuple(dict.fromkeys(modes))


def validate_request(
    *,
    workload: str | None = None,
    preset: str | None = None,
    modes: str | Sequence[str] = ("fp32", "bf16", "fp16"),
    device: str = "auto",
    steps: int | None = None,
    accumulation: int = 1,
    fused: bool | None = None,
    loss_scale_lab: bool = False,
    out: str | Path = "profile-out",
) -> ProfileRequest:
    """Check every profile argument; ``ValueError`` (or ``RuntimeError`` for absent hardware)."""
    from precision_nb.core.device import resolve_device
    from precision_nb.engine import workloads as wl

    workload = wl.DEFAULT_WORKLOAD if workload is None else workload
    preset = wl.DEFAULT_PRESET if preset is None else preset
    wl.get_workload(workload, preset)  # raises ValueError listing the known names
    if steps is not None and (isinstance(steps, bool) or int(steps) != steps or steps <= 0):
        raise ValueError(f"steps: invalid value {steps!r}; allowed: an integer >= 1")
    if isinstance(accumulation, bool) or int(accumulation) != accumulation or accumulation <= 0:
        raise ValueError(f"accumulation: invalid value {accumulation!r}; allowed: an integer >= 1")
    if fused not in (None, True, False):
        raise ValueError(f"fused: invalid value {fused!r}; allowed: None (auto), True, False")
    resolve_device(device)  # RuntimeError for absent CUDA/MPS, ValueError for a bad string
    out_path = Path(out).expanduser()
    check_output_folder(out_path)
    return ProfileRequest(
        workload=str(workload),
        preset=str(preset).strip().lower(),
        modes=parse_modes(modes),
        device=str(device),
        steps=None if steps is None else int(steps),
        accumulation=int(accumulation),
        fused=fused,
        loss_scale_lab=bool(loss_scale_lab),
        out=out_path,
    )


def check_output_folder(out: Path) -> None:
    """``ValueError`` unless ``out`` can become (or already is) a writable folder."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"out: {str(out)!r} exists and is not a folder; give a folder path")
    if out.is_dir() and not os.access(out, os.W_OK | os.X_OK):
        raise ValueError(f"out: folder {str(out)!r} is not writable")
    parent = _existing_ancestor(out.absolute().parent)
    if not parent.is_dir():
        raise ValueError(f"out: {str(out)!r} cannot be created: {str(parent)!r} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"out: {str(out)!r} cannot be created: {str(parent)!r} is not writable")


def _existing_ancestor(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _staging_folder(out: Path) -> Path:
    """A fresh temporary folder beside ``out`` (same file system, so moving it is atomic)."""
    parent = out.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=parent))
    except OSError as err:
        raise ValueError(f"out: cannot write next to {str(out)!r}: {err.strerror}") from err
    # mkdtemp makes the folder private (0o700); the report folder gets the usual permissions.
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)
    return staging


def _move_into_place(staging: Path, out: Path) -> dict[str, Path]:
    if not out.exists():
        staging.rename(out)
    else:
        for item in staging.iterdir():
            os.replace(item, out / item.name)
        staging.rmdir()
    return {name: out / name for name in OUTPUT_FILES if (out / name).exists()}


def profile(
    *,
    workload: str | None = None,
    preset: str | None = None,
    modes: str | Sequence[str] = ("fp32", "bf16", "fp16"),
    device: str = "auto",
    steps: int | None = None,
    accumulation: int = 1,
    fused: bool | None = None,
    loss_scale_lab: bool = False,
    out: str | Path = "profile-out",
    progress: bool = True,
    settings: Mapping[str, Any] | None = None,
) -> ProfileOutput:
    """Run a comparison of ``modes`` on a built-in workload and write the report folder.

    Everything is validated first (``ValueError`` / ``RuntimeError``, nothing written); see
    :func:`run_profile` for how the folder is written.
    """
    request = validate_request(
        workload=workload,
        preset=preset,
        modes=modes,
        device=device,
        steps=steps,
        accumulation=accumulation,
        fused=fused,
        loss_scale_lab=loss_scale_lab,
        out=out,
    )
    return run_profile(request, progress=progress, settings=settings)


def run_profile(
    request: ProfileRequest,
    *,
    progress: bool = True,
    settings: Mapping[str, Any] | None = None,
) -> ProfileOutput:
    """Run a validated request and write its folder.

    The files are written into a temporary folder beside ``request.out`` and moved into place only
    when all of them are done, so a failed run leaves ``out`` as it was. Files of an earlier
    report in ``out`` are replaced; other files there are left alone.
    """
    staging = _staging_folder(request.out)
    try:
        comparison = run_comparison(request, progress=progress)
        shown = {
            "requested plans": ", ".join(request.modes),
            "device requested": request.device,
            "gradient accumulation": request.accumulation,
            "fused AdamW": {None: "auto (probe)", True: "true", False: "false"}[request.fused],
            "loss-scale lab": request.loss_scale_lab,
            **_machine(comparison),
            **(settings or {}),
        }
        write_report(comparison, staging, settings=shown)
        files = _move_into_place(staging, request.out)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return ProfileOutput(
        out_dir=request.out,
        files=files,
        comparison=comparison,
        summary=summary(comparison),
        hints=tuple(hints(comparison)),
    )


def _machine(comparison: Any) -> dict[str, Any]:
    """What the numbers were measured on: device used, torch build, CPU vector capability."""
    import torch

    devices = {str(getattr(r, "device", "")) for r in results_of(comparison).values()}
    return {
        "device used": ", ".join(sorted(d for d in devices if d)),
        "torch": torch.__version__,
        "CPU capability (torch)": torch.backends.cpu.get_cpu_capability(),
    }


def run_comparison(request: ProfileRequest, *, progress: bool = True) -> Any:
    """Call the engine's ``compare()`` for a validated request.

    Logs about 25 points per plan (``log_every``) so the figures have curves while host syncs
    stay rare.
    """
    from precision_nb.core.optim import OptimizerConfig
    from precision_nb.engine.compare import compare

    options: dict[str, Any] = dict(accumulation=request.accumulation, progress=progress)
    if request.steps is not None:
        options["steps"] = request.steps
        options["log_every"] = max(1, request.steps // PROFILE_POINTS)
    else:
        options["steps"] = DEFAULT_STEPS
        options["log_every"] = max(1, DEFAULT_STEPS // PROFILE_POINTS)
    return compare(
        request.modes,
        request.workload,
        request.preset,
        device=request.device,
        optimizer=OptimizerConfig(fused=request.fused),
        loss_scale_lab=request.loss_scale_lab,
        **options,
    )
