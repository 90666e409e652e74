"""Precision resolution: the spec's matrix, and an explanation of every decision it makes.

``resolve_precision(config, device)`` returns the :class:`PrecisionPlan` of the spec's resolution
matrix. ``explain_precision(...)`` returns the same plan with the ordered decisions that produced
it (device, mode, dtype, scaler, autocast, fused AdamW), the matrix row that applied and warnings.
Every fallback of the spec appears as a decision; nothing falls back silently.
"""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from precision_nb.core.capabilities import Capabilities, get_capabilities
from precision_nb.core.device import normalize_device_request, resolve_device_traced
from precision_nb.core.optim import OptimizerConfig, describe_fused
from precision_nb.core.plan import TORCH_DTYPES, PrecisionConfig, PrecisionPlan


@dataclass(frozen=True)
class MatrixRow:
    """One row of the resolution matrix.

    ``source`` is "spec" for the spec's twelve rows, "implied" for cases the spec does not list
    (CUDA explicit fp32; device types other than CUDA/CPU/MPS) and "lab" for the opt-in
    loss-scale lab (CPU fp16 with a CPU GradScaler).
    """

    id: str
    device: str
    request: str
    mode: str
    scaler: bool
    autocast: bool
    source: str = "spec"
    note: str = ""


MATRIX: tuple[MatrixRow, ...] = (
    MatrixRow("cuda-auto-bf16", "CUDA", "auto, BF16 supported", "bf16", False, True),
    MatrixRow("cuda-auto-no-bf16", "CUDA", "auto, BF16 unsupported", "fp16", True, True),
    MatrixRow("cuda-bf16", "CUDA", "explicit bf16, supported", "bf16", False, True),
    MatrixRow(
        "cuda-bf16-unsupported", "CUDA", "explicit bf16, unsupported/error", "fp32", False, False
    ),
    MatrixRow("cuda-fp16", "CUDA", "explicit fp16", "fp16", True, True),
    MatrixRow("cpu-auto", "CPU", "auto", "fp32", False, False),
    MatrixRow("cpu-fp32", "CPU", "explicit fp32", "fp32", False, False),
    MatrixRow("cpu-fp16", "CPU", "explicit fp16", "fp32", False, False),
    MatrixRow("cpu-bf16", "CPU", "explicit bf16", "bf16", False, True),
    MatrixRow("mps-auto", "MPS", "auto", "fp32", False, False),
    MatrixRow("mps-mixed", "MPS", "explicit mixed mode", "fp32", False, False),
    MatrixRow("mps-fp32", "MPS", "explicit fp32", "fp32", False, False),
    MatrixRow(
        "cuda-fp32", "CUDA", "explicit fp32", "fp32", False, False, "implied",
        "not listed by the spec; fp32 is what was asked for",
    ),
    MatrixRow(
        "other-device", "other", "any", "fp32", False, False, "implied",
        "device types outside CUDA/CPU/MPS (e.g. meta, xpu) are not in the spec's matrix",
    ),
    MatrixRow(
        "cpu-fp16-lab", "CPU", "explicit fp16 + loss_scale_lab", "fp16", True, True, "lab",
        "opt-in loss-scale lab: CPU autocast fp16 with torch.amp.GradScaler('cpu')",
    ),
)  # fmt: skip
ROWS: dict[str, MatrixRow] = {row.id: row for row in MATRIX}


@dataclass(frozen=True)
class Decision:
    """One step of resolution: which ``field`` got which ``outcome`` and why.

    ``fallback`` is true when a request was not honoured as asked.
    """

    field: str
    outcome: str
    reason: str
    fallback: bool = False


@dataclass(frozen=True)
class _Resolved:
    plan: PrecisionPlan
    row: MatrixRow
    decisions: tuple[Decision, ...]
    warnings: tuple[str, ...]


def _as_config(config: Any) -> PrecisionConfig:
    if config is None:
        return PrecisionConfig()
    if isinstance(config, PrecisionConfig):
        return config
    if isinstance(config, (str, torch.dtype)):
        return PrecisionConfig(mode=config)
    raise ValueError(
        f"precision: invalid value {config!r} ({type(config).__name__}); expected a "
        "PrecisionConfig, a mode string ('auto', 'fp32', 'bf16', 'fp16') or None"
    )


def _as_device(device: Any, caps: Capabilities) -> torch.device:
    text = normalize_device_request(device)
    if text == "auto":
        return resolve_device_traced("auto", caps)[0]
    return torch.device(text)


