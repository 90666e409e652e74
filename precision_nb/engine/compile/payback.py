"""When compiling pays back: the steps after which a compiled plan has spent less time than its
eager twin, with the uncertainty of the step-time interval.

Rule (docs/profiling.md#pay-back): the compiled run's first step costs ``first_compiled`` seconds
(the compile and the step), the eager run's first step ``first_eager``; after that a compiled
step takes ``t_c`` (its steady-state median) and an eager one ``t_e = S * t_c``, where ``S`` is
the compiled plan's paired speedup over its eager twin. After ``n`` steps the two runs have spent
``first + (n - 1) * t`` each, so the compiled run is ahead from

    n = 1 + (first_compiled - first_eager) / (t_e - t_c)

steps on (rounded up). The speedup's interval ``[S_low, S_high]`` gives the range of ``n``; where
the interval reaches 1 or below, "never" is within it. ``S <= 1``: compiling never pays back at
this step time. The first-step times are one measurement each (no interval); the sentence says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["PayBack", "pay_back"]


@dataclass(frozen=True)
class PayBack:
    """Steps after which compiling pays back (``steps``; None: never at this step time).

    ``steps_low`` / ``steps_high``: the range over the speedup interval (``steps_high`` None: the
    interval includes no gain, so "never" is possible). ``extra_s``: the compiled first step's
    cost over the eager first step. ``text``: the sentence shown, true whatever the numbers are.
    """

    steps: int | None
    steps_low: int | None
    steps_high: int | None
    extra_s: float
    saving_s: float | None
    text: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _steps(extra: float, saving: float) -> int | None:
    if saving <= 0 or not math.isfinite(saving):
        return None
    if extra <= 0:
        return 1
    return 1 + math.ceil(extra / saving)


def _fmt_steps(n: int) -> str:
    return f"{n} step{'s' if n != 1 else ''}"


def pay_back(
    first_compiled_s: float,
    first_eager_s: float,
    compiled_step_s: float,
    speedup: float,
    speedup_low: float | None = None,
    speedup_high: float | None = None,
    confidence: float = 0.95,
) -> PayBack:
    """Pay-back steps of a compiled plan against its eager twin (see the module docstring).

    ``speedup`` (> 1: compiled faster) with its interval from the same paired measurement as
    every other speedup; ``compiled_step_s`` the compiled plan's steady-state median step time.
    """
    extra = float(first_compiled_s) - float(first_eager_s)
    pct = f"{confidence:.0%}".replace("%", " %")
    once = "first steps measured once each"
    if not (math.isfinite(speedup) and math.isfinite(compiled_step_s) and compiled_step_s > 0):
        return PayBack(
            None, None, None, extra, None,
            "pay-back not known: no paired steady-state step times of the compiled plan and its "
            "eager twin",
        )  # fmt: skip
    saving = compiled_step_s * (speedup - 1)
    ci = ""
    if speedup_low is not None and speedup_high is not None:
        ci = f" ({pct} CI {speedup_low:.2f}-{speedup_high:.2f})"
    ratio = f"the compiled plan runs at {speedup:.2f}x its eager speed{ci}"
    cost = (
        f"its first step cost {extra:.2f} s more than eager's ({once})"
        if extra > 0
        else f"its first step cost no more than eager's ({extra:+.2f} s; {once})"
    )
    steps = _steps(extra, saving)
    low = high = None
    if speedup_high is not None:
        low = _steps(extra, compiled_step_s * (speedup_high - 1))
    if speedup_low is not None:
        high = _steps(extra, compiled_step_s * (speedup_low - 1))
    if steps is None:
        text = f"never pays back at this step time: {ratio}, not faster; {cost}"
        if low is not None:
            text += f"; at the interval's upper end it would pay back after {_fmt_steps(low)}"
        return PayBack(None, low, None, extra, saving, text)
    text = (
        f"pays back after {_fmt_steps(steps)} at this step time "
        f"({compiled_step_s * 1e3:.3g} ms compiled, {saving * 1e3:.3g} ms saved per step): "
        f"{ratio}; {cost}"
    )
    if speedup_low is None or speedup_high is None:
        text += "; no interval for the speedup, so no range for the steps"
    elif high is None:
        text += (
            f"; the interval includes no gain, so it may never pay back (at the upper end: after "
            f"{_fmt_steps(low or steps)})"
        )
    elif low != high:
        text += f"; within the interval: after {low} to {high} steps"
    return PayBack(steps, low, high, extra, saving, text)
