"""When compiling pays back: the steps after which a compiled plan has spent less time than its
eager twin, with the uncertainty of the step-time interval.

Rule (docs/profiling.md#compiled-plans): compiling costs the compile step, ``compile_s`` seconds
before the first training step; after that a compiled step takes ``t_c`` (its steady-state
median) and an eager one ``t_e = S * t_c``, where ``S`` is the compiled plan's paired speedup over
its eager twin. After ``n`` steps the compiled run has spent ``compile_s + n * t_c`` and the eager
run ``n * t_e``, so the compiled run is ahead from

    n = compile_s / (t_e - t_c)

steps on (rounded up). The speedup's interval ``[S_low, S_high]`` gives the range of ``n``; where
the interval reaches 1 or below, "never" is within it. ``S <= 1``: compiling never pays back at
this step time. The compile step is one measurement (no interval); the sentence says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from precision_nb.core.defaults import CONFIDENCE
from precision_nb.core.text import confidence_text, interval_text, times_text

__all__ = ["PayBack", "pay_back"]


@dataclass(frozen=True)
class PayBack:
    """Steps after which compiling pays back (``steps``; None: never at this step time).

    ``steps_low`` / ``steps_high``: the range over the speedup interval (``steps_high`` None: the
    interval includes no gain, so "never" is possible). ``compile_s``: what compiling cost.
    ``saving_s``: seconds saved per step at the median speedup. ``text``: the sentence shown,
    true whatever the numbers are.
    """

    steps: int | None
    steps_low: int | None
    steps_high: int | None
    compile_s: float
    saving_s: float | None
    text: str


def _steps(compile_s: float, saving: float) -> int | None:
    if saving <= 0 or not math.isfinite(saving):
        return None
    # the tolerance keeps a ratio that is an integer up to float rounding on that integer
    return max(1, math.ceil(compile_s / saving - 1e-9))


def _fmt(n: int) -> str:
    return f"{n} step{'s' if n != 1 else ''}"


def pay_back(
    compile_s: float,
    compiled_step_s: float,
    speedup: float,
    speedup_low: float | None = None,
    speedup_high: float | None = None,
) -> PayBack:
    """Pay-back steps of a compiled plan against its eager twin (see the module docstring).

    ``speedup`` (> 1: compiled faster) with its interval from the same paired measurement as
    every other speedup; ``compiled_step_s`` the compiled plan's steady-state median step time.
    """
    compile_s = float(compile_s)
    if not (math.isfinite(speedup) and math.isfinite(compiled_step_s) and compiled_step_s > 0):
        return PayBack(
            None, None, None, compile_s, None,
            "pay-back not known: no paired steady-state step times of the compiled plan and its "
            "eager twin",
        )  # fmt: skip
    saving = compiled_step_s * (speedup - 1)
    ci = ""
    if speedup_low is not None and speedup_high is not None:
        ends = interval_text(speedup_low, speedup_high, speedup)
        ci = f" ({confidence_text(CONFIDENCE)} interval {ends})"
    ratio = f"the compiled plan runs at {times_text(speedup)} its eager speed{ci}"
    cost = f"compiling cost {compile_s:.2f} s (one measurement)"
    steps = _steps(compile_s, saving)
    low = _steps(compile_s, compiled_step_s * (speedup_high - 1)) if speedup_high else None
    high = _steps(compile_s, compiled_step_s * (speedup_low - 1)) if speedup_low else None
    if steps is None:
        text = f"never pays back at this step time: {ratio}, not faster; {cost}"
        if low is not None:
            text += f"; at the interval's upper end it would pay back after {_fmt(low)}"
        return PayBack(None, low, None, compile_s, saving, text)
    text = (
        f"pays back after {_fmt(steps)} at this step time ({compiled_step_s * 1e3:.3g} ms "
        f"compiled, {saving * 1e3:.3g} ms saved per step): {ratio}; {cost}"
    )
    if speedup_low is None or speedup_high is None:
        text += "; no interval for the speedup, so no range for the steps"
    elif high is None:
        text += (
            "; the interval includes no gain, so it may never pay back (at the interval's upper "
            f"end: after {_fmt(low or steps)})"
        )
    elif low != high:
        text += f"; within the interval: after {low} to {high} steps"
    return PayBack(steps, low, high, compile_s, saving, text)
