"""Typed outcomes for tests: a plan's :class:`~precision_nb.engine.comparison.PlanOutcome` from a
plain description of what a measurement found (imported by tests as ``typed_outcomes``)."""

from __future__ import annotations

import math
from typing import Any


def typed_outcome(label: str, result: Any = None, row: dict[str, Any] | None = None) -> Any:
    """A :class:`~precision_nb.engine.comparison.PlanOutcome` from a plain description of what a
    measurement found (``verdict`` text and ``verdict_kind``, ``speedup_vs_fp32`` with its
    ``speedup_ci_low`` / ``_high``, ``median_step_time_s`` / ``step_time_iqr_s``, ``tf32``,
    ``rounds``, ``warmup_steps``, ``samples_per_s``, ``drift``, ``failed``): tests state
    results, the engine's outcome type carries them."""
    from precision_nb.engine.comparison import Drift, PlanOutcome, Rates, Timing
    from precision_nb.engine.measurement import Warmup
    from precision_nb.engine.stats import Speedup
    from precision_nb.engine.verdicts import Verdict

    row = dict(row or {})
    estimate = row.get("speedup_vs_fp32")
    low, high = row.get("speedup_ci_low"), row.get("speedup_ci_high")
    rounds = int(row.get("rounds") or 8)
    speed = None if estimate is None else Speedup(estimate, low, high, rounds, ())
    verdict = None
    if row.get("verdict"):
        verdict = Verdict(
            row.get("verdict_kind", ""), str(row["verdict"]), label=label,
            estimate=estimate if estimate is not None else math.nan, low=low, high=high,
        )  # fmt: skip
        if speed is None:
            speed = Speedup(1.0 if verdict.kind == "baseline" else math.nan, None, None, rounds, ())
    timing = None
    median = row.get("median_step_time_s")
    if median is not None or "rounds" in row or "warmup_steps" in row:
        m = median if median is not None else 0.01
        iqr = row.get("step_time_iqr_s") or 0.0
        blocks = [(m - iqr / 2, m - iqr / 2, m, m + iqr / 2, m + iqr / 2)] * rounds
        warm = Warmup(int(row.get("warmup_steps") or 0), 0.0, "stable")
        timing = Timing((tuple(blocks),), warm)
    drift = row.get("drift")
    return PlanOutcome(
        label,
        result,
        timing,
        speed,
        verdict,
        Rates(samples_per_s=row.get("samples_per_s")),
        None if drift is None else Drift(drift.get("final_loss_diff"), drift.get("param_rel_diff")),
        row.get("tf32"),
        failure=row.get("failed"),
    )


def with_outcomes(comparison: Any, found: dict[str, dict[str, Any]]) -> Any:
    """``comparison`` with a typed outcome per label of ``found`` (see :func:`typed_outcome`)."""
    for label, row in found.items():
        comparison.outcomes[label] = typed_outcome(label, comparison.results.get(label), row)
    return comparison
