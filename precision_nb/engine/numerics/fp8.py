"""FP8 what-if: the error of casting a tensor to e4m3 / e5m2 with per-tensor amax scaling.

A numerics simulation only: nothing here trains in fp8. FP8 training libraries (Transformer
Engine, torchao's float8) multiply each tensor by ``scale = fp8_max / amax`` before the cast, so its
largest magnitude lands on the format's maximum, and divide by it after; this module does the same
with the tensor's own current amax (no amax history, no margin). Without that scaling, a cast loses
everything below the format's smallest subnormal: the unscaled underflow comes from
:func:`precision_nb.engine.numerics.formats.cast_counts`.
"""

from __future__ import annotations

import torch

from precision_nb.core.capabilities import FP8_MIN_COMPUTE_CAPABILITY, PRESETS, get_capabilities
from precision_nb.engine.numerics.formats import FORMATS, Magnitudes, magnitudes

#: Order of the values in the tensor :func:`scaled_error` returns.
ERROR_FIELDS: tuple[str, ...] = ("amax", "squared_error", "squared_norm", "underflow_scaled")

FP8_FORMATS: tuple[str, ...] = ("fp8_e4m3", "fp8_e5m2")


def scaled_error(x: torch.Tensor | Magnitudes, name: str) -> torch.Tensor:
    """Float64 device tensor (order :data:`ERROR_FIELDS`) for ``x`` cast to ``name`` with
    per-tensor amax scaling; non-finite elements are left out (they are reported elsewhere).

    Works on ``|x|``: rounding to nearest is symmetric, so the error is the same as for ``x``.
    """
    m = magnitudes(x)
    info = FORMATS[name]
    a = m.a
    amax = a.amax() if a.numel() else torch.zeros((), device=a.device)
    scale = torch.where(amax > 0, info.max / amax, torch.ones((), device=a.device))
    back = (a * scale).to(info.dtype).float() / scale
    err = torch.linalg.vector_norm(back - a).double().square()
    norm = torch.linalg.vector_norm(a).double().square()
    lost = torch.count_nonzero(back == 0) - m.dead
    return torch.stack([amax.double(), err, norm, lost.double()])


def merge(a: torch.Tensor | None, b: torch.Tensor) -> torch.Tensor:
    """Combine two :func:`scaled_error` results of one module called twice (amax: the max)."""
    if a is None:
        return b
    out = a + b
    out[0] = torch.maximum(a[0], b[0])
    return out


def relative_error(values: list[float]) -> float | None:
    """Norm-wise relative error ``||cast(x) - x|| / ||x||`` from :func:`scaled_error` values."""
    fields = dict(zip(ERROR_FIELDS, values, strict=True))
    if not fields["squared_norm"] > 0:
        return None
    return (fields["squared_error"] / fields["squared_norm"]) ** 0.5


def hardware_note() -> dict[str, object]:
    """Which hardware runs fp8 matmuls, from the capability presets, and whether this one does."""
    presets = []
    for name in PRESETS:
        if name == "this-machine":
            continue
        caps = get_capabilities(name)
        if caps.fp8_matmul:
            cc = ".".join(map(str, caps.compute_capability or ()))
            presets.append(f"{name} ({caps.device_name}, compute capability {cc})")
    here = get_capabilities(None)
    minimum = ".".join(map(str, FP8_MIN_COMPUTE_CAPABILITY))
    return {
        "min_compute_capability": minimum,
        "presets": presets,
        "this_machine": here.fp8_matmul,
        "text": (
            "A numerics simulation: tensors are cast to fp8 and back; no fp8 training runs here. "
            f"FP8 matmuls run on CUDA GPUs with compute capability {minimum} or newer"
            + (f" (simulated preset: {', '.join(presets)})" if presets else "")
            + "; this machine: "
            + {True: "yes", False: "no", None: "unknown"}[here.fp8_matmul]
            + "."
        ),
    }
