"""Statistics of one block-scaled cast: relative error, underflow and saturation, with intervals.

:func:`block_stats` casts a 2-D matrix (rows blocked along the last dimension) with torchao
(:func:`~precision_nb.engine.numerics.blocks.cast_back`) and sums, per row: the squared error
and squared norm (the norm-wise relative error is ``sqrt(sum err / sum norm)``), the live
elements (finite, non-zero), those the cast turns into 0 (underflow) and those beyond the largest
element times their block's scale (saturated, clamped: ``|x| / scale > element max``).

Rows are independent in every format here (an MX block lies inside a row; NVFP4's per-tensor
scale is taken from the whole tensor's amax), so a matrix with more than
:data:`SAMPLE_ELEMENTS` elements is cast on a simple random sample of whole rows (a fixed seed),
and every row cast is bit for bit what casting the whole matrix gives that row. The sums then
estimate the whole matrix's ratios, and :func:`estimate` gives each a 95 % interval from the
ratio estimator's standard error for sampling without replacement (zero when every row was
cast). The tests check how often those intervals cover the exact value.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from precision_nb.engine.numerics.blocks import BLOCK_FORMATS, MX_SCALE_MODE, cast_back, pad_last

#: Casts of larger matrices use a random sample of whole rows with about this many elements.
SAMPLE_ELEMENTS = 2**16
#: Two-sided 95 % normal quantile.
Z95 = 1.959963984540054

#: Order of the values in the tensor :func:`block_stats` returns: sums over the cast rows of
#: the per-row values e (squared error), n (squared norm), l (live), u (underflow), s
#: (saturated) and their products (for the standard errors), then the row and element counts.
BLOCK_FIELDS: tuple[str, ...] = (
    "e", "n", "l", "u", "s", "ee", "nn", "en", "ll", "uu", "ul", "ss", "sl",
    "rows_cast", "rows", "elements", "padded",
)  # fmt: skip


def _rows(x: torch.Tensor) -> torch.Tensor:
    """A sorted random sample of row indices (fixed seed) when ``x`` is too large, else None."""
    rows, cols = x.shape
    want = max(2, math.ceil(SAMPLE_ELEMENTS / max(cols, 1)))
    if want >= rows:
        return None
    gen = torch.Generator(device=x.device).manual_seed(0)
    return torch.randperm(rows, generator=gen, device=x.device)[:want].sort().values


def block_stats(x: torch.Tensor, name: str, scale_mode: str = MX_SCALE_MODE) -> torch.Tensor:
    """Float64 device tensor (order :data:`BLOCK_FIELDS`) of ``x`` blocked along its last
    dimension and cast to ``name`` (leading dimensions are rows; non-finite elements count as
    0; a last dimension that is not a multiple of the block is zero-padded, ``padded`` says by
    how many elements)."""
    fmt = BLOCK_FORMATS[name]
    x = x.detach()
    x = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    x = x.float()
    out = torch.zeros(len(BLOCK_FIELDS), dtype=torch.float64, device=x.device)
    if x.numel() == 0:
        return out
    x = torch.where(torch.isfinite(x), x, torch.zeros((), device=x.device))
    amax = x.abs().amax() if fmt.family == "nvfp4" else None
    pick = _rows(x)
    part = x if pick is None else x.index_select(0, pick)
    padded, _ = pad_last(part, fmt.block)
    back, scales = cast_back(padded, name, scale_mode, amax=amax)
    live = padded != 0
    rows, nblocks = padded.shape[0], padded.shape[1] // fmt.block
    limit = (scales * fmt.element_max).reshape(rows, nblocks, 1)
    over = padded.abs().reshape(rows, nblocks, fmt.block) > limit
    per_row = torch.stack(
        [
            (back - padded).double().square().sum(1),
            padded.double().square().sum(1),
            live.sum(1).double(),
            (live & (back == 0)).sum(1).double(),
            over.reshape(rows, -1).sum(1).double(),
        ]
    )
    e, n, lv, u, s = per_row
    out[:13] = torch.stack(
        [e.sum(), n.sum(), lv.sum(), u.sum(), s.sum(), (e * e).sum(), (n * n).sum(),
         (e * n).sum(), (lv * lv).sum(), (u * u).sum(), (u * lv).sum(), (s * s).sum(),
         (s * lv).sum()]
    )  # fmt: skip
    out[13] = rows
    out[14] = x.shape[0]
    out[15] = x.numel()
    out[16] = (-x.shape[1]) % fmt.block * x.shape[0]
    return out


def _ratio(sy: float, sx: float, syy: float, sxx: float, sxy: float, m: float, big_m: float):
    """``sum y / sum x`` over the cast rows and its standard error as an estimate of the
    whole matrix's ratio (simple random sample of ``m`` of ``big_m`` rows; 0 when all were)."""
    if sx <= 0:
        return None, None
    r = sy / sx
    if m >= big_m or m < 2:
        return r, 0.0
    resid = max(syy - 2 * r * sxy + r * r * sxx, 0.0)
    mean_x = sx / m
    var = (1 - m / big_m) * resid / (m * (m - 1)) / mean_x**2
    return r, math.sqrt(var)


def estimate(values: list[float]) -> dict[str, Any]:
    """Host values of :func:`block_stats` -> the relative error, underflow and saturated
    fractions (of the live elements), each with the half-width of its 95 % interval
    (``*_pm``, 0 when exact), and the counts."""
    v = dict(zip(BLOCK_FIELDS, values, strict=True))
    m, big_m = v["rows_cast"], v["rows"]
    out: dict[str, Any] = {
        "elements": int(v["elements"]),
        "padded": int(v["padded"]),
        "rows": int(big_m),
        "rows_cast": int(m),
    }
    r, se = _ratio(v["e"], v["n"], v["ee"], v["nn"], v["en"], m, big_m)
    out["rel_error"] = math.sqrt(r) if r is not None else None
    # delta method: d sqrt(r) = dr / (2 sqrt(r))
    out["rel_error_pm"] = Z95 * se / (2 * out["rel_error"]) if r else (0.0 if r == 0 else None)
    for key, field in (("underflow", "u"), ("saturated", "s")):
        sxy = v["ul"] if field == "u" else v["sl"]
        f, fse = _ratio(v[field], v["l"], v[field * 2], v["ll"], sxy, m, big_m)
        out[f"{key}_fraction"] = f
        out[f"{key}_pm"] = Z95 * fse if fse is not None else None
    return out


def reference_stats(x: torch.Tensor) -> torch.Tensor:
    """Float64 device tensor ``[squared error of the bf16 cast, squared norm]`` of ``x``."""
    x = x.detach().float()
    x = torch.where(torch.isfinite(x), x, torch.zeros((), device=x.device))
    err = torch.linalg.vector_norm(x.to(torch.bfloat16).float() - x).double().square()
    return torch.stack([err, torch.linalg.vector_norm(x).double().square()])


def relative(err: float, norm: float) -> float | None:
    """``sqrt(err / norm)``, None when the norm is 0 (nothing to lose)."""
    return (err / norm) ** 0.5 if norm > 0 else None
