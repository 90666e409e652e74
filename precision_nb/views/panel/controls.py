"""The panel's input widgets and the frozen :class:`~.selection.Selection` they describe.

This module knows widgets, not precision rules (value checks are in :mod:`.selection`): the panel
passes in the device options (real and simulated), the workloads, and asks for the current
:class:`Selection` to resolve it with the core.
Every widget carries a stable CSS class (``pnb-...``) so browser tests can find it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ipywidgets as widgets

from precision_nb.views.panel.selection import (
    BUDGET_RANGE,
    COMPARE_CHOICES,
    COMPILE_MODES,
    DEFAULT_COMPARE,
    DTYPES,
    FUSED_CHOICES,
    MAX_ACCUMULATION,
    MAX_STEPS,
    MODES,
    USER_MODEL,
    DeviceOption,
    Selection,
    normalise,
)

__all__ = ["Controls"]

#: The widgets whose change re-resolves the plan.
_INPUTS = tuple(
    "device device_text mode dtype fused compile workload preset steps accumulation seed "
    "loss_scale_lab".split()
)


class Controls:
    """The panel's input widgets.

    ``device_options`` lists real devices first and simulated presets after; ``workloads`` maps a
    workload name to its preset names (empty when the panel trains the user's model).
    """

    def __init__(
        self,
        device_options: Sequence[DeviceOption],
        workloads: Mapping[str, Sequence[str]],
        *,
        user_model: bool = False,
    ) -> None:
        self.device_options = tuple(device_options)
        self.workloads = {name: tuple(presets) for name, presets in workloads.items()}
        self.user_model = user_model
        style = {"description_width": "110px"}
        wide, narrow = widgets.Layout(width="360px"), widgets.Layout(width="220px")

        self.device = widgets.Dropdown(
            options=[(o.label, o.value) for o in self.device_options],
            value=self.device_options[0].value,
            description="Device",
            style=style,
            layout=wide,
        )
        self.device_text = widgets.Text(
            placeholder="or type a device: cuda:1, mps, ...",
            continuous_update=False,
            style=style,
            layout=wide,
            description="Other device",
            tooltip="Any torch device string; empty uses the menu above",
        )
        self.mode = widgets.ToggleButtons(
            options=list(MODES),
            value="auto",
            description="Mode",
            style={**style, "button_width": "56px"},
        )
        self.dtype = widgets.Dropdown(
            options=list(DTYPES),
            value="none",
            description="dtype (auto)",
            style=style,
            layout=narrow,
        )
        self.fused = widgets.ToggleButtons(
            options=list(FUSED_CHOICES),
            value="probe",
            description="Fused AdamW",
            style={**style, "button_width": "64px"},
            tooltips=["probe on the training device", "ask for fused", "plain AdamW"],
        )
        self.compile = widgets.Dropdown(
            options=list(COMPILE_MODES),
            value="off",
            description="Compile",
            style=style,
            layout=widgets.Layout(width="260px"),
            tooltip="torch.compile mode: off trains eagerly; the others compile the model",
        )
        names = [USER_MODEL] if user_model else list(self.workloads)
        self.workload = widgets.Dropdown(
            options=names,
            value=names[0] if names else None,
            description="Workload",
            style=style,
            layout=wide,
            disabled=user_model,
        )
        self.preset = widgets.Dropdown(
            options=self._presets_for(self.workload.value),
            description="Size preset",
            style=style,
            layout=widgets.Layout(width="260px"),
            disabled=user_model,
        )
        self.steps, self.accumulation = (
            widgets.BoundedIntText(
                value=value, min=1, max=top, description=text, style=style, layout=narrow
            )
            for value, top, text in (
                (30, MAX_STEPS, "Steps"),
                (1, MAX_ACCUMULATION, "Accumulation"),
            )
        )
        self.seed = widgets.IntText(value=0, description="Seed", style=style, layout=narrow)
        self.loss_scale_lab = widgets.Checkbox(
            description="Loss-scale lab (fp16 + GradScaler on CPU)",
            indent=False,
            layout=wide,
        )
        self.lab_note = widgets.HTML()
        self.compare_plans = widgets.SelectMultiple(
            options=list(COMPARE_CHOICES),
            value=DEFAULT_COMPARE,
            description="Compare",
            rows=len(COMPARE_CHOICES),
            style=style,
            layout=widgets.Layout(width="320px"),
        )
        self.budget = widgets.BoundedFloatText(
            value=Selection.budget,
            min=BUDGET_RANGE[0],
            max=BUDGET_RANGE[1],
            step=5,
            description="Budget (s)",
            tooltip=(
                "Compare: seconds the measurement may take. After this process's rounds, fresh "
                "processes are added until every speedup interval is within ±5 % or the budget "
                "is spent"
            ),
            style=style,
            layout=narrow,
        )

        for name in (*_INPUTS, "lab_note", "compare_plans", "budget"):
            css = "lab" if name == "loss_scale_lab" else name.replace("_", "-")
            getattr(self, name).add_class(f"pnb-{css}")

        self.workload.observe(self._on_workload, names="value")
        # Picking from the menu replaces a typed device.
        self.device.observe(self._on_device_menu, names="value")
        self.update_enabled(lab_applies=False, lab_reason="")

    # ------------------------------------------------------------------ layout

    def box(self) -> widgets.Widget:
        precision, training = (
            [getattr(self, name) for name in names]
            for names in (
                ("device", "device_text", "mode", "dtype", "fused", "compile"),
                ("workload", "preset", "steps", "accumulation", "seed", "compare_plans", "budget"),
            )
        )
        precision.append(widgets.VBox([self.loss_scale_lab, self.lab_note]))
        box = widgets.HBox(
            [widgets.VBox(precision), widgets.VBox(training)],
            layout=widgets.Layout(flex_flow="row wrap"),
        )
        box.add_class("pnb-controls")
        return box

    def observe(self, callback: Callable[[dict[str, Any]], None]) -> None:
        for name in _INPUTS:
            getattr(self, name).observe(callback, names="value")

    # ------------------------------------------------------------------ reading

    def selection(self) -> Selection:
        dtype = self.dtype.value
        workload = None if self.user_model else self.workload.value
        typed = self.device_text.value.strip()
        return Selection(
            device=typed or str(self.device.value),
            mode=str(self.mode.value),
            dtype=None if dtype == "none" else str(dtype),
            fused=FUSED_CHOICES[str(self.fused.value)],
            workload=workload,
            preset=None if self.user_model else self.preset.value,
            steps=int(self.steps.value),
            accumulation=int(self.accumulation.value),
            loss_scale_lab=bool(self.loss_scale_lab.value),
            seed=int(self.seed.value),
            compare_plans=tuple(self.compare_plans.value),
            compile=str(self.compile.value),
            budget=float(self.budget.value),
        )

    # ------------------------------------------------------------------ writing

    def normalise(self, **values: Any) -> dict[str, Any]:
        """Validate ``values`` (control name -> value) into widget values, raising ValueError."""
        return normalise(
            values,
            device_options=self.device_options,
            workloads=self.workloads,
            user_model=self.user_model,
            current_workload=self.workload.value,
        )

    def apply(self, values: Mapping[str, Any]) -> None:
        """Set already-normalised values (workload before preset)."""
        order = ("workload", "preset", *[k for k in values if k not in ("workload", "preset")])
        for name in order:
            if name not in values:
                continue
            if name == "device":
                self.set_device(values[name])
            else:
                getattr(self, name).value = values[name]

    def set_device(self, value: str) -> None:
        """A menu value selects it (and clears the typed device); anything else is typed."""
        if value in [o.value for o in self.device_options]:
            self.device_text.value = ""
            self.device.value = value
        else:
            self.device_text.value = value

    def update_enabled(self, *, lab_applies: bool, lab_reason: str) -> None:
        """dtype only matters for mode auto; the lab only for an fp16 request on CPU."""
        auto = self.mode.value == "auto"
        self.dtype.disabled = not auto
        self.dtype.tooltip = (
            None if auto else f"dtype only matters when mode is auto (mode is {self.mode.value})"
        )
        self.loss_scale_lab.disabled = not lab_applies
        note = "" if lab_applies else lab_reason
        if self.loss_scale_lab.value and not lab_applies:
            note = f"ignored here: {lab_reason}"
        self.lab_note.value = f"<small>{note}</small>" if note else ""

    # ------------------------------------------------------------------ helpers

    def _on_device_menu(self, _change: dict[str, Any]) -> None:
        self.device_text.value = ""

    def _presets_for(self, workload: str | None) -> list[str]:
        if self.user_model or workload is None:
            return ["(your batches)"]
        return list(self.workloads.get(workload, ()))

    def _on_workload(self, change: dict[str, Any]) -> None:
        presets = self._presets_for(change["new"])
        current = self.preset.value
        self.preset.options = presets
        if current in presets:
            self.preset.value = current
