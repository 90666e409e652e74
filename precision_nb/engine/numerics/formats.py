"""Low-precision formats and exact cast counts: what becomes zero, subnormal or overflows.

Every count comes from really casting the tensor with torch on its own device, so rounding at the
format boundaries is exactly what a cast does (round to nearest, ties to even). Format limits come
from ``torch.finfo``. Counts are returned as device tensors, so a caller can collect many and read
them with one host transfer.

Classes of an fp32 element ``x`` cast to a format (``scale`` multiplies first, as a loss scaler
does):

- **structural zero**: ``x == 0`` already in fp32 (behind a ReLU, a masked position...); never
  counted as underflow;
- **non-finite**: ``x`` is inf/NaN already in fp32 (a finding of its own, never cast-counted);
- **underflow**: ``x`` is finite and non-zero, its cast is zero;
- **subnormal**: the cast is non-zero but below the smallest normal value (precision is lost);
- **overflow**: the value lies beyond the largest finite value after rounding. A cast gives inf
  there for fp16, bf16 and e5m2; ``float8_e4m3fn`` has no inf, and what its cast does is read from
  torch at run time (:func:`overflow_behaviour`: torch builds differ, saturating to +-448 or NaN),
  so overflow is told against the smallest magnitude that overflows (:func:`overflow_limit`,
  found by casting), which holds either way.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch

from precision_nb.core.validate import short_repr

#: Order of the counts in the tensor :func:`cast_counts` returns.
COUNT_FIELDS: tuple[str, ...] = ("zeros", "nonfinite", "underflow", "subnormal", "overflow")


@dataclass(frozen=True)
class FormatInfo:
    """Limits of one floating-point format (from ``torch.finfo``)."""

    name: str
    dtype: torch.dtype
    max: float
    smallest_normal: float
    smallest_subnormal: float
    mantissa_bits: int
    has_inf: bool

    @property
    def label(self) -> str:
        return str(self.dtype).replace("torch.", "")


def _info(name: str, dtype: torch.dtype, has_inf: bool) -> FormatInfo:
    fi = torch.finfo(dtype)
    mantissa = round(-math.log2(fi.eps))
    normal = float(fi.smallest_normal)
    return FormatInfo(
        name, dtype, float(fi.max), normal, normal * 2.0**-mantissa, mantissa, has_inf
    )


#: The formats analysed, by short name.
FORMATS: Mapping[str, FormatInfo] = MappingProxyType(
    {
        "fp16": _info("fp16", torch.float16, True),
        "bf16": _info("bf16", torch.bfloat16, True),
        "fp8_e4m3": _info("fp8_e4m3", torch.float8_e4m3fn, False),  # "fn": finite + NaN only
        "fp8_e5m2": _info("fp8_e5m2", torch.float8_e5m2, True),
    }
)

_ALIASES = {
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "e4m3": "fp8_e4m3",
    "float8_e4m3fn": "fp8_e4m3",
    "fp8_e4m3fn": "fp8_e4m3",
    "e5m2": "fp8_e5m2",
    "float8_e5m2": "fp8_e5m2",
}


def format_name(value: Any, field: str = "formats") -> str:
    """The short name of a format spelled as a name, an alias or a torch dtype."""
    if isinstance(value, torch.dtype):
        for info in FORMATS.values():
            if info.dtype == value:
                return info.name
    if isinstance(value, str):
        key = value.strip().lower().replace("torch.", "").replace("-", "_")
        key = _ALIASES.get(key, key)
        if key in FORMATS:
            return key
    raise ValueError(
        f"{field}: invalid value {short_repr(value)} ({type(value).__name__}); allowed: "
        + ", ".join(repr(n) for n in FORMATS)
        + " (or float16, bfloat16, float8_e4m3fn, float8_e5m2)"
    )


def overflow_behaviour(name: str) -> str:
    """What a cast of a finite value beyond the format's range gives, read from torch now:
    ``"inf"``, ``"nan"`` or ``"saturates"`` (to +-max)."""
    info = FORMATS[format_name(name)]
    out = float(torch.tensor([info.max * 4.0]).to(info.dtype).float()[0])
    return "inf" if math.isinf(out) else "nan" if math.isnan(out) else "saturates"


@dataclass(frozen=True)
class Magnitudes:
    """What every count of one tensor shares: ``a = |x|`` in fp32 with non-finite elements set
    to 0, and device counts of structural zeros and non-finite elements. A cast of ``|x|`` is
    the magnitude of the cast of ``x`` (rounding to nearest is symmetric), so one ``a`` serves
    every format and scale."""

    a: torch.Tensor
    zeros: torch.Tensor
    nonfinite: torch.Tensor

    @property
    def elements(self) -> int:
        return self.a.numel()

    @property
    def dead(self) -> torch.Tensor:
        """Elements no cast can lose: structural zeros and non-finite ones."""
        return self.zeros + self.nonfinite


def magnitudes(x: torch.Tensor | Magnitudes) -> Magnitudes:
    """:class:`Magnitudes` of ``x`` (returned as is when it already is one)."""
    if isinstance(x, Magnitudes):
        return x
    x = x.detach()
    if x.dtype != torch.float32:
        x = x.float()
    finite = torch.isfinite(x)
    a = torch.where(finite, x.abs(), torch.zeros((), device=x.device))
    return Magnitudes(a, torch.count_nonzero(x == 0), x.numel() - torch.count_nonzero(finite))


_BITS = {1: torch.uint8, 2: torch.int16}


@functools.lru_cache(maxsize=8)
def _normal_bits(name: str) -> int:
    info = FORMATS[name]
    one = torch.tensor([info.smallest_normal]).to(info.dtype)
    return int(one.view(_BITS[one.element_size()])[0])


@functools.lru_cache(maxsize=8)
def overflow_limit(name: str) -> float:
    """The smallest fp32 magnitude whose cast to ``name`` overflows, found by casting: the
    candidate is the midpoint above the maximum, tested with ``cast(v / 2) * 2 > max`` (scaling
    by 2 moves no rounding position while the value stays normal; e4m3fn has no inf to see)."""
    info = FORMATS[name]

    def beyond(v: torch.Tensor) -> bool:
        half = (v * 0.5).to(info.dtype).float().abs() * 2.0
        return bool(half[0] > info.max) or not bool(torch.isfinite(v.to(info.dtype).float())[0])

    ulp = 2.0 ** (math.floor(math.log2(info.max)) - info.mantissa_bits)
    o = torch.tensor([info.max + ulp / 2], dtype=torch.float32)
    if not beyond(o):
        o = torch.nextafter(o, torch.tensor([math.inf]))
    return float(o[0])


@functools.lru_cache(maxsize=8)
def normal_limit(name: str) -> float:
    """The smallest fp32 magnitude whose cast to ``name`` is a normal number, found by casting:
    the midpoint between the largest subnormal and the smallest normal, or its fp32 neighbour
    above when the midpoint rounds down (for fp16, ``2^-14 - 2^-25`` rounds up to ``2^-14``)."""
    info = FORMATS[name]
    v = torch.tensor([info.smallest_normal - info.smallest_subnormal / 2], dtype=torch.float32)
    if float(v.to(info.dtype).float()[0]) < info.smallest_normal:
        v = torch.nextafter(v, torch.tensor([math.inf]))
    return float(v[0])


def count_casts(
    x: torch.Tensor | Magnitudes, specs: Sequence[tuple[str, float | torch.Tensor | None]]
) -> torch.Tensor:
    """``(len(specs), 5)`` int64 device tensor: counts (order :data:`COUNT_FIELDS`) of ``x *
    scale`` cast to each ``(format, scale)`` of ``specs`` (``scale`` ``None``: unscaled).

    Zero and subnormal results are read from the bits of the real cast; overflow is ``|x| *
    scale >= overflow_limit(format)`` (exact: rounding is monotone, the limit comes from a cast).
    Working memory: a few temporaries the size of ``x``.
    """
    m = magnitudes(x)
    if not specs:  # e.g. the fp8 counts of an activation when no fp8 format was asked for
        return torch.zeros((0, len(COUNT_FIELDS)), dtype=torch.int64, device=m.a.device)
    dead = m.dead
    rows = []
    for name, scale in specs:
        info = FORMATS[name]
        b = m.a if scale is None else m.a * scale
        cast = b.to(info.dtype)
        bits = cast.view(_BITS[cast.element_size()])
        zero = torch.count_nonzero(bits == 0)  # structural zeros and non-finite (set to 0) included
        below_normal = torch.count_nonzero(bits < _normal_bits(name))
        over = torch.count_nonzero(b >= overflow_limit(name))
        rows.append(torch.stack([m.zeros, m.nonfinite, zero - dead, below_normal - zero, over]))
    return torch.stack(rows)


def cast_counts(
    x: torch.Tensor | Magnitudes, name: str, scale: float | torch.Tensor | None = None
) -> torch.Tensor:
    """Counts (int64 device tensor, order :data:`COUNT_FIELDS`) of ``x * scale`` cast to
    ``name``; see :func:`count_casts`."""
    return count_casts(x, [(name, scale)])[0]


def counts_row(counts: Any, elements: int) -> dict[str, Any]:
    """Plain row from host counts: the counts, ``live`` (finite non-zero elements) and fractions.

    ``underflow``, ``subnormal`` and ``overflow`` fractions are of the live elements (the ones a
    cast could lose; ``None`` when there are none); ``zero_fraction`` is of all elements.
    """
    c = dict(zip(COUNT_FIELDS, (int(v) for v in counts), strict=True))
    live = elements - c["zeros"] - c["nonfinite"]
    row: dict[str, Any] = {"elements": elements, "live": live, **c}
    row["zero_fraction"] = c["zeros"] / elements if elements else None
    for key in ("underflow", "subnormal", "overflow"):
        row[f"{key}_fraction"] = c[key] / live if live else None
    return row
