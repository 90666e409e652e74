"""What the panel's controls select, as plain values, and the checks every value passes.

:class:`Selection` is the frozen state of the controls; :func:`normalise` validates values given
by name (``Panel(...)``, ``panel.set(...)``) into widget values, raising ``ValueError`` that names
the control, the value and what is allowed. No widget in here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from precision_nb.core.defaults import DEFAULT_BUDGET_S
from precision_nb.core.device import normalize_device_request
from precision_nb.core.names import COMPILE_MODES, PLAN_SPELLINGS, compile_name
from precision_nb.core.plan import normalize_plan, normalize_precision
from precision_nb.core.validate import SEED_RANGE, integer, number, positive_int, short_repr

__all__ = [
    "COMPARE_CHOICES",
    "COMPILE_MODES",
    "DEFAULT_COMPARE",
    "DeviceOption",
    "FUSED_CHOICES",
    "MODES",
    "SEED_RANGE",
    "SIM_PREFIX",
    "Selection",
    "check_seed",
    "compare_measure",
    "device_value",
    "normalise",
]

MAX_STEPS = 100_000
MAX_ACCUMULATION = 1024
#: The Compare's measurement budget in seconds: at least one, at most an hour.
BUDGET_RANGE = (1.0, 3600.0)
#: The Mode menu: the four requests, then the true plans with their remedies (docs/plans.md).
MODES = PLAN_SPELLINGS
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
    "bf16-true": ("bf16-true", False),
    "bf16-true+stochastic": ("bf16-true+stochastic", False),
    "bf16-true+kahan": ("bf16-true+kahan", False),
}
DEFAULT_COMPARE = ("fp32", "bf16", "fp16 + loss-scale lab")


def check_seed(value: Any) -> int:
    """``value`` as a seed ``torch.manual_seed`` accepts, else ValueError naming ``seed``."""
    return integer("seed", value, *SEED_RANGE)


@dataclass(frozen=True)
class DeviceOption:
    """One entry of the device menu: ``value`` is ``auto``, a torch device string, or
    ``sim:<preset>`` for a simulated hardware preset."""

    value: str
    label: str


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
    #: "off" (eager) or a torch.compile mode (see ``core/compile_mode.py``).
    compile: str = "off"
    #: Seconds a Compare's measurement may take (this process's rounds, then fresh processes
    #: until every interval is within the target); the profile's default.
    budget: float = DEFAULT_BUDGET_S

    @property
    def simulated_preset(self) -> str | None:
        """The hardware preset name when the device is simulated, else None."""
        if self.device.startswith(SIM_PREFIX):
            return self.device[len(SIM_PREFIX) :]
        return None


def _normalise_dtype(value: Any) -> str:
    """The dtype control's value: "none", or the core's canonical precision name."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return "none"
    try:
        return normalize_precision(value, field="dtype", allow_auto=False)
    except ValueError as exc:
        raise ValueError(f"{exc}; or None (no dtype)") from None


def _compare_choice(value: Any) -> Any:
    """A Compare list entry: a choice as listed, or a plan spelled as the Mode menu takes it
    (``BF16-true+Kahan``); a plan refused for a reason (``fp32-true``) says why."""
    if not isinstance(value, str) or value in COMPARE_CHOICES:
        return value
    try:
        return normalize_plan(value, field="compare_plans")
    except ValueError:
        if "-true" in value.lower():
            raise  # why the true request is refused (fp32-true, an unknown remedy...)
        return value  # named with every allowed choice


def _normalise_fused(value: Any) -> str:
    if value is None or value in FUSED_CHOICES:
        return "probe" if value is None else str(value)
    if isinstance(value, bool):
        return "on" if value else "off"
    raise ValueError(
        f"fused={short_repr(value)} is not a fused AdamW choice; allowed: None or 'probe', True or "
        "'on', False or 'off'"
    )


def _normalise_lab(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"loss_scale_lab={short_repr(value)} must be True or False")
    return value


