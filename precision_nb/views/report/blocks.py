"""The block-scaled formats of a numerics analysis as summaries, tables and HTML.

Plain functions of a :class:`~precision_nb.engine.numerics.analysis.NumericsResult`: a summary per
format (errors against bf16 and per-tensor fp8, underflow and saturation, the layers kept in bf16,
the FLOP shares), the GEMM shape table, and the what-if hardware with its roofline estimates
(always labelled as estimates from datasheet figures). ``Numerics`` exposes them as DataFrames
and puts :func:`blocks_html` into its HTML; the panel's Numerics tab shows the same HTML.
"""

from __future__ import annotations

import html
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from precision_nb.core.text import confidence_text
from precision_nb.engine.numerics.block_stats import SAMPLE_CONFIDENCE, SAMPLE_ELEMENTS
from precision_nb.engine.numerics.blocks import BLOCK_FORMATS, MX_SCALE_MODE, MX_SCALE_MODES
from precision_nb.engine.numerics.gemm_shapes import family_of
from precision_nb.engine.numerics.hardware import (
    ASSUMPTIONS,
    WHATIF_GPUS,
    estimate_rows,
    runs_natively,
    support_rows,
    this_machine,
    total_speedup,
    whatif_gpu,
)
from precision_nb.views.report.markup import fmt, table_html

__all__ = ["METHOD", "blocks_html", "hardware_rows", "summary_rows"]

METHOD = (
    "A simulation: each GEMM operand a block-scaled recipe casts (the layer's input and weight "
    "for the forward GEMM, blocks along K; the output gradient and the weight for the "
    "input-gradient GEMM, blocks along N; the output gradient and the input for the "
    "weight-gradient GEMM, blocks along M) is cast with torchao's own quantisation and read back "
    "in fp32 during one fp32 step on a copy of the model; the GEMM outputs, the weight gradient "
    "among them, stay in high precision. MX block scales are rounded "
    f"{MX_SCALE_MODE.upper()} ({MX_SCALE_MODES[MX_SCALE_MODE][1]}). Operands larger than "
    f"{SAMPLE_ELEMENTS:,} elements are cast on a sample of whole rows: their values carry "
    f"{confidence_text(SAMPLE_CONFIDENCE)} intervals. Nothing trains in these formats here."
)


