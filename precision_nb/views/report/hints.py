"""What the measurements say about each plan, and what to try next.

:func:`hints` reads a ``Comparison`` (or a ``RunResult``, or bare records) and returns
:class:`Hint` values. Each hint cites only measurements (or hardware facts with their source),
names the measurement and the report figure it rests on, and never claims more than the speedup's
interval supports. Thresholds are module constants, documented where they are used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from precision_nb.core.text import interval_text, times_text
from precision_nb.engine.peaks import tf32_gain_note
from precision_nb.engine.stats import MIN_ROUNDS as _MIN_ROUNDS
from precision_nb.views.report import tables as col
from precision_nb.views.report.hint import Hint, capabilities_of
from precision_nb.views.report.hint import is_mixed as _is_mixed
from precision_nb.views.report.hint import is_number as _ok
from precision_nb.views.report.hint import rate_text as _rate
from precision_nb.views.report.hint import share_text as _share
from precision_nb.views.report.hint import who as _who
from precision_nb.views.report.hint import workload_info as _workload
from precision_nb.views.report.hints_setup import cpu_facts as _cpu_facts
from precision_nb.views.report.hints_setup import matmul_dims_not_multiple_of_8, setup_hints
from precision_nb.views.report.source import as_comparison
from precision_nb.views.report.tables import RecordSource, summary, to_frame

if TYPE_CHECKING:
    from precision_nb.engine.compare import Comparison
    from precision_nb.engine.results import RunResult

__all__ = ["Hint", "hints", "hints_by_run", "matmul_dims_not_multiple_of_8", "what_to_try_next"]

#: Below this fraction of the peak, most of the step's time goes to something other than matmul
#: arithmetic at peak rate.
OVERHEAD_MFU = 0.10
#: Without a known peak, below this achieved rate (FLOP/s) the model is too small to tell.
OVERHEAD_FLOPS_PER_S = 5e9
#: Step times whose 10th-90th percentile range exceeds this fraction of the median are noisy.
NOISY_SPREAD = 0.5
#: Steady-state step times whose IQR exceeds this fraction of the median are noisy.
NOISY_IQR = 0.25
#: A mixed mode's torch dtype name (the key of its peak ratio).
_DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16"}


def hints(source: RecordSource) -> list[Hint]:
    """Hints for a Comparison, a RunResult or records (fewer hints from bare records)."""
    source = as_comparison(source)
    table = summary(source)
    if table.empty:
        return []
    results = source.results
    rows = {str(r["run"]): r for r in table.to_dict("records")}
    out: list[Hint] = []
    out += _payoff(rows, source)
    out += _peak_gain(rows, source, results)
    out += _cpu_facts(rows, results)
    out += _overhead(rows, results)
    out += setup_hints(rows, results)
    out += _noise(rows, to_frame(source), source)
    return out


def hints_by_run(hint_list: Sequence[Hint], labels: Sequence[str]) -> dict[str, list[Hint]]:
    """Label -> the hints that apply to it (a hint about several runs is listed under each)."""
    return {label: [h for h in hint_list if h.applies_to(label)] for label in labels}


# ----------------------------------------------------------------------------- rules


def _payoff(rows: Mapping[str, Mapping[str, Any]], source: Comparison) -> list[Hint]:
    """The verdict of each mixed plan: from the interleaved measurement where there is one."""
    out = []
    for label, row in rows.items():
        if not _is_mixed(row):
            continue
        verdict = source.outcome(label).verdict
        if verdict is not None:
            advice = {
                "unresolved": "Run more rounds (--steps) or a larger model or batch.",
                "too_few": f"Run at least {_MIN_ROUNDS} rounds (more --steps).",
            }.get(verdict.kind, "")
            advice = verdict.advice or advice  # the verdict's own advice names its level
            out.append(
                Hint(
                    label,
                    "payoff",
                    str(verdict),
                    f"{col.SPEEDUP} with {col.CI_LOW} / {col.CI_HIGH} (paired per-round "
                    "ratios; what the interval covers: the verdict)",
                    "throughput.png",
                    advice,
                )
            )
            continue
        speedup = row.get(col.SPEEDUP)
        if not _ok(speedup):
            continue
        times = f"median step time {row[col.MEDIAN_STEP] * 1e3:.2f} ms"
        out.append(
            Hint(
                label,
                "payoff",
                f"single-run figure: {row['mode']} ran at {times_text(speedup)} the fp32 speed "
                f"({times}); "
                "runs measured one after the other carry no interval, so this says nothing "
                "about which is faster.",
                f"{col.SPEEDUP} = fp32 / this median step time (logged intervals)",
                "throughput.png",
                "Use compare() or precision-nb profile for an interleaved measurement.",
            )
        )
    return out


def _peak_kind(row: Mapping[str, Any]) -> str:
    """Where the peaks came from, from the run's ``mfu_peak_source`` (else its device type)."""
    source = str(row.get("mfu_peak_source") or "")
    by_device = {"cuda": "datasheet", "cpu": "measured"}.get(str(row.get("device_type")), "unnamed")
    return next((k for k in ("datasheet", "measured") if source.startswith(k)), by_device)


