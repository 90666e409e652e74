"""Precision and device names as a user types them, checked without importing torch.

The command line checks its flags with these before torch loads (a bad value answers at once);
:mod:`precision_nb.core.plan` and :mod:`precision_nb.core.device` build on them.
"""

from __future__ import annotations

import re
from typing import Any

from precision_nb.core.validate import short_repr

#: The precision modes a request may name ("auto" lets the device decide).
MODES: tuple[str, ...] = ("auto", "fp32", "bf16", "fp16")
#: The concrete precisions a plan can resolve to.
PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")

PRECISION_ALIASES: dict[str, str] = {
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "single": "fp32",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
}
SPELLINGS = "'float32', 'bfloat16', 'float16', 'half', torch.float32/bfloat16/float16"

#: Where the weights live: "mixed" (fp32 weights, gradients and AdamW state; autocast lowers the
#: ops) or "true" (parameters, gradients and AdamW state in the low-precision dtype; no autocast).
WEIGHTS: tuple[str, ...] = ("mixed", "true")
#: How a true plan wins back the updates bf16 rounds away: "none" (torch's AdamW),
#: "stochastic" (stochastic rounding of the bf16 weight update, torchao's AdamW) or "kahan"
#: (Kahan-compensated updates, torch-optimi's AdamW). Written after a "+": ``bf16-true+kahan``.
REMEDIES: tuple[str, ...] = ("none", "stochastic", "kahan")
#: Every plan a precision string may name, in the order menus list them.
PLAN_SPELLINGS: tuple[str, ...] = (
    "auto", "fp32", "bf16", "fp16", "bf16-true", "bf16-true+stochastic", "bf16-true+kahan",
    "fp16-true",
)  # fmt: skip
_PLAN_FORMS = (
    "a precision (auto, fp32, bf16, fp16), optionally with '-mixed' or '-true' "
    "(bf16-true, fp16-true) and for a true plan '+stochastic' or '+kahan' (bf16-true+kahan)"
)

#: Device types ``torch.device`` accepts (a test keeps this equal to torch's own list).
TORCH_DEVICE_TYPES: tuple[str, ...] = (
    "cpu", "cuda", "ipu", "xpu", "mkldnn", "opengl", "opencl", "ideep", "hip", "ve", "fpga",
    "maia", "xla", "lazy", "vulkan", "mps", "meta", "hpu", "mtia", "privateuseone",
)  # fmt: skip
#: torch.compile as a plan dimension: "off" (eager, the default) or a ``torch.compile`` mode.
COMPILE_MODES: tuple[str, ...] = ("off", "default", "reduce-overhead", "max-autotune")
DEVICE_FORMS = "'auto', 'cpu', 'cuda', 'cuda:N', 'mps', or another torch device string"
_DEVICE = re.compile(r"(?P<type>[a-z_]+)(?::(?P<index>0|[1-9][0-9]{0,5}))?")


def precision_name(value: Any, field: str = "precision.mode", allow_auto: bool = True) -> str:
    """The canonical name ("auto", "fp32", "bf16", "fp16") of a typed precision string.

    Case, surrounding space and a ``torch.`` prefix are ignored. ``ValueError`` names ``field``,
    the value and what is allowed.
    """
    if isinstance(value, str):
        key = value.strip().lower().removeprefix("torch.")
        if allow_auto and key == "auto":
            return "auto"
        name = PRECISION_ALIASES.get(key)
        if name is not None:
            return name
    allowed = ", ".join(repr(a) for a in (MODES if allow_auto else PRECISIONS))
    raise ValueError(
        f"{field}: invalid value {short_repr(value)} ({type(value).__name__}); "
        f"allowed: {allowed} (also spelled {SPELLINGS})"
    )


def plan_label(mode: str, weights: str = "mixed", remedy: str = "none") -> str:
    """The one spelling of a plan request: ``bf16``, ``bf16-true``, ``bf16-true+kahan``."""
    if weights != "true":
        return mode
    return f"{mode}-true" + ("" if remedy == "none" else f"+{remedy}")


def check_weights(mode: str, weights: str, remedy: str, field: str, value: Any) -> None:
    """Refuse a combination no plan has: ``true`` for fp32 or auto, a remedy of a mixed plan,
    stochastic rounding of anything but bf16 (``ValueError`` naming ``field`` and ``value``)."""
    shown = short_repr(value)
    if weights == "true" and mode == "fp32":
        raise ValueError(
            f"{field}: invalid value {shown}: an fp32 plan has no true variant (its weights, "
            "gradients and optimizer state are fp32 already); allowed: bf16-true, fp16-true, "
            "or fp32"
        )
    if weights == "true" and mode == "auto":
        raise ValueError(
            f"{field}: invalid value {shown}: a true plan needs its dtype named (auto may resolve "
            "to fp32, which has no true variant); allowed: bf16-true, fp16-true"
        )
    if remedy != "none" and weights != "true":
        raise ValueError(
            f"{field}: invalid value {shown}: remedy {remedy!r} applies to a true plan only (a "
            f"mixed plan keeps fp32 weights, nothing to remedy); allowed: {mode}-true+{remedy} "
            "if the mode is bf16 or fp16, or no remedy"
        )
    if remedy == "stochastic" and mode != "bf16":
        raise ValueError(
            f"{field}: invalid value {shown}: stochastic rounding (torchao's AdamW, "
            "bf16_stochastic_round=True) rounds bf16 weights only; allowed: bf16-true+stochastic, "
            f"{mode}-true+kahan"
        )


