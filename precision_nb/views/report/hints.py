"""What the measurements say about each plan, and what to try next.

:func:`hints` reads a ``Comparison`` (or a ``RunResult``, or bare records) and returns
:class:`Hint` values. Each hint cites only measurements (or hardware facts with their source),
names the measurement and the report figure it rests on, and never claims more than the speedup's
interval supports. Thresholds are module constants, documented where they are used.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from precision_nb.engine.stats import MIN_ROUNDS as _MIN_ROUNDS
from precision_nb.views.report.tables import RecordSource, results_of, summary, to_frame

__all__ = ["Hint", "hints", "hints_by_run", "matmul_dims_not_multiple_of_8", "what_to_try_next"]

#: Below this fraction of the peak, the step is dominated by something other than matmul FLOPs.
OVERHEAD_MFU = 0.10
#: Without a known peak, below this achieved rate (FLOP/s) the model is too small to tell.
OVERHEAD_FLOPS_PER_S = 5e9
#: A scaled plan skipping more than this fraction of its optimizer attempts skips "often".
SKIP_FRACTION = 0.05
#: Step times whose 10th-90th percentile range exceeds this fraction of the median are noisy.
NOISY_SPREAD = 0.5
#: Steady-state step times whose IQR exceeds this fraction of the median are noisy.
NOISY_IQR = 0.25

# Workload dims that become matmul (GEMM) dimensions in the built-in models.
_MATMUL_DIM_KEYS = (
    "in_dim",
    "hidden",
    "classes",
    "d_model",
    "vocab",
    "seq_len",
    "batch_size",
    "channels",
)


@dataclass(frozen=True)
class Hint:
    """One observation: which run (or ``"all"``), the topic, the message, the measurement used."""

    run: str
    topic: str
    message: str
    measurement: str
    #: The report figure (or table) the hint rests on, e.g. "throughput.png", "summary table".
    figure: str = "summary table"
    #: What to try next, drawn from this measurement ("" when nothing follows from it).
    next_step: str = ""

    def __str__(self) -> str:
        return f"[{self.run}] {self.message} (measured: {self.measurement}; see {self.figure})"

    def applies_to(self, label: str) -> bool:
        """True when this hint is about run ``label`` (directly, in a list, or ``"all"``)."""
        return self.run == "all" or label == self.run or label in self.run.split(", ")

    def to_dict(self) -> dict[str, str]:
        return {
            "run": self.run,
            "topic": self.topic,
            "message": self.message,
            "measurement": self.measurement,
            "figure": self.figure,
            "next_step": self.next_step,
        }


def matmul_dims_not_multiple_of_8(dims: Mapping[str, Any]) -> dict[str, int]:
    """The workload dims that feed matmuls and are not multiples of 8 (name -> value).

    List values (conv channels) are reported per element as ``channels[i]``; a transformer's
    per-head width ``d_model / heads`` is checked as ``head_dim``.
    """
    bad: dict[str, int] = {}
    for key in _MATMUL_DIM_KEYS:
        value = dims.get(key)
        values = list(enumerate(value)) if isinstance(value, (list, tuple)) else [(None, value)]
        for index, item in values:
            if isinstance(item, int) and not isinstance(item, bool) and item % 8:
                bad[key if index is None else f"{key}[{index}]"] = item
    d_model, heads = dims.get("d_model"), dims.get("heads")
    if isinstance(d_model, int) and isinstance(heads, int) and heads > 0:
        head_dim = d_model // heads
        if head_dim % 8:
            bad["head_dim"] = head_dim
    return bad


def hints(source: RecordSource) -> list[Hint]:
    """Hints for a Comparison, a RunResult or records (fewer hints from bare records)."""
    table = summary(source)
    if table.empty:
        return []
    results = results_of(source)
    rows = {str(r["run"]): r for r in table.to_dict("records")}
    out: list[Hint] = []
    out += _payoff(rows, source)
    out += _peak_gain(rows, source)
    out += _cpu_facts(rows, results)
    out += _overhead(rows, results)
    out += _dims(rows, results)
    out += _bf16_emulated(rows, results)
    out += _skips(rows, results)
    out += _fused(rows, results)
    out += _noise(rows, to_frame(source), source)
    return out


def hints_by_run(hint_list: Sequence[Hint], labels: Sequence[str]) -> dict[str, list[Hint]]:
    """Label -> the hints that apply to it (a hint about several runs is listed under each)."""
    return {label: [h for h in hint_list if h.applies_to(label)] for label in labels}


# ----------------------------------------------------------------------------- rules


def _who(labels: Sequence[str], rows: Mapping[str, Any]) -> str:
    """``"all"`` when a hint is about every run of several, else the runs' labels."""
    return "all" if len(rows) > 1 and len(labels) == len(rows) else ", ".join(labels)


