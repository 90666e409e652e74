"""Block-scaled formats (MXFP8, MXFP4, NVFP4) through torchao's own casts.

A numerics simulation only, like the fp8 what-if: a tensor is quantised with torchao's cast
(``torchao.prototype.mx_formats``: ``MXTensor.to_mx`` for the OCP MX formats, 32-element blocks
with a power-of-two E8M0 scale each; ``NVFP4Tensor.to_nvfp4`` for NVFP4, 16-element blocks with
an E4M3 scale each times one fp32 per-tensor scale) and dequantised back to fp32; nothing here is
re-implemented, so the values are torchao's bit for bit. torchao is an optional dependency (the
``blocks`` extra): :func:`torchao_api` imports it once, keeping the warnings its CUDA extensions
print on import out of the user's output and recording them (:func:`torchao_notes`).

Each cast blocks a 2-D tensor along its last dimension (the GEMM's reduction dimension for the
cast in question). A last dimension that is not a multiple of the block is padded with zeros to
the next multiple, as a kernel would need, and the statistics say how many zeros were added;
zeros do not change any block's amax, so the real elements are cast as in their padded block.
Non-finite elements (reported elsewhere) are set to 0 first: in the recipe one inf or NaN turns
its whole block into NaN.

The statistics of each cast are in :mod:`precision_nb.engine.numerics.block_stats`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType, SimpleNamespace
from typing import Any

import torch

from precision_nb.core.validate import short_repr
from precision_nb.engine.numerics.formats import FORMATS, format_name
from precision_nb.engine.quiet import captured

#: The optional extra that installs torchao.
EXTRA = "blocks"
INSTALL_HINT = 'pip install "precision-nb[blocks]" (torchao 0.18)'


@dataclass(frozen=True)
class BlockFormat:
    """One block-scaled format: element type, block size and scale format (torchao's cast)."""

    name: str
    element: str  # the torch dtype name of the elements
    block: int
    scale: str  # the scale format, in words
    element_max: float  # the largest element magnitude
    family: str  # "mx" (OCP MX, E8M0 scales) or "nvfp4"
    fp8_reference: str  # the per-tensor fp8 format its error is compared with

    @property
    def dtype(self) -> torch.dtype:
        return getattr(torch, self.element)


#: The block-scaled formats, by short name.
BLOCK_FORMATS: Mapping[str, BlockFormat] = MappingProxyType(
    {
        "mxfp8_e4m3": BlockFormat(
            "mxfp8_e4m3", "float8_e4m3fn", 32, "E8M0 (a power of two) per 32 elements", 448.0,
            "mx", "fp8_e4m3",
        ),
        "mxfp8_e5m2": BlockFormat(
            "mxfp8_e5m2", "float8_e5m2", 32, "E8M0 (a power of two) per 32 elements", 57344.0,
            "mx", "fp8_e5m2",
        ),
        "mxfp4": BlockFormat(
            "mxfp4", "float4_e2m1fn_x2", 32, "E8M0 (a power of two) per 32 elements", 6.0,
            "mx", "fp8_e4m3",
        ),
        "nvfp4": BlockFormat(
            "nvfp4", "float4_e2m1fn_x2", 16,
            "E4M3 per 16 elements times one fp32 per-tensor scale (amax / (448 * 6))", 6.0,
            "nvfp4", "fp8_e4m3",
        ),
    }
)  # fmt: skip

#: Other spellings of the block formats.
BLOCK_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "mxfp8": "mxfp8_e4m3",
        "mxfp8_e4m3fn": "mxfp8_e4m3",
        "mx_fp8": "mxfp8_e4m3",
        "mx_fp8_e4m3": "mxfp8_e4m3",
        "mx_fp8_e5m2": "mxfp8_e5m2",
        "mxfp4_e2m1": "mxfp4",
        "mx_fp4": "mxfp4",
        "nvfp4_e2m1": "nvfp4",
        "nv_fp4": "nvfp4",
    }
)


