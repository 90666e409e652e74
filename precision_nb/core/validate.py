"""Field checks shared by every layer: each error names the field, the bad value, what is allowed.

``field`` is the name the user wrote (``"train.steps"``, ``"optimizer.lr"``, ``"--steps"``).
Values in messages are shown with :func:`short_repr`, so a huge or hostile value never floods a
message.
"""

from __future__ import annotations

import math
import reprlib
from typing import Any

#: The most optimizer steps one call may ask for: a bound on ``steps`` everywhere (library, panel,
#: command line), so a typo like ``steps=10**12`` is refused instead of starting a run for years.
MAX_STEPS = 10_000_000
#: The seeds ``torch.manual_seed`` accepts (a signed or unsigned 64-bit integer).
SEED_RANGE = (-(2**63), 2**64 - 1)

_REPR = reprlib.Repr()
_REPR.maxstring = 60
_REPR.maxother = 60
_REPR.maxlong = 40
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 6
_REPR.maxlevel = 3


def short_repr(value: Any) -> str:
    """``repr(value)`` bounded to about 60 characters (long strings, ints and nests are cut)."""
    return _REPR.repr(value)


def _fail(field: str, value: Any, allowed: str) -> ValueError:
    return ValueError(
        f"{field}: invalid value {short_repr(value)} ({type(value).__name__}); allowed: {allowed}"
    )


def integer(field: str, value: Any, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an int within [minimum, maximum] (bools and floats refused)."""
    ok = isinstance(value, int) and not isinstance(value, bool)
    if not (ok and (minimum is None or value >= minimum) and (maximum is None or value <= maximum)):
        if minimum is not None and maximum is not None:
            allowed = f"an integer from {minimum} to {maximum}"
        elif minimum is not None:
            allowed = f"an integer >= {minimum}"
        elif maximum is not None:
            allowed = f"an integer <= {maximum}"
        else:
            allowed = "an integer"
        raise _fail(field, value, allowed)
    return int(value)


def positive_int(field: str, value: Any, maximum: int | None = None) -> int:
    """An integer >= 1 (and <= ``maximum`` when given)."""
    return integer(field, value, 1, maximum)


def number(
    field: str,
    value: Any,
    *,
    minimum: float | None = None,
    strict: bool = False,
    maximum: float | None = None,
    accept_str: bool = False,
) -> float:
    """A finite real number, optionally bounded (``strict``: the minimum itself is refused).

    ``accept_str`` accepts numeric strings (YAML reads ``1e-3`` without a dot as a string).
    Integers too large for a float (``10**400``) are refused, not an OverflowError.
    """
    result: float | None = None
    real = isinstance(value, (int, float)) and not isinstance(value, bool)
    if real or (accept_str and isinstance(value, str)):
        try:  # an int too large for a float overflows; a string may not be a number
            result = float(value if real else value.strip())
        except (OverflowError, ValueError):
            result = None
    ok = result is not None and math.isfinite(result)
    if ok and minimum is not None:
        ok = result > minimum if strict else result >= minimum  # type: ignore[operator]
    if ok and maximum is not None:
        ok = result <= maximum  # type: ignore[operator]
    if not ok:
        parts = ["a finite number"]
        if minimum is not None:
            parts.append(f"{'>' if strict else '>='} {minimum:g}")
        if maximum is not None:
            parts.append(f"<= {maximum:g}")
        raise _fail(field, value, " ".join(parts))
    return float(result)  # type: ignore[arg-type]


def boolean(field: str, value: Any) -> bool:
    """``value`` if it is True or False (not 0, 1 or a string that reads as one)."""
    if not isinstance(value, bool):
        raise _fail(field, value, "True or False")
    return value


def choice(field: str, value: Any, allowed: tuple[Any, ...] | list[Any]) -> Any:
    """``value`` if it is one of ``allowed``."""
    if value not in allowed:
        raise _fail(field, value, ", ".join(repr(a) for a in allowed))
    return value