def _bf16_text(caps: Capabilities) -> str:
    if caps.cuda_bf16 == "error":
        return f"torch.cuda.is_bf16_supported() raised ({caps.cuda_bf16_error or 'error'})"
    return f"torch.cuda.is_bf16_supported() is {caps.cuda_bf16 == 'supported'}"


def _pick_row(cfg: PrecisionConfig, device: torch.device, caps: Capabilities) -> tuple[str, str]:
    """Return (row id, reason) of the matrix row for this request on this device."""
    req = cfg.requested
    kind = device.type
    if kind == "cuda":
        if req == "auto":
            if caps.cuda_bf16 == "supported":
                return "cuda-auto-bf16", f"auto on CUDA and {_bf16_text(caps)}"
            extra = " (a raising query counts as unsupported)" if caps.cuda_bf16 == "error" else ""
            return "cuda-auto-no-bf16", f"auto on CUDA and {_bf16_text(caps)}{extra}"
        if req == "bf16":
            if caps.cuda_bf16 == "supported":
                return "cuda-bf16", f"explicit bf16 on CUDA and {_bf16_text(caps)}"
            return "cuda-bf16-unsupported", (
                f"explicit bf16 on CUDA but {_bf16_text(caps)}: falls back to fp32"
            )
        if req == "fp16":
            return "cuda-fp16", "explicit fp16 on CUDA"
        return "cuda-fp32", "explicit fp32 on CUDA (a row the spec implies but does not list)"
    if kind == "cpu":
        if req == "auto":
            return "cpu-auto", "auto on CPU stays fp32 for broad custom-module compatibility"
        if req == "fp16":
            if cfg.loss_scale_lab:
                return "cpu-fp16-lab", (
                    "explicit fp16 on CPU with loss_scale_lab=True: an opt-in outside the spec's "
                    "matrix (CPU autocast fp16 with torch.amp.GradScaler('cpu'))"
                )
            return "cpu-fp16", (
                "explicit fp16 on CPU falls back to fp32: the matrix has no CPU GradScaler path "
                "(set loss_scale_lab=True to study CPU fp16 with a CPU GradScaler)"
            )
        if req == "bf16":
            return "cpu-bf16", (
                "explicit bf16 on CPU is kept with CPU autocast; CPU BF16 capability is not "
                "checked (the spec's rule) and depends on the torch build and custom operators "
                "- verify_autocast() checks what is really computed"
            )
        return "cpu-fp32", "explicit fp32 on CPU"
    if kind == "mps":
        if req == "auto":
            return "mps-auto", "auto on MPS stays fp32"
        if req in ("bf16", "fp16"):
            return "mps-mixed", f"explicit {req} on MPS falls back to fp32 (spec: MPS runs fp32)"
        return "mps-fp32", "explicit fp32 on MPS"
    return "other-device", (
        f"device type {kind!r} is not in the spec's matrix (CUDA, CPU, MPS): fp32 without "
        "autocast or scaler is the only choice known to be safe there"
    )