def plan_request(value: Any, field: str = "precision") -> tuple[str, str, str]:
    """``(mode, weights, remedy)`` of a typed plan request: ``"BF16-true+Kahan"`` ->
    ``("bf16", "true", "kahan")``; ``"bf16-mixed"`` -> ``("bf16", "mixed", "none")``.

    ``ValueError`` names ``field``, the value and what is allowed (an unknown remedy lists the
    remedies; ``fp32-true`` says an fp32 plan has no true variant).
    """
    if not isinstance(value, str):
        return precision_name(value, field), "mixed", "none"
    text = value.strip().lower().removeprefix("torch.")
    base, plus, remedy = text.partition("+")
    remedy = remedy.strip() if plus else "none"
    weights = "mixed"
    for suffix in WEIGHTS:
        if base.endswith(f"-{suffix}"):
            base, weights = base[: -len(suffix) - 1], suffix
    if remedy not in REMEDIES or (plus and remedy == "none"):
        raise ValueError(
            f"{field}: invalid value {short_repr(value)}: unknown remedy {remedy!r}; allowed "
            "remedies: '+stochastic' (stochastic rounding, torchao) or '+kahan' (Kahan "
            "summation, torch-optimi), after a true plan: bf16-true+stochastic, bf16-true+kahan"
        )
    try:
        mode = precision_name(base, field)
    except ValueError as exc:
        if base == text:  # a plain precision: the plain message
            raise
        raise ValueError(
            str(exc).replace(short_repr(base), short_repr(value), 1)
            + "; a plan may add '-mixed' or '-true' (bf16-true, fp16-true) and, for a true "
            "plan, '+stochastic' or '+kahan' (bf16-true+kahan)"
        ) from None
    check_weights(mode, weights, remedy, field, value)
    return mode, weights, remedy


def precision_list(value: str, field: str) -> list[str]:
    """Comma-separated requests (``"fp32, bf16-true"``) -> their canonical spellings, at least
    one."""
    names = [part.strip() for part in str(value).split(",") if part.strip()]
    if not names:
        raise ValueError(
            f"{field}: invalid value {short_repr(value)}: give at least one precision request, "
            f"comma-separated; allowed: {_PLAN_FORMS}"
        )
    return [plan_label(*plan_request(name, field)) for name in names]


def device_string(value: str, field: str = "device") -> str:
    """A device request as typed ("CUDA:1 ", "auto") -> its canonical form ("cuda:1", "auto").

    ``ValueError`` for anything ``torch.device`` would refuse, naming what is allowed (not torch's
    list of every device type it knows).
    """
    text = value.strip().lower()
    if text == "auto":
        return text
    match = _DEVICE.fullmatch(text)
    if match is None or match["type"] not in TORCH_DEVICE_TYPES:
        gpu = text.split(":")[0] in ("gpu", "nvidia", "metal")
        hint = " (for a GPU: 'cuda', 'cuda:N' or 'mps')" if gpu else ""
        raise ValueError(
            f"{field}: invalid value {short_repr(value)}; allowed: {DEVICE_FORMS}{hint}"
        )
    return text


def compile_name(value: Any, field: str = "compile") -> str:
    """The canonical compile mode ("off", "default", "reduce-overhead", "max-autotune").

    Case and surrounding space are ignored; ``None`` and ``False`` mean "off", ``True`` means
    "default". ``ValueError`` names ``field``, the value and what is allowed.
    """
    if value is None or value is False:
        return "off"
    if value is True:
        return "default"
    if isinstance(value, str) and value.strip().lower() in COMPILE_MODES:
        return value.strip().lower()
    python = "" if field.startswith("--") else " (True means 'default', False or None 'off')"
    raise ValueError(
        f"{field}: invalid value {short_repr(value)} ({type(value).__name__}); allowed: "
        + ", ".join(repr(m) for m in COMPILE_MODES)
        + python
    )


def compile_list(value: str, field: str = "--compile") -> list[str]:
    """Comma-separated compile modes (``"off,default"``) -> canonical names, at least one, no
    repeats."""
    names = [compile_name(part, field) for part in str(value).split(",") if part.strip()]
    if not names:
        raise ValueError(
            f"{field}: invalid value {short_repr(value)}: give at least one compile mode, "
            "comma-separated; allowed: " + ", ".join(COMPILE_MODES)
        )
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(
            f"{field}: invalid value {short_repr(value)}: {', '.join(repeated)} given twice; "
            "allowed: each mode once"
        )
    return names
