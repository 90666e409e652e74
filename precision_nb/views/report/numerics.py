"""``precision_nb.numerics()``: what fp16, bf16 and fp8 would do to the user's own model.

The engine (:func:`precision_nb.engine.numerics.analysis.analyze`) runs one instrumented fp32
step on a deep copy and returns plain rows; :class:`Numerics` shows them as DataFrames, figures
and HTML. See docs/numerics.md for how to read them.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from precision_nb.core.text import percent_text, times_text
from precision_nb.core.validate import short_repr
from precision_nb.engine.numerics.analysis import DEFAULT_FORMATS, NumericsResult, analyze
from precision_nb.engine.numerics.hardware import ASSUMPTIONS
from precision_nb.engine.numerics.scale_window import (
    DEFAULT_THRESHOLD,
    ERROR_SAMPLE_LIMIT,
    history_vs_window,
)
from precision_nb.views.report.blocks import blocks_html, hardware_rows, summary_rows
from precision_nb.views.report.figure_base import PlanFigure, figure_to_png
from precision_nb.views.report.markup import fmt, img_html, table_html
from precision_nb.views.report.numerics_figures import scale_window_figure, underflow_heatmap
from precision_nb.views.report.sections import Section, csv_file, png_file

__all__ = ["METHOD", "NUMERICS_FILES", "Numerics", "numerics", "numerics_section"]

#: The numerics files of a report (the activation heat map only when there are activation rows).
NUMERICS_FILES = (
    "numerics.csv",
    "numerics_gradient_underflow.png",
    "numerics_activation_underflow.png",
    "numerics_scale_window.png",
)

METHOD = (
    "Exact counts for one batch and one optimizer step, from an fp32 forward and backward on a "
    "copy of the model: each tensor is cast to the format on the device (the mean relative error "
    "of fp16 subnormals is estimated from an evenly strided sample in tensors with more than "
    f"{ERROR_SAMPLE_LIMIT:,} candidate elements). Which gradients a real fp16 step holds in "
    "fp16 comes from one traced forward under fp16 autocast. Other batches give other "
    "fractions; rerun on a few to see how much they move."
)


def numerics(
    model: Any,
    batches: Any = None,
    loss_fn: Callable[..., Any] | None = None,
    formats: Sequence[Any] = DEFAULT_FORMATS,
    device: Any = "auto",
    scale: float | None = None,
    run: Any = None,
    *,
    preset: str = "tiny",
    threshold: float = DEFAULT_THRESHOLD,
    optimizer: Any = None,
) -> Numerics:
    """Analyse one batch of ``model`` (a module, or a built-in workload name such as ``"mlp"``
    with ``preset``) and return a :class:`Numerics`.

    ``formats``: the formats analysed, names or aliases (``"fp16"``, ``"bf16"``, ``"fp8_e4m3"``,
    ``"fp8_e5m2"``, and the block-scaled ``"mxfp8_e4m3"``, ``"mxfp8_e5m2"``, ``"mxfp4"``,
    ``"nvfp4"``, which need torchao: the ``blocks`` extra).
    ``scale``: the loss scale of the "fp16 x scale" column; by default the last scale of ``run``
    (a ``RunResult``) when given, else 2^16. ``run``: its ``scale_history`` is drawn over the
    safe window, and its measured lost updates (``RunResult.update_stats``: a true plan's, or any
    run with ``update_stats=True``) are shown per layer beside the what-if stagnation.
    ``optimizer``: your optimizer (its state is copied, never changed) for the
    stagnation check; by default a fresh AdamW. The caller's model, optimizer and RNG stream are
    left as they were.
    """
    if run is not None:
        history = getattr(run, "scale_history", None)
        if not isinstance(history, list):
            raise ValueError(
                f"run has type {type(run).__name__}; allowed: a RunResult (with scale_history) "
                "or None"
            )
        if scale is None:
            scale = next((h["loss_scale"] for h in reversed(history) if h.get("loss_scale")), None)
    result = analyze(
        model,
        batches,
        loss_fn=loss_fn,
        formats=formats,
        device=device,
        scale=scale,
        threshold=threshold,
        optimizer=optimizer,
        preset=preset,
    )
    return Numerics(result, run)


def _rows(name: str, doc: str | None = None) -> Any:
    """A property of :class:`Numerics`: the result's ``name`` rows as a DataFrame."""
    return property(lambda self: pd.DataFrame(getattr(self.result, name)), doc=doc)


