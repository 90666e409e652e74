"""Statistics of one block-scaled cast: relative error, underflow and saturation, with intervals.

:func:`block_stats` casts a 2-D matrix (rows blocked along the last dimension) with torchao
(:func:`~precision_nb.engine.numerics.blocks.cast_back`) and sums, per row: the squared error
and squared norm (the norm-wise relative error is ``sqrt(sum err / sum norm)``), the live
elements (finite, non-zero), those the cast turns into 0 (underflow) and those beyond the largest
element times their block's scale (saturated, clamped: ``|x| / scale > element max``).

Rows are independent in every format here (an MX block lies inside a row; NVFP4's per-tensor
scale is taken from the whole tensor's amax), so a matrix with more than
:data:`SAMPLE_ELEMENTS` elements is cast on a sample of whole rows (a fixed seed), and every row
cast is bit for bit what casting the whole matrix gives that row. Two samples share the cast,
half the rows each:

- the relative error: rows so heavy that they dominate the squared norm (a few tokens with large
  activations are common) are cast whole; the others are drawn with replacement with probability
  proportional to their squared norm, which makes the mean of the drawn rows' own relative
  squared errors an unbiased estimate of theirs, with the standard error of that mean;
- the underflow and saturated fractions: a simple random sample of rows, a ratio estimator of
  the live elements' fraction, with its standard error for sampling without replacement.

The squared norm and the live elements of every row are counted exactly (no cast needed).
:func:`estimate` turns the sums into values with 95 % intervals (see there; they shrink to the
value when every row was cast); the tests check by simulation how often they cover the exact
value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from precision_nb.engine.numerics.blocks import BLOCK_FORMATS, MX_SCALE_MODE, cast_back, pad_last
from precision_nb.engine.stats import t_quantile

#: Casts of larger matrices use a sample of whole rows with about this many elements...
SAMPLE_ELEMENTS = 2**14
#: ... and at least this many rows (half for each of the two samples).
MIN_SAMPLE_ROWS = 32
#: The confidence of the sampled casts' intervals (:func:`t95`).
SAMPLE_CONFIDENCE = 0.95


def t95(df: float) -> float:
    """Two-sided 95 % quantile of Student's t with ``df`` degrees of freedom (scipy.stats)."""
    return t_quantile(0.975, df) if df >= 1 else math.inf


#: Order of the values in the tensor :func:`block_stats` returns: estimated totals of the
#: squared error, underflowed and saturated elements (exact when every row was cast), the exact
#: squared norm and live elements, the variances of the three estimates, then counts.
BLOCK_FIELDS: tuple[str, ...] = (
    "error", "norm", "underflow", "saturated", "live", "error_var", "underflow_var",
    "saturated_var", "sample", "live_sample", "rows_cast", "rows", "elements", "padded",
)  # fmt: skip


