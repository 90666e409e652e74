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
        key = value.strip().lower()
        key = key.removeprefix("torch.")
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


def precision_list(value: str, field: str) -> list[str]:
    """Comma-separated requests (``"fp32, bf16"``) -> their canonical names, at least one."""
    names = [part.strip() for part in str(value).split(",") if part.strip()]
    if not names:
        raise ValueError(
            f"{field}: invalid value {short_repr(value)}: give at least one precision request, "
            "comma-separated; allowed: auto, fp32, bf16, fp16"
        )
    return [precision_name(name, field) for name in names]


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
