"""Run records as pandas DataFrames, and a summary with one row per plan.

A *record source* is any of: a ``Comparison``, a ``RunResult``, a mapping of label -> RunResult,
or bare records (a list of the engine's flat per-step record dicts, or a DataFrame of them); it is
normalised once by :func:`~precision_nb.views.report.source.as_comparison`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Union

import pandas as pd

from precision_nb.engine.compare import Comparison
from precision_nb.engine.results import RunResult
from precision_nb.views.report.source import as_comparison

__all__ = [
    "MEASURED_COLUMNS",
    "PLAN_FIELDS",
    "SUMMARY_COLUMNS",
    "RecordSource",
    "results_of",
    "scale_histories",
    "summary",
    "to_frame",
]

RecordSource = Union[Sequence[Mapping[str, Any]], "pd.DataFrame", Any]

PLAN_FIELDS = ("mode", "dtype", "use_scaler", "autocast_enabled", "device_type")

SUMMARY_COLUMNS = (
    "run",
    "final_loss",
    "final_loss_diff_vs_fp32",
    "param_rel_diff_vs_fp32",
    "median_step_time_s",
    "step_time_iqr_s",
    "samples_per_s",
    "tokens_per_s",
    "speedup_vs_fp32",
    "speedup_ci_low",
    "speedup_ci_high",
    "speedup_half_width",
    "rounds",
    "processes",
    "verdict",
    "stopped_by",
    "warmup_steps",
    "warmup_s",
    "warmup_rule",
    "peak_memory_mib",
    "memory_kind",
    "mfu",
    "mfu_low",
    "mfu_high",
    "mfu_peak_source",
    "flops_per_s",
    "skipped_steps",
    "steps",
    "fused_adamw",
    *PLAN_FIELDS,
    "device",
    "loss_scale_lab",
    "also_requested_as",
    "failed",
)

#: Columns taken from a Comparison's interleaved measurement (``comparison.figures``) when present.
MEASURED_COLUMNS = (
    "median_step_time_s",
    "step_time_iqr_s",
    "samples_per_s",
    "tokens_per_s",
    "flops_per_s",
    "mfu",
    "mfu_low",
    "mfu_high",
    "speedup_vs_fp32",
    "speedup_ci_low",
    "speedup_ci_high",
    "speedup_half_width",
    "rounds",
    "processes",
    "verdict",
    "stopped_by",
    "warmup_steps",
    "warmup_s",
    "warmup_rule",
    "failed",
)


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
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out


def _int(value: Any) -> int:
    number = _num(value)
    return 0 if math.isnan(number) else int(number)


def _num_or_value(value: Any) -> Any:
    """None -> NaN (so numeric columns stay numeric); everything else as it is."""
    return math.nan if value is None else value


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
    - Speed columns (:data:`MEASURED_COLUMNS`) of a Comparison come from its interleaved
      measurement (``figures``): steady-state median step time and IQR, samples/tokens/FLOP per
      second and MFU from that same median, ``speedup_vs_fp32`` = median of per-round paired
      ratios with its interval (``speedup_ci_low`` / ``_high``, empty with too few ``rounds``),
      the ``verdict`` in words, and the warm-up (``warmup_steps``, ``warmup_s``, ``warmup_rule``).
      For a single run or bare records they are medians over the logged intervals (single-run
      figures: no interval, no verdict).
    - ``peak_memory_mib`` with its ``memory_kind``; ``skipped_steps`` = last ``skipped_total``;
      ``steps`` = last logged step; ``fused_adamw``; the resolved plan fields and device.
    - ``also_requested_as``: requests merged into this run because they resolved to the same plan.

    The baseline is the run labelled ``baseline``, else the first run whose resolved mode is fp32.
    """
    comparison = as_comparison(source)
    frame = source if isinstance(source, pd.DataFrame) else _frame(comparison)
    if drift is None:
        drift = comparison.drift or None  # empty: not measured (a single run, bare records)
    merged = comparison.merged if merged is None else merged
    figures = comparison.figures
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
        d = (drift or {}).get(label) if drift is not None else None
        if label == base and d is None:
            loss_diff, param_diff = 0.0, 0.0
        elif drift is not None:
            loss_diff = _num((d or {}).get("final_loss_diff"))
            param_diff = _num((d or {}).get("param_rel_diff"))
        else:
            loss_diff = final_loss - base_loss if base else math.nan
            param_diff = math.nan
        peak = (
            pd.to_numeric(r["memory_peak_bytes"], errors="coerce").max()
            if "memory_peak_bytes" in r
            else math.nan
        )
        fused = _last(r, "fused_adamw")
        row = {
            "run": label,
            "final_loss": final_loss,
            "final_loss_diff_vs_fp32": loss_diff,
            "param_rel_diff_vs_fp32": param_diff,
            "median_step_time_s": step_time,
            "samples_per_s": _median(r, "samples_per_s"),
            "tokens_per_s": _median(r, "tokens_per_s"),
            "speedup_vs_fp32": base_time / step_time if base and step_time > 0 else math.nan,
            "peak_memory_mib": float(peak) / 2**20 if not math.isnan(_num(peak)) else math.nan,
            "memory_kind": _last(r, "memory_kind"),
            "mfu": _median(r, "mfu"),
            "mfu_peak_source": _last(r, "mfu_peak_source"),
            "flops_per_s": _median(r, "flops_per_s"),
            "skipped_steps": _int(_last(r, "skipped_total")),
            "steps": _int(_last(r, "step")),
            "fused_adamw": bool(fused) if fused is not None else None,
            **{f: _last(r, f) for f in PLAN_FIELDS},
            "device": _last(r, "device"),
            "loss_scale_lab": bool(_last(r, "loss_scale_lab") or False),
            "also_requested_as": ", ".join(
                req for req, target in merged.items() if target == label and req != label
            ),
            "failed": None,
        }
        measured = figures.get(label)
        if measured:
            row.update({c: _num_or_value(measured.get(c)) for c in MEASURED_COLUMNS})
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
