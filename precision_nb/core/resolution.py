"""Precision resolution: apply the resolution rules and explain every decision they make.

``resolve_precision(config, device)`` returns the :class:`PrecisionPlan` of the resolution rules
(the keyed table in :mod:`precision_nb.core.matrix`, listed in ``docs/plans.md#resolution-rules``).
``explain_precision(...)`` returns the same plan with the ordered decisions that produced it
(device, mode, dtype, scaler, autocast, weights for a ``-true`` request, fused AdamW, remedy for a
``-true`` request, and compile when one is asked for), the rule
that applied and warnings. Every fallback appears as a decision; nothing falls back silently.
Text and HTML of an :class:`Explanation` come from :mod:`precision_nb.core.render`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from precision_nb.core import render, validate
from precision_nb.core.capabilities import Capabilities, get_capabilities
from precision_nb.core.compile_mode import CompilePlan, resolve_compile
from precision_nb.core.device import (
    normalize_device_request,
    resolve_device,
    resolve_device_traced,
)
from precision_nb.core.matrix import MATRIX, RULES_DOC, MatrixRow, lookup
from precision_nb.core.optim import OptimizerConfig, as_optimizer_config, describe_fused
from precision_nb.core.plan import TORCH_DTYPES, PrecisionConfig, PrecisionPlan
from precision_nb.core.remedies import optimizer_decision

__all__ = [
    "MATRIX",
    "Decision",
    "Explanation",
    "MatrixRow",
    "explain_precision",
    "plan",
    "resolve_precision",
]


@dataclass(frozen=True)
class Decision:
    """One step of resolution: which ``field`` got which ``outcome`` and why.

    ``fallback`` is true when a request was not honoured as asked.
    """

    field: str
    outcome: str
    reason: str
    fallback: bool = False


def _as_config(config: Any) -> PrecisionConfig:
    if config is None:
        return PrecisionConfig()
    if isinstance(config, PrecisionConfig):
        return config
    if isinstance(config, (str, torch.dtype)):
        return PrecisionConfig(mode=config)
    raise ValueError(
        f"precision: invalid value {validate.short_repr(config)} ({type(config).__name__}); "
        "expected a PrecisionConfig, a mode string ('auto', 'fp32', 'bf16', 'fp16') or None"
    )


def _resolve(
    cfg: PrecisionConfig, device: torch.device, caps: Capabilities
) -> tuple[PrecisionPlan, MatrixRow, tuple[Decision, ...], tuple[str, ...]]:
    """The plan of the rules, the row it came from, its decisions and its warnings."""
    row, why = lookup(cfg.requested, cfg.loss_scale_lab, device.type, caps, cfg.weights)
    plan = PrecisionPlan(
        mode=row.mode,
        dtype=TORCH_DTYPES[row.mode],
        use_scaler=row.scaler,
        autocast_enabled=row.autocast,
        device_type=device.type,
        weights=row.weights,
        remedy=cfg.remedy if row.weights == "true" else "none",
    )
    warnings: list[str] = []
    fallback = cfg.requested not in ("auto", plan.mode)

    # mode
    request_text = ""
    if cfg.mode == "auto" and cfg.dtype is not None:
        request_text = f"mode auto with dtype {cfg.dtype} requests {cfg.dtype}; "
    mode_reason = f"{request_text}{why} (resolution rule {row.id!r}, see {RULES_DOC})"
    decisions = [Decision("mode", plan.mode, mode_reason, fallback)]

    # dtype (precision.dtype counts only when mode is auto)
    if cfg.dtype is None:
        dtype_reason = "precision.dtype not set"
    elif cfg.mode == "auto":
        dtype_reason = f"precision.dtype={cfg.dtype} used as the request because mode is auto"
    else:
        dtype_reason = (
            f"precision.dtype={cfg.dtype} ignored: mode is {cfg.mode} and dtype counts only "
            "when mode is auto"
        )
    if plan.true_weights:
        dtype_reason += f"; parameters, gradients, AdamW state and the math are {plan.dtype}"
    elif plan.autocast_enabled:
        dtype_reason += f"; autocast computes in {plan.dtype}"
    else:
        dtype_reason += "; parameters and math stay fp32 (no autocast)"
    ignored = cfg.dtype is not None and cfg.mode != "auto"
    decisions.append(Decision("dtype", str(plan.dtype), dtype_reason, ignored))

    # scaler
    if plan.use_scaler and plan.device_type == "cuda":
        scaler = ("torch.amp.GradScaler('cuda')", "fp16 on CUDA uses dynamic loss scaling")
    elif plan.use_scaler:
        scaler = (
            "torch.amp.GradScaler('cpu')",
            "loss-scale lab: fp16 gradients can underflow, so the loss is scaled (opt-in, "
            "outside the resolution rules)",
        )
    elif plan.mode == "bf16":
        scaler = ("none", "bf16 has fp32's exponent range, so no loss scaling is needed")
    elif plan.true_weights:
        scaler = ("none", "torch's GradScaler refuses to unscale fp16 gradients")
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
    elif plan.true_weights:
        autocast = (
            "off (nullcontext)",
            f"a true plan runs the model in {plan.dtype} itself (its parameters and floating-point "
            "inputs are cast), so nothing is left for autocast to lower",
        )
    else:
        autocast = ("off (nullcontext)", "fp32 runs without autocast")
    decisions.append(Decision("autocast", *autocast))
    if cfg.weights == "true":
        decisions.append(_weights_decision(cfg, plan))

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
                "torch.cuda.is_bf16_supported() counts emulation, so the resolution rules pick "
                "bf16, but it is likely slower than fp16 here (explicit fp16 uses a GradScaler)"
            )
        elif caps.cuda_bf16_native is None:
            warnings.append(
                f"could not tell whether BF16 on {where} is native (compute capability >= 8.0) "
                "or emulated"
            )
    if row.source == "lab":
        warnings.append(
            "loss-scale lab: CPU fp16 with a CPU GradScaler is an opt-in outside the resolution "
            "rules, for studying loss scaling; without it the rules give fp32 here"
        )
    elif cfg.loss_scale_lab:
        why = "loss_scale_lab only changes an explicit fp16 request on CPU"
        decisions.append(Decision("loss_scale_lab", "no effect", why))
    if row.source == "implied":
        warnings.append(
            f"resolution rule {row.id!r} is implied, not one of the listed rules: {row.note}"
        )
    return plan, row, tuple(decisions), tuple(warnings)


def _weights_decision(cfg: PrecisionConfig, plan: PrecisionPlan) -> Decision:
    """The weights decision of a ``-true`` request (shown only when one was made)."""
    if not plan.true_weights:
        dropped = f"; remedy {cfg.remedy!r} dropped with them" if cfg.remedy != "none" else ""
        return Decision(
            "weights",
            "mixed (fp32)",
            f"{cfg.label} resolved to {plan.mode} (the mode decision says why): the weights "
            f"stay fp32{dropped}",
            True,
        )
    dtype = str(plan.dtype).removeprefix("torch.")
    return Decision(
        "weights",
        f"true ({dtype})",
        f"a fit casts the model's floating-point parameters and buffers to {dtype} in "
        "place (integer buffers stay as they are) and leaves them so, so gradients and "
        f"AdamW state are {dtype} too: no fp32 master copy (see docs/plans.md#mixed-or-true)",
    )


def resolve_precision(
    config: Any, device: Any, capabilities: Capabilities | str | None = None
) -> PrecisionPlan:
    """Resolve a precision request on a device to the :class:`PrecisionPlan` of the rules.

    ``config`` is a :class:`PrecisionConfig` (or a mode string / None); ``device`` a
    ``torch.device`` or device string ("auto" resolves it first). ``capabilities`` is a
    :class:`Capabilities` value or preset name; by default torch is read now.
    """
    caps = get_capabilities(capabilities)
    text = normalize_device_request(device)
    dev = resolve_device("auto", caps) if text == "auto" else torch.device(text)
    return _resolve(_as_config(config), dev, caps)[0]


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
    compile: CompilePlan = field(default_factory=CompilePlan)

    @property
    def simulated(self) -> bool:
        return self.capabilities.simulated

    @property
    def fallbacks(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if d.fallback)

    def summary(self) -> str:
        p = self.plan
        text = (
            f"{p.label} on {self.device} ({p.dtype}); scaler: {'yes' if p.use_scaler else 'no'}; "
            f"autocast: {'yes' if p.autocast_enabled else 'no'}"
        )
        if self.compile.enabled:
            text += f"; compile: {self.compile.mode}"
        return text

    @property
    def label(self) -> str:
        """The plan's short label: its mode (``bf16-true+kahan`` for a true plan), with
        ``+compile`` when compiled (``bf16+compile``)."""
        return self.compile.label(self.plan.label)

    def __str__(self) -> str:
        return render.explanation_text(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # IPython's plain-text form (nbconvert to text, diffs, logs): the decisions, not the
        # dataclass fields
        printer.text(str(self))

    def _repr_html_(self) -> str:
        return render.explanation_html(self)

    def code(
        self, framework: str = "pytorch", *, steps: int = 20, accumulation: int = 1, seed: int = 0
    ) -> str:
        """This plan as a runnable script: ``pytorch`` (a plain loop), ``lightning``,
        ``accelerate`` or ``transformers``; what does not carry over is said in comments."""
        from precision_nb.core.plan_code import code_spec, plan_code

        spec = code_spec(self, steps=steps, accumulation=accumulation, seed=seed)
        return plan_code(spec, framework)

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
            "compile": self.compile.to_dict(),
        }


def _compile_precision_note(plan: PrecisionPlan) -> str:
    """What a compiled plan does with the precision's own pieces (they stay where they are)."""
    note = ""
    if plan.autocast_enabled:
        note += (
            f"; torch.compile wraps the model only: autocast ({plan.mode}) is entered outside it, "
            "dynamo traces the casts autocast makes into the graph and guards on the autocast "
            "state"
        )
    if plan.use_scaler:
        note += (
            "; the GradScaler (scale, unscale, step, update) runs eagerly outside the compiled "
            "model"
        )
    return note


