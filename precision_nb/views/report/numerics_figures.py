"""Figures of a numerics analysis: underflow heat map by layer and format, and the scale window.

Both return a standalone :class:`~precision_nb.views.report.figure_base.PlanFigure` (never pyplot
state). Inputs are the plain rows of
:class:`~precision_nb.engine.numerics.analysis.NumericsResult`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import PowerNorm

from precision_nb.views.report.figure_base import PlanFigure

#: At most this many layers in a heat map (those with the most underflow); the title says so.
MAX_ROWS = 60

_NO_DATA = {"no gradient": "no grad", "frozen": "frozen"}


def _grid(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[str], dict, dict, dict]:
    values: dict[tuple[str, str], float | None] = {}
    status: dict[str, str] = {}
    zeros: dict[str, tuple[Any, Any]] = {}
    for r in rows:
        if r["layer"] not in status:
            status[r["layer"]] = r["status"]
            zeros[r["layer"]] = (r.get("zero_fraction"), r.get("fp16_run"))
        values[(r["layer"], r["variant"])] = r.get("underflow_fraction")
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    return list(status), variants, values, status, zeros


def underflow_heatmap(
    rows: Sequence[Mapping[str, Any]], *, title: str = "Parameter gradients"
) -> PlanFigure:
    """Heat map: one row per layer (tensor), one column per format; the colour is the fraction
    of non-zero fp32 elements that a cast turns into 0. Grey cells name tensors with no gradient
    or frozen ones; a row label shows the structural zeros (already 0 in fp32) beside the name,
    and "fp32 in fp16 run" (or "partly fp16 in fp16 run") for a gradient a real fp16 autocast
    step does not hold in fp16 whole: its fp16 cells are a what-if."""
    layers, variants, values, status, zeros = _grid(rows)
    total = len(layers)
    if total > MAX_ROWS:
        worst = sorted(layers, key=lambda n: -max((values.get((n, v)) or 0) for v in variants))
        keep = set(worst[:MAX_ROWS])
        layers = [n for n in layers if n in keep]
    grid = np.array(  # a missing or None value is NaN
        [[values.get((n, v)) for v in variants] for n in layers], dtype=float
    ).reshape(len(layers), len(variants))
    fig = PlanFigure(figsize=(2.2 + 1.3 * len(variants), 1.6 + 0.28 * max(len(layers), 1)))
    ax = fig.add_subplot()
    cmap = colormaps["magma_r"].with_extremes(bad="0.9")
    image = ax.imshow(grid, aspect="auto", cmap=cmap, norm=PowerNorm(0.3, vmin=0.0, vmax=1.0))
    ax.set_xticks(range(len(variants)), variants, rotation=30, ha="right")
    labels = []
    for name in layers:
        z, held = zeros.get(name) or (None, None)
        notes = [f"{z:.0%} zeros"] if z else []
        if held is not None and held != "fp16":
            notes.append("partly fp16 in fp16 run" if "+" in held else f"{held} in fp16 run")
        labels.append(f"{name}  [{'; '.join(notes)}]" if notes else name)
    ax.set_yticks(range(len(layers)), labels, fontsize=8)
    small = len(layers) * len(variants) <= 400
    for i, name in enumerate(layers):
        for j, v in enumerate(grid[i]):
            if np.isnan(v):
                text, color = _NO_DATA.get(status[name], "n/a"), "0.35"
            elif small:
                text, color = _pct(v), "white" if v > 0.05 else "black"
            else:
                continue
            ax.text(j, i, text, ha="center", va="center", fontsize=7, color=color)
    shown = f" ({len(layers)} of {total} with the most underflow)" if total > len(layers) else ""
    ax.set_title(f"{title}: underflow to zero by format{shown}", fontsize=10)
    bar = fig.colorbar(image, ax=ax, fraction=0.04)
    bar.set_label("fraction of non-zero elements cast to 0")
    fig.tight_layout()
    return fig


def _pct(v: float) -> str:
    if v == 0:
        return "0"
    if v < 0.001:
        return f"{v:.0e}"
    return f"{v:.1%}"


def scale_window_figure(
    sweep: Sequence[Mapping[str, Any]],
    win: Mapping[str, Any],
    history: Sequence[Mapping[str, Any]] | None = None,
    *,
    run_label: str | None = None,
) -> PlanFigure:
    """Left: per fp16 loss scale (log2 on the shared y axis), the fraction of the counted
    gradients (those a real fp16 step holds in fp16) cast to 0, the fraction cast to a subnormal,
    and, dotted, the fraction of every gradient cast to 0; scales where something overflows are
    marked. Right: a run's loss-scale history over its optimizer attempts (left out when no run
    has one). The band spans the safe window's edges exactly (underflow at most the threshold, no
    overflow)."""
    points = [
        (i, math.log2(h["loss_scale"]), bool(h.get("skipped")))
        for i, h in enumerate(history or [], start=1)
        if h.get("loss_scale") and h["loss_scale"] > 0 and math.isfinite(h["loss_scale"])
    ]
    fig = PlanFigure(figsize=(10.0 if points else 6.0, 4.2))
    if points:
        axes = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [1, 2]})
    else:
        axes = [fig.add_subplot()]
    left, right = axes[0], axes[-1]
    ks = [r["log2_scale"] for r in sweep]
    floor = 1e-7

    def curve(key: str) -> list[float]:
        return [max(r.get(key) or 0.0, floor) for r in sweep]

    left.plot(curve("underflow_fraction"), ks, marker="o", ms=3, color="#1f77b4", label="cast to 0")
    if any(r.get("subnormal_fraction") for r in sweep):
        left.plot(
            curve("subnormal_fraction"), ks, marker=".", ms=3, color="#9467bd", label="subnormal"
        )
    if any(r.get("all_underflow_fraction") != r.get("underflow_fraction") for r in sweep):
        left.plot(
            curve("all_underflow_fraction"),
            ks,
            ls=":",
            color="0.45",
            label="every gradient cast to 0",
        )
    over = [r["log2_scale"] for r in sweep if r["overflow_elements"]]
    if over:
        left.scatter([floor] * len(over), over, marker="x", color="#d62728", label="overflow")
    left.set_xscale("log")
    left.axvline(win["threshold"], color="0.5", ls="--", lw=1, label="threshold")
    left.set_xlabel(f"fraction of non-zero fp16-held gradients (floor {floor:g})")
    left.set_ylabel("log2(loss scale)")
    for ax in axes:
        if win.get("lo") is not None:
            ax.axhspan(win["lo"], win["hi"], color="#2ca02c", alpha=0.15)
        ax.grid(alpha=0.3)
    left.legend(fontsize=7, loc="lower left")
    if points:
        right.set_xlabel("optimizer attempt")
        xs, ys, skipped = zip(*points, strict=True)
        right.step(xs, ys, where="post", color="#2ca02c", label=run_label or "loss scale")
        bad = [(x, y) for x, y, s in points if s]
        if bad:
            right.scatter(*zip(*bad, strict=True), marker="v", color="#d62728", label="skipped")
        right.legend(fontsize=7, loc="lower right")
    if win.get("lo") is None:
        title = f"No safe fp16 window: {win.get('reason')}"
    else:
        title = (
            f"Safe fp16 loss-scale window: 2^{win['lo']} .. 2^{win['hi']} (band, edges included)"
        )
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
