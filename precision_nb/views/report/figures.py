"""Matplotlib figures of run records: loss, loss scale, throughput, memory and a dashboard.

Every function returns a standalone :class:`matplotlib.figure.Figure` (never pyplot state), so the
figures work with any backend: Agg in tests and the CLI, inline or widget backends in notebooks,
and PNG bytes for an ``ipywidgets.Image`` through :func:`figure_to_png`.

The figures accept any record source (:mod:`~precision_nb.views.report.tables`); a plan keeps its
colour across every figure (:func:`plan_colors`, keyed by run label).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from precision_nb.core.text import speedup_text
from precision_nb.views.report.figure_base import (
    DASHBOARD_SIZE,
    LINESTYLES,
    SINGLE_SIZE,
    figure_to_png,
    legend,
    memory_kinds,
    new_figure,
    no_data,
    numeric,
    plan_colors,
    pow2_label,
    prepare,
    style_axes,
    throughput_column,
    to_float,
)
from precision_nb.views.report.inspection_figures import draw_memory_breakdown
from precision_nb.views.report.source import as_comparison
from precision_nb.views.report.tables import RecordSource

__all__ = [
    "MEMORY_KIND_LABELS",
    "dashboard_figure",
    "figure_to_png",
    "loss_figure",
    "loss_scale_figure",
    "memory_figure",
    "plan_colors",
    "throughput_figure",
    "uses_loss_scale",
]

MEMORY_KIND_LABELS = {
    "cuda_allocated": "CUDA allocated",
    "mps_allocated": "MPS allocated",
    "host_rss": "host RSS, the whole process",
}

# ----------------------------------------------------------------------------- drawing on axes


def draw_loss(ax: Axes, frame: Any, labels: Sequence[str], colors: Mapping[str, str]) -> None:
    """Loss against optimizer step, one line per run. Records that share a step number (logging
    intervals made only of skipped attempts count no step) are drawn once, the last of them, so the
    line never jumps vertically at one step."""
    drawn = False
    for index, label in enumerate(labels):
        rows = frame[frame["run"] == label]
        if "step" in rows:
            rows = rows.drop_duplicates("step", keep="last")
        loss = numeric(rows["loss"]) if "loss" in rows else None
        if loss is None or loss.notna().sum() == 0:
            continue
        ax.plot(
            rows["step"],
            loss,
            color=colors[label],
            label=label,
            linewidth=1.8,
            linestyle=LINESTYLES[index % len(LINESTYLES)],
        )
        drawn = True
    style_axes(ax, "Training loss per plan", "optimizer step", "loss")
    legend(ax, drawn, "no loss recorded")


def draw_loss_scale(
    ax: Axes,
    frame: Any,
    labels: Sequence[str],
    colors: Mapping[str, str],
    histories: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> None:
    """Loss scale on a log2 axis, skipped steps (an inf or a NaN in the gradients) marked with a
    red ``x``.

    With a run's ``scale_history`` (every optimizer attempt) the line follows each attempt and
    every skipped attempt is marked; from records alone the scale is the logged value and a logged
    step whose ``skipped`` count is positive is marked.
    """
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(FuncFormatter(pow2_label))
    histories = histories or {}
    drawn = skip_marked = by_attempt = False
    for label in labels:
        history = histories.get(label)
        if history:
            # skipped attempts do not advance the step counter, so the x axis counts attempts
            xs = [
                float(i if h.get("attempt") is None else h["attempt"])
                for i, h in enumerate(history)
            ]
            ys = [to_float(h.get("loss_scale")) for h in history]
            skipped = [bool(h.get("skipped")) for h in history]
        else:
            rows = frame[frame["run"] == label]
            if "loss_scale" not in rows:
                continue
            xs = [float(s) for s in rows["step"]]
            ys = [to_float(v) for v in rows["loss_scale"]]
            skipped = [(to_float(v) or 0) > 0 for v in rows.get("skipped", [0] * len(rows))]
        points = [
            (x, y, s) for x, y, s in zip(xs, ys, skipped, strict=True) if y is not None and y > 0
        ]
        if not points:
            continue
        by_attempt = by_attempt or bool(history)
        kept_x, kept_y, _ = zip(*points, strict=True)
        ax.step(kept_x, kept_y, where="post", color=colors[label], label=label, linewidth=1.6)
        drawn = True
        bad = [(x, y) for x, y, s in points if s]
        if bad:
            mark = None if skip_marked else "skipped step (inf or NaN)"
            ax.scatter(
                *zip(*bad, strict=True), marker="x", color="#d62728", s=36, zorder=3, label=mark
            )
            skip_marked = True
    xlabel = "optimizer attempt (skipped ones included)" if by_attempt else "optimizer step"
    style_axes(ax, "Loss scale (log2) and skipped steps", xlabel, "loss scale (log2)")
    if not drawn:
        ax.set_ylim(1, 2**16)
    legend(ax, drawn, "no plan uses a loss scaler\n(only fp16 on CUDA or the loss-scale lab)")


def draw_throughput(
    ax: Axes,
    frame: Any,
    labels: Sequence[str],
    colors: Mapping[str, str],
    measured: Mapping[str, Any] | None = None,
) -> str | None:
    """Throughput per logged step, tokens/s when every run has it, else samples/s.

    With ``measured`` (a Comparison's typed ``outcomes``) the dotted line is the steady-state
    rate of the interleaved measurement and the legend carries each speedup with its interval;
    otherwise it is the median of the logged points. Returns the column plotted, or None.
    """
    column = throughput_column(frame)
    unit = "tokens/s" if column == "tokens_per_s" else "samples/s"
    drawn = False
    if column is not None:
        for label in labels:
            rows = frame[frame["run"] == label]
            values = numeric(rows[column])
            if values.notna().sum() == 0:
                continue
            outcome = (measured or {}).get(label)
            steady = to_float(getattr(outcome.rates, column)) if outcome is not None else None
            ax.plot(
                rows["step"],
                values,
                color=colors[label],
                label=label + _speedup_text(outcome),
                linewidth=1.4,
            )
            median = steady if steady is not None else float(values.median())
            ax.axhline(median, color=colors[label], linestyle=":", linewidth=1.0)
            drawn = True
    dotted = "steady-state median, warm-up excluded" if measured else "median"
    style_axes(
        ax, f"Throughput ({unit}; dotted: {dotted})", "optimizer step", f"throughput ({unit})"
    )
    legend(ax, drawn, "no throughput recorded")
    return column if drawn else None


def draw_memory(
    ax: Axes,
    frame: Any,
    labels: Sequence[str],
    colors: Mapping[str, str],
    kind: str | None = None,
) -> None:
    """Peak memory per run as bars, in MiB, for one memory kind (the axis names the kind)."""
    if kind is None:
        kind = next(iter(memory_kinds(frame)), None)
    names: list[str] = []
    peaks: list[float] = []
    for label in labels:
        rows = frame[(frame["run"] == label)]
        if kind is not None and "memory_kind" in rows:
            rows = rows[rows["memory_kind"] == kind]
        if rows.empty or "memory_peak_bytes" not in rows:
            continue
        peak = numeric(rows["memory_peak_bytes"]).max()
        if peak is None or math.isnan(peak):
            continue
        names.append(label)
        peaks.append(float(peak) / 2**20)
    kind_label = MEMORY_KIND_LABELS.get(kind or "", kind or "memory")
    if names:
        bars = ax.bar(names, peaks, color=[colors[n] for n in names])
        ax.bar_label(bars, labels=[f"{p:.1f}" for p in peaks], fontsize="small")
        ax.margins(y=0.15)
    else:
        no_data(ax, "no memory recorded")
    style_axes(ax, f"Peak memory ({kind_label})", "plan", f"peak {kind_label} (MiB)")
    ax.grid(False, axis="x")


# ----------------------------------------------------------------------------- figures


def loss_figure(source: RecordSource, *, colors: Mapping[str, str] | None = None) -> Figure:
    """Loss against optimizer step, one line per plan."""
    p = prepare(source, colors)
    fig = new_figure()
    draw_loss(fig.add_subplot(), p.frame, p.labels, p.colors)
    return fig


def loss_scale_figure(
    source: RecordSource,
    *,
    colors: Mapping[str, str] | None = None,
    histories: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> Figure:
    """Loss scale on a log2 axis with skipped steps marked.

    ``histories`` maps run label to that run's ``scale_history``; by default each run's own.
    """
    p = prepare(source, colors)
    fig = new_figure()
    draw_loss_scale(fig.add_subplot(), p.frame, p.labels, p.colors, p.histories(histories))
    return fig


def throughput_figure(source: RecordSource, *, colors: Mapping[str, str] | None = None) -> Figure:
    """Throughput per step (tokens/s for token workloads, else samples/s)."""
    p = prepare(source, colors)
    fig = new_figure()
    draw_throughput(fig.add_subplot(), p.frame, p.labels, p.colors, p.comparison.outcomes or None)
    return fig


def _speedup_text(outcome: Any) -> str:
    """ " 1.31× (1.22–1.40)" from a plan's typed outcome ("" without a speedup, or for the
    baseline)."""
    verdict = getattr(outcome, "verdict", None)
    if verdict is None or verdict.kind == "baseline":
        return ""
    text = speedup_text(outcome)
    return f" {text}" if text else ""


def memory_figure(source: RecordSource, *, colors: Mapping[str, str] | None = None) -> Figure:
    """Peak memory per plan as the runs recorded it (device allocator, or the host process's
    RSS); one axis per memory kind, so kinds are never mixed on one axis."""
    p = prepare(source, colors)
    kinds = memory_kinds(p.frame) or [None]
    fig = new_figure((SINGLE_SIZE[0], SINGLE_SIZE[1]) if len(kinds) == 1 else (11.0, 4.0))
    axes = fig.subplots(1, len(kinds), squeeze=False)[0]
    for ax, kind in zip(axes, kinds, strict=True):
        draw_memory(ax, p.frame, p.labels, p.colors, kind)
    return fig


def uses_loss_scale(source: RecordSource) -> bool:
    """True when some plan scales its loss (a grad scaler): only then is there a scale to draw."""
    return any(r.plan.use_scaler for r in as_comparison(source).results.values())


def dashboard_figure(
    source: RecordSource,
    *,
    colors: Mapping[str, str] | None = None,
    histories: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    title: str | None = None,
    inspections: Mapping[str, Any] | None = None,
) -> Figure:
    """Loss, throughput and memory per plan; the loss scale too when a plan has one.

    With ``inspections`` (label -> inspection of one training step) the memory panel is memory
    by kind, read from the tensors; without, it is the peak the runs recorded (the kind is in
    its title: a host process's RSS says little about precision). Without any loss scale, the
    loss spans the top row instead of sharing it with an empty loss-scale panel.
    """
    p = prepare(source, colors)
    fig = new_figure(DASHBOARD_SIZE)
    grid = fig.add_gridspec(2, 2)
    if uses_loss_scale(p.comparison):
        ax_loss, ax_scale = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])
        draw_loss_scale(ax_scale, p.frame, p.labels, p.colors, p.histories(histories))
    else:
        ax_loss = fig.add_subplot(grid[0, :])
    ax_tput, ax_mem = fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1])
    draw_loss(ax_loss, p.frame, p.labels, p.colors)
    draw_throughput(ax_tput, p.frame, p.labels, p.colors, p.comparison.outcomes or None)
    if inspections:
        draw_memory_breakdown(ax_mem, inspections, legend_outside=False)
    else:
        kinds = memory_kinds(p.frame)
        draw_memory(ax_mem, p.frame, p.labels, p.colors, next(iter(kinds), None))  # the first
        if len(kinds) > 1:
            ax_mem.set_title(ax_mem.get_title() + f" (+{len(kinds) - 1} other kind(s) not shown)")
    fig.suptitle(title or "Precision plans compared: " + ", ".join(p.labels))
    return fig