def _normalise_compare(value: Any) -> tuple[str, ...]:
    many = isinstance(value, (list, tuple))
    chosen = tuple(_compare_choice(c) for c in (value if many else (value,)))
    unknown = [c for c in chosen if not isinstance(c, str) or c not in COMPARE_CHOICES]
    if unknown or not chosen:
        raise ValueError(
            f"compare_plans={short_repr(value)} must name one or more of: "
            + ", ".join(COMPARE_CHOICES)
        )
    return chosen


#: The checks of the controls that need nothing but their value.
_CHECKS: dict[str, Callable[[Any], Any]] = {
    "mode": lambda value: normalize_plan(value, field="mode"),
    "dtype": _normalise_dtype,
    "fused": _normalise_fused,
    "compile": lambda value: compile_name(value, "compile"),
    "preset": lambda value: value,  # checked against the workload below
    "steps": lambda value: positive_int("steps", value, MAX_STEPS),
    "accumulation": lambda value: positive_int("accumulation", value, MAX_ACCUMULATION),
    "seed": check_seed,
    "budget": lambda value: number(
        "budget", value, minimum=BUDGET_RANGE[0], maximum=BUDGET_RANGE[1]
    ),
    "loss_scale_lab": _normalise_lab,
    "compare_plans": _normalise_compare,
}


def normalise(
    values: Mapping[str, Any],
    *,
    device_options: Sequence[DeviceOption],
    workloads: Mapping[str, Sequence[str]],
    user_model: bool,
    current_workload: str | None,
) -> dict[str, Any]:
    """Validate ``values`` (control name -> value) into widget values, raising ValueError.

    ``current_workload`` is the workload a ``preset`` alone is checked against.
    """
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name == "device":
            out[name] = device_value(value, device_options)
        elif name == "workload":
            if user_model:
                raise ValueError(
                    "workload cannot be chosen: this panel trains the model passed as "
                    "Panel(model=...)"
                )
            if not isinstance(value, str) or value not in workloads:
                raise ValueError(
                    f"workload={short_repr(value)} is unknown; allowed: {', '.join(workloads)}"
                )
            out[name] = value
        elif name in _CHECKS:
            out[name] = _CHECKS[name](value)
        else:
            raise ValueError(
                f"{short_repr(name)} is not a panel control; allowed: device, mode, dtype, fused, "
                "compile, workload, preset, steps, accumulation, seed, loss_scale_lab, "
                "compare_plans, budget; "
                "distributed, strategy, nproc, comm_hook, backend, param_dtype, reduce_dtype, "
                "output_dtype"
            )
    if "preset" in out and user_model:
        raise ValueError(
            "preset cannot be chosen: this panel trains the model passed as Panel(model=...)"
        )
    if "preset" in out:
        preset, workload = out["preset"], out.get("workload", current_workload)
        allowed = workloads.get(workload, ())
        if preset not in allowed:
            raise ValueError(
                f"preset={short_repr(preset)} is not a size preset of workload {workload!r}; "
                f"allowed: {', '.join(map(str, allowed))}"
            )
    return out


def device_value(value: Any, device_options: Sequence[DeviceOption]) -> str:
    """A menu value (real device or ``sim:<preset>``), or a torch device string to type."""
    text = str(value).strip() if isinstance(value, str) else value
    values = [o.value for o in device_options]
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
                f"device={short_repr(value)} is not a simulated preset; allowed: "
                + ", ".join(presets)
            )
    try:
        return normalize_device_request(text)
    except ValueError as exc:
        raise ValueError(
            f"{exc}; the menu offers: {', '.join(values)} (a simulated preset may be named "
            "without the 'sim:' prefix)"
        ) from None


def compare_measure(selection: Selection) -> Any:
    """How a panel comparison is measured: as a profile is (warm-up, rounds, then fresh
    processes until every interval is within the target), within the panel's budget. The
    first process always completes its rounds (they are the runs the charts show)."""
    from precision_nb.core import defaults
    from precision_nb.engine.measure_config import MeasureConfig

    return MeasureConfig(
        warmup_max=defaults.DEFAULT_WARMUP_MAX,
        processes=defaults.DEFAULT_PROCESSES,
        target=defaults.DEFAULT_TARGET,
        budget_s=selection.budget,
        refuse_small_budget=False,
    )
