"""The panel's input widgets and the frozen :class:`Selection` they describe.

This module knows widgets, not precision rules: the panel passes in the device options (real and
simulated), the workloads, and asks for the current :class:`Selection` to resolve it with the core.
Every widget carries a stable CSS class (``pnb-...``) so browser tests can find it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ipywidgets as widgets

from precision_nb.core.device import normalize_device_request
from precision_nb.core.plan import normalize_precision
from precision_nb.core.validate import integer, positive_int

__all__ = [
    "COMPARE_CHOICES",
    "Controls",
    "DeviceOption",
    "FUSED_CHOICES",
    "MODES",
    "SEED_RANGE",
    "SIM_PREFIX",
    "Selection",
    "check_seed",
]

MODES = ("auto", "fp32", "bf16", "fp16")
DTYPES = ("none", "fp32", "bf16", "fp16")
FUSED_CHOICES: dict[str, bool | None] = {"probe": None, "on": True, "off": False}
SIM_PREFIX = "sim:"
USER_MODEL = "your model"

# Comparison entries: label -> (mode, loss_scale_lab).
COMPARE_CHOICES: dict[str, tuple[str, bool]] = {
    "fp32": ("fp32", False),
    "bf16": ("bf16", False),
    "fp16": ("fp16", False),
    "fp16 + loss-scale lab": ("fp16", True),
    "auto": ("auto", False),
}
DEFAULT_COMPARE = ("fp32", "bf16", "fp16 + loss-scale lab")

#: The seeds ``torch.manual_seed`` accepts (a signed or unsigned 64-bit integer).
SEED_RANGE = (-(2**63), 2**64 - 1)


def check_seed(value: Any) -> int:
    """``value`` as a seed ``torch.manual_seed`` accepts, else ValueError naming ``seed``."""
    return integer("seed", value, *SEED_RANGE)


@dataclass(frozen=True)
class DeviceOption:
    """One entry of the device menu: ``value`` is ``auto``, a torch device string, or
    ``sim:<preset>`` for a simulated hardware preset."""

    value: str
    label: str

    @property
    def simulated(self) -> bool:
        return self.value.startswith(SIM_PREFIX)


@dataclass(frozen=True)
class Selection:
    """What the controls say, as plain values (no widget in here)."""

    device: str
    mode: str
    dtype: str | None
    fused: bool | None
    workload: str | None
    preset: str | None
    steps: int
    accumulation: int
    loss_scale_lab: bool
    seed: int
    compare_plans: tuple[str, ...] = field(default=DEFAULT_COMPARE)

    @property
    def simulated_preset(self) -> str | None:
        """The hardware preset name when the device is simulated, else None."""
        if self.device.startswith(SIM_PREFIX):
            return self.device[len(SIM_PREFIX) :]
        return None

    @property
    def fused_label(self) -> str:
        return {None: "probe", True: "on", False: "off"}[self.fused]


def _normalise_dtype(value: Any) -> str:
    """The dtype control's value: "none", or the core's canonical precision name."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return "none"
    try:
        return normalize_precision(value, field="dtype", allow_auto=False)
    except ValueError as exc:
        raise ValueError(f"{exc}; or None (no dtype)") from None


def _normalise_mode(value: Any) -> str:
    return normalize_precision(value, field="mode")


def _normalise_fused(value: Any) -> str:
    if value is None or value in FUSED_CHOICES:
        return "probe" if value is None else str(value)
    if isinstance(value, bool):
        return "on" if value else "off"
    raise ValueError(
        f"fused={value!r} is not a fused AdamW choice; allowed: None or 'probe', True or 'on', "
        "False or 'off'"
    )


