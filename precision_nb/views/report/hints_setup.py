"""Hints about a plan's setup and hardware: CPU features, matmul dims, emulated bf16, skipped
steps, fused AdamW. Each cites a measurement or a hardware fact with its source."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from precision_nb.core.optim import PLAIN_ADAMW_COST
from precision_nb.views.report import tables as col
from precision_nb.views.report.hint import Hint, capabilities_of
from precision_nb.views.report.hint import is_mixed as _is_mixed
from precision_nb.views.report.hint import who as _who
from precision_nb.views.report.hint import workload_info as _workload

if TYPE_CHECKING:
    from precision_nb.engine.results import RunResult

#: What a run's rows and its results look like to every rule here.
Rows = Mapping[str, Mapping[str, Any]]
Results = Mapping[str, "RunResult"]

__all__ = ["matmul_dims_not_multiple_of_8", "setup_hints"]

#: A scaled plan skipping more than this fraction of its optimizer attempts skips "often".
SKIP_FRACTION = 0.05

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


def setup_hints(rows: Rows, results: Results) -> list[Hint]:
    """The setup and hardware hints, in report order (CPU facts come after the speed hints)."""
    return [
        hint for rule in (_dims, _bf16_emulated, _skips, _fused) for hint in rule(rows, results)
    ]


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


def cpu_facts(rows: Rows, results: Results) -> list[Hint]:
    """A bf16/fp16 plan on a CPU without native instructions for it (a hardware fact, sourced)."""
    out = []
    for label, row in rows.items():
        if row.get("device_type") != "cpu" or not _is_mixed(row):
            continue
        caps = capabilities_of(results.get(label))
        cpu = caps.cpu if caps is not None else None
        if cpu is None:
            continue
        native = cpu.native_bf16 if row["mode"] == "bf16" else cpu.native_fp16
        if native is not False:
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


def _dims(rows: Rows, results: Results) -> list[Hint]:
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


def _bf16_emulated(rows: Rows, results: Results) -> list[Hint]:
    out = []
    for label, row in rows.items():
        if row.get("mode") != "bf16" or row.get("device_type") != "cuda":
            continue
        caps = capabilities_of(results.get(label))
        if caps is None or caps.cuda_bf16_native is not False:
            continue
        name = caps.device_name or "this GPU"
        cc = caps.compute_capability
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


def _skips(rows: Rows, results: Results) -> list[Hint]:
    out = []
    for label, row in rows.items():
        skipped = int(row.get(col.SKIPPED) or 0)
        if not row.get("use_scaler") or skipped == 0:
            continue
        result = results.get(label)
        history = result.scale_history if result is not None else None
        attempts = (result.attempts if result is not None else 0) or (
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
                "the scaled gradients held an inf or a NaN (an fp16 overflow, or a NaN the model "
                "made). A few skips while the scale calibrates down from its start are expected; "
                "many mean fewer real updates per second and a slower loss curve: lower the "
                "initial scale, or use bf16 where supported; if the scale keeps falling, look "
                "for a NaN.",
                "skipped_total" + (" and scale_history" if history else ""),
                "loss_scale.png",
                "Lower the initial loss scale (init_scale), or use bf16 where supported.",
            )
        )
    return out


def _fused(rows: Rows, results: Results) -> list[Hint]:
    """One hint per distinct reason, naming every run it applies to."""
    by_message: dict[tuple[str, str], list[str]] = {}
    for label, row in rows.items():
        result = results.get(label)
        outcome = result.optimizer_outcome if result is not None else None
        used = outcome.used if outcome is not None else row.get("fused_adamw")
        if used is None or bool(used):
            continue
        if getattr(getattr(result, "plan", None), "remedy", "none") != "none":
            continue  # a remedy's library AdamW runs by design (the plan's remedy decision)
        if outcome is not None:
            requested = outcome.requested
            reason = str(outcome.reason or "no reason recorded").rstrip(".")
            asked = {True: "requested", False: "disabled", None: "left to the probe"}.get(
                requested, str(requested)
            )
            message = f"Fused AdamW was not used (fused {asked}): {reason}."
            if requested is not False and PLAIN_ADAMW_COST not in reason:
                message += f" What that costs: {PLAIN_ADAMW_COST}."
            measurement = "optimizer_outcome (FusedOutcome)"
        else:
            message = "Fused AdamW was not used; the records do not say why."
            measurement = "fused_adamw record field"
        by_message.setdefault((message, measurement), []).append(label)
    return [Hint(_who(labels, rows), "fused_adamw", m, k) for (m, k), labels in by_message.items()]
