"""A true plan's figures on its typed outcome: what it saves, what it loses.

:class:`TrueSaving`: a true plan's parameter, gradient and optimizer-state bytes against the
mixed plan of the same dtype, read from both plans' inspections (the Kahan compensation buffers
apart). :class:`LostUpdates`: the run's updates rounded away at its last measured step, from the
update probe on the run's own weights. :class:`~precision_nb.engine.comparison.PlanOutcome`
carries both; the views word them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from precision_nb.engine.inspect import memory as mem
from precision_nb.engine.results import RunResult

__all__ = ["TRUE_KINDS", "LostUpdates", "TrueSaving", "lost_updates", "true_saving"]

#: The kinds a true plan holds in its low dtype (the weights, their gradients, the optimizer state).
TRUE_KINDS = (mem.PARAMS, mem.GRADS, mem.OPTIM)


@dataclass(frozen=True)
class TrueSaving:
    """A true plan's memory against the mixed plan of the same dtype (``mixed``), by the inspected
    tensors' bytes (measured ``nbytes`` of each storage; the hand arithmetic on a simulated
    device): ``by_kind`` holds (kind, mixed bytes, true bytes) for parameters, gradients and
    optimizer state; ``kept`` the bytes of those kinds the true plan holds outside its dtype
    (AdamW's scalar step counters), counted as held alike in both plans; the Kahan compensation
    buffers (``kahan`` bytes in ``kahan_dtypes``) are apart, not in the sums."""

    mixed: str
    dtype: str
    by_kind: tuple[tuple[str, int, int], ...]
    kept: int = 0
    kahan: int = 0
    kahan_dtypes: str = ""

    @property
    def before(self) -> int:
        """The mixed plan's parameter, gradient and optimizer-state bytes."""
        return sum(b for _, b, _ in self.by_kind)

    @property
    def after(self) -> int:
        """The true plan's bytes of the same kinds."""
        return sum(a for _, _, a in self.by_kind)

    @property
    def ratio(self) -> float:
        """``after / before`` (NaN when the mixed plan counted nothing)."""
        return self.after / self.before if self.before else math.nan

    @property
    def cast_ratio(self) -> float:
        """The same ratio without ``kept``: the tensors the plan holds in its dtype (0.5 for
        bf16 against fp32, by bytes)."""
        before = self.before - self.kept
        return (self.after - self.kept) / before if before > 0 else math.nan


@dataclass(frozen=True)
class LostUpdates:
    """A run's updates lost to its weights' rounding at its last measured step (the update
    probe on the run's own weights, ``RunResult.update_stats``): the fraction of parameter
    elements that step left unchanged, and the fraction never moved since the fit began."""

    step: int
    updates_rounded_away: float
    weights_never_moved: float


def lost_updates(result: RunResult | None) -> LostUpdates | None:
    """The last measured entry of ``result.update_stats`` (else of its records), or None."""
    if result is None:
        return None
    keys = ("updates_rounded_away", "weights_never_moved")
    found = [u for u in result.update_stats if all(u.get(k) is not None for k in keys)]
    found = found or [r for r in result.records if all(r.get(k) is not None for k in keys)]
    if not found:
        return None
    last = found[-1]
    return LostUpdates(int(last.get("step") or 0), *(float(last[k]) for k in keys))


def _bytes_by_kind(data: Any) -> dict[str, dict[str, int]]:
    """Kind -> dtype -> counted bytes of an inspection (hand arithmetic when simulated)."""
    out: dict[str, dict[str, int]] = {}
    for r in data.memory:
        if not r.get("counted"):
            continue
        value = r.get("expected_bytes") if data.simulated else r.get("bytes")
        kind = out.setdefault(r["kind"], {})
        dtype = str(r.get("dtype") or "")
        kind[dtype] = kind.get(dtype, 0) + int(value or 0)
    return out


def true_saving(
    label: str, results: Mapping[str, RunResult], inspections: Mapping[str, Any]
) -> TrueSaving | None:
    """``label``'s saving against the mixed plan of its dtype, when ``label`` is a true plan and
    both are inspected (None otherwise)."""
    plan = getattr(results.get(label), "plan", None)
    if plan is None or not plan.true_weights or label not in inspections:
        return None
    twin = next(
        (k for k, r in results.items()
         if k != label and r.plan.mode == plan.mode and not r.plan.true_weights
         and k in inspections),
        None,
    )  # fmt: skip
    if twin is None:
        return None
    mine, ref = _bytes_by_kind(inspections[label]), _bytes_by_kind(inspections[twin])
    low = str(plan.mode)
    kinds = tuple(
        (k, sum(ref.get(k, {}).values()), sum(mine.get(k, {}).values())) for k in TRUE_KINDS
    )
    kept = sum(b for k in TRUE_KINDS for d, b in mine.get(k, {}).items() if d != low)
    kahan = mine.get(mem.KAHAN, {})
    return TrueSaving(twin, low, kinds, kept, sum(kahan.values()), "+".join(kahan))
