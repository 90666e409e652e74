"""Why a plan did or did not pay off, said where the numbers show it.

:func:`hints` reads a ``Comparison`` (or a ``RunResult``, or bare records) and returns
:class:`Hint` values. Each hint names the measurement it came from, so a reader can check it in
the summary table or the records. Thresholds are module constants, documented where they are used.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from precision_nb.views.report.tables import RecordSource, results_of, summary, to_frame

__all__ = ["Hint", "hints", "hints_by_run", "matmul_dims_not_multiple_of_8"]

#: A mixed plan must be at least this much faster than fp32 to count as "paid off" ...
PAYOFF_SPEEDUP = 1.10
#: ... and counts as "slower" below this.
SLOWER_SPEEDUP = 0.95
#: Below this fraction of the peak, the step is dominated by something other than matmul FLOPs.
OVERHEAD_MFU = 0.10
#: Without a known peak, below this achieved rate (FLOP/s) the model is too small to tell.
OVERHEAD_FLOPS_PER_S = 5e9
#: A scaled plan skipping more than this fraction of its optimizer attempts skips "often".
SKIP_FRACTION = 0.05
#: Step times whose 10th-90th percentile range exceeds this fraction of the median are noisy.
NOISY_SPREAD = 0.5

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

    def __str__(self) -> str:
        return f"[{self.run}] {self.message} (measured: {self.measurement})"

    def applies_to(self, label: str) -> bool:
        """True when this hint is about run ``label`` (directly, in a list, or ``"all"``)."""
        return self.run == "all" or label == self.run or label in self.run.split(", ")

    def to_dict(self) -> dict[str, str]:
        return {
            "run": self.run,
            "topic": self.topic,
            "message": self.message,
            "measurement": self.measurement,
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
    out += _payoff(rows)
    out += _overhead(rows, results)
    out += _dims(rows, results)
    out += _bf16_emulated(rows, results)
    out += _skips(rows, results)
    out += _fused(rows, results)
    frame = to_frame(source)
    if "step_time_s" in frame:
        out += _noise(rows, frame)
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


def _payoff(rows: Mapping[str, Mapping[str, Any]]) -> list[Hint]:
    out = []
    for label, row in rows.items():
        speedup = row.get("speedup_vs_fp32")
        if not _is_mixed(row) or not _ok(speedup):
            continue
        times = f"median step time {row['median_step_time_s'] * 1e3:.2f} ms"
        if speedup >= PAYOFF_SPEEDUP:
            message = f"{row['mode']} paid off: {speedup:.2f}x the fp32 speed ({times})."
        elif speedup < SLOWER_SPEEDUP:
            message = (
                f"{row['mode']} did not pay off: {speedup:.2f}x the fp32 speed ({times})."
                + _slow_reason(row)
            )
        else:
            message = f"{row['mode']} made no measurable difference: {speedup:.2f}x fp32 ({times})."
        out.append(Hint(label, "payoff", message, "speedup_vs_fp32 = fp32 / this median step time"))
    return out


def _slow_reason(row: Mapping[str, Any]) -> str:
    if row.get("device_type") != "cpu":
        return " The casts autocast inserts cost more than the lower precision saved."
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    return (
        f" On CPU, reduced-precision matmuls are fast only with native support (AVX512-BF16 / "
        f"AMX); torch reports this CPU's vector capability as {capability}, so autocast mostly "
        "adds casts."
    )


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
            "(64 for the largest gains) let reduced precision pay off.",
            "workload dims",
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


def _noise(rows: Mapping[str, Mapping[str, Any]], frame: Any) -> list[Hint]:
    """Step times that spread widely make every speedup above uncertain; say so."""
    noisy: list[str] = []
    noisy_labels: list[str] = []
    for label in rows:
        times = frame.loc[frame["run"] == label, "step_time_s"].dropna().astype(float)
        if len(times) < 4:
            continue
        median = float(times.median())
        spread = float(times.quantile(0.9) - times.quantile(0.1)) / median if median > 0 else 0.0
        if spread > NOISY_SPREAD:
            noisy.append(f"{label} {spread:.0%}")
            noisy_labels.append(label)
    if not noisy:
        return []
    return [
        Hint(
            _who(noisy_labels, rows),
            "noise",
            "Step times varied widely (" + ", ".join(noisy) + " of the median between the 10th "
            "and 90th percentile): the machine was busy or still warming up, so treat the "
            "speedups as rough; more --steps or a quieter machine give steadier numbers.",
            "step_time_s spread (p90 - p10) / median",
        )
    ]


def _rate(flops_per_s: float) -> str:
    for scale, unit in ((1e12, "TFLOP/s"), (1e9, "GFLOP/s"), (1e6, "MFLOP/s")):
        if flops_per_s >= scale:
            return f"{flops_per_s / scale:.1f} {unit}"
    return f"{flops_per_s:.0f} FLOP/s"
