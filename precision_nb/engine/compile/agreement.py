"""Does a compiled plan train what its eager twin trains? Loss trajectories within the
precision's own tolerance.

Both runs start from the same weights and see the same batches, so their per-step losses differ
only by rounding: inductor fuses ops and may keep intermediates in fp32 inside a fused kernel
where eager rounds to the compute dtype after every op. The tolerance at step ``t`` (0-based) is

    tol(t) = max( eps(dtype) * sqrt(t + 1) * max(1, |L_eager(t)|),  D(t) )

- ``eps(dtype)``: the machine epsilon of the plan's compute dtype (``torch.finfo``: 2**-23 for
  fp32, 2**-7 for bf16, 2**-10 for fp16): a loss value of magnitude ``|L|`` cannot be resolved
  more finely than ``eps * |L|`` in that dtype, and independent rounding differences that feed
  into later steps grow like a random walk, hence ``sqrt(t + 1)``;
- ``D(t)``: the plan's own drift, the largest ``|L_plan(s) - L_fp32(s)|`` of the eager runs up
  to step ``t`` (only for a mixed plan compared with an eager fp32 run on the same weights and
  data): lowering the precision already moves the trajectory that much, so a compiled run of the
  same precision moving it as much is within what that precision does.

A step where the difference exceeds ``tol(t)`` (or only one side is finite) is a disagreement;
:class:`Agreement` names the first one. Skipped steps (fp16 with a scaler) are compared as
recorded: both runs skip the same steps when they agree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Agreement", "RULE", "agreement", "tolerance"]

#: The rule in one line, for reports.
RULE = (
    "per step t: |L_compiled - L_eager| <= max(eps(dtype) * sqrt(t+1) * max(1, |L_eager|), "
    "the eager plan's largest drift from eager fp32 so far)"
)


@dataclass(frozen=True)
class Agreement:
    """The comparison of a compiled run's losses with its eager twin's.

    ``agrees``: every compared step within tolerance. ``worst_ratio``: the largest
    ``|difference| / tol``, so 0.1 means ten times inside the tolerance. ``first_bad``: the index of
    the first loss outside it, or None. ``tolerance_at_end``: ``tol`` at the last loss compared.
    """

    label: str
    eager_label: str
    steps: int
    agrees: bool
    max_abs_diff: float
    worst_ratio: float
    first_bad: int | None
    dtype: str
    tolerance_at_end: float = math.nan
    rule: str = RULE
    #: Ops of the model that draw random numbers (dropout...): compiled code draws other ones.
    random_ops: tuple[str, ...] = ()

    def message(self) -> str:
        if self.steps == 0:
            return f"{self.label} vs {self.eager_label}: no common steps to compare"
        within = f"worst step at {self.worst_ratio:.2g} of the tolerance"
        if self.agrees:
            return (
                f"{self.label} trains what {self.eager_label} trains: {self.steps} step losses "
                f"within the {self.dtype} tolerance (largest difference {self.max_abs_diff:.3g}, "
                f"{within})"
            )
        departs = (
            f"{self.label} departs from {self.eager_label} at step {self.first_bad}: loss "
            f"differences beyond the {self.dtype} tolerance (largest {self.max_abs_diff:.3g}, "
            f"{within})"
        )
        if self.random_ops:
            return (
                f"{departs}; the model draws random numbers ({', '.join(self.random_ops)}) and "
                "compiled code draws them from inductor's own generator, not eager's, so the "
                "steps differ by more than rounding: set torch._inductor.config.fallback_random "
                "= True to compare step by step"
            )
        return f"{departs}; the compiled graph computes something else (check the graph breaks)"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def tolerance(
    eager: Sequence[float],
    dtype: torch.dtype,
    fp32_eager: Sequence[float] | None = None,
    steps: Sequence[int] | None = None,
) -> list[float]:
    """``tol(t)`` for every loss of ``eager`` (see the module docstring); ``fp32_eager``: the eager
    fp32 run's losses at the same steps, for a mixed plan's own drift ``D(t)``; ``steps``: the
    0-based step of each loss (default: one loss per step)."""
    eps = float(torch.finfo(dtype).eps)
    drift = 0.0
    out: list[float] = []
    for i, loss in enumerate(eager):
        t = steps[i] if steps is not None else i
        if fp32_eager is not None and i < len(fp32_eager):
            d = abs(float(loss) - float(fp32_eager[i]))
            if math.isfinite(d):
                drift = max(drift, d)
        scale = abs(float(loss)) if math.isfinite(float(loss)) else 1.0
        out.append(max(eps * math.sqrt(t + 1) * max(1.0, scale), drift))
    return out


def agreement(
    label: str,
    compiled: Sequence[float],
    eager_label: str,
    eager: Sequence[float],
    dtype: torch.dtype,
    fp32_eager: Sequence[float] | None = None,
    steps: Sequence[int] | None = None,
    random_ops: Sequence[str] = (),
) -> Agreement:
    """Compare per-step losses of a compiled run with its eager twin (same weights, same data).

    ``fp32_eager``, ``steps``: as :func:`tolerance` takes them. ``random_ops``: the model's random
    ops (from the graph breaks report), named when they explain a departure.
    """
    n = min(len(compiled), len(eager))
    tol = tolerance(list(eager[:n]), dtype, fp32_eager, steps)
    worst, max_diff, first_bad = 0.0, 0.0, None
    for t in range(n):
        c, e = float(compiled[t]), float(eager[t])
        if not math.isfinite(c) and not math.isfinite(e):
            continue  # both skipped or both overflowed: the same outcome
        diff = abs(c - e)
        if not math.isfinite(diff):
            ratio = math.inf
        else:
            max_diff = max(max_diff, diff)
            ratio = diff / tol[t]
        worst = max(worst, ratio)
        if ratio > 1 and first_bad is None:
            first_bad = t
    return Agreement(
        label=label,
        eager_label=eager_label,
        steps=n,
        agrees=first_bad is None,
        max_abs_diff=max_diff,
        worst_ratio=worst,
        first_bad=first_bad,
        dtype=str(dtype).removeprefix("torch."),
        tolerance_at_end=tol[-1] if tol else math.nan,
        random_ops=tuple(random_ops),
    )
