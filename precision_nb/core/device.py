"""Device resolution: ``resolve_device(requested="auto")``.

Auto order: CUDA when available, then MPS when exposed and available, then CPU. Explicit CUDA and
MPS requests verify availability and raise ``RuntimeError`` when absent (also "cuda:7" on a
machine with fewer devices). Other device strings go to ``torch.device``; a string torch rejects
becomes a ``ValueError`` naming the field, the value and the allowed forms.
"""

from __future__ import annotations

from typing import Any

import torch

from precision_nb.core.capabilities import Capabilities, get_capabilities
from precision_nb.core.names import DEVICE_FORMS, device_string
from precision_nb.core.validate import short_repr

__all__ = ["DEVICE_FORMS", "normalize_device_request", "resolve_device", "resolve_device_traced"]


def normalize_device_request(requested: Any, field: str = "device") -> str:
    """Return the canonical device request string ("auto", "cpu", "cuda:1", ...).

    Accepts strings (case and surrounding space are ignored), ``torch.device`` objects and
    ``None`` (meaning "auto"). Anything else raises ``ValueError``; so does a string that
    ``torch.device`` cannot parse. Availability is not checked here.
    """
    if requested is None:
        return "auto"
    if isinstance(requested, torch.device):
        return str(requested)
    if not isinstance(requested, str):
        raise ValueError(
            f"{field}: invalid value {short_repr(requested)} ({type(requested).__name__}); "
            f"expected a string or torch.device: {DEVICE_FORMS}"
        )
    try:
        text = device_string(requested, field)
    except ValueError as exc:
        try:  # a backend renamed with torch.utils.rename_privateuse1_backend
            return str(torch.device(requested.strip().lower()))
        except RuntimeError:
            raise exc from None
    return text if text == "auto" else str(torch.device(text))


def resolve_device_traced(
    requested: Any = "auto", capabilities: Capabilities | str | None = None
) -> tuple[torch.device, str]:
    """Resolve a device request and return it with the reason (used by the explanation)."""
    text = normalize_device_request(requested)
    caps = get_capabilities(capabilities)
    where = f" ({caps.name}, simulated)" if caps.simulated else ""
    if text == "auto":
        if caps.cuda_available:
            return torch.device("cuda"), f"auto: CUDA is available{where}, first in the order"
        if caps.mps_available:
            return torch.device("mps"), f"auto: no CUDA, MPS is available{where}"
        return torch.device("cpu"), f"auto: neither CUDA nor MPS is available{where}, using CPU"
    device = torch.device(text)
    if device.type == "cuda":
        if not caps.cuda_available:
            raise RuntimeError(
                f"device: {requested!r} requested but CUDA is not available{where} "
                "(torch.cuda.is_available() is False); use 'auto' or 'cpu'"
            )
        count = caps.cuda_device_count
        if device.index is not None and count is not None and device.index >= count:
            raise RuntimeError(
                f"device: {requested!r} requested but this machine{where} has {count} CUDA "
                f"device(s); allowed indices: 0..{count - 1}"
            )
        return device, f"explicit {device}: CUDA is available{where}"
    if device.type == "mps":
        if not caps.mps_available:
            raise RuntimeError(
                f"device: {requested!r} requested but MPS is not available{where} "
                "(torch.backends.mps.is_available() is False); use 'auto' or 'cpu'"
            )
        return device, f"explicit mps: MPS is available{where}"
    if device.type == "cpu":
        return device, "explicit cpu"
    return device, f"explicit {device}: passed to torch.device as given (availability not verified)"


def resolve_device(
    requested: Any = "auto", capabilities: Capabilities | str | None = None
) -> torch.device:
    """Resolve a device request to a ``torch.device`` (see the module docstring)."""
    return resolve_device_traced(requested, capabilities)[0]