class Controls:
    """The panel's input widgets.

    ``device_options`` lists real devices first and simulated presets after; ``workloads`` maps a
    workload name to its preset names (empty when the panel trains the user's model).
    """

    MAX_STEPS = 100_000
    MAX_ACCUMULATION = 1024

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
        wide = widgets.Layout(width="360px")

        self.device = widgets.Dropdown(
            options=[(o.label, o.value) for o in self.device_options],
            value=self.device_options[0].value,
            description="Device",
            style=style,
            layout=wide,
        )
        self.device_text = widgets.Text(
            value="",
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
            layout=widgets.Layout(width="220px"),
        )
        self.fused = widgets.ToggleButtons(
            options=list(FUSED_CHOICES),
            value="probe",
            description="Fused AdamW",
            style={**style, "button_width": "64px"},
            tooltips=["probe on the training device", "ask for fused", "plain AdamW"],
        )
        if user_model:
            names: list[str] = [USER_MODEL]
        else:
            names = list(self.workloads)
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
        self.steps = widgets.BoundedIntText(
            value=30,
            min=1,
            max=self.MAX_STEPS,
            description="Steps",
            style=style,
            layout=widgets.Layout(width="220px"),
        )
        self.accumulation = widgets.BoundedIntText(
            value=1,
            min=1,
            max=self.MAX_ACCUMULATION,
            description="Accumulation",
            style=style,
            layout=widgets.Layout(width="220px"),
        )
        self.seed = widgets.IntText(
            value=0, description="Seed", style=style, layout=widgets.Layout(width="220px")
        )
        self.loss_scale_lab = widgets.Checkbox(
            value=False,
            description="Loss-scale lab (fp16 + GradScaler on CPU)",
            indent=False,
            layout=widgets.Layout(width="360px"),
        )
        self.lab_note = widgets.HTML(value="")
        self.compare_plans = widgets.SelectMultiple(
            options=list(COMPARE_CHOICES),
            value=DEFAULT_COMPARE,
            description="Compare",
            rows=len(COMPARE_CHOICES),
            style=style,
            layout=widgets.Layout(width="320px"),
        )

        for widget, css in (
            (self.device, "pnb-device"),
            (self.device_text, "pnb-device-text"),
            (self.mode, "pnb-mode"),
            (self.dtype, "pnb-dtype"),
            (self.fused, "pnb-fused"),
            (self.workload, "pnb-workload"),
            (self.preset, "pnb-preset"),
            (self.steps, "pnb-steps"),
            (self.accumulation, "pnb-accumulation"),
            (self.seed, "pnb-seed"),
            (self.loss_scale_lab, "pnb-lab"),
            (self.lab_note, "pnb-lab-note"),
            (self.compare_plans, "pnb-compare-plans"),
        ):
            widget.add_class(css)

        self.workload.observe(self._on_workload, names="value")
        # Picking from the menu replaces a typed device.
        self.device.observe(self._on_device_menu, names="value")
        self.update_enabled(lab_applies=False, lab_reason="")

    # ------------------------------------------------------------------ layout

    @property
    def inputs(self) -> tuple[widgets.Widget, ...]:
        """The widgets whose change re-resolves the plan."""
        return (
            self.device,
            self.device_text,
            self.mode,
            self.dtype,
            self.fused,
            self.workload,
            self.preset,
            self.steps,
            self.accumulation,
            self.seed,
            self.loss_scale_lab,
        )

    def box(self) -> widgets.Widget:
        precision = widgets.VBox(
            [
                self.device,
                self.device_text,
                self.mode,
                self.dtype,
                self.fused,
                widgets.VBox([self.loss_scale_lab, self.lab_note]),
            ]
        )
        training = widgets.VBox(
            [
                self.workload,
                self.preset,
                self.steps,
                self.accumulation,
                self.seed,
                self.compare_plans,
            ]
        )
        box = widgets.HBox([precision, training], layout=widgets.Layout(flex_flow="row wrap"))
        box.add_class("pnb-controls")
        return box

    def observe(self, callback: Callable[[dict[str, Any]], None]) -> None:
        for widget in self.inputs:
            widget.observe(callback, names="value")

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
        )

    # ------------------------------------------------------------------ writing

    def normalise(self, **values: Any) -> dict[str, Any]:
        """Validate ``values`` (control name -> value) into widget values, raising ValueError."""
        out: dict[str, Any] = {}
        for name, value in values.items():
            if name == "device":
                out[name] = self._device_value(value)
            elif name == "mode":
                out[name] = _normalise_mode(value)
            elif name == "dtype":
                out[name] = _normalise_dtype(value)
            elif name == "fused":
                out[name] = _normalise_fused(value)
            elif name == "workload":
                if self.user_model:
                    raise ValueError(
                        "workload cannot be chosen: this panel trains the model passed as "
                        "Panel(model=...)"
                    )
                if value not in self.workloads:
                    raise ValueError(
                        f"workload={value!r} is unknown; allowed: {', '.join(self.workloads)}"
                    )
                out[name] = value
            elif name == "preset":
                out[name] = value
            elif name == "steps":
                out[name] = positive_int("steps", value, self.MAX_STEPS)
            elif name == "accumulation":
                out[name] = positive_int("accumulation", value, self.MAX_ACCUMULATION)
            elif name == "seed":
                out[name] = check_seed(value)
            elif name == "loss_scale_lab":
                if not isinstance(value, bool):
                    raise ValueError(f"loss_scale_lab={value!r} must be True or False")
                out[name] = value
            elif name == "compare_plans":
                chosen = (value,) if isinstance(value, str) else tuple(value)
                unknown = [c for c in chosen if c not in COMPARE_CHOICES]
                if unknown or not chosen:
                    raise ValueError(
                        f"compare_plans={value!r} must name one or more of: "
                        + ", ".join(COMPARE_CHOICES)
                    )
                out[name] = chosen
            else:
                raise ValueError(
                    f"{name!r} is not a panel control; allowed: device, mode, dtype, fused, "
                    "workload, preset, steps, accumulation, seed, loss_scale_lab, compare_plans"
                )
        preset = out.get("preset")
        if "preset" in out and not self.user_model:
            workload = out.get("workload", self.workload.value)
            allowed = self.workloads.get(workload, ())
            if preset not in allowed:
                raise ValueError(
                    f"preset={preset!r} is not a size preset of workload {workload!r}; "
                    f"allowed: {', '.join(map(str, allowed))}"
                )
        elif "preset" in out:
            raise ValueError(
                "preset cannot be chosen: this panel trains the model passed as Panel(model=...)"
            )
        return out

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

    def _device_value(self, value: Any) -> str:
        """A menu value (real device or ``sim:<preset>``), or a torch device string to type."""
        text = str(value).strip() if isinstance(value, str) else value
        values = [o.value for o in self.device_options]
        if isinstance(text, str):
            lowered = text.lower()
            if lowered in values:
                return lowered
            for name in (lowered, lowered.removeprefix("simulated:")):
                if SIM_PREFIX + name in values:
                    return SIM_PREFIX + name
            if lowered.startswith(SIM_PREFIX):
                presets = [v[len(SIM_PREFIX) :] for v in values if v.startswith(SIM_PREFIX)]
                raise ValueError(
                    f"device={value!r} is not a simulated preset; allowed: {', '.join(presets)}"
                )
        try:
            return normalize_device_request(text)
        except ValueError as exc:
            raise ValueError(
                f"{exc}; the menu offers: {', '.join(values)} (a simulated preset may be named "
                "without the 'sim:' prefix)"
            ) from None

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
