"""Input shapes and dtypes for the timed profiled steps, recorded in a step of their own.

Recording input shapes (``record_shapes=True``) changes what it measures: on mlp/small every
profiled step then faulted in about 13.5 MB of fresh memory (3,456 page faults a step, against
none without), the heap grew by that much a step until the profiler stopped, and the profiled
step ran 1.3 to 5 times as long as the same step unprofiled, by a cost that follows the bytes
allocated, not the events recorded. Without shapes the same steps faulted in nothing and ran
10-30 % longer than unprofiled ones. So the timed profiled steps record no shapes, and one more
step of each plan, after them, records them (its time is not used): each op of a timed step whose
shapes the split reads (copies, for the casts' dtypes and bytes; matmuls and convolutions, for
their (M, K, N)) takes the shapes and dtypes of the op of the same name at the same place in that
step (its n-th occurrence in the walk of the step's tree). A step whose ops differ from the shapes
step's (a step the grad scaler skipped, a model whose ops depend on the data) matches what it
can; what it cannot, it counts, and the split says so.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from precision_nb.engine.time_split.families import SHAPED_OPS, StepSplit, op_name, step_roots

__all__ = [
    "CastSummary",
    "MatmulShape",
    "cast_summary",
    "lend",
    "lend_steps",
    "matmul_shapes",
    "recorded",
]


@dataclass(frozen=True)
class CastSummary:
    """The casts of one step (means over the profiled steps): how many, bytes written, time;
    and the part autocast issued."""

    count: float = 0.0
    nbytes: float = 0.0
    seconds: float = 0.0
    autocast_count: float = 0.0
    autocast_nbytes: float = 0.0


@dataclass(frozen=True)
class MatmulShape:
    """A matmul shape of one step: op, (M, K, N) (M None for a convolution), input dtype, calls
    and seconds per step."""

    op: str
    m: int | None
    k: int
    n: int
    dtype: str
    calls: float
    seconds: float


#: Shapes and dtypes of one op occurrence: (input shapes, input dtypes).
Shapes = tuple[list[Any], list[str]]


def _walk(roots: Sequence[Any]) -> Iterator[Any]:
    """Every event under ``roots``, parents before children, children in their start order."""
    stack = list(reversed(roots))
    while stack:
        event = stack.pop()
        yield event
        stack.extend(reversed(getattr(event, "cpu_children", ()) or ()))


def recorded(roots: Sequence[Any]) -> dict[str, list[Shapes]]:
    """Name -> the shapes and dtypes of each occurrence of that op in one step (walk order)."""
    out: dict[str, list[Shapes]] = {}
    for event in _walk(roots):
        if op_name(event.name) in SHAPED_OPS:
            shapes = list(getattr(event, "input_shapes", None) or [])
            dtypes = list(getattr(event, "input_dtypes", None) or [])
            out.setdefault(event.name, []).append((shapes, dtypes))
    return out


def lend(roots: Sequence[Any], found: dict[str, list[Shapes]]) -> int:
    """Give every op of one timed step that the split reads the shapes and dtypes of its match
    in ``found`` (:func:`recorded`); returns how many had no match on either side (0: the
    step's ops are the shapes step's). An op without a match gets none (a copy is then no cast,
    a matmul has no shape)."""
    seen: dict[str, int] = {}
    unmatched = 0
    for event in _walk(roots):
        if op_name(event.name) not in SHAPED_OPS:
            continue
        k = seen.get(event.name, 0)
        seen[event.name] = k + 1
        there = found.get(event.name, ())
        unmatched += k >= len(there)
        event.input_shapes, event.input_dtypes = there[k] if k < len(there) else ([], [])
    return unmatched + sum(max(len(v) - seen.get(name, 0), 0) for name, v in found.items())


def lend_steps(events: Sequence[Any], shaped_events: Sequence[Any], mark: str) -> tuple[str, ...]:
    """Lend the shapes of the step marked ``mark`` in ``shaped_events`` to every step marked
    ``mark`` in ``events``; returns the note the split keeps when some ops had no match."""
    shaped = step_roots(shaped_events, mark)
    found = recorded(shaped[-1]) if shaped else {}  # the step that counted (after any skipped)
    steps = step_roots(events, mark)
    unmatched = sum(lend(roots, found) for roots in steps)
    if not shaped:
        return ("no step recorded the ops' input shapes: no cast is told from other copies and "
                "no matmul shape is read",)  # fmt: skip
    if not unmatched:
        return ()
    return (
        f"the profiled steps' ops differ from those of the step that recorded their shapes (a "
        f"skipped step, or ops that depend on the data): over {len(steps)} steps, {unmatched} of "
        "their copies, matmuls and convolutions had no match; a copy without one is not counted "
        "as a cast, and a matmul without one has no shape",
    )


def cast_summary(steps: list[StepSplit]) -> CastSummary:
    """The casts of ``steps``, per step (means)."""
    n = len(steps)
    every = [c for s in steps for c in s.casts]
    auto = [c for c in every if c.autocast]
    return CastSummary(
        len(every) / n,
        sum(c.nbytes for c in every) / n,
        sum(c.seconds for c in every) / n,
        len(auto) / n,
        sum(c.nbytes for c in auto) / n,
    )


def matmul_shapes(steps: list[StepSplit]) -> tuple[MatmulShape, ...]:
    """The matmul shapes of ``steps``: calls and seconds per step, the longest first."""
    n = len(steps)
    acc: dict[tuple[Any, ...], list[float]] = {}
    for s in steps:
        for m in s.matmuls:
            entry = acc.setdefault((m.op, m.m, m.k, m.n, m.dtype), [0.0, 0.0])
            entry[0] += 1
            entry[1] += m.seconds
    shapes = [MatmulShape(*key, calls / n, sec / n) for key, (calls, sec) in acc.items()]
    return tuple(sorted(shapes, key=lambda m: -m.seconds))
