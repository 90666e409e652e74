"""How every view says a number: values, sizes, speedups, intervals and their confidence.

The report, the panel, the command line and a notebook's ``_repr_html_`` all word their numbers
here, so one speedup reads the same everywhere: ``1.31× (1.22–1.40)``, one glyph for "times" and
one dash for a range. The confidence is the statistics module's
(:data:`precision_nb.engine.stats.CONFIDENCE`), never written out by hand. No plotting import.
"""

from __future__ import annotations

import math
from typing import Any

from precision_nb.engine.stats import CONFIDENCE

__all__ = [
    "TIMES",
    "confidence_text",
    "fmt",
    "interval_text",
    "number",
    "ratio_text",
    "size_text",
    "speedup_text",
]

#: The one glyph for "times" in a speedup.
TIMES = "×"


def confidence_text(confidence: float = CONFIDENCE) -> str:
    """``0.95`` -> ``"95 %"``."""
    return f"{confidence:.0%}".replace("%", " %")


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
    """A value as table text: None and NaN empty, booleans yes/no, floats to 4 significant
    digits (scientific beyond 1e5 or below 1e-3)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.3g}"
        return f"{value:.4g}"
    return str(value)


def size_text(nbytes: float, *, signed: bool = False) -> str:
    """Bytes in the largest binary unit that keeps the number >= 1 (B, KiB, MiB, GiB)."""
    sign = "+" if signed and nbytes > 0 else ""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            return f"{sign}{nbytes / scale:.2f} {unit}"
    return f"{sign}{nbytes:.0f} B"


def interval_text(low: Any, high: Any) -> str:
    """``"1.22–1.40"`` ("" when either end is missing)."""
    lo, hi = number(low), number(high)
    return "" if lo is None or hi is None else f"{lo:.2f}–{hi:.2f}"


def ratio_text(estimate: Any, low: Any = None, high: Any = None) -> str:
    """``"1.31× (1.22–1.40)"``, ``"0.90× (no interval)"`` without ends; "" without an estimate."""
    value = number(estimate)
    if value is None:
        return ""
    return f"{value:.2f}{TIMES} ({interval_text(low, high) or 'no interval'})"


def speedup_text(outcome: Any) -> str:
    """A plan's speedup from its typed outcome: ``"1.31× (1.22–1.40)"``; ``"1.00× (baseline)"``
    for the baseline; ``"0.90× (no interval)"`` where the measurement gives none (the verdict
    says why); "" without a speedup."""
    speed = getattr(outcome, "speedup", None)
    estimate = number(getattr(speed, "estimate", None))
    if estimate is None:
        return ""
    verdict = getattr(outcome, "verdict", None)
    if getattr(verdict, "kind", "") == "baseline":
        return f"{estimate:.2f}{TIMES} (baseline)"
    return ratio_text(estimate, speed.low, speed.high)