def _median(values: list[Any]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summary_rows(result: Any) -> list[dict[str, Any]]:
    """One row per block format: the median over the casts of the relative error and of its
    ratios to bf16 and per-tensor fp8, the worst underflow and saturation, the layers kept in
    bf16, and the FLOP shares (qualifying by shape; staying in the format under the rule)."""
    info = result.blocks_info
    out = []
    for name in info.get("formats", []):
        fmt_info = BLOCK_FORMATS[name]
        rows = [r for r in result.blocks if r["format"] == name and r.get("status") == "ok"]
        keep = info["keep"][name]
        out.append(
            {
                "format": name,
                "block": fmt_info.block,
                "scale": fmt_info.scale,
                "median_rel_error": _median([r["rel_error"] for r in rows]),
                "median_vs_bf16": _median([r["vs_bf16"] for r in rows]),
                "fp8_reference": fmt_info.fp8_reference,
                "median_vs_fp8": _median([r["vs_fp8"] for r in rows]),
                "max_underflow": max((r["underflow_fraction"] or 0 for r in rows), default=None),
                "max_saturated": max((r["saturated_fraction"] or 0 for r in rows), default=None),
                "kept_in_bf16": len(keep["keep"]),
                "qualifying_flop_share": info["qualifying_share"][family_of(name)],
                "low_precision_flop_share": keep["low_precision_flop_share"],
            }
        )
    return out


def hardware_rows(
    result: Any, gpus: Sequence[Any] = tuple(WHATIF_GPUS)
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(summary, per_layer)`` of the what-if GPUs: per GPU and format (the block formats and
    per-tensor fp8 e4m3), native or emulated with the datasheet peak, and the roofline estimate
    of the GEMM speedup over bf16 of the layers the rule keeps in the format (per-tensor fp8:
    the layers meeting its shape rule but the first and the last, the same convention); per
    layer, each estimate."""
    chosen = [whatif_gpu(g) for g in gpus]
    formats = ["fp8_e4m3", *result.blocks_info.get("formats", [])]
    per_layer = estimate_rows(result.gemms, formats, chosen)
    keep = result.blocks_info.get("keep", {})
    summary = []
    for row in support_rows(chosen, formats):
        fmt_name, gpu = row["format"], row["hardware"]
        if fmt_name in keep:
            layers = keep[fmt_name]["low_precision_layers"]
        else:
            ends = {result.gemms[0]["layer"], result.gemms[-1]["layer"]} if result.gemms else set()
            layers = [g["layer"] for g in result.gemms if g["fp8_qualifies"]]
            layers = [name for name in layers if name not in ends]
        mine = [r for r in per_layer if r["hardware"] == gpu and r["format"] == fmt_name]
        row["layers"] = len(layers)
        row["speedup_estimate"] = total_speedup(mine, layers) if layers else None
        summary.append(row)
    return summary, per_layer


def _pm(row: Mapping[str, Any], key: str, value_key: str) -> str:
    value, low, high = row.get(value_key), row.get(f"{key}_low"), row.get(f"{key}_high")
    if value is None:
        return ""
    if low is None or low == high == value:
        return fmt(value)
    return f"{fmt(value)} ({fmt(low)}-{fmt(high)})"


def worst_rows(result: Any, limit: int = 12) -> list[dict[str, Any]]:
    """The casts with the largest relative error (each format's), for the HTML table."""
    rows = sorted(
        (r for r in result.blocks if r.get("status") == "ok" and r.get("rel_error") is not None),
        key=lambda r: -r["rel_error"],
    )
    return [
        {
            **r,
            "cast": f"{r['tensor']} ({r['gemm']} GEMM, blocks along {r['blocks_along']})",
            "rel_error_text": _pm(r, "rel_error", "rel_error"),
            "underflow_text": _pm(r, "underflow", "underflow_fraction"),
            "saturated_text": _pm(r, "saturated", "saturated_fraction"),
        }
        for r in rows[:limit]
    ]


def blocks_html(result: Any, heading: str = "h4") -> str:
    """The block-format section: method, per-format summary, the layers kept in bf16, the GEMM
    shapes, the what-if GPUs and the worst casts ("" when no block format was asked for)."""
    info = result.blocks_info
    if not info:
        return ""
    e = html.escape
    parts = [f"<{heading}>Block-scaled formats: MXFP8, MXFP4, NVFP4 (a simulation)</{heading}>"]
    torchao = info.get("torchao", {})
    parts.append(
        f"<p>{e(METHOD)} torchao {e(str(torchao.get('version')))}"
        + (
            f"; what its import printed ({len(torchao.get('import_notes', []))} lines, e.g. its "
            "CUDA extensions not loading on this build) was recorded in "
            "numerics.result.blocks_info, not shown"
            if torchao.get("import_notes")
            else ""
        )
        + ".</p>"
    )
    if info.get("reason"):
        parts.append(f"<p><b>No GEMM layer: {e(info['reason'])}.</b></p>")
    if info.get("untraced"):
        parts.append(
            "<p>Not traced (nn.MultiheadAttention computes its projections inside one call): "
            f"{e(', '.join(info['untraced']))}.</p>"
        )
    if not result.gemms:
        return "\n".join(parts)
    headers = {
        "median_rel_error": "median rel. error",
        "median_vs_bf16": "x bf16's error",
        "median_vs_fp8": "x per-tensor fp8's",
        "qualifying_flop_share": "FLOPs qualifying by shape",
        "low_precision_flop_share": "FLOPs staying in the format",
    }
    columns = ["format", "block", "scale", "median_rel_error", "median_vs_bf16",
               "fp8_reference", "median_vs_fp8", "max_underflow", "max_saturated",
               "kept_in_bf16", "qualifying_flop_share", "low_precision_flop_share"]  # fmt: skip
    parts.append(table_html(summary_rows(result), columns, headers=headers))
    first = next(iter(info["keep"].values()))
    parts.append(f"<p>Which layers stay in bf16: {e(first['rule'])}.</p><ul>")
    for name, keep in info["keep"].items():
        kept = "; ".join(f"{k['layer']} ({', '.join(k['reasons'])})" for k in keep["keep"])
        parts.append(f"<li><b>{e(name)}</b>: {e(kept or 'none')}</li>")
    parts.append("</ul>")
    parts.append(
        "<p>GEMMs of the traced step: " + e("; ".join(info["shape_rules"].values())) + ".</p>"
    )
    gemm_cols = ["layer", "op", "calls", "M", "K", "N", "groups", "step_flops",
                 "fp8_qualifies", "mx_qualifies", "mx_pad_K", "mx_pad_N", "nvfp4_qualifies",
                 "mx_pad_M"]  # fmt: skip
    parts.append(f"<div class='scroll'>{table_html(result.gemms, gemm_cols)}</div>")
    summary, _ = hardware_rows(result)
    here = this_machine()
    formats = ["fp8_e4m3", *info["formats"]]
    native = [f for f in formats if runs_natively(f, here["compute_capability"])]
    parts.append(
        f"<p>What-if hardware (datasheet figures; speedups are a {e(ASSUMPTIONS)}). This "
        f"machine, read from torch: {e(here['text'])}; native here: "
        f"{e(', '.join(native) or 'none of these formats')}.</p>"
    )
    hw_cols = ["hardware", "compute_capability", "format", "runs", "datasheet_tflops",
               "datasheet_bf16_tflops", "layers", "speedup_estimate"]  # fmt: skip
    hw_headers = {"speedup_estimate": "GEMM speedup over bf16 (estimate)"}
    parts.append(table_html(summary, hw_cols, headers=hw_headers))
    worst_cols = ["layer", "cast", "format", "rel_error_text", "bf16_rel_error",
                  "fp8_rel_error", "underflow_text", "saturated_text"]  # fmt: skip
    worst_headers = {
        "rel_error_text": f"rel. error ({confidence_text(SAMPLE_CONFIDENCE)} interval)",
        "underflow_text": "underflow",
        "saturated_text": "saturated",
    }
    parts.append("<p>The casts with the largest errors (all in numerics.blocks):</p>")
    parts.append(table_html(worst_rows(result), worst_cols, headers=worst_headers))
    return "\n".join(parts)