def block_format_name(value: Any) -> str | None:
    """The short name of a block format spelled as a name or an alias, else None."""
    if not isinstance(value, str):
        return None
    key = value.strip().lower().replace("-", "_")
    key = BLOCK_ALIASES.get(key, key)
    return key if key in BLOCK_FORMATS else None


#: How an MX block's power-of-two scale is rounded: torchao's ``ScaleCalculationMode`` member
#: and what it means. RCEIL is the default here: the rounding of cuBLAS's and Transformer
#: Engine's MXFP8 casts and of torchao's MXFP8 training; FLOOR (``to_mx``'s own default, the
#: OCP spec's minimal rule) saturates a block whose largest element lies between 448 x 2^k and
#: 512 x 2^k (for e4m3; 6 x 2^k and 8 x 2^k for e2m1).
MX_SCALE_MODES: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        "rceil": ("RCEIL", "2^ceil(log2(block amax / element max)): the block's largest element "
                  "fits, nothing saturates"),
        "floor": ("FLOOR", "2^(floor(log2(block amax)) - element emax), the OCP MX v1.0 rule: "
                  "elements above element max x scale saturate"),
    }
)  # fmt: skip
MX_SCALE_MODE = "rceil"

# ------------------------------------------------------------------------------ torchao import

log = logging.getLogger(__name__)
_NOTES: list[str] = []


@functools.lru_cache(maxsize=1)
def _import() -> tuple[Any, str | None]:
    """torchao's casts, or None and why not. What its import prints, warns or logs (its CUDA
    extensions cannot load on a CPU build of torch) is kept as notes, not shown."""
    notes: list[str] = []
    try:
        with captured(notes):
            from torchao.prototype.mx_formats.config import ScaleCalculationMode
            from torchao.prototype.mx_formats.mx_tensor import MXTensor, get_fp_scale
            from torchao.prototype.mx_formats.nvfp4_tensor import (
                NVFP4Tensor,
                per_tensor_amax_to_scale,
            )
    except ImportError as err:
        return None, f"{type(err).__name__}: {err}"
    finally:
        _NOTES[:] = list(dict.fromkeys(n.strip() for n in notes))
        for note in _NOTES:
            log.info("torchao import (kept out of the output): %s", note)
    import torchao

    return SimpleNamespace(
        MXTensor=MXTensor,
        ScaleCalculationMode=ScaleCalculationMode,
        get_fp_scale=get_fp_scale,
        NVFP4Tensor=NVFP4Tensor,
        per_tensor_amax_to_scale=per_tensor_amax_to_scale,
        version=getattr(torchao, "__version__", "unknown"),
    ), None


def torchao_api() -> Any:
    """torchao's cast functions; ``ImportError`` naming the extra when torchao is missing."""
    api, error = _import()
    if api is None:
        raise ImportError(
            "formats: the block-scaled formats ("
            + ", ".join(BLOCK_FORMATS)
            + f") are computed with torchao's own casts, and torchao cannot be imported here "
            f"({error}); install the optional extra '{EXTRA}': {INSTALL_HINT}"
        )
    return api


def torchao_notes() -> list[str]:
    """What torchao printed or warned when it was imported (kept out of the user's output)."""
    _import()
    return list(_NOTES)


# ------------------------------------------------------------------------------------ casting


