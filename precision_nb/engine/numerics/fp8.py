"""FP8 what-if: the error of casting a tensor to e4m3 / e5m2 with per-tensor amax scaling.

A numerics simulation only: nothing here trains in fp8. The cast is torchao.float8's default
recipe, dynamic ("current") per-tensor scaling, step for step: ``scale = fp8_max / max(amax,
1e-12)`` computed in float64 and rounded to fp32 (``torchao.float8.float8_utils.amax_to_scale``),
``x * scale`` clamped to +-fp8_max and cast (``to_fp8_saturated``), and divided by the scale to
read it back. The amax is the tensor's own, now: torchao removed its delayed scaling in 2025.
Every tensor kind is cast in both formats; :func:`recipe_role` says which of those casts the
recipes make (weight gradients: none of them).
Transformer Engine's ``DelayedScaling`` recipe instead takes the largest amax of a history of
earlier steps (``amax_history_len``, 1024 by default) with a ``margin`` (default 0), and TE also
ships current scaling (``Float8CurrentScaling``) and block-scaled recipes. Without scaling, a cast
loses everything below the format's smallest subnormal: the unscaled underflow comes from
:func:`precision_nb.engine.numerics.formats.cast_counts`.
"""

from __future__ import annotations

import torch

from precision_nb.core.capabilities import FP8_MIN_COMPUTE_CAPABILITY, PRESETS, get_capabilities
from precision_nb.engine.numerics.formats import FORMATS, Magnitudes, magnitudes

#: Order of the values in the tensor :func:`scaled_error` returns.
ERROR_FIELDS: tuple[str, ...] = ("amax", "squared_error", "squared_norm", "underflow_scaled")

FP8_FORMATS: tuple[str, ...] = ("fp8_e4m3", "fp8_e5m2")

#: The floor torchao.float8 puts under the amax before dividing by it.
AMAX_EPS = 1e-12

#: The format the default tensorwise recipes (torchao.float8's tensorwise config, Transformer
#: Engine's HYBRID format) cast each tensor of a linear layer to; None: neither casts it, since
#: the weight-gradient GEMM reads grad_output (e5m2) and the input (e4m3) and writes the weight
#: gradient in high precision.
RECIPE_FORMAT: dict[str, str | None] = {
    "weight": "fp8_e4m3",
    "activation": "fp8_e4m3",
    "activation_grad": "fp8_e5m2",
    "weight_grad": None,
}
#: Values of an fp8 row's ``recipe`` column.
RECIPE = "recipe cast"
OTHER_FORMAT = "recipes use the other format"
OUTSIDE = "outside the recipes (kept in high precision)"


def recipe_role(tensor: str, fmt: str) -> str:
    """Whether the default recipes cast ``tensor`` to ``fmt`` (see :data:`RECIPE_FORMAT`): a row
    outside them is a what-if no torchao or Transformer Engine recipe makes."""
    target = RECIPE_FORMAT.get(tensor)
    if target is None:
        return OUTSIDE
    return RECIPE if fmt == target else OTHER_FORMAT


def scaled_error(x: torch.Tensor | Magnitudes, name: str) -> torch.Tensor:
    """Float64 device tensor (order :data:`ERROR_FIELDS`) for ``x`` cast to ``name`` with
    per-tensor amax scaling (the module's recipe); non-finite elements are left out (they are
    reported elsewhere).

    Works on ``|x|``: rounding to nearest and saturation are symmetric, so the error is the same
    as for ``x``.
    """
    m = magnitudes(x)
    info = FORMATS[name]
    a = m.a
    amax = a.amax() if a.numel() else torch.zeros((), device=a.device)
    scale = (info.max / amax.double().clamp(min=AMAX_EPS)).float()
    back = (a * scale).clamp(max=info.max).to(info.dtype).float() / scale
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
    known = {name: get_capabilities(name) for name in PRESETS if name != "this-machine"}
    presets = [
        f"{name} ({caps.device_name}, compute capability "
        f"{'.'.join(map(str, caps.compute_capability or ()))})"
        for name, caps in known.items()
        if caps.fp8_matmul
    ]
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
