"""How every surface says a number: values, sizes, speedups, intervals and their confidence.

The engine's verdicts, the report, the panel, the command line and a notebook's ``_repr_html_``
all word their numbers here, so one speedup reads the same everywhere: ``1.31× (1.22–1.40,
±7 %)``: one glyph for "times", one dash for a range, the half-width beside every interval
narrower than ±100 %. The confidence is :data:`precision_nb.core.defaults.CONFIDENCE`, never
written out by hand. Without torch.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

from precision_nb.core.defaults import CONFIDENCE

__all__ = [
    "TIMES",
    "confidence_text",
    "fmt",
    "interval_text",
    "number",
    "percent_text",
    "plus_minus_text",
    "ratio_text",
    "size_text",
    "speedup_text",
    "times_text",
]

#: The one glyph for "times" in a speedup.
TIMES = "×"


def confidence_text(confidence: float = CONFIDENCE) -> str:
    """``0.95`` -> ``"95 %"``, ``0.975`` -> ``"97.5 %"``."""
    return f"{round(confidence * 100, 4):g} %"


def number(value: Any) -> float | None:
    """``value`` as a finite float, or None (None, booleans, text, NaN and infinities)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def fmt(value: Any) -> str:
    """A value as table text: None, "" and NaN empty, booleans yes/no, integers with thousands
    separators, other numbers to 4 significant digits (scientific beyond 1e5 or below 1e-3)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Integral):
        return f"{int(value):,}"
    if not isinstance(value, Real):
        return str(value)
    out = number(value)
    if out is None:
        return ""
    if out != 0 and (abs(out) >= 1e5 or abs(out) < 1e-3):
        return f"{out:.3g}"
    return f"{out:.4g}"


def size_text(nbytes: float, *, signed: bool = False) -> str:
    """Bytes in the largest binary unit that keeps the number >= 1 (B, KiB, MiB, GiB)."""
    sign = "+" if signed and nbytes > 0 else ""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            return f"{sign}{nbytes / scale:.2f} {unit}"
    return f"{sign}{nbytes:.0f} B"


def times_text(value: Any, spec: str = ".2f") -> str:
    """``1.3071`` -> ``"1.31×"`` ("" without a finite value); ``spec``: the number's format
    (``".3f"``, ``".2g"``...), the glyph is always :data:`TIMES`."""
    out = number(value)
    return "" if out is None else f"{out:{spec}}{TIMES}"


def plus_minus_text(fraction: Any, spec: str = ".0f") -> str:
    """A relative tolerance or half-width: ``0.05`` -> ``"±5 %"`` ("" without a finite value)."""
    out = number(fraction)
    return "" if out is None else f"±{out * 100:{spec}} %"


def percent_text(fraction: Any) -> str:
    """A share as a percentage to 2 significant digits: ``0.001`` -> ``"0.1 %"`` ("" without a
    finite value)."""
    out = number(fraction)
    return "" if out is None else f"{out * 100:.2g} %"


def interval_text(low: Any, high: Any, estimate: Any = None, spec: str = ".2f") -> str:
    """``"1.22–1.40"``, with the half-width relative to ``estimate`` when given:
    ``"1.22–1.40, ±7 %"`` ("" when either end is missing); ``spec``: the ends' format."""
    lo, hi, centre = number(low), number(high), number(estimate)
    if lo is None or hi is None:
        return ""
    # the half-width is left out from 100 % on, where a symmetric "±" would misdescribe an
    # interval on a ratio's log scale
    half = number((hi - lo) / (2 * centre)) if centre else None
    pm = plus_minus_text(half) if half is not None and half < 1 else ""
    return f"{lo:{spec}}–{hi:{spec}}" + (f", {pm}" if pm else "")


def ratio_text(estimate: Any, low: Any = None, high: Any = None) -> str:
    """``"1.31× (1.22–1.40, ±7 %)"``, ``"0.90× (no interval)"`` without ends; "" without an
    estimate."""
    value = number(estimate)
    if value is None:
        return ""
    return f"{times_text(value)} ({interval_text(low, high, value) or 'no interval'})"


def speedup_text(outcome: Any) -> str:
    """A plan's speedup from its typed outcome: ``"1.31× (1.22–1.40, ±7 %)"``;
    ``"1.00× (baseline)"`` for the baseline; ``"0.90× (no interval)"`` where the measurement
    gives none (the verdict says why); "" without a speedup."""
    speed = getattr(outcome, "speedup", None)
    estimate = number(getattr(speed, "estimate", None))
    if estimate is None:
        return ""
    verdict = getattr(outcome, "verdict", None)
    if getattr(verdict, "kind", "") == "baseline":
        return f"{times_text(estimate)} (baseline)"
    return ratio_text(estimate, speed.low, speed.high)
