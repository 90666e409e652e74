"""The panel's live plan: a :class:`Selection` resolved by the core, and what is shown of it.

:class:`PlanResolver` resolves a selection with the core's ``explain_precision`` (cached per
selection, so a control change costs well under a millisecond); nothing here decides a precision.
:class:`LivePlan` keeps what is shown of it up to date: the badge, the header's line, the code.
"""

from __future__ import annotations

import html
import time
from typing import TYPE_CHECKING, Any

from precision_nb.core import remedies
from precision_nb.core.capabilities import PRESETS, Capabilities, get_capabilities
from precision_nb.core.device import resolve_device
from precision_nb.core.optim import OptimizerConfig
from precision_nb.core.plan import PrecisionConfig
from precision_nb.core.resolution import Explanation, explain_precision
from precision_nb.views.panel.controls import Controls
from precision_nb.views.panel.selection import SIM_PREFIX, DeviceOption, Selection, check_seed

if TYPE_CHECKING:
    from precision_nb.core.distributed import DistributedPlan
    from precision_nb.views.panel.distributed import DistributedPlanner
    from precision_nb.views.panel.outputs import PanelOutputs

__all__ = ["LivePlan", "PlanResolver", "device_options", "headline_html"]

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


class PlanResolver:
    """Resolves selections against this machine (or a simulated preset), with a cache."""

    def __init__(self, capabilities: Capabilities, optimizer: OptimizerConfig) -> None:
        self.capabilities = capabilities
        self.optimizer = optimizer
        self._sim_caps: dict[str, Capabilities] = {}
        self.cache: dict[tuple[Any, ...], Explanation] = {}

    def optimizer_for(self, selection: Selection) -> OptimizerConfig:
        return OptimizerConfig(**{**self.optimizer.to_dict(), "fused": selection.fused})

    def resolve(self, selection: Selection) -> tuple[Explanation, str | None]:
        """The selection's explanation, and why the loss-scale lab does not apply (None: it
        does). Raises like the core (``ValueError`` bad input, ``RuntimeError`` absent
        hardware)."""
        preset = selection.simulated_preset
        if preset is not None and preset not in self._sim_caps:
            self._sim_caps[preset] = get_capabilities(preset)
        caps = self.capabilities if preset is None else self._sim_caps[preset]
        request = "auto" if preset else selection.device
        requested = PrecisionConfig(mode=selection.mode, dtype=selection.dtype).requested
        device_type = resolve_device(request, caps).type
        why = None
        if requested != "fp16":
            why = f"the loss-scale lab applies to an fp16 request (this request is {requested})"
        elif device_type == "mps":
            why = "the loss-scale lab applies on CPU (MPS resolves to fp32)"
        elif device_type != "cpu":
            why = f"the loss-scale lab applies on CPU ({device_type} fp16 already has its scaler)"
        lab = selection.loss_scale_lab and why is None
        key = (selection.device, selection.mode, selection.dtype, selection.fused, lab,
               selection.compile)  # fmt: skip
        explanation = self.cache.get(key)
        if explanation is None:
            config = PrecisionConfig(mode=selection.mode, dtype=selection.dtype, loss_scale_lab=lab)
            optimizer = self.optimizer_for(selection)
            explanation = explain_precision(
                config, request, caps, optimizer=optimizer, compile=selection.compile
            )
            self.cache[key] = explanation
        return explanation, why


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


def headline_html(explanation: Explanation, distributed: DistributedPlan | None = None) -> str:
    """The request and the plan it resolves to, on one line: "request bf16 → bf16: autocast
    torch.bfloat16 · no loss scaler · plain AdamW · eager" (the fused decision's outcome in the
    core's words, then the compile mode or "eager"; a fallback marked as one, with the reasons on
    hover)."""
    esc = html.escape
    plan, config = explanation.plan, explanation.config
    request = config.label + (" + loss-scale lab" if config.loss_scale_lab else "")
    parts = [f"{plan.dtype} weights (true)"] if plan.true_weights else []
    parts.append(f"autocast {plan.dtype}" if plan.autocast_enabled else "no autocast")
    parts.append("loss scaler" if plan.use_scaler else "no loss scaler")
    fused = next((d for d in explanation.decisions if d.field == "fused AdamW"), None)
    if fused is not None:
        parts.append(fused.outcome)
    remedy = next((d for d in explanation.decisions if d.field == "remedy"), None)
    if remedy is not None and plan.remedy != "none":
        parts.append(remedy.outcome)
    compiled = explanation.compile
    parts.append(f"compile {compiled.outcome}" if compiled.enabled else "eager")
    if distributed is not None:
        parts.append(f"{distributed.request.strategy} x{distributed.request.nproc} (torchrun)")
    mark = ""
    if explanation.fallbacks:
        why = "; ".join(f"{d.field}: {d.reason}" for d in explanation.fallbacks)
        mark = (
            f" <span class='pnb-headline-fallback' title='{esc(why, quote=True)}' "
            "style='color:#856404'>(fallback)</span>"
        )
    return (
        f"<span style='white-space:nowrap'>request <b>{esc(request)}</b> &rarr; plan "
        f"<b>{esc(plan.label)}</b>{mark}</span>: {esc(' · '.join(parts))}"
    )