def _tf32_note(row: Mapping[str, Any], source: Comparison, results: Mapping[str, RunResult]) -> str:
    """On CUDA, what the peaks say for the part of an fp32 baseline that ran as TF32: decided by
    the FLOPs the run counted by op class and the TF32 flags it ran with."""
    if row.get("device_type") != "cuda":
        return ""
    caps = capabilities_of(results.get(str(row.get("run"))))
    state = next((r.workload["tf32"] for r in results.values() if r.workload.get("tf32")), None)
    state = state or next((o.tf32 for o in source.outcomes.values() if o.tf32), None)
    name = caps.device_name if caps is not None else None
    dtype = _DTYPE_NAMES.get(str(row.get("mode")), "")
    return tf32_gain_note(name, _workload(results).get("flops_by_class"), state, dtype)


def _peak_gain(
    rows: Mapping[str, Mapping[str, Any]], source: Comparison, results: Mapping[str, RunResult]
) -> list[Hint]:
    """An estimate of what low precision could gain on matmul-bound work: the peaks' ratio, with
    the range of its calibration repeats where the peaks were measured."""
    out = []
    for label, row in rows.items():
        value = source.peak_ratios.get(_DTYPE_NAMES.get(str(row.get("mode")), ""))
        if value is None or not _is_mixed(row) or not _ok(value.ratio):
            continue
        ratio, low, high = value.ratio, value.low, value.high
        kind = _peak_kind(row)
        mode = row["mode"]
        spread = (
            ""
            if low == high
            else f"; range {interval_text(low, high)} over the calibration repeats, on this "
            "machine as loaded while they ran"
        )
        out.append(
            Hint(
                label,
                "peak",
                f"Estimate: the {mode} matmul peak is {times_text(ratio)} the fp32 peak on this "
                f"device ({kind} peaks{spread}). That is what matmul-bound work would gain if "
                "both dtypes reached the same fraction of their peaks; it is no upper bound "
                f"(fp32 kernels can reach a smaller fraction of their peak than {mode} ones, "
                "which makes the gain larger), and time outside matmuls makes the gain smaller."
                + _tf32_note(row, source, results),
                f"peak_ratios from {kind} peaks (mfu_peak_source)",
                "summary table",
            )
        )
    return out


