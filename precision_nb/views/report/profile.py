"""``profile()``: validate a request, run the comparison, write the report folder atomically.

What ``precision-nb profile`` runs; the folder's files come from
:mod:`precision_nb.views.report.html`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from precision_nb.core import validate
from precision_nb.views.report import folder
from precision_nb.views.report.folder import check_output_folder
from precision_nb.views.report.hints import Hint, hints
from precision_nb.views.report.html import OUTPUT_FILES, write_report
from precision_nb.views.report.tables import results_of, summary

__all__ = [
    "DEFAULT_STEPS",
    "PROFILE_POINTS",
    "ProfileInterrupted",
    "ProfileOutput",
    "ProfileRequest",
    "ReportWriteError",
    "check_output_folder",
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
            f"compare: invalid value {validate.short_repr(value)}: give at least one precision "
            "request, comma-separated; allowed: auto, fp32, bf16, fp16"
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
    from precision_nb.engine.train_config import MAX_STEPS

    workload = wl.DEFAULT_WORKLOAD if workload is None else workload
    preset = wl.DEFAULT_PRESET if preset is None else preset
    wl.get_workload(workload, preset)  # raises ValueError listing the known names
    if steps is not None:
        validate.positive_int("steps", steps, MAX_STEPS)
    validate.positive_int("accumulation", accumulation)
    if fused is not None:
        validate.boolean("fused", fused)  # None: auto
    validate.boolean("loss_scale_lab", loss_scale_lab)
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


class ProfileInterrupted(KeyboardInterrupt):
    """The profile was interrupted (Ctrl-C or ``stop``); the output folder was left as it was."""


class ReportWriteError(OSError):
    """The report could not be written (e.g. a full disk); the output folder was left as it was."""


def run_profile(
    request: ProfileRequest,
    *,
    progress: bool = True,
    settings: Mapping[str, Any] | None = None,
    stop: Any = None,
) -> ProfileOutput:
    """Run a validated request and write its folder.

    ``stop`` (anything with ``is_set()``) ends the comparison between steps. An interrupted
    comparison (``stop`` or Ctrl-C) raises :class:`ProfileInterrupted` and writes nothing. The
    files are staged inside ``request.out`` and moved into place only when all of them are written
    (:mod:`precision_nb.views.report.folder`), so a failed, interrupted or disk-full run leaves
    ``out`` as it was (:class:`ReportWriteError` says what could not be written and the free
    space). Files of an earlier report in ``out`` are replaced; other files are left alone.
    """
    comparison = run_comparison(request, progress=progress, stop=stop)
    if getattr(comparison, "stopped", False):
        raise ProfileInterrupted(f"interrupted; {str(request.out)!r} was left as it was")
    shown = {
        "requested plans": ", ".join(request.modes),
        "device requested": request.device,
        "gradient accumulation": request.accumulation,
        "fused AdamW": {None: "auto (probe)", True: "true", False: "false"}[request.fused],
        "loss-scale lab": request.loss_scale_lab,
        **_machine(comparison),
        **(settings or {}),
    }
    staging, created = folder.staging_folder(request.out)
    committed = False
    try:
        write_report(comparison, staging, settings=shown)
        names = folder.commit(staging, request.out)
        committed = True
    except OSError as err:
        message = folder.describe_write_error(err, request.out)
        raise ReportWriteError(
            err.errno, f"{message}; {str(request.out)!r} was left as it was"
        ) from err
    finally:
        if not committed:
            folder.discard(staging, request.out, created)
    files = {name: request.out / name for name in OUTPUT_FILES if name in names}
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


def run_comparison(request: ProfileRequest, *, progress: bool = True, stop: Any = None) -> Any:
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
        stop=stop,
        **options,
    )