class LivePlan:
    """The plan of the controls' current selection, re-resolved on every change and shown.

    ``refresh()`` resolves the selection (a seed typed into the widget is checked as ``set``
    checks it), then shows the explanation, the badge and the code, or the reason it cannot be
    resolved in the error box (source ``"selection"``, cleared by the next good refresh).
    ``explanation`` is None and ``error`` the exception while the selection cannot be resolved.
    """

    def __init__(
        self,
        resolver: PlanResolver,
        controls: Controls,
        outputs: PanelOutputs,
        planner: DistributedPlanner | None = None,
    ) -> None:
        self.resolver = resolver
        self.controls = controls
        self.outputs = outputs
        # resolves the Distributed tab's request (a DistributedPlanner), if the panel has one
        self.planner = planner
        self.explanation: Explanation | None = None
        self.distributed: DistributedPlan | None = None  # with a strategy, else None
        self.error: BaseException | None = None
        self.refresh_seconds = 0.0

    def refresh(self) -> None:
        start = time.perf_counter()
        selection = self.controls.selection()
        try:
            check_seed(selection.seed)
            explanation, why = self.resolver.resolve(selection)
        except (ValueError, RuntimeError) as exc:
            self.explanation, self.error = None, exc
            self.controls.update_enabled(lab_applies=False, lab_reason="")
            self.outputs.clear_plan()
            self.outputs.show_error(f"Cannot resolve this selection: {exc}", "selection")
            self.refresh_seconds = time.perf_counter() - start
            return
        self.explanation, self.error, self.distributed = explanation, None, None
        self.controls.update_enabled(lab_applies=why is None, lab_reason=why or "")
        framework = self.outputs.code_framework.value
        code = explanation.code(
            framework,
            steps=selection.steps,
            accumulation=selection.accumulation,
            seed=selection.seed,
        )
        plan_html = explanation._repr_html_()
        if self.planner is not None:
            try:
                self.distributed = self.planner.resolve(
                    selection, explanation, self.resolver.optimizer_for(selection)
                )
            except (ValueError, RuntimeError) as exc:
                self.error = exc
            if self.distributed is not None:
                plan_html = self.planner.plan_html(self.distributed) + plan_html
                code = self.planner.code(self.distributed, selection, explanation)
        self.outputs.show_plan(
            plan_html,
            badge_html(explanation),
            headline_html(explanation, self.distributed),
            explanation.simulated,
            code,
            fit_code=self.distributed is not None,
            framework=framework,
        )
        if self.error is not None:
            self.outputs.show_error(
                f"Cannot use this distributed request: {self.error}", "selection"
            )
        elif self.outputs.error_source == "selection":
            self.outputs.show_error(None)
        self.refresh_seconds = time.perf_counter() - start

    def block_reason(self) -> str | None:
        """Why Run cannot start with this selection (None when it can)."""
        explanation, distributed = self.explanation, self.distributed
        if self.error is not None and explanation is not None:
            return f"Run is disabled: the distributed request cannot run here: {self.error}"
        if self.error is not None:
            return "Run is disabled: the selection cannot be resolved (see the message above)."
        if explanation is None:
            return None
        if distributed is not None and explanation.compile.enabled:
            return (
                "Run is disabled: distributed runs train eagerly (their ranks do not compile "
                "the model); set Compile to off, or the strategy to none"
            )
        remedy = explanation.plan.remedy
        if remedy != "none" and not remedies.installed(remedy):
            return f"Run is disabled: {remedies.missing_message(remedy)}"
        if distributed is not None and explanation.plan.true_weights:
            return (
                "Run is disabled: true plans train on one process; pick a mixed plan, or the "
                "strategy none"
            )
        if explanation.simulated:
            name = explanation.capabilities.name
            return (
                f"Run is disabled: {name} is simulated hardware. The plan shows what it would "
                "resolve to there; pick a real device (auto, cpu, ...) to run."
            )
        return None