def explain_precision(
    config: Any = None,
    device: Any = "auto",
    capabilities: Capabilities | str | None = None,
    optimizer: OptimizerConfig | None = None,
    compile: Any = "off",
) -> Explanation:
    """Resolve device and precision and return the plan with every decision that produced it.

    Raises like :func:`resolve_device` (``RuntimeError`` for absent CUDA/MPS, ``ValueError`` for
    bad input). ``optimizer`` adds the fused-AdamW decision for that optimizer config.
    ``compile`` ("off", "default", "reduce-overhead", "max-autotune", or a resolved
    :class:`CompilePlan`) adds the compile decision when it is not "off"; a mode this machine
    cannot compile raises ``RuntimeError`` (see
    :func:`~precision_nb.core.compile_mode.resolve_compile`).
    """
    caps = get_capabilities(capabilities)
    cfg = _as_config(config)
    opt = as_optimizer_config(optimizer)
    requested = normalize_device_request(device)
    dev, device_reason = resolve_device_traced(requested, caps)
    resolved, row, decided, warnings = _resolve(cfg, dev, caps)
    remedy = optimizer_decision(resolved, opt)  # ValueError for a refused pair
    outcome, reason, fallback = describe_fused(opt, dev, caps)
    if remedy is not None and resolved.remedy != "none":
        outcome, reason, fallback = "not used", "the remedy's optimizer runs instead", False
    compiled = (
        compile if isinstance(compile, CompilePlan) else resolve_compile(compile, dev.type, caps)
    )
    decisions = (
        Decision("device", str(dev), device_reason),
        *decided,
        Decision("fused AdamW", outcome, reason, fallback),
    )
    if remedy is not None:
        decisions += (Decision("remedy", *remedy),)
    if compiled.enabled:
        reason = compiled.reason + _compile_precision_note(resolved)
        decisions += (Decision("compile", compiled.outcome, reason, compiled.fallback),)
    return Explanation(
        plan=resolved,
        device=str(dev),
        capabilities=caps,
        decisions=decisions,
        row=row,
        warnings=warnings,
        config=cfg,
        optimizer=opt,
        requested_device=requested,
        compile=compiled,
    )