def _resolve(cfg: PrecisionConfig, device: torch.device, caps: Capabilities) -> _Resolved:
    row_id, why = _pick_row(cfg, device, caps)
    row = ROWS[row_id]
    plan = PrecisionPlan(
        mode=row.mode,
        dtype=TORCH_DTYPES[row.mode],
        use_scaler=row.scaler,
        autocast_enabled=row.autocast,
        device_type=device.type,
    )
    warnings: list[str] = []
    req = cfg.requested
    fallback = req not in ("auto", plan.mode)

    # mode
    request_text = ""
    if cfg.mode == "auto" and cfg.dtype is not None:
        request_text = f"mode auto with dtype {cfg.dtype} requests {cfg.dtype}; "
    mode_reason = f"{request_text}{why} (matrix row {row.id!r}, {row.source})"
    decisions = [Decision("mode", plan.mode, mode_reason, fallback)]

    # dtype (the spec's rule: precision.dtype counts only when mode is auto)
    if cfg.dtype is None:
        dtype_reason = "precision.dtype not set"
    elif cfg.mode == "auto":
        dtype_reason = f"precision.dtype={cfg.dtype} used as the request because mode is auto"
    else:
        dtype_reason = (
            f"precision.dtype={cfg.dtype} ignored: mode is {cfg.mode} and dtype counts only "
            "when mode is auto"
        )
    dtype_reason += (
        f"; autocast computes in {plan.dtype}"
        if plan.autocast_enabled
        else ("; parameters and math stay fp32 (no autocast)")
    )
    decisions.append(
        Decision(
            "dtype", str(plan.dtype), dtype_reason, cfg.dtype is not None and cfg.mode != "auto"
        )
    )

    # scaler
    if plan.use_scaler and plan.device_type == "cuda":
        scaler = ("torch.amp.GradScaler('cuda')", "fp16 on CUDA uses dynamic loss scaling")
    elif plan.use_scaler:
        scaler = (
            "torch.amp.GradScaler('cpu')",
            "loss-scale lab: fp16 gradients can underflow, so the loss is scaled (opt-in, "
            "outside the spec's matrix)",
        )
    elif plan.mode == "bf16":
        scaler = ("none", "bf16 has fp32's exponent range, so no loss scaling is needed")
    elif plan.mode == "fp32":
        scaler = ("none", "fp32 needs no loss scaling")
    else:
        scaler = ("none", "the matrix gives no scaler for this row")
    decisions.append(Decision("scaler", *scaler))

    # autocast
    if plan.autocast_enabled:
        autocast = (
            f"torch.autocast({plan.device_type!r}, dtype={plan.dtype})",
            "mixed precision runs inside autocast; parameters stay fp32",
        )
    else:
        autocast = ("off (nullcontext)", "fp32 runs without autocast")
    decisions.append(Decision("autocast", *autocast))

    # warnings
    if device.type == "cuda" and not caps.cuda_available:
        warnings.append(
            "resolving for a CUDA device although the capabilities report no CUDA; "
            "the plan shows what the matrix would give"
        )
    if device.type == "cuda" and plan.mode == "bf16":
        where = caps.device_name or "this CUDA device"
        cc = caps.compute_capability
        cc_text = f" (compute capability {cc[0]}.{cc[1]})" if cc else ""
        if caps.cuda_bf16_native is False:
            warnings.append(
                f"BF16 on {where}{cc_text} is emulated, not native: "
                "torch.cuda.is_bf16_supported() counts emulation, so the spec picks bf16, but "
                "it is likely slower than fp16 here (explicit fp16 uses a GradScaler)"
            )
        elif caps.cuda_bf16_native is None:
            warnings.append(
                f"could not tell whether BF16 on {where} is native (compute capability >= 8.0) "
                "or emulated"
            )
    if row.source == "lab":
        warnings.append(
            "loss-scale lab: CPU fp16 with a CPU GradScaler is an opt-in outside the spec's "
            "matrix, for studying loss scaling; the default resolution gives fp32 here"
        )
    elif cfg.loss_scale_lab:
        decisions.append(
            Decision(
                "loss_scale_lab",
                "no effect",
                "loss_scale_lab only changes an explicit fp16 request on CPU",
            )
        )
    if row.source == "implied":
        warnings.append(f"matrix row {row.id!r} is implied, not listed by the spec: {row.note}")
    return _Resolved(plan, row, tuple(decisions), tuple(warnings))


def resolve_precision(
    config: Any, device: Any, capabilities: Capabilities | str | None = None
) -> PrecisionPlan:
    """Resolve a precision request on a device to the spec's :class:`PrecisionPlan`.

    ``config`` is a :class:`PrecisionConfig` (or a mode string / None); ``device`` a
    ``torch.device`` or device string ("auto" resolves it first). ``capabilities`` is a
    :class:`Capabilities` value or preset name; by default torch is read now.
    """
    caps = get_capabilities(capabilities)
    return _resolve(_as_config(config), _as_device(device, caps), caps).plan


