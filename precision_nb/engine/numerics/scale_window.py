"""The fp16 safe loss-scale window: per power-of-two scale, what underflows and what overflows.

For a scale ``s = 2^k`` the product ``x * s`` is exact in fp32, so whether its fp16 cast is zero or
inf depends only on ``|x|`` against two limits read from torch by casting (:func:`cast_limits`):
``|x| * s <= U`` gives zero (for fp16 ``U = 2^-25``: exactly half the smallest subnormal rounds to
zero, ties to even), ``|x| * s < N`` a subnormal (``N = 2^-14 - 2^-25``, which rounds up to the
smallest normal) and ``|x| * s >= O`` inf (``O = 65520``, the midpoint above 65504).
:func:`sweep_counts` counts all three for every scale of the sweep in one pass
(``torch.bucketize``); :func:`subnormal_error_sums` adds how much precision the subnormal results
lose (their relative error, from real casts).

The window is the range of scales where the underflowed fraction is at most a threshold and
nothing overflows. Underflow falls and overflow rises with the scale, so the window is one
contiguous range of exponents (or empty). Which gradients it counts is the caller's choice
(:func:`sweep_rows`): the analysis counts those a real fp16 autocast step holds in fp16.
Subnormals are not counted as lost, but near the lower edge most surviving gradients can be
subnormal, each with only a few significant bits: the rows carry their share and mean relative
error, and :func:`window` reports both at the edges.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from precision_nb.core.text import percent_text
from precision_nb.core.validate import short_repr
from precision_nb.engine.numerics.formats import (
    FORMATS,
    Magnitudes,
    magnitudes,
    normal_limit,
    overflow_limit,
)

#: Exponents of the sweep: scales 2^0 ... 2^24.
SCALE_EXPONENTS: tuple[int, ...] = tuple(range(25))

#: Order of the columns :func:`sweep_counts` returns.
SWEEP_FIELDS: tuple[str, ...] = ("underflow", "subnormal", "overflow")

#: Candidates (elements subnormal at some scale) per tensor beyond which the subnormal error is
#: computed on an evenly strided sample of about this many (:func:`subnormal_error_sums`).
ERROR_SAMPLE_LIMIT = 1 << 16

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


def _ladder(limit: float, exps: Sequence[int], below: bool) -> torch.Tensor:
    """``limit * 2^-k`` for each ``k`` (exact in fp32), or the next fp32 value down from it."""
    out = torch.tensor([limit * 2.0**-k for k in exps], dtype=torch.float32)
    return torch.nextafter(out, torch.zeros(())) if below else out


def sweep_counts(x: torch.Tensor | Magnitudes) -> torch.Tensor:
    """``(len(SCALE_EXPONENTS), 3)`` int64 device tensor: per scale ``2^k`` of
    :data:`SCALE_EXPONENTS`, the finite non-zero elements of ``x`` whose fp16 cast of ``x * 2^k``
    is zero, subnormal (non-zero, below the smallest normal) and inf (order :data:`SWEEP_FIELDS`).

    One ``torch.bucketize`` against three limit ladders: ``|x| <= U * 2^-k`` (zero), ``|x| <=
    below(N * 2^-k)`` (zero or subnormal) and ``|x| <= below(O * 2^-k)`` (finite), ``below`` being
    the next fp32 value down and ``N`` :func:`~precision_nb.engine.numerics.formats.normal_limit`.
    Every limit is an exact fp32 value (a power of two times U, N or O).
    """
    exps = SCALE_EXPONENTS
    m = magnitudes(x)
    u, o = cast_limits("fp16")
    n = len(exps)
    dev = m.a.device
    bounds = torch.cat(
        [
            _ladder(u, exps, below=False),
            _ladder(normal_limit("fp16"), exps, below=True),
            _ladder(o, exps, below=True),
        ]
    )
    ordered, order = torch.sort(bounds)
    # bucketize: index i with ordered[i-1] < a <= ordered[i]; cum[i] = #(a <= ordered[i])
    hits = torch.bincount(torch.bucketize(m.a.flatten(), ordered.to(dev)), minlength=3 * n + 1)
    cum = torch.empty(3 * n, dtype=torch.int64, device=dev)
    cum[order.to(dev)] = hits.cumsum(0)[: 3 * n]
    zero_or_less = cum[:n] - m.dead  # structural zeros and non-finite (set to 0) removed
    below_normal = cum[n : 2 * n] - m.dead
    finite = cum[2 * n :]
    return torch.stack([zero_or_less, below_normal - zero_or_less, m.elements - finite], dim=1)


def subnormal_error_sums(
    x: torch.Tensor | Magnitudes,
    exponents: Sequence[int] = SCALE_EXPONENTS,
    limit: int | None = ERROR_SAMPLE_LIMIT,
) -> torch.Tensor:
    """``(len(exponents),)`` float64 device tensor: per scale ``2^k``, the sum over the elements
    whose fp16 cast of ``x * 2^k`` is subnormal of their relative error ``|cast(v) - v| / |v|``
    (``v = x * 2^k``). Divided by the subnormal count of :func:`sweep_counts` it is their mean
    relative error.

    The candidates are the elements subnormal at some scale of the sweep. Up to ``limit`` of them
    every one is visited; of more, an evenly strided ``limit`` (about), and the sums are scaled by
    the candidates per visited one: an estimate of the mean whose sampling error is a fraction of
    a percent at the default limit (``None``: visit all).

    Exact, from the bits: an fp16 subnormal is a multiple of ``2^-24``, so ``v`` rounds to an
    integer ``y = v * 2^24 = M / 2^s``, ``M`` being the 24-bit fp32 significand of ``|x|`` and
    ``s`` (14 to 24) the bits the cast drops; the error is ``min(r, 2^s - r) / M`` with ``r`` the
    dropped bits, the scale ``k = -(e + 1) - s`` for ``|x| = M * 2^(e - 23)``. Ties to even
    decide the two ends: ``y = 0.5`` rounds to 0, ``y >= 1023.5`` to the smallest normal. One pass
    per dropped-bit count (11) over the elements that are subnormal at some scale of the sweep.
    """
    exps = [int(k) for k in exponents]
    if exps != sorted(exps):
        raise ValueError(
            f"exponents: invalid value {short_repr(exps)}; allowed: ascending integers"
        )
    m = magnitudes(x)
    dev = m.a.device
    if not exps:
        return torch.zeros(0, dtype=torch.float64, device=dev)
    k_lo, k_hi = min(exps), max(exps)
    a = m.a.flatten()
    a = a[(a > cast_limits("fp16")[0] * 2.0**-k_hi) & (a < normal_limit("fp16") * 2.0**-k_lo)]
    candidates = a.numel()
    if limit is not None and candidates > limit:
        a = a[:: -(-candidates // limit)]
    bits = a.view(torch.int32)  # every candidate is a normal fp32 value, 2^-50 < |x| < 2^-14
    significand = (bits & 0x7FFFFF) | 0x800000
    inverse = 1.0 / significand.float()
    # |x| = M * 2^(e - 23) with e in [-50, -15 - k_lo]: k = -(e + 1) - s spans k_lo - 10 ...
    # k_hi + 10; bin b = k - (k_lo - 10) = 126 - (bits >> 23) - s + 10 - k_lo
    first = 136 - k_lo - (bits >> 23)
    width = k_hi - k_lo + 21
    sums = torch.zeros(width, dtype=torch.float64, device=dev)
    for s in range(14, 25):
        half = float(1 << (s - 1))
        r = (significand & ((1 << s) - 1)).float()  # the dropped bits, exact in fp32
        rel = (half - (r - half).abs()) * inverse  # min(r, 2^s - r) / M
        if s == 24:  # y = 0.5 (significand 2^23) rounds to 0: not a subnormal
            rel = torch.where(significand == 1 << 23, 0.0, rel)
        if s == 14:  # y >= 1023.5 rounds up to 1024 = the smallest normal
            rel = torch.where(significand >= 2047 << 13, 0.0, rel)
        sums += torch.bincount(first - s, weights=rel.double(), minlength=width)[:width]
    picked = sums[torch.tensor(exps, device=dev) - (k_lo - 10)]
    return picked * (candidates / a.numel()) if a.numel() else picked


@dataclass
class SweepTotal:
    """Host sweep counts summed over a group of gradient tensors (see :func:`sweep_counts`)."""

    counts: list[list[int]] = field(default_factory=lambda: [[0, 0, 0] for _ in SCALE_EXPONENTS])
    errors: list[float] = field(default_factory=lambda: [0.0 for _ in SCALE_EXPONENTS])
    live: int = 0
    tensors: int = 0

    def add(self, grad: Mapping[str, Any]) -> None:
        """Add one tensor's host stats (``sweep``, ``sweep_error``, ``live``)."""
        self.live += int(grad["live"])
        self.tensors += 1
        for row, values in zip(self.counts, grad["sweep"], strict=True):
            for i, v in enumerate(values):
                row[i] += int(v)
        self.errors = [e + float(v) for e, v in zip(self.errors, grad["sweep_error"], strict=True)]

    def __add__(self, other: SweepTotal) -> SweepTotal:
        pairs = zip(self.counts, other.counts, strict=True)
        return SweepTotal(
            [[a + b for a, b in zip(r, q, strict=True)] for r, q in pairs],
            [a + b for a, b in zip(self.errors, other.errors, strict=True)],
            self.live + other.live,
            self.tensors + other.tensors,
        )