def plan(
    precision: Any = "auto",
    device: Any = "auto",
    *,
    simulate: Capabilities | str | None = None,
    fused: bool | None = None,
    loss_scale_lab: bool = False,
    optimizer: OptimizerConfig | None = None,
    compile: Any = "off",
) -> Explanation:
    """The plan a request resolves to, with every decision behind it (``pnb.plan("bf16")``).

    ``precision``: a mode (``auto``, ``fp32``, ``bf16``, ``fp16``) or a :class:`PrecisionConfig`;
    ``simulate``: a hardware preset name (``"cuda-bf16"``...) to resolve for a machine you do not
    have; ``fused``: the AdamW ``fused`` request (None probes); ``loss_scale_lab``: CPU fp16 with a
    CPU GradScaler; ``compile``: "off" (eager), "default", "reduce-overhead" or "max-autotune"
    (``torch.compile`` modes, resolved with what this torch supports on the device). Returns the
    :class:`Explanation`: ``.plan``, ``.decisions``, ``str()``, and
    ``.code(framework)`` for the same plan in plain PyTorch, Lightning, Accelerate or
    Transformers. ``ValueError`` for bad input, ``RuntimeError`` for absent hardware.
    """
    validate.boolean("loss_scale_lab", loss_scale_lab)
    if fused is not None:
        validate.boolean("fused", fused)
    config = _as_config(precision)
    if loss_scale_lab:
        config = PrecisionConfig(**{**config.to_dict(), "loss_scale_lab": True})
    if optimizer is None:
        optimizer = OptimizerConfig(fused=fused)
    elif fused is not None:
        raise ValueError("fused: give it inside optimizer=OptimizerConfig(fused=...), not both")
    return explain_precision(
        config, device, capabilities=simulate, optimizer=optimizer, compile=compile
    )
