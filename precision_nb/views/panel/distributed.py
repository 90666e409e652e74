"""The panel's Distributed tab: strategy, processes, comm hook and FSDP2 dtypes, as widgets
and as values, and the request they make checked by the library before any run.

:class:`DistributedControls` holds the widgets (the Distributed tab's controls), turns
them into a :class:`~precision_nb.core.distributed.Distributed` request (``None`` for strategy
"none": the single-process path) and enables only the fields the chosen strategy uses, saying why
the others are off. :class:`DistributedPlanner` resolves that request with
``explain_distributed`` for the live plan and checks, before anything starts, that the model can
reach torchrun's workers and that the global batch splits into ``nproc`` slices. Every rule is the
library's; this module only gathers the values and shows what the library says.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets

from precision_nb.core import validate
from precision_nb.core.distributed import (
    BACKENDS,
    COMM_HOOKS,
    Distributed,
    DistributedPlan,
    explain_distributed,
)
from precision_nb.core.plan import normalize_precision
from precision_nb.core.render import decisions_html

if TYPE_CHECKING:
    from precision_nb.core.optim import OptimizerConfig
    from precision_nb.core.resolution import Explanation
    from precision_nb.views.panel.selection import Selection
    from precision_nb.views.panel.session import RunSession

__all__ = [
    "DIST_CONTROLS",
    "STRATEGY_CHOICES",
    "DistributedControls",
    "DistributedPlanner",
    "distributed_plan_html",
]

STRATEGY_CHOICES = ("none", "ddp", "fsdp2")
FSDP_DTYPES = ("auto", "fp32", "bf16", "fp16")
_FSDP_FIELDS = ("param_dtype", "reduce_dtype", "output_dtype")
#: The names ``Panel.set`` accepts for this tab (``distributed`` sets them all at once).
DIST_CONTROLS = ("distributed", "strategy", "nproc", "comm_hook", "backend", *_FSDP_FIELDS)
#: Request fields without a widget, kept from a ``Distributed`` given in code.
_EXTRAS = ("rdzv_host", "count_collectives", "timeout_s")
_DEFAULTS: dict[str, Any] = {
    "strategy": "none",
    "nproc": 2,
    "comm_hook": "none",
    "backend": "auto",
    **dict.fromkeys(_FSDP_FIELDS, "auto"),
}
_WHY_OFF = {
    "none": "strategy none: the run trains in this process; pick ddp or fsdp2 to train on "
    "several processes started by torchrun (this kernel launches them and is not a rank)",
    "comm_hook": "comm hook: DDP's gradient compression; FSDP2 sets reduce_dtype instead",
    "fsdp": "param/reduce/output dtype: FSDP2's MixedPrecisionPolicy; DDP does not use them",
}


def _dtype_value(name: str, value: Any) -> str:
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return "auto"
    try:
        return normalize_precision(value, f"distributed.{name}", allow_auto=False)
    except ValueError as exc:
        raise ValueError(f"{exc}; or 'auto' (derived from the plan)") from None


class DistributedControls:
    """The Distributed tab's widgets (``box``), the request they describe and the tab's
    ``title`` (``"Distributed: ddp x2"`` once a strategy is chosen)."""

    def __init__(self) -> None:
        style = {"description_width": "110px"}
        self.strategy = widgets.ToggleButtons(
            options=list(STRATEGY_CHOICES),
            value="none",
            description="Strategy",
            style={**style, "button_width": "64px"},  # "fsdp2" whole
            tooltips=["one process (no torchrun)", "DistributedDataParallel", "fully_shard"],
        )
        self.nproc = widgets.IntText(
            value=2, description="Processes", style=style, layout=widgets.Layout(width="220px")
        )
        small = widgets.Layout(width="260px")
        self.backend = widgets.Dropdown(
            options=list(BACKENDS), value="auto", description="Backend", style=style, layout=small
        )
        self.comm_hook = widgets.Dropdown(
            options=list(COMM_HOOKS), value="none", description="Comm hook", style=style,
            layout=small,
        )  # fmt: skip
        self.param_dtype, self.reduce_dtype, self.output_dtype = (
            widgets.Dropdown(
                options=list(FSDP_DTYPES), value="auto", description=text, style=style, layout=small
            )
            for text in ("param dtype", "reduce dtype", "output dtype")
        )
        self.note = widgets.HTML()
        self.extras: dict[str, Any] = {}
        self.title = "Distributed"  # the tab's title: the strategy and nproc once chosen
        self.box = widgets.VBox([self.strategy, *self.fields, self.note])
        for name in _DEFAULTS:
            getattr(self, name).add_class(f"pnb-dist-{name.replace('_', '-')}")
        self.note.add_class("pnb-dist-note")
        self.box.add_class("pnb-distributed")
        self.update_enabled()

    @property
    def fields(self) -> tuple[widgets.Widget, ...]:
        return (self.nproc, self.backend, self.comm_hook, *self.fsdp_fields)

    @property
    def fsdp_fields(self) -> tuple[widgets.Widget, ...]:
        return (self.param_dtype, self.reduce_dtype, self.output_dtype)

    def observe(self, callback: Callable[[dict[str, Any]], None]) -> None:
        for widget in (self.strategy, *self.fields):
            widget.observe(callback, names="value")

    # ------------------------------------------------------------------ reading

    def values(self) -> dict[str, Any]:
        return {name: getattr(self, name).value for name in _DEFAULTS}

    def request(
        self, values: Mapping[str, Any] | None = None, extras: Mapping[str, Any] | None = None
    ) -> Distributed | None:
        """The request of ``values`` and ``extras`` (default: the widgets' and the kept ones);
        None for strategy "none". Raises the library's ``ValueError`` for a bad field or
        combination."""
        v = dict(values if values is not None else self.values())
        if v["strategy"] == "none":
            return None
        v.update({f: None if v[f] == "auto" else v[f] for f in _FSDP_FIELDS})
        return Distributed(**v, **(extras if extras is not None else self.extras))

    # ------------------------------------------------------------------ writing

    def normalise(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Widget values for ``values`` (this tab's names), checked as a whole request:
        ``ValueError`` names the field, the bad value and what is allowed."""
        out: dict[str, Any] = {}
        if "distributed" in values:
            out.update(self._from_request(values["distributed"]))
        for name, value in values.items():
            if name == "strategy":
                text = value.strip().lower() if isinstance(value, str) else value
                out[name] = validate.choice("distributed.strategy", text, STRATEGY_CHOICES)
            elif name == "nproc":
                out[name] = validate.positive_int("distributed.nproc", value, maximum=4096)
            elif name == "comm_hook":
                out[name] = validate.choice("distributed.comm_hook", value, COMM_HOOKS)
            elif name == "backend":
                out[name] = validate.choice("distributed.backend", value, BACKENDS)
            elif name in _FSDP_FIELDS:
                out[name] = _dtype_value(name, value)
        merged = {**self.values(), **{k: v for k, v in out.items() if k in _DEFAULTS}}
        self.request(merged, out.get("_extras"))  # the library checks the combination
        return out

    def _from_request(self, request: Any) -> dict[str, Any]:
        if request is None or (isinstance(request, str) and request.strip().lower() == "none"):
            return {**_DEFAULTS, "_extras": {}}
        if not isinstance(request, Distributed):
            raise ValueError(
                f"distributed: invalid value {validate.short_repr(request)}; allowed: None or "
                "precision_nb.Distributed(strategy='ddp' or 'fsdp2', nproc=..., ...)"
            )
        out = {name: getattr(request, name) for name in _DEFAULTS if name != "strategy"}
        out["strategy"] = request.strategy
        out.update({f: _dtype_value(f, getattr(request, f)) for f in _FSDP_FIELDS})
        out["_extras"] = {k: getattr(request, k) for k in _EXTRAS}
        return out

    def apply(self, values: Mapping[str, Any]) -> None:
        """Set already-normalised values (from :meth:`normalise`)."""
        if "_extras" in values:
            self.extras = dict(values["_extras"])
        for name, value in values.items():
            if name in _DEFAULTS:
                getattr(self, name).value = value
        self.update_enabled()

    def update_enabled(self) -> None:
        """Enable the fields the strategy uses. A field it does not use stays enabled while it
        holds a value other than its default, so the value the library refuses can be cleared."""
        strategy = self.strategy.value
        if strategy == "none":
            for widget in self.fields:
                widget.disabled = True
            note = _WHY_OFF["none"]
        else:
            self.nproc.disabled = self.backend.disabled = False
            hook_used = strategy == "ddp"
            self.comm_hook.disabled = not hook_used and self.comm_hook.value == "none"
            for widget in self.fsdp_fields:
                widget.disabled = hook_used and widget.value == "auto"
            note = _WHY_OFF["fsdp"] if hook_used else _WHY_OFF["comm_hook"]
        self.note.value = f"<small>{html.escape(note)}</small><br>"
        self.title = (
            "Distributed" if strategy == "none" else f"Distributed: {strategy} x{self.nproc.value}"
        )


def distributed_plan_html(plan: DistributedPlan) -> str:
    """The distributed resolution for the Plan tab: summary, what-if preset, every decision
    with its reason and the warnings (the core's decision table)."""
    esc = html.escape
    sim = " (simulated: nothing can run here)" if plan.simulated else ""
    out = [
        "<div class='pnb-dist-plan'><p><b>Distributed plan:</b> "
        f"{esc(plan.summary())}{esc(sim)}</p>"
    ]
    if plan.preset is not None:
        out.append(f"<p>What-if preset: {esc(plan.preset.name)} ({esc(plan.preset.source)})</p>")
    out.append(decisions_html(plan.decisions, plan.warnings))
    out.append("</div><hr>")
    return "".join(out)


class DistributedPlanner:
    """Resolves the controls' request for a selection and checks it can start.

    ``session`` (the panel's run session) gives the user's model (``session.user_model``: None for a
    built-in workload; dropped when the panel closes) and the runs' ``train_config``.
    ``resolve`` raises the library's ``ValueError`` / ``RuntimeError``; results are cached per
    request and selection, so a control change stays cheap.
    """

    def __init__(self, controls: DistributedControls, session: RunSession) -> None:
        self.controls = controls
        self.session = session
        self._cache: dict[Any, DistributedPlan | BaseException] = {}

    plan_html = staticmethod(distributed_plan_html)

    def code(self, plan: DistributedPlan, selection: Selection, explanation: Explanation) -> str:
        """The ``pnb.fit(..., distributed=...)`` call the Run button makes."""
        from precision_nb.core.optim import OptimizerConfig
        from precision_nb.core.plan_code import fit_code

        user = self.session.user_model
        notes = []
        if user is None:
            model = f"{selection.workload!r}, preset={selection.preset!r}"
        else:
            model = f"model, {user.batches_path!r}, factory={user.factory!r}"
            if user.loss_fn_path is not None:
                model += f", loss_fn={user.loss_fn_path!r}"
            notes.append("model: your nn.Module; its weights are loaded into factory()'s model")
        device = selection.device
        if explanation.simulated:
            device = explanation.device
            notes.append(f"Resolved for simulated hardware ({explanation.capabilities.name}).")
        return fit_code(
            model=model, precision=explanation.config, distributed=plan.request, device=device,
            train=self.session.train_config(selection),
            optimizer=explanation.optimizer or OptimizerConfig(fused=selection.fused),
            note="\n".join(notes),
        )  # fmt: skip

    def resolve(
        self, selection: Selection, explanation: Explanation, optimizer: OptimizerConfig
    ) -> DistributedPlan | None:
        request = self.controls.request()
        if request is None:
            return None
        key = (request, selection.device, selection.workload, selection.preset, id(explanation))
        cached = self._cache.get(key)
        if cached is None:
            try:
                cached = self._resolve(request, selection, explanation, optimizer)
            except (ValueError, RuntimeError) as exc:
                cached = exc
            self._cache[key] = cached
        if isinstance(cached, BaseException):
            raise cached
        return cached

    def _resolve(
        self,
        request: Distributed,
        selection: Selection,
        explanation: Explanation,
        optimizer: OptimizerConfig,
    ) -> DistributedPlan:
        preset = selection.simulated_preset
        device = "auto" if preset else selection.device
        plan = explain_distributed(
            request, explanation.config, device, hardware=preset, optimizer=optimizer
        )
        from precision_nb.views.panel.distributed_run import check_reachable

        check_reachable(self.session.user_model, selection, plan)
        return plan
