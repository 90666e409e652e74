"""Run records as pandas DataFrames, and a summary with one row per plan.

A *record source* is any of: a ``Comparison``, a ``RunResult``, a mapping of label -> RunResult,
or bare records (a list of the engine's flat per-step record dicts, or a DataFrame of them); it is
normalised once by :func:`~precision_nb.views.report.source.as_comparison`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Union

import pandas as pd

from precision_nb.engine.comparison import Comparison, PlanOutcome
from precision_nb.engine.results import RunResult
from precision_nb.views.report.source import as_comparison

__all__ = [
    "PLAN_FIELDS",
    "SUMMARY_COLUMNS",
    "RecordSource",
    "results_of",
    "scale_histories",
    "summary",
    "measured_row",
    "to_frame",
    "true_row",
]

RecordSource = Union[Sequence[Mapping[str, Any]], "pd.DataFrame", Any]

PLAN_FIELDS = ("mode", "dtype", "use_scaler", "autocast_enabled", "device_type")

# The summary's result columns other views show by name: their strings live in this module only
# (tests/test_structure.py fails on one spelled anywhere else in the package).
SPEEDUP, CI_LOW, CI_HIGH = "speedup_vs_fp32", "speedup_ci_low", "speedup_ci_high"
MEDIAN_STEP, STEP_IQR = "median_step_time_s", "step_time_iqr_s"
LOSS_DIFF, PARAM_DIFF = "final_loss_diff_vs_fp32", "param_rel_diff_vs_fp32"
PEAK_MIB, SKIPPED, ALSO_REQUESTED = "peak_memory_mib", "skipped_steps", "also_requested_as"
WARMUP_STEPS, WARMUP_S = "warmup_steps", "warmup_s"
# A true plan's figures (its outcome's ``saving`` and ``lost_updates``).
MIXED_TWIN, STATE_RATIO = "state_vs_mixed_plan", "state_bytes_ratio_vs_mixed"
CAST_RATIO, KAHAN_MIB = "cast_bytes_ratio_vs_mixed", "kahan_buffers_mib"
LOST_STEP, ROUNDED_AWAY = "lost_updates_step", "rounded_away_share"
NEVER_MOVED = "never_moved_share"

SUMMARY_COLUMNS = (
    "run",
    "final_loss",
    LOSS_DIFF,
    PARAM_DIFF,
    MEDIAN_STEP,
    STEP_IQR,
    "samples_per_s",
    "tokens_per_s",
    SPEEDUP,
    CI_LOW,
    CI_HIGH,
    "speedup_half_width",
    "rounds",
    "processes",
    "verdict",
    "stopped_by",
    WARMUP_STEPS,
    WARMUP_S,
    "warmup_rule",
    PEAK_MIB,
    "memory_kind",
    "mfu",
    "mfu_low",
    "mfu_high",
    "mfu_peak_source",
    "flops_per_s",
    SKIPPED,
    "steps",
    "fused_adamw",
    *PLAN_FIELDS,
    "device",
    "loss_scale_lab",
    ALSO_REQUESTED,
    "failed",
    MIXED_TWIN,
    STATE_RATIO,
    CAST_RATIO,
    KAHAN_MIB,
    LOST_STEP,
    ROUNDED_AWAY,
    NEVER_MOVED,
)


def measured_row(outcome: PlanOutcome) -> dict[str, Any]:
    """The summary's columns taken from one plan's typed outcome, its interleaved measurement
    (empty when not measured; the speedup's columns None without a verdict)."""
    t = outcome.timing
    if t is None:
        return {}
    warm, speed, v = t.warmup, outcome.speedup, outcome.verdict
    row: dict[str, Any] = {
        MEDIAN_STEP: t.median,
        STEP_IQR: t.spread.iqr,
        **dataclasses.asdict(outcome.rates),
        "rounds": t.rounds,
        "processes": t.processes,
        WARMUP_STEPS: warm.steps if warm else 0,
        WARMUP_S: warm.seconds if warm else 0.0,
        "warmup_rule": warm.rule if warm else "",
        "failed": outcome.failure,
        **dict.fromkeys((SPEEDUP, CI_LOW, CI_HIGH, "speedup_half_width", "stopped_by", "verdict")),
    }
    if speed is not None and v is not None:
        row |= {
            SPEEDUP: speed.estimate,
            CI_LOW: speed.low,
            CI_HIGH: speed.high,
            "speedup_half_width": v.half_width,
            "stopped_by": v.stopped_by,
            "verdict": str(v),
        }
    return row


def true_row(outcome: PlanOutcome) -> dict[str, Any]:
    """A true plan's columns of its typed outcome: its saving against the mixed plan of its
    dtype (parameters + gradients + optimizer state bytes; the tensors held in its dtype alone;
    Kahan buffers apart) and its measured lost updates at the last measured step."""
    row: dict[str, Any] = {}
    saving, lost = outcome.saving, outcome.lost_updates
    if saving is not None:
        row |= {
            MIXED_TWIN: saving.mixed,
            STATE_RATIO: saving.ratio,
            CAST_RATIO: saving.cast_ratio,
            KAHAN_MIB: saving.kahan / 2**20 if saving.kahan else math.nan,
        }
    if lost is not None:
        row |= {
            LOST_STEP: lost.step,
            ROUNDED_AWAY: lost.updates_rounded_away,
            NEVER_MOVED: lost.weights_never_moved,
        }
    return row


def results_of(source: RecordSource) -> dict[str, RunResult]:
    """Label -> RunResult of any accepted source (:func:`~.source.as_comparison`)."""
    return dict(as_comparison(source).results)


def to_frame(source: RecordSource) -> pd.DataFrame:
    """Records -> DataFrame (one row per logged step, columns = record keys)."""
    if isinstance(source, pd.DataFrame):
        return source
    return _frame(as_comparison(source))


def _frame(comparison: Comparison) -> pd.DataFrame:
    records = [
        record if "run" in record else {**record, "run": label}
        for label, result in comparison.results.items()
        for record in result.records
    ]
    frame = pd.DataFrame.from_records([dict(r) for r in records])
    if "dtype" in frame:
        frame["dtype"] = frame["dtype"].map(lambda d: d if d is None else str(d))
    return frame


def scale_histories(source: RecordSource) -> dict[str, list[Mapping[str, Any]]]:
    """Label -> ``scale_history`` of every run that has one."""
    return {
        label: list(result.scale_history)
        for label, result in as_comparison(source).results.items()
        if result.scale_history
    }


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _int(value: Any) -> int:
    number = _num(value)
    return 0 if math.isnan(number) else int(number)


def _median(rows: pd.DataFrame, column: str) -> float:
    if column not in rows:
        return math.nan
    values = pd.to_numeric(rows[column], errors="coerce").dropna()
    return float(values.median()) if len(values) else math.nan


def _last(rows: pd.DataFrame, column: str) -> Any:
    if column not in rows or rows.empty:
        return None
    values = rows[column].dropna()
    return values.iloc[-1] if len(values) else None


def summary(
    source: RecordSource,
    *,
    drift: Mapping[str, Mapping[str, Any]] | None = None,
    merged: Mapping[str, str] | None = None,
    baseline: str | None = None,
) -> pd.DataFrame:
    """One row per plan (run label) with the columns of :data:`SUMMARY_COLUMNS`.

    - ``final_loss``: the last logged loss. ``final_loss_diff_vs_fp32`` / ``param_rel_diff_vs_fp32``
      come from ``drift`` (the Comparison's, taken from the source when it is one); without it the
      loss difference is this run's final loss minus the baseline's and the parameter difference
      is left empty (it needs the weights).
    - Speed columns (:func:`measured_row`) of a Comparison come from its interleaved
      measurement (its typed outcomes): steady-state median step time and IQR, samples/tokens/FLOP
      per second and MFU from that same median, ``speedup_vs_fp32`` = median of per-round paired
      ratios with its interval (``speedup_ci_low`` / ``_high``, empty with too few ``rounds``),
      the ``verdict`` in words, and the warm-up (``warmup_steps``, ``warmup_s``, ``warmup_rule``).
      For a single run or bare records they are medians over the logged intervals (single-run
      figures: no interval, no verdict).
    - ``peak_memory_mib`` with its ``memory_kind``; ``skipped_steps`` = last ``skipped_total``;
      ``steps`` = last logged step; ``fused_adamw``; the resolved plan fields and device.
    - ``also_requested_as``: requests merged into this run because they resolved to the same plan.
    - A true plan's figures (:func:`true_row`): ``state_bytes_ratio_vs_mixed`` (its parameter,
      gradient and optimizer-state bytes over those of ``state_vs_mixed_plan``, by the inspected
      tensors), ``cast_bytes_ratio_vs_mixed`` (the tensors held in its dtype alone),
      ``kahan_buffers_mib``; the update probe's ``rounded_away_share`` and ``never_moved_share``
      at ``lost_updates_step`` (any run that probed them).

    The baseline is the run labelled ``baseline``, else the first run whose resolved mode is fp32.
    """
    comparison = as_comparison(source)
    frame = source if isinstance(source, pd.DataFrame) else _frame(comparison)
    if drift is None:
        drift = comparison.drift or None  # empty: not measured (a single run, bare records)
    merged = comparison.merged if merged is None else merged
    if frame.empty or "run" not in frame:
        return pd.DataFrame(columns=list(SUMMARY_COLUMNS))
    labels = list(dict.fromkeys(frame["run"].tolist()))
    rows = {label: frame[frame["run"] == label] for label in labels}
    base = baseline if baseline in rows else None
    if base is None:
        base = next((lb for lb in labels if _last(rows[lb], "mode") == "fp32"), None)
    base_time = _median(rows[base], "step_time_s") if base else math.nan
    base_loss = _num(_last(rows[base], "loss")) if base else math.nan

    miscalibrated = _miscalibrated(comparison)
    out = []
    for label in labels:
        r = rows[label]
        final_loss = _num(_last(r, "loss"))
        step_time = _median(r, "step_time_s")
        d = drift.get(label) if drift is not None else None
        if label == base and d is None:
            loss_diff, param_diff = 0.0, 0.0
        elif drift is not None:
            loss_diff = _num((d or {}).get("final_loss_diff"))
            param_diff = _num((d or {}).get("param_rel_diff"))
        else:
            loss_diff = final_loss - base_loss if base else math.nan
            param_diff = math.nan
        peak = r["memory_peak_bytes"] if "memory_peak_bytes" in r else pd.Series(dtype=float)
        fused = _last(r, "fused_adamw")
        row = {
            "run": label,
            "final_loss": final_loss,
            LOSS_DIFF: loss_diff,
            PARAM_DIFF: param_diff,
            MEDIAN_STEP: step_time,
            "samples_per_s": _median(r, "samples_per_s"),
            "tokens_per_s": _median(r, "tokens_per_s"),
            SPEEDUP: base_time / step_time if base and step_time > 0 else math.nan,
            PEAK_MIB: _num(pd.to_numeric(peak, errors="coerce").max()) / 2**20,
            "memory_kind": _last(r, "memory_kind"),
            "mfu": _median(r, "mfu"),
            "mfu_peak_source": _last(r, "mfu_peak_source"),
            "flops_per_s": _median(r, "flops_per_s"),
            SKIPPED: _int(_last(r, "skipped_total")),
            "steps": _int(_last(r, "step")),
            "fused_adamw": bool(fused) if fused is not None else None,
            **{f: _last(r, f) for f in PLAN_FIELDS},
            "device": _last(r, "device"),
            "loss_scale_lab": bool(_last(r, "loss_scale_lab") or False),
            ALSO_REQUESTED: ", ".join(
                req for req, target in merged.items() if target == label and req != label
            ),
            "failed": None,
        }
        outcome = comparison.outcome(label)
        # None -> NaN, so numeric columns stay numeric
        row |= {c: math.nan if v is None else v for c, v in measured_row(outcome).items()}
        row |= true_row(outcome)
        _drop_impossible_mfu(row, calibrated=label in miscalibrated)
        out.append(row)
    return pd.DataFrame(out, columns=list(SUMMARY_COLUMNS))


#: Appended to ``mfu_peak_source`` when an MFU above 1 is left out of a summary.
MFU_NOTE = "mfu above 1 not shown: the FLOP/s beat the peak (the calibration event says why)"


def _miscalibrated(comparison: Comparison) -> set[str]:
    """Labels with a ``calibration`` event (an MFU above 1 was measured and recorded as such)."""
    labels = {
        str(event.data["run"])
        for event in comparison.events
        if event.kind == "calibration" and event.data.get("run")
    }
    for label, result in comparison.results.items():
        if any(e.kind == "calibration" for e in result.events):
            labels.add(label)
    return labels


def _drop_impossible_mfu(row: dict[str, Any], *, calibrated: bool) -> None:
    """An MFU above 1 is no utilisation (the FLOP count or the peak is off): empty it, say so."""
    mfu = _num(row.get("mfu"))
    if mfu > 1 or (calibrated and math.isnan(mfu)):
        row["mfu"] = row["mfu_low"] = row["mfu_high"] = math.nan
        source = row.get("mfu_peak_source")
        row["mfu_peak_source"] = f"{source}; {MFU_NOTE}" if source else MFU_NOTE