class Numerics:
    """The analysis as DataFrames (``gradients``, ``activations``, ``scale_window``,
    ``stagnation``, ``fp8``; with a block-scaled format ``blocks``, ``gemms``, ``keep_bf16`` and
    ``hardware()``), figures (``heatmap()``, ``window_figure()``) and HTML."""

    def __init__(self, result: NumericsResult, run: Any = None) -> None:
        self.result = result
        self.run = run

    # ------------------------------------------------------------------------------ data
    gradients = _rows("gradients")
    activations = _rows("activations")
    scale_window = _rows("scale_window")
    stagnation = _rows("stagnation")
    fp8 = _rows("fp8")
    blocks = _rows("blocks", "Block formats: one row per GEMM layer, cast and format.")
    gemms = _rows("gemms", "The traced step's GEMM layers: (M, K, N), FLOPs, shape rules, padding.")
    findings = property(lambda self: list(self.result.findings))
    info = property(lambda self: dict(self.result.info))

    @property
    def lost_updates(self) -> pd.DataFrame:
        """Measured on the run (``run.update_stats``), per logged step and layer: the fraction of
        the layer's elements its optimizer step left unchanged (``updates_rounded_away``) and
        still at their start values (``weights_never_moved``). Empty without such a run."""
        stats = getattr(self.run, "update_stats", None) or []
        rows = [
            {"run": getattr(self.run, "label", None), "step": entry["step"], "layer": name,
             **values}
            for entry in stats
            for name, values in entry["layers"].items()
        ]  # fmt: skip
        return pd.DataFrame(rows)

    @property
    def keep_bf16(self) -> dict[str, Any]:
        """Per block format: the rule, the layers it keeps in bf16 (with reasons), the share of
        the GEMM FLOPs that stays in the format."""
        return dict(self.result.blocks_info.get("keep", {}))

    def hardware(self, gpus: Sequence[str] = ("h100", "h200", "b200", "gb200")) -> pd.DataFrame:
        """Per what-if GPU and format: native or emulated, the datasheet peaks, and the roofline
        estimate of the GEMM speedup over bf16 (an estimate from datasheet figures, never a
        measurement); ``.attrs["per_layer"]`` holds each layer's estimate."""
        summary, per_layer = hardware_rows(self.result, gpus)
        frame = pd.DataFrame(summary)
        frame.attrs |= {"per_layer": pd.DataFrame(per_layer), "assumptions": ASSUMPTIONS}
        return frame

    @property
    def window(self) -> dict[str, Any]:
        """``lo``/``hi`` exponents of the safe fp16 window (``None`` when empty), ``reason``,
        ``threshold``; with a run, ``run`` counts its attempts below / inside / above it."""
        out = dict(self.result.window)
        if self.run is not None:
            out["run"] = history_vs_window(self.run.scale_history, self.result.window)
        return out

    # --------------------------------------------------------------------------- figures
    def heatmap(self, which: str = "gradients") -> PlanFigure:
        """Underflow by layer and format, for ``"gradients"`` or ``"activations"``."""
        if which not in ("gradients", "activations"):
            raise ValueError(
                f"which: invalid value {short_repr(which)}; allowed: 'gradients', 'activations'"
            )
        title = "Parameter gradients" if which == "gradients" else "Activation gradients"
        return underflow_heatmap(getattr(self.result, which), title=title)

    def window_figure(self) -> PlanFigure:
        history = self.run.scale_history if self.run is not None else None
        label = getattr(self.run, "label", None)
        return scale_window_figure(
            self.result.scale_window, self.result.window, history, run_label=label
        )

    def figures(self) -> dict[str, PlanFigure]:
        heatmaps = {"gradient_underflow": "gradients", "activation_underflow": "activations"}
        # no gradient rows when only block formats were asked for
        figs = {stem: self.heatmap(w) for stem, w in heatmaps.items() if getattr(self.result, w)}
        return figs | {"scale_window": self.window_figure()}

    # ------------------------------------------------------------------------------ text
    def window_text(self) -> str:
        w = self.window
        if w["lo"] is None:
            text = f"No safe fp16 loss-scale window: {w['reason']}."
        else:
            text = (
                f"Safe fp16 loss scales: 2^{w['lo']} to 2^{w['hi']} (at most "
                f"{percent_text(w['threshold'])} of the non-zero gradients flush to 0, nothing "
                "overflows)."
            )
            text += _subnormal_text(w)
        if w.get("basis"):
            text += f" Counted: {w['basis']}."
        run = w.get("run")
        if run and run["attempts"]:
            text += (
                f" The run's scaler used a scale inside it on {run['inside']} of "
                f"{run['attempts']} attempts ({run['below']} below, {run['above']} above)."
            )
        return text

    def __repr__(self) -> str:
        info = self.result.info
        lines = [
            f"Numerics of {info.get('model')} on {info.get('device')} "
            f"(loss {fmt(info.get('loss'))}, formats {', '.join(info.get('formats', []))})",
            self.window_text(),
            *_blocks_lines(self.result),
            *(f"- {e.message}" for e in self.result.findings),
        ]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        info = self.result.info
        behaviour = ", ".join(f"{k}: {v}" for k, v in info.get("overflow_behaviour", {}).items())
        parts = [
            "<div class='precision-nb-numerics'>",
            f"<h3>Numerics of {html.escape(str(info.get('model')))}</h3>",
            f"<p>{html.escape(METHOD)} Device {html.escape(str(info.get('device')))}, fp32 loss "
            f"{fmt(info.get('loss'))}; fp16 also at loss scale {fmt(info.get('scale'))}. "
            f"A cast beyond the range gives: {html.escape(behaviour)}.</p>",
            f"<p><b>{html.escape(self.window_text())}</b></p>",
        ]
        if self.result.findings:
            items = "".join(f"<li>{html.escape(e.message)}</li>" for e in self.result.findings)
            parts.append(f"<ul>{items}</ul>")
        for stem, fig in self.figures().items():
            parts.append(img_html(stem, figure_to_png(fig)))
        parts.append("<h4>Update stagnation (one optimizer step)</h4>")
        parts.append(f"<p>{html.escape(str(info.get('optimizer')))}.</p>")
        parts.append(_stagnation_table(self.result.stagnation))
        lost = self.lost_updates
        if not lost.empty:
            last = lost[lost["step"] == lost["step"].max()]
            parts.append(
                f"<h4>Lost updates measured on the run {html.escape(str(self.run.label))} "
                f"(step {int(last['step'].iloc[0])}, per layer)</h4>"
            )
            columns = ["layer", "updates_rounded_away", "weights_never_moved"]
            parts.append(table_html(last[columns].to_dict("records"), columns))
        parts.append("<h4>FP8 what-if (per-tensor amax scaling)</h4>")
        parts.append(f"<p>{html.escape(str(info.get('fp8', {}).get('text', '')))}</p>")
        parts.append(_fp8_table(self.result.fp8))
        parts.append(blocks_html(self.result))
        parts.append(
            f"<p><small>Activation gradients covered: {html.escape(str(info.get('coverage')))}. "
            f"Memory: {html.escape(str(info.get('memory')))}</small></p></div>"
        )
        return "\n".join(parts)


