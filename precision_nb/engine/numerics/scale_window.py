"""The fp16 safe loss-scale window: per power-of-two scale, what underflows and what overflows.

For a scale ``s = 2^k`` the product ``x * s`` is exact in fp32, so whether its fp16 cast is zero or
inf depends only on ``|x|`` against two limits read from torch by casting (:func:`cast_limits`):
``|x| * s <= U`` gives zero (for fp16 ``U = 2^-25``: exactly half the smallest subnormal rounds to
zero, ties to even) and ``|x| * s >= O`` gives inf (``O = 65520``, the midpoint above 65504).
:func:`sweep_counts` counts both for every scale of the sweep in one pass (``torch.bucketize``).

The window is the range of scales where the underflowed fraction is at most a threshold and
nothing overflows. Underflow falls and overflow rises with the scale, so the window is one
contiguous range of exponents (or empty).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from precision_nb.core.validate import short_repr
from precision_nb.engine.numerics.formats import FORMATS, Magnitudes, magnitudes, overflow_limit

#: Exponents of the sweep: scales 2^0 ... 2^24.
SCALE_EXPONENTS: tuple[int, ...] = tuple(range(25))

#: Default for "underflow below a threshold": at most 0.1 % of the non-zero elements flush to 0.
DEFAULT_THRESHOLD = 1e-3


@functools.lru_cache(maxsize=8)
def cast_limits(name: str = "fp16") -> tuple[float, float]:
    """``(U, O)``: the largest fp32 magnitude whose cast is zero, the smallest whose cast overflows.

    Both are found by casting (half the smallest subnormal, or its fp32 neighbour below when that
    half rounds up; :func:`~precision_nb.engine.numerics.formats.overflow_limit`), so ties round
    as the cast rounds them.
    """
    info = FORMATS[name]
    u = torch.tensor([info.smallest_subnormal / 2], dtype=torch.float32)
    if float(u.to(info.dtype).float()[0]) != 0.0:
        u = torch.nextafter(u, torch.zeros(1))
    return float(u[0]), overflow_limit(name)


def sweep_counts(
    x: torch.Tensor | Magnitudes, exponents: Sequence[int] = SCALE_EXPONENTS
) -> torch.Tensor:
    """``(len(exponents), 2)`` int64 device tensor: per scale ``2^k``, the finite non-zero elements
    of ``x`` whose fp16 cast of ``x * 2^k`` is zero, and those whose cast is inf.

    One ``torch.bucketize`` against both limit ladders: ``|x| <= U * 2^-k`` (zero) and ``|x| >
    below(O * 2^-k)`` (inf), ``below`` being the next fp32 value down. All limits are exact fp32
    values (powers of two times U or O), and the U ladder lies wholly below the O ladder.
    """
    exps = [int(k) for k in exponents]
    if exps != sorted(exps):
        raise ValueError(
            f"exponents: invalid value {short_repr(exps)}; allowed: ascending integers"
        )
    m = magnitudes(x)
    u, o = cast_limits("fp16")
    n = len(exps)
    dev = m.a.device
    ub = torch.tensor([u * 2.0**-k for k in reversed(exps)], dtype=torch.float32)
    ob = torch.tensor([o * 2.0**-k for k in reversed(exps)], dtype=torch.float32)
    ob = torch.nextafter(ob, torch.zeros(()))
    bounds = torch.cat([ub, ob]).to(dev)  # ascending
    # bucketize: index i with bounds[i-1] < a <= bounds[i]; cum[i] = #(a <= bounds[i])
    cum = torch.bincount(torch.bucketize(m.a.flatten(), bounds), minlength=2 * n + 1).cumsum(0)
    under = cum[:n] - m.dead  # a <= U_k, structural zeros and non-finite (set to 0) removed
    over = m.elements - cum[n : 2 * n]  # a > below(O_k)
    return torch.stack([under.flip(0), over.flip(0)], dim=1)


def sweep_rows(
    param_counts: Any,
    act_counts: Any,
    param_live: int,
    act_live: int,
    threshold: float = DEFAULT_THRESHOLD,
    exponents: Sequence[int] = SCALE_EXPONENTS,
) -> list[dict[str, Any]]:
    """Plain rows, one per scale, from host sweep counts (``[[underflow, overflow], ...]``) of the
    parameter gradients and the activation gradients; ``in_window`` marks the window."""
    rows = []
    live = param_live + act_live
    for i, k in enumerate(exponents):
        pu, po = (int(v) for v in param_counts[i])
        au, ao = (int(v) for v in act_counts[i])
        frac = (pu + au) / live if live else None
        rows.append(
            {
                "log2_scale": k,
                "scale": 2.0**k,
                "underflow_fraction": frac,
                "param_underflow_fraction": pu / param_live if param_live else None,
                "activation_underflow_fraction": au / act_live if act_live else None,
                "overflow_elements": po + ao,
                "in_window": frac is not None and frac <= threshold and po + ao == 0,
            }
        )
    return rows


def window(rows: Sequence[Mapping[str, Any]], threshold: float) -> dict[str, Any]:
    """The window of the sweep: ``lo``/``hi`` exponents (``None`` when empty) and why it ends."""
    inside = [r["log2_scale"] for r in rows if r["in_window"]]
    first, last = rows[0], rows[-1]
    info: dict[str, Any] = {"threshold": threshold, "lo": None, "hi": None}
    if inside:
        info.update(lo=min(inside), hi=max(inside))
    if first["underflow_fraction"] is None:
        info["reason"] = "no finite non-zero gradient elements"
    elif first["overflow_elements"]:
        info["reason"] = f"gradients overflow fp16 already at scale 2^{first['log2_scale']}"
    elif not inside and (last["underflow_fraction"] or 0) > threshold:
        info["reason"] = f"underflow stays above {threshold:.2g} up to scale 2^{last['log2_scale']}"
    elif not inside:
        info["reason"] = "every scale with little enough underflow also overflows"
    else:
        info["reason"] = "underflow at most the threshold and no overflow"
    return info


def history_vs_window(history: Iterable[Mapping[str, Any]], win: Mapping[str, Any]) -> dict:
    """How many of a run's optimizer attempts used a scale below, inside or above the window."""
    out = {"attempts": 0, "below": 0, "inside": 0, "above": 0}
    lo, hi = win.get("lo"), win.get("hi")
    for entry in history:
        scale = entry.get("loss_scale")
        if scale is None or lo is None or not scale > 0 or not math.isfinite(scale):
            continue
        k = math.log2(scale)
        out["attempts"] += 1
        out["below" if k < lo else "above" if k > hi else "inside"] += 1
    return out