def pad_last(x: torch.Tensor, block: int) -> tuple[torch.Tensor, int]:
    """``x`` with its last dimension zero-padded to a multiple of ``block``, contiguous, and how
    many zeros were added."""
    extra = (-x.shape[-1]) % block
    if extra:
        x = torch.nn.functional.pad(x, (0, extra))
    return x.contiguous(), extra * (x.numel() // x.shape[-1])


def cast_back(
    x: torch.Tensor,
    name: str,
    scale_mode: str = MX_SCALE_MODE,
    amax: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """torchao's cast of ``x`` (fp32, contiguous, last dimension a multiple of the block) to
    ``name`` and back to fp32 as a 2-D ``(rows, cols)`` tensor, and each block's effective scale
    (``(rows, cols / block)``; an element saturates when ``|x| / scale`` exceeds the largest
    element). ``scale_mode``: how an MX block's E8M0 scale is rounded (:data:`MX_SCALE_MODES`).
    ``amax``: NVFP4's per-tensor amax when ``x`` is some rows of a larger tensor (default:
    ``x``'s own); for a 3-D ``x``, one per leading index (torchao's per-expert scales)."""
    fmt = BLOCK_FORMATS[name]
    api = torchao_api()
    cols = x.shape[-1]
    if fmt.family == "mx":
        mode = getattr(api.ScaleCalculationMode, MX_SCALE_MODES[scale_mode][0])
        mx = api.MXTensor.to_mx(x, fmt.dtype, block_size=fmt.block, scaling_mode=mode)
        back = mx.dequantize(torch.float32).reshape(-1, cols)
        return back, api.get_fp_scale(mx.scale).reshape(back.shape[0], -1)
    amax = x.abs().amax() if amax is None else amax
    # an all-zero tensor: torchao's per-tensor scale would be 0 and its cast NaN; 1 keeps zeros
    scale = torch.where(amax > 0, api.per_tensor_amax_to_scale(amax), torch.ones_like(amax))
    if x.dim() == 3:
        scale = scale.reshape(-1, 1, 1)
    nv = api.NVFP4Tensor.to_nvfp4(x, block_size=fmt.block, per_tensor_scale=scale)
    back = nv.dequantize(torch.float32).reshape(-1, cols)
    return back, nv.get_hp_scales().reshape(back.shape[0], -1)


def block_cast(
    x: torch.Tensor, fmt: str, scale_mode: str = MX_SCALE_MODE
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` cast to the block format ``fmt`` with torchao and read back in fp32 (same shape),
    and each block's effective scale (``(rows, blocks per row)``: rows are ``x``'s leading
    dimensions, blocks run along its last one, zero-padded to a multiple of the block).

    ``fmt``: a name or alias of :data:`BLOCK_FORMATS`; ``scale_mode``: ``"rceil"`` or
    ``"floor"`` (:data:`MX_SCALE_MODES`, MX formats only). Non-finite elements count as 0."""
    name = block_format_name(fmt)
    if name is None:
        raise ValueError(
            f"fmt: invalid value {short_repr(fmt)}; allowed: "
            + ", ".join(repr(n) for n in BLOCK_FORMATS)
            + " (aliases: "
            + ", ".join(BLOCK_ALIASES)
            + ")"
        )
    if scale_mode not in MX_SCALE_MODES:
        raise ValueError(
            f"scale_mode: invalid value {short_repr(scale_mode)}; allowed: "
            + ", ".join(repr(m) for m in MX_SCALE_MODES)
        )
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() == 0:
        raise ValueError(
            f"x: invalid value of type {type(x).__name__}; allowed: a floating-point tensor with "
            "at least one dimension"
        )
    flat = x.detach().reshape(-1, x.shape[-1]).float()
    flat = torch.where(torch.isfinite(flat), flat, torch.zeros((), device=flat.device))
    padded, _ = pad_last(flat, BLOCK_FORMATS[name].block)
    back, scales = cast_back(padded, name, scale_mode)
    return back[:, : x.shape[-1]].reshape(x.shape), scales


def resolve_formats(values: Sequence[Any], field: str = "formats") -> tuple[list[str], list[str]]:
    """``(formats of FORMATS, block formats)`` named by ``values`` (names, aliases, torch
    dtypes), each once, in order; ``ValueError`` naming the bad value and every allowed one."""
    base: list[str] = []
    block: list[str] = []
    for value in values:
        name = block_format_name(value)
        if name is not None:
            block.append(name)
            continue
        try:
            base.append(format_name(value, field))
        except ValueError:
            raise ValueError(
                f"{field}: invalid value {short_repr(value)} ({type(value).__name__}); allowed: "
                + ", ".join(repr(n) for n in (*FORMATS, *BLOCK_FORMATS))
                + " (aliases: float16, half, bfloat16, float8_e4m3fn, e4m3, float8_e5m2, e5m2, "
                + "the torch dtypes, "
                + ", ".join(BLOCK_ALIASES)
                + ")"
            ) from None
    return list(dict.fromkeys(base)), list(dict.fromkeys(block))