@dataclass(frozen=True)
class Explanation:
    """A plan with the ordered decisions that produced it."""

    plan: PrecisionPlan
    device: str
    capabilities: Capabilities
    decisions: tuple[Decision, ...]
    row: MatrixRow | None
    warnings: tuple[str, ...] = field(default_factory=tuple)
    config: PrecisionConfig = field(default_factory=PrecisionConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    requested_device: str = "auto"

    @property
    def simulated(self) -> bool:
        return self.capabilities.simulated

    @property
    def fallbacks(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if d.fallback)

    def summary(self) -> str:
        p = self.plan
        return (
            f"{p.mode} on {self.device} ({p.dtype}); scaler: {'yes' if p.use_scaler else 'no'}; "
            f"autocast: {'yes' if p.autocast_enabled else 'no'}"
        )

    def __str__(self) -> str:
        caps = self.capabilities
        hw = f"{caps.name}{' (simulated)' if caps.simulated else ''}: {caps.description}"
        lines = [f"Precision plan: {self.summary()}", f"Hardware: {hw}"]
        if self.row is not None:
            r = self.row
            lines.append(
                f"Matrix row [{r.source}] {r.id}: {r.device} | {r.request} -> {r.mode} | "
                f"scaler {'yes' if r.scaler else 'no'} | autocast {'yes' if r.autocast else 'no'}"
            )
        lines.append("Decisions:")
        width = max(len(d.field) for d in self.decisions)
        for i, d in enumerate(self.decisions, 1):
            mark = " (fallback)" if d.fallback else ""
            lines.append(f"  {i}. {d.field:<{width}}  {d.outcome}{mark}: {d.reason}")
        if self.warnings:
            lines.append("Warnings:")
            lines.extend(f"  ! {w}" for w in self.warnings)
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        e = html.escape
        caps = self.capabilities
        out = [
            '<div class="precision-nb-explanation">',
            f"<p><b>Precision plan:</b> {e(self.summary())}<br>",
            f"<b>Hardware:</b> {e(caps.name)}{' (simulated)' if caps.simulated else ''}"
            f" &mdash; {e(caps.description)}</p>",
            "<table><caption>Decisions, in order</caption>"
            "<thead><tr><th>#</th><th>decision</th><th>outcome</th><th>why</th>"
            "</tr></thead><tbody>",
        ]
        for i, d in enumerate(self.decisions, 1):
            style = ' style="background:#fff3cd"' if d.fallback else ""
            tag = " (fallback)" if d.fallback else ""
            out.append(
                f"<tr{style}><td>{i}</td><td>{e(d.field)}</td><td><code>{e(d.outcome)}</code>"
                f"{tag}</td><td>{e(d.reason)}</td></tr>"
            )
        out.append("</tbody></table>")
        if self.warnings:
            out.append("<ul>")
            out.extend(f'<li style="color:#a15c00">&#9888; {e(w)}</li>' for w in self.warnings)
            out.append("</ul>")
        out.append(
            "<table><caption>Resolution matrix (spec rows, implied rows, opt-in lab)</caption>"
            "<thead><tr><th></th><th>device</th><th>request</th><th>resolved mode</th>"
            "<th>scaler</th><th>autocast</th><th>source</th></tr></thead><tbody>"
        )
        applied = self.row.id if self.row is not None else None
        for r in MATRIX:
            mark = r.id == applied
            style = ' style="background:#d4edda;font-weight:bold"' if mark else ""
            out.append(
                f'<tr{style} data-row="{e(r.id)}"><td>{"&#9654; applied" if mark else ""}</td>'
                f"<td>{e(r.device)}</td><td>{e(r.request)}</td><td>{e(r.mode)}</td>"
                f"<td>{'Yes' if r.scaler else 'No'}</td><td>{'Yes' if r.autocast else 'No'}</td>"
                f"<td>{e(r.source)}</td></tr>"
            )
        out.append("</tbody></table></div>")
        return "".join(out)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able mapping of everything shown."""
        return {
            "plan": self.plan.to_dict(),
            "device": self.device,
            "requested_device": self.requested_device,
            "config": self.config.to_dict(),
            "optimizer": self.optimizer.to_dict(),
            "capabilities": self.capabilities.to_dict(),
            "simulated": self.simulated,
            "row": asdict(self.row) if self.row is not None else None,
            "decisions": [asdict(d) for d in self.decisions],
            "warnings": list(self.warnings),
        }


def explain_precision(
    config: Any = None,
    device: Any = "auto",
    capabilities: Capabilities | str | None = None,
    optimizer: OptimizerConfig | None = None,
) -> Explanation:
    """Resolve device and precision and return the plan with every decision that produced it.

    Raises like :func:`resolve_device` (``RuntimeError`` for absent CUDA/MPS, ``ValueError`` for
    bad input). ``optimizer`` adds the fused-AdamW decision for that optimizer config.
    """
    caps = get_capabilities(capabilities)
    cfg = _as_config(config)
    opt = optimizer if optimizer is not None else OptimizerConfig()
    if not isinstance(opt, OptimizerConfig):
        raise ValueError(
            f"optimizer: invalid value {optimizer!r} ({type(optimizer).__name__}); "
            "expected an OptimizerConfig or None"
        )
    requested = normalize_device_request(device)
    dev, device_reason = resolve_device_traced(requested, caps)
    resolved = _resolve(cfg, dev, caps)
    outcome, reason, fallback = describe_fused(opt, dev, caps)
    decisions = (
        Decision("device", str(dev), device_reason),
        *resolved.decisions,
        Decision("fused AdamW", outcome, reason, fallback),
    )
    return Explanation(
        plan=resolved.plan,
        device=str(dev),
        capabilities=caps,
        decisions=decisions,
        row=resolved.row,
        warnings=resolved.warnings,
        config=cfg,
        optimizer=opt,
        requested_device=requested,
    )
