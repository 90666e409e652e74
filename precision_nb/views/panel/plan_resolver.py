"""The panel's live plan: a :class:`Selection` resolved by the core, and what is shown of it.

:class:`PlanView` turns the controls' selection into the core's :class:`Explanation` (cached per
selection, so a control change costs well under a millisecond), says whether the loss-scale lab
applies, and renders the badge and the "copy as code" snippet. Resolution itself is the core's
``explain_precision``; nothing here decides a precision.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from precision_nb.core.capabilities import PRESETS, Capabilities, get_capabilities
from precision_nb.core.device import resolve_device
from precision_nb.core.optim import OptimizerConfig
from precision_nb.core.plan import PrecisionConfig
from precision_nb.core.resolution import Explanation, explain_precision
from precision_nb.views.panel.code import CodeSpec, plan_code
from precision_nb.views.panel.controls import SIM_PREFIX, DeviceOption, Selection

__all__ = ["PlanView", "Resolved", "device_options"]

_BADGE_REAL = "background:#d4edda;color:#155724"
_BADGE_SIM = "background:#fff3cd;color:#856404;border:1px solid #d39e00"


def device_options(caps: Capabilities) -> list[DeviceOption]:
    """``auto``, the devices ``caps`` really has, then every simulated preset (labelled so)."""
    auto = resolve_device("auto", caps)
    options = [DeviceOption("auto", f"auto (this machine: {auto})"), DeviceOption("cpu", "cpu")]
    if caps.cuda_available:
        for index in range(caps.cuda_device_count or 1):
            name = f" - {caps.device_name}" if caps.device_name and index == 0 else ""
            options.append(DeviceOption(f"cuda:{index}", f"cuda:{index}{name}"))
    if caps.mps_available:
        options.append(DeviceOption("mps", "mps"))
    for name in PRESETS:
        if name == "this-machine":
            continue
        sim = get_capabilities(name)
        what = sim.device_name or sim.description
        options.append(DeviceOption(SIM_PREFIX + name, f"[simulated] {name} ({what})"))
    return options


def fused_flag(explanation: Explanation) -> bool | None:
    """The AdamW ``fused`` flag the explanation's fused decision amounts to."""
    for decision in explanation.decisions:
        if decision.field == "fused AdamW":
            return decision.outcome.startswith("fused")
    return explanation.optimizer.fused


@dataclass(frozen=True)
class Resolved:
    """A selection's explanation, and whether the loss-scale lab applies (with why not)."""

    explanation: Explanation
    lab_applies: bool
    lab_reason: str


class PlanView:
    """Resolves selections against this machine (or a simulated preset), with a cache."""

    def __init__(self, capabilities: Capabilities, optimizer: OptimizerConfig) -> None:
        self.capabilities = capabilities
        self.optimizer = optimizer
        self._sim_caps: dict[str, Capabilities] = {}
        self.cache: dict[tuple[Any, ...], Explanation] = {}

    def capabilities_for(self, selection: Selection) -> Capabilities:
        preset = selection.simulated_preset
        if preset is None:
            return self.capabilities
        if preset not in self._sim_caps:
            self._sim_caps[preset] = get_capabilities(preset)
        return self._sim_caps[preset]

    def optimizer_for(self, selection: Selection) -> OptimizerConfig:
        return OptimizerConfig(**{**self.optimizer.to_dict(), "fused": selection.fused})

    def resolve(self, selection: Selection) -> Resolved:
        """Raises like the core (``ValueError`` bad input, ``RuntimeError`` absent hardware)."""
        caps = self.capabilities_for(selection)
        request = "auto" if selection.simulated_preset else selection.device
        requested = PrecisionConfig(mode=selection.mode, dtype=selection.dtype).requested
        device_type = resolve_device(request, caps).type
        lab_applies, why = True, ""
        if requested != "fp16":
            lab_applies = False
            why = f"the loss-scale lab applies to an fp16 request (this request is {requested})"
        elif device_type == "mps":
            lab_applies, why = False, "the loss-scale lab applies on CPU (MPS resolves to fp32)"
        elif device_type != "cpu":
            lab_applies = False
            why = f"the loss-scale lab applies on CPU ({device_type} fp16 already has its scaler)"
        lab = selection.loss_scale_lab and lab_applies
        key = (selection.device, selection.mode, selection.dtype, selection.fused, lab)
        explanation = self.cache.get(key)
        if explanation is None:
            config = PrecisionConfig(mode=selection.mode, dtype=selection.dtype, loss_scale_lab=lab)
            optimizer = self.optimizer_for(selection)
            explanation = explain_precision(config, request, caps, optimizer=optimizer)
            self.cache[key] = explanation
        return Resolved(explanation, lab_applies, why)


def badge_html(explanation: Explanation) -> str:
    """ "this machine · cpu" or "SIMULATED · <preset> → cuda"."""
    if explanation.simulated:
        name = html.escape(explanation.capabilities.name)
        text = f"SIMULATED &middot; {name} &rarr; {html.escape(explanation.device)}"
        style = _BADGE_SIM
    else:
        text = f"this machine &middot; {html.escape(explanation.device)}"
        style = _BADGE_REAL
    return (
        f"<span style='{style};padding:2px 8px;border-radius:10px;margin-left:12px'>{text}</span>"
    )


def code_for(explanation: Explanation, selection: Selection) -> str:
    """The copy-as-code snippet for this explanation's plan and the selection's loop settings."""
    plan = explanation.plan
    opt = explanation.optimizer
    note = ""
    if explanation.simulated:
        note = (
            f"Resolved for simulated hardware ({explanation.capabilities.name}); "
            "run it on such a machine."
        )
    spec = CodeSpec(
        device=explanation.device,
        mode=plan.mode,
        dtype=plan.mode if plan.autocast_enabled else None,
        autocast_enabled=plan.autocast_enabled,
        use_scaler=plan.use_scaler,
        fused=fused_flag(explanation),
        lr=opt.lr,
        betas=tuple(opt.betas),
        eps=opt.eps,
        weight_decay=opt.weight_decay,
        steps=selection.steps,
        accumulation=selection.accumulation,
        seed=selection.seed,
        note=note,
    )
    return plan_code(spec)