def _fraction(count: int, total: int) -> float | None:
    return count / total if total else None


def sweep_rows(
    params: SweepTotal,
    activations: SweepTotal,
    threshold: float = DEFAULT_THRESHOLD,
    *,
    every: SweepTotal | None = None,
) -> list[dict[str, Any]]:
    """Plain rows, one per scale, from the summed sweeps of the parameter gradients and the
    activation gradients the window is computed over (``in_window`` marks it).

    ``every``: the same sums over every gradient, also those a real fp16 run keeps in fp32, shown
    as ``all_underflow_fraction`` / ``all_overflow_elements`` for reference (default: the two
    groups themselves).
    """
    held = params + activations
    every = held if every is None else every
    rows = []
    for i, k in enumerate(SCALE_EXPONENTS):
        under, sub, over = held.counts[i]
        frac = _fraction(under, held.live)
        rows.append(
            {
                "log2_scale": k,
                "scale": 2.0**k,
                "underflow_fraction": frac,
                "param_underflow_fraction": _fraction(params.counts[i][0], params.live),
                "activation_underflow_fraction": _fraction(
                    activations.counts[i][0], activations.live
                ),
                "subnormal_fraction": _fraction(sub, held.live),
                "subnormal_rel_error": held.errors[i] / sub if sub else None,
                "overflow_elements": over,
                "all_underflow_fraction": _fraction(every.counts[i][0], every.live),
                "all_overflow_elements": every.counts[i][2],
                "in_window": frac is not None and frac <= threshold and over == 0,
            }
        )
    return rows