def sample_rows(
    x: torch.Tensor, norms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``(uniform, certain, drawn)`` row indices when ``x`` is too large to cast whole, else
    None. ``uniform``: a simple random sample (half the budget). ``certain``: the rows so heavy
    that a draw in proportion to the squared norm would pick each at least once in expectation
    (cast whole, beyond the budget, at most half of it). ``drawn``: half the budget, drawn with
    replacement from the other rows in proportion to their squared norms. Fixed seed."""
    rows, cols = x.shape
    want = max(MIN_SAMPLE_ROWS, math.ceil(SAMPLE_ELEMENTS / max(cols, 1)))
    if want >= rows:
        return None
    half = want // 2
    gen = torch.Generator(device=x.device).manual_seed(0)
    uniform = torch.randperm(rows, generator=gen, device=x.device)[:half]
    order = norms.argsort(descending=True)
    ranked = norms[order]
    rest = ranked.flip(0).cumsum(0).flip(0)  # the norm of this row and all lighter ones
    heavy = (ranked * half >= rest) & (rest > 0)
    certain_n = int(heavy[:half].long().cumprod(0).sum())
    others = order[certain_n:]
    weights = norms[others]
    weights = weights + (weights.sum() == 0).double()  # all zero: any row will do
    drawn = others[torch.multinomial(weights, half, replacement=True, generator=gen)]
    return uniform, order[:certain_n], drawn


def _per_row(x: torch.Tensor, name: str, scale_mode: str, amax: Any) -> torch.Tensor:
    """``(4, rows)``: squared error, live, underflow and saturated elements of each row of
    ``x`` cast to ``name`` (a 3-D ``x``: NVFP4 per expert, rows counted across experts)."""
    fmt = BLOCK_FORMATS[name]
    padded, _ = pad_last(x, fmt.block)
    back, scales = cast_back(padded, name, scale_mode, amax=amax)
    padded = padded.reshape(-1, padded.shape[-1])
    live = padded != 0
    rows, nblocks = padded.shape[0], padded.shape[1] // fmt.block
    limit = (scales * fmt.element_max).reshape(rows, nblocks, 1)
    over = padded.abs().reshape(rows, nblocks, fmt.block) > limit
    return torch.stack(
        [
            (back - padded).double().square().sum(1),
            live.sum(1).double(),
            (live & (back == 0)).sum(1).double(),
            over.reshape(rows, -1).sum(1).double(),
        ]
    )


def _ratio_total(
    y: torch.Tensor, live: torch.Tensor, total: torch.Tensor, rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Estimated total of ``y`` (a simple random sample of rows out of ``rows``) from the ratio
    ``sum y / sum live`` times the exact ``total`` live, and that estimate's variance."""
    m = y.numel()
    ratio = y.sum() / live.sum().clamp(min=1.0)
    resid = (y - ratio * live).square().sum()
    mean_live = (live.sum() / m).clamp(min=1e-300)
    var = (1 - m / rows) * resid / (m * (m - 1)) / mean_live.square()
    return ratio * total, var * total.square()


@dataclass
class _Operand:
    """One matrix prepared for casting: finite, 2-D fp32, its row norms, totals and sample."""

    x: torch.Tensor
    norms: torch.Tensor
    norm: torch.Tensor
    live: torch.Tensor
    sample: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    part: torch.Tensor  # the rows to cast
    where: torch.Tensor | None  # for each sampled index, its row in ``part``


def _prepare(x: torch.Tensor) -> _Operand:
    x = x.detach()
    x = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    x = torch.where(torch.isfinite(x), x.float(), torch.zeros((), device=x.device))
    norms = x.double().square().sum(1)
    sample = sample_rows(x, norms)
    if sample is None:
        part, where = x.contiguous(), None
    else:
        picked, where = torch.unique(torch.cat(list(sample)), return_inverse=True)
        part = x.index_select(0, picked)
    return _Operand(x, norms, norms.sum(), (x != 0).sum().double(), sample, part, where)


def _cast_rows(ops: list[_Operand], name: str, scale_mode: str) -> list[torch.Tensor]:
    """:func:`_per_row` of every operand's rows to cast, in one torchao call (the operands share
    their number of columns; MX: their rows stacked, every block lies in a row; NVFP4: stacked
    as a 3-D tensor with one per-tensor scale each, torchao's per-expert scaling)."""
    sizes = [op.part.shape[0] for op in ops]
    if BLOCK_FORMATS[name].family != "nvfp4":
        return list(_per_row(torch.cat([op.part for op in ops]), name, scale_mode, None).split(
            sizes, dim=1
        ))  # fmt: skip
    if len(ops) == 1:
        return [_per_row(ops[0].part, name, scale_mode, ops[0].x.abs().amax())]
    longest = max(sizes)
    pad = torch.nn.functional.pad
    stacked = torch.stack([pad(op.part, (0, 0, 0, longest - op.part.shape[0])) for op in ops])
    amax = torch.stack([op.x.abs().amax() for op in ops])
    rows = _per_row(stacked, name, scale_mode, amax).reshape(4, len(ops), longest)
    return [rows[:, i, :n] for i, n in enumerate(sizes)]


def block_stats_many(
    views: Sequence[torch.Tensor], names: Sequence[str], scale_mode: str = MX_SCALE_MODE
) -> list[torch.Tensor]:
    """:func:`block_stats` of several matrices, one ``(len(names), fields)`` tensor each; those
    with the same number of columns are cast together, one torchao call per format (each row
    is cast exactly as on its own)."""
    ops = [_prepare(v) for v in views]
    out: list[list[torch.Tensor]] = [[] for _ in ops]
    groups: dict[int, list[int]] = {}
    for i, op in enumerate(ops):
        if op.x.numel():
            groups.setdefault(op.x.shape[1], []).append(i)
    for fmt_name in names:
        block = BLOCK_FORMATS[fmt_name].block
        for i in (i for i, op in enumerate(ops) if not op.x.numel()):
            out[i].append(
                torch.zeros(len(BLOCK_FIELDS), dtype=torch.float64, device=views[i].device)
            )
        for members in groups.values():
            per_rows = _cast_rows([ops[i] for i in members], fmt_name, scale_mode)
            for i, per_row in zip(members, per_rows, strict=True):
                out[i].append(_values(ops[i], per_row, block))
    return [torch.stack(per_format) for per_format in out]


def _values(op: _Operand, per_row: torch.Tensor, block: int) -> torch.Tensor:
    """The :data:`BLOCK_FIELDS` of one operand from its cast rows."""
    rows = op.x.shape[0]
    if op.where is None:
        e, _live, u, s = per_row
        values: list[Any] = [e.sum(), op.norm, u.sum(), s.sum(), op.live, 0.0, 0.0, 0.0, 0, 0, rows]
    else:
        values = _sampled(per_row, op, rows)
    values += [rows, op.x.numel(), (-op.x.shape[1]) % block * rows]
    device = op.x.device
    return torch.stack([torch.as_tensor(v, dtype=torch.float64, device=device) for v in values])


def block_stats(x: torch.Tensor, name: str, scale_mode: str = MX_SCALE_MODE) -> torch.Tensor:
    """Float64 device tensor (order :data:`BLOCK_FIELDS`) of ``x`` blocked along its last
    dimension and cast to ``name`` (leading dimensions are rows; non-finite elements count as
    0; a last dimension that is not a multiple of the block is zero-padded, ``padded`` says by
    how many elements). Sums of several calls add up (a layer called twice)."""
    return block_stats_many([x], [name], scale_mode)[0][0]


def _sampled(per_row: torch.Tensor, op: _Operand, rows: int) -> list[Any]:
    """The estimated totals and variances (see the module) from the cast rows of a sample."""
    assert op.sample is not None and op.where is not None
    uniform, certain, drawn = op.sample
    where, norms, norm, live = op.where, op.norms, op.norm, op.live
    e, lv, u, s = per_row
    at_u, at_c, at_d = where.split([uniform.numel(), certain.numel(), drawn.numel()])
    # the heavy rows exactly; the others drawn in proportion to their norms, where the mean of
    # e_i / n_i estimates their sum e / sum n
    rest = norm - norms[certain].sum()
    r = e[at_d] / norms[drawn].clamp(min=1e-300)
    error = e[at_c].sum() + rest * r.mean()
    error_var = rest.square() * r.var() / r.numel()
    u_hat, u_var = _ratio_total(u[at_u], lv[at_u], live, rows)
    s_hat, s_var = _ratio_total(s[at_u], lv[at_u], live, rows)
    picked = where.max() + 1  # the rows cast
    return [error, norm, u_hat, s_hat, live, error_var, u_var, s_var, drawn.numel(),
            lv[at_u].sum(), picked]  # fmt: skip


def _wilson(p: float, n: float, q: float) -> tuple[float, float]:
    """Wilson's score interval of a proportion ``p`` from ``n`` (effective) observations."""
    if n <= 0:
        return 0.0, 1.0
    denom = 1 + q * q / n
    centre = (p + q * q / (2 * n)) / denom
    half = q / denom * math.sqrt(max(p * (1 - p), 0.0) / n + q * q / (4 * n * n))
    return max(centre - half, 0.0), min(centre + half, 1.0)


def estimate(values: list[float]) -> dict[str, Any]:
    """Host values of :func:`block_stats` -> the relative error, underflow and saturated
    fractions (of the live elements), each with its 95 % interval (``*_low``, ``*_high``;
    equal to the value when every row was cast), and the counts.

    The relative error's interval is ``sqrt`` of the squared one's, ``r +- t se``. A fraction's
    is Wilson's score interval for the sample's effective size (``p (1 - p) / variance``, the
    design effect of sampling whole rows; the live elements cast when no variance was seen),
    which stays honest for rare events (a few underflows), where ``p +- t se`` is not."""
    v = dict(zip(BLOCK_FIELDS, values, strict=True))
    q = t95(v["sample"] - 1) if v["sample"] else 0.0  # each sample: half the rows cast
    out: dict[str, Any] = {
        "elements": int(v["elements"]),
        "padded": int(v["padded"]),
        "rows": int(v["rows"]),
        "rows_cast": int(v["rows_cast"]),
    }
    if v["norm"] > 0:
        r = max(v["error"], 0.0) / v["norm"]
        se = math.sqrt(max(v["error_var"], 0.0)) / v["norm"]
        out["rel_error"] = math.sqrt(r)
        out["rel_error_low"] = math.sqrt(max(r - q * se, 0.0))
        out["rel_error_high"] = math.sqrt(r + q * se)
    else:
        out["rel_error"] = out["rel_error_low"] = out["rel_error_high"] = None
    for key in ("underflow", "saturated"):
        if not v["live"] > 0:
            out[f"{key}_fraction"] = out[f"{key}_low"] = out[f"{key}_high"] = None
            continue
        p = min(max(v[key] / v["live"], 0.0), 1.0)
        out[f"{key}_fraction"] = p
        if not v["sample"]:
            out[f"{key}_low"] = out[f"{key}_high"] = p
            continue
        var = max(v[f"{key}_var"], 0.0) / v["live"] ** 2
        n = p * (1 - p) / var if var > 0 else v["live_sample"]
        out[f"{key}_low"], out[f"{key}_high"] = _wilson(p, min(n, v["live_sample"]), q)
    return out


def reference_stats(x: torch.Tensor) -> torch.Tensor:
    """Float64 device tensor ``[squared error of the bf16 cast, squared norm]`` of ``x``."""
    x = x.detach().float()
    x = torch.where(torch.isfinite(x), x, torch.zeros((), device=x.device))
    err = (x.to(torch.bfloat16).float() - x).double().square().sum()
    return torch.stack([err, x.double().square().sum()])


def relative(err: float, norm: float) -> float | None:
    """``sqrt(err / norm)``, None when the norm is 0 (nothing to lose)."""
    return (err / norm) ** 0.5 if norm > 0 else None