def _is_mixed(row: Mapping[str, Any]) -> bool:
    return row.get("mode") in ("bf16", "fp16")


def _ok(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _payoff(rows: Mapping[str, Mapping[str, Any]], source: Any) -> list[Hint]:
    """The verdict of each mixed plan: from the interleaved measurement where there is one."""
    figures = getattr(source, "figures", None) or {}
    out = []
    for label, row in rows.items():
        if not _is_mixed(row):
            continue
        measured = figures.get(label)
        if measured and measured.get("verdict"):
            kind = measured.get("verdict_kind", "")
            advice = {
                "unresolved": "Run more rounds (--steps) or a larger model or batch.",
                "too_few": f"Run at least {_MIN_ROUNDS} rounds (more --steps).",
            }.get(kind, "")
            out.append(
                Hint(
                    label,
                    "payoff",
                    str(measured["verdict"]),
                    "speedup_vs_fp32 with speedup_ci_low / speedup_ci_high (median of per-round "
                    "paired ratios, bootstrap interval)",
                    "throughput.png",
                    advice,
                )
            )
            continue
        speedup = row.get("speedup_vs_fp32")
        if not _ok(speedup):
            continue
        times = f"median step time {row['median_step_time_s'] * 1e3:.2f} ms"
        out.append(
            Hint(
                label,
                "payoff",
                f"single-run figure: {row['mode']} ran at {speedup:.2f}x the fp32 speed ({times}); "
                "runs measured one after the other carry no interval, so this says nothing "
                "about which is faster.",
                "speedup_vs_fp32 = fp32 / this median step time (logged intervals)",
                "throughput.png",
                "Use compare() or precision-nb profile for an interleaved measurement.",
            )
        )
    return out


def _peak_gain(rows: Mapping[str, Mapping[str, Any]], source: Any) -> list[Hint]:
    """What low precision can gain here at best: measured matmul peaks against fp32."""
    ratios = getattr(source, "peak_ratios", None) or {}
    names = {"bf16": "bfloat16", "fp16": "float16"}
    out = []
    for label, row in rows.items():
        ratio = ratios.get(names.get(str(row.get("mode")), ""))
        if not _is_mixed(row) or not _ok(ratio):
            continue
        out.append(
            Hint(
                label,
                "peak",
                f"On this device the {row['mode']} matmul peak is {ratio:.2f}x the fp32 peak: "
                f"the most {row['mode']} can gain on matmul-bound work here; a step that also "
                "spends time outside matmuls gains less.",
                "calibrated peaks (mfu_peak_source)",
                "summary table",
            )
        )
    return out


def _cpu_facts(rows: Mapping[str, Mapping[str, Any]], results: Mapping[str, Any]) -> list[Hint]:
    """A bf16/fp16 plan on a CPU without native instructions for it (a hardware fact, sourced)."""
    out = []
    for label, row in rows.items():
        if row.get("device_type") != "cpu" or not _is_mixed(row):
            continue
        explanation = getattr(results.get(label), "explanation", None)
        cpu = getattr(getattr(explanation, "capabilities", None), "cpu", None)
        native = getattr(cpu, "native_bf16" if row["mode"] == "bf16" else "native_fp16", None)
        if cpu is None or native is not False:
            continue
        out.append(
            Hint(
                label,
                "cpu_features",
                f"This CPU reports no native {row['mode']} instructions ({cpu.summary()}); "
                f"{row['mode']} matmuls then run through conversions to fp32.",
                "CPU features (settings table)",
                "summary table",
            )
        )
    return out


def _overhead(rows: Mapping[str, Mapping[str, Any]], results: Mapping[str, Any]) -> list[Hint]:
    with_mfu = {k: r for k, r in rows.items() if _ok(r.get("mfu"))}
    if with_mfu:
        low = {k: r for k, r in with_mfu.items() if r["mfu"] < OVERHEAD_MFU}
        if not low:
            return []
        parts = ", ".join(f"{k} {_rate(r['flops_per_s'])} = {r['mfu']:.1%}" for k, r in low.items())
        sources = "; ".join(
            dict.fromkeys(str(r.get("mfu_peak_source") or "unnamed peak") for r in low.values())
        )
        return [
            Hint(
                _who(list(low), rows),
                "overhead",
                f"The step is dominated by overhead, not matmul FLOPs: {parts} of the peak "
                f"(peaks: {sources}). Python, kernel launches and the optimizer cost about as "
                "much in any precision, so a larger model or batch shows the precision effect "
                "better.",
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


def _workload(results: Mapping[str, Any]) -> Mapping[str, Any]:
    for result in results.values():
        info = getattr(result, "workload", None)
        if isinstance(info, Mapping):
            return info
    return {}


def _dims(rows: Mapping[str, Mapping[str, Any]], results: Mapping[str, Any]) -> list[Hint]:
    mixed = [k for k, r in rows.items() if _is_mixed(r)]
    dims = _workload(results).get("dims")
    if not mixed or not isinstance(dims, Mapping):
        return []
    bad = matmul_dims_not_multiple_of_8(dims)
    if not bad:
        return []
    listed = ", ".join(f"{k}={v}" for k, v in bad.items())
    return [
        Hint(
            ", ".join(mixed),
            "dims",
            f"Matmul dimensions that are not multiples of 8 ({listed}) leave tensor cores "
            "(and CPU AMX tiles) partly idle or force padding in fp16/bf16; multiples of 8 "
            "(64 for the largest gains) suit reduced-precision kernels.",
            "workload dims",
            "summary table",
            "Round the listed dimensions up to multiples of 8.",
        )
    ]


def _bf16_emulated(rows: Mapping[str, Mapping[str, Any]], results: Mapping[str, Any]) -> list[Hint]:
    out = []
    for label, row in rows.items():
        if row.get("mode") != "bf16" or row.get("device_type") != "cuda":
            continue
        explanation = getattr(results.get(label), "explanation", None)
        caps = getattr(explanation, "capabilities", None)
        if caps is None or getattr(caps, "cuda_bf16_native", None) is not False:
            continue
        name = getattr(caps, "device_name", None) or "this GPU"
        cc = getattr(caps, "compute_capability", None)
        cc_text = f" (compute capability {cc[0]}.{cc[1]})" if cc else ""
        out.append(
            Hint(
                label,
                "bf16_emulated",
                f"bf16 is emulated on {name}{cc_text}: torch accepts bf16 but the hardware has no "
                "native bf16 matmul (needs compute capability 8.0+), so expect no speedup; fp16 "
                "with a loss scaler is the fast reduced precision here.",
                "capabilities.cuda_bf16_native",
                "summary table",
                "Compare fp16 (with its loss scaler) instead of bf16 on this GPU.",
            )
        )
    return out


def _skips(rows: Mapping[str, Mapping[str, Any]], results: Mapping[str, Any]) -> list[Hint]:
    out = []
    for label, row in rows.items():
        skipped = int(row.get("skipped_steps") or 0)
        if not row.get("use_scaler") or skipped == 0:
            continue
        result = results.get(label)
        history = getattr(result, "scale_history", None)
        attempts = getattr(result, "attempts", None) or (
            len(history) if history else int(row.get("steps") or 0) + skipped
        )
        fraction = skipped / attempts if attempts else 0.0
        if fraction <= SKIP_FRACTION:
            continue
        out.append(
            Hint(
                label,
                "skips",
                f"{skipped} of {attempts} optimizer attempts were skipped ({fraction:.0%}) because "
                "the scaled gradients overflowed fp16. A few skips while the scale calibrates "
                "down from its start are expected; many mean fewer real updates per second and "
                "a slower loss curve: lower the initial scale, or use bf16 where supported.",
                "skipped_total" + (" and scale_history" if history else ""),
                "loss_scale.png",
                "Lower the initial loss scale (init_scale), or use bf16 where supported.",
            )
        )
    return out


def _fused(rows: Mapping[str, Mapping[str, Any]], results: Mapping[str, Any]) -> list[Hint]:
    """One hint per distinct reason, naming every run it applies to."""
    by_message: dict[tuple[str, str], list[str]] = {}
    for label, row in rows.items():
        outcome = getattr(results.get(label), "optimizer_outcome", None)
        used = getattr(outcome, "used", row.get("fused_adamw"))
        if used is None or bool(used):
            continue
        if outcome is not None:
            requested = getattr(outcome, "requested", None)
            reason = str(getattr(outcome, "reason", "") or "no reason recorded").rstrip(".")
            asked = {True: "requested", False: "disabled", None: "left to the probe"}.get(
                requested, str(requested)
            )
            message = f"Fused AdamW was not used (fused {asked}): {reason}."
            if requested is not False:
                message += " The plain AdamW loop launches more kernels per step."
            measurement = "optimizer_outcome (FusedOutcome)"
        else:
            message = "Fused AdamW was not used; the records do not say why."
            measurement = "fused_adamw record field"
        by_message.setdefault((message, measurement), []).append(label)
    return [Hint(_who(labels, rows), "fused_adamw", m, k) for (m, k), labels in by_message.items()]


def _noise(rows: Mapping[str, Mapping[str, Any]], frame: Any, source: Any) -> list[Hint]:
    """Step times that spread widely make every speedup above uncertain; say so."""
    figures = getattr(source, "figures", None) or {}
    noisy: list[str] = []
    noisy_labels: list[str] = []
    for label in rows:
        measured = figures.get(label) or {}
        median, iqr = measured.get("median_step_time_s"), measured.get("step_time_iqr_s")
        if _ok(median) and _ok(iqr) and median > 0:
            if iqr / median > NOISY_IQR:
                noisy.append(f"{label} IQR {iqr / median:.0%}")
                noisy_labels.append(label)
            continue
        if figures or "step_time_s" not in frame:
            continue
        times = frame.loc[frame["run"] == label, "step_time_s"].dropna().astype(float)
        if len(times) < 4:
            continue
        median = float(times.median())
        spread = float(times.quantile(0.9) - times.quantile(0.1)) / median if median > 0 else 0.0
        if spread > NOISY_SPREAD:
            noisy.append(f"{label} p10-p90 {spread:.0%}")
            noisy_labels.append(label)
    if not noisy:
        return []
    return [
        Hint(
            _who(noisy_labels, rows),
            "noise",
            "Step times varied widely (" + ", ".join(noisy) + " of the median): the machine was "
            "busy, so the intervals above are wide.",
            "step_time_iqr_s / median_step_time_s (steady state)"
            if figures
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


def _rate(flops_per_s: float) -> str:
    for scale, unit in ((1e12, "TFLOP/s"), (1e9, "GFLOP/s"), (1e6, "MFLOP/s")):
        if flops_per_s >= scale:
            return f"{flops_per_s / scale:.1f} {unit}"
    return f"{flops_per_s:.0f} FLOP/s"