def window(rows: Sequence[Mapping[str, Any]], threshold: float) -> dict[str, Any]:
    """The window of the sweep: ``lo``/``hi`` exponents (``None`` when empty), why it ends, and
    the subnormal share and mean relative error of the surviving gradients at each edge
    (``lo_subnormal_fraction``, ``lo_subnormal_rel_error``, ``hi_...``)."""
    inside = [r["log2_scale"] for r in rows if r["in_window"]]
    first, last = rows[0], rows[-1]
    info: dict[str, Any] = {"threshold": threshold, "lo": None, "hi": None}
    if inside:
        info.update(lo=min(inside), hi=max(inside))
        by_exp = {r["log2_scale"]: r for r in rows}
        for edge in ("lo", "hi"):
            row = by_exp[info[edge]]
            info[f"{edge}_subnormal_fraction"] = row.get("subnormal_fraction")
            info[f"{edge}_subnormal_rel_error"] = row.get("subnormal_rel_error")
    if first["underflow_fraction"] is None:
        info["reason"] = "no finite non-zero gradient elements"
    elif first["overflow_elements"]:
        info["reason"] = f"gradients overflow fp16 already at scale 2^{first['log2_scale']}"
    elif not inside and (last["underflow_fraction"] or 0) > threshold:
        info["reason"] = (
            f"underflow stays above {percent_text(threshold)} of the non-zero gradients up to "
            f"scale 2^{last['log2_scale']}"
        )
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