def _blocks_lines(result: NumericsResult) -> list[str]:
    """The block formats in a few lines of text (none when none was asked for)."""
    info = result.blocks_info
    if not info:
        return []
    if info.get("reason"):
        return [f"Block formats: {info['reason']}."]
    return [
        f"{row['format']}: median relative error {fmt(row['median_rel_error'])} "
        f"({times_text(row['median_vs_bf16'], '.4g')} bf16's, "
        f"{times_text(row['median_vs_fp8'], '.4g')} per-tensor "
        f"{row['fp8_reference']}'s); {row['kept_in_bf16']} layer(s) kept in bf16; "
        f"{fmt(row['low_precision_flop_share'])} of the GEMM FLOPs stay in the format"
        for row in summary_rows(result)
    ]


def _subnormal_text(w: dict[str, Any]) -> str:
    """The subnormal share and its mean relative error at the window's edges, in words."""
    parts = []
    for edge in ("lo", "hi"):
        share = w.get(f"{edge}_subnormal_fraction")
        if share is None:
            continue
        error = w.get(f"{edge}_subnormal_rel_error")
        detail = f", mean relative error {error:.1e}" if error is not None else ""
        parts.append(f"at 2^{w[edge]} {share:.1%}{detail}")
    if not parts:
        return ""
    return (
        " Subnormal in fp16 (kept, but with fewer significant bits; share of the non-zero "
        "gradients): " + "; ".join(parts) + "."
    )