def _overhead(
    rows: Mapping[str, Mapping[str, Any]], results: Mapping[str, RunResult]
) -> list[Hint]:
    with_mfu = {k: r for k, r in rows.items() if _ok(r.get("mfu"))}
    if with_mfu:
        low = {k: r for k, r in with_mfu.items() if r["mfu"] < OVERHEAD_MFU}
        if not low:
            return []
        parts = ", ".join(
            f"{k} {_rate(r['flops_per_s'])} = {_share(r['mfu'])}" for k, r in low.items()
        )
        sources = "; ".join(
            dict.fromkeys(str(r.get("mfu_peak_source") or "unnamed peak") for r in low.values())
        )
        return [
            Hint(
                _who(list(low), rows),
                "overhead",
                f"The step reaches under {OVERHEAD_MFU:.0%} of the matmul peak: {parts} of the "
                f"peak (peaks: {sources}). Most of its time goes to something other than matmul "
                "arithmetic at peak rate (Python and op dispatch, kernel launches, elementwise "
                "and memory-bound ops, the optimizer); a faster matmul shortens only the matmul "
                "part, so a larger model or batch shows the precision effect better.",
                f"mfu (median flops_per_s / peak, below {OVERHEAD_MFU:.0%})",
                "throughput.png",
                "Profile a larger model or batch: overhead hides the precision effect.",
            )
        ]
    rates = {k: r for k, r in rows.items() if _ok(r.get("flops_per_s"))}
    low_rates = {k: r for k, r in rates.items() if r["flops_per_s"] < OVERHEAD_FLOPS_PER_S}
    if not low_rates:
        return []
    flops_step = _workload(results).get("flops_per_step")
    per_step = f" for {flops_step / 1e6:.1f} MFLOP per step" if _ok(flops_step) else ""
    parts = ", ".join(f"{k} {_rate(r['flops_per_s'])}" for k, r in low_rates.items())
    return [
        Hint(
            _who(list(low_rates), rows),
            "overhead",
            f"The model is so small that the step is likely dominated by overhead: {parts}"
            f"{per_step}; no peak is known for this device to say how far from the limit it is.",
            "flops_per_s (median; no peak known)",
            "throughput.png",
            "Profile a larger model or batch: overhead hides the precision effect.",
        )
    ]


def _noise(rows: Mapping[str, Mapping[str, Any]], frame: Any, source: Comparison) -> list[Hint]:
    """Step times that spread widely make every speedup above uncertain; say so."""
    measured = bool(source.outcomes)
    noisy: dict[str, str] = {}  # label -> its spread in words
    for label in rows:
        timing = source.outcome(label).timing
        median = timing.median if timing is not None else None
        iqr = timing.spread.iqr if timing is not None else None
        if _ok(median) and _ok(iqr) and median > 0:
            if iqr / median > NOISY_IQR:
                noisy[label] = f"{label} IQR {iqr / median:.0%}"
            continue
        if measured or "step_time_s" not in frame:
            continue
        times = frame.loc[frame["run"] == label, "step_time_s"].dropna().astype(float)
        if len(times) < 4:
            continue
        median = float(times.median())
        spread = float(times.quantile(0.9) - times.quantile(0.1)) / median if median > 0 else 0.0
        if spread > NOISY_SPREAD:
            noisy[label] = f"{label} p10-p90 {spread:.0%}"
    if not noisy:
        return []
    load = getattr(source.measurement, "load", None)
    if load is None:
        why = "the intervals above are wide (how busy the machine was is not measured here)"
    elif load.busy:
        why = (
            f"the machine was busy while they were measured ({load.describe()}), and the "
            "intervals above are wide"
        )
    else:
        why = (
            f"the machine was not busy ({load.describe()}), so the spread is the run's own, and "
            "the intervals above are wide"
        )
    return [
        Hint(
            _who(list(noisy), rows),
            "noise",
            "Step times varied widely (" + ", ".join(noisy.values()) + f" of the median): {why}.",
            f"{col.STEP_IQR} / {col.MEDIAN_STEP} (steady state)"
            if measured
            else "step_time_s spread (p90 - p10) / median (logged intervals)",
            "throughput.png",
            "More --steps (more rounds) or a quieter machine narrow the intervals.",
        )
    ]


def what_to_try_next(hint_list: Sequence[Hint]) -> list[str]:
    """The next steps the hints draw from the measurements, de-duplicated, in hint order."""
    steps: dict[str, list[str]] = {}
    for h in hint_list:
        if h.next_step:
            steps.setdefault(h.next_step, []).append(h.run)
    if not steps:
        return ["No measurement here points to a change of plan or workload."]
    return [f"{step} ({', '.join(dict.fromkeys(runs))})" for step, runs in steps.items()]