def _stagnation_table(rows: Sequence[dict[str, Any]]) -> str:
    frame = pd.DataFrame([r for r in rows if r["status"] == "ok"])
    if frame.empty:
        return "<p>No parameter got an update.</p>"
    total = frame.groupby("format", sort=False)[["updated", "lost"]].sum()
    total["lost_fraction"] = total["lost"] / total["updated"].where(total["updated"] > 0)
    columns = ["format", "updated", "lost", "lost_fraction"]
    return table_html(total.reset_index().to_dict("records"), columns)


def _fp8_table(rows: Sequence[dict[str, Any]]) -> str:
    frame = pd.DataFrame(rows)
    if frame.empty:
        return "<p>No fp8 format was asked for.</p>"
    cols = ["rel_error", "underflow_scaled_fraction", "underflow_unscaled_fraction"]
    keys = ["tensor", "format", "recipe"]
    table = frame.groupby(keys, sort=False)[cols].median().reset_index()
    headers = {c: f"median {c}" for c in cols}
    return table_html(table.to_dict("records"), [*keys, *cols], headers=headers)


#: The title of the report's numerics section.
TITLE = "Numerics: gradient underflow and the fp16 scale window"


def numerics_section(numerics: Numerics) -> Section:
    """The report's numerics section: numerics.csv, the figures and their HTML (nothing
    written): the window in words, findings, figures, the stagnation and fp8 tables."""
    files = [csv_file("numerics.csv", numerics.gradients)]
    files += [png_file(f"numerics_{stem}.png", fig) for stem, fig in numerics.figures().items()]
    e = html.escape
    info = numerics.info
    run = numerics.run
    overlay = (
        f" The scale history of the {e(str(run.label))} plan is drawn over the window."
        if run is not None
        else " No plan here ran with a grad scaler, so no scale history is drawn (an fp16 plan "
        "on CUDA, or on CPU with the loss-scale lab, has one)."
    )
    parts = [
        f"<p>{e(METHOD)} Device {e(str(info.get('device')))}; fp16 also at loss scale "
        f"{e(str(info.get('scale')))}.{overlay} Per-layer rows are in numerics.csv.</p>",
        f"<p><b>{e(numerics.window_text())}</b></p>",
    ]
    if numerics.findings:
        items = "".join(f"<li>{e(f.message)}</li>" for f in numerics.findings)
        parts.append(f"<ul>{items}</ul>")
    parts += [img_html(f.name.removesuffix(".png"), f.data) for f in files[1:]]
    parts.append("<h3>Update stagnation (one optimizer step)</h3>")
    parts.append(_stagnation_table(numerics.result.stagnation))
    parts.append("<h3>FP8 what-if (per-tensor amax scaling; a simulation)</h3>")
    parts.append(f"<p>{e(str(info.get('fp8', {}).get('text', '')))}</p>")
    parts.append(_fp8_table(numerics.result.fp8))
    return Section("numerics", TITLE, "\n".join(parts), tuple(files))
