"""Figures of an inspection: a stacked memory bar per plan, and where each op's dtype went.

- :func:`memory_breakdown_figure`: one bar per plan, stacked by kind (parameters, gradients,
  optimizer state, autocast weight copies, saved activations, ...), in MiB, with the allocator
  peak marked where the device has one. A simulated plan draws its expected bytes, hatched.
- :func:`op_dtype_figure`: two stacked bars for one plan, the step's counted FLOPs and its op
  calls, split by verdict ("ran in bf16", "kept in fp32 by autocast", "cast inserted", ...).

Both accept the engine's :class:`~precision_nb.engine.inspect.InspectionData` or an
:class:`~precision_nb.views.report.inspection.Inspection` (anything with a ``data`` of that type).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from precision_nb.engine.inspect import memory as mem
from precision_nb.engine.inspect import op_trace as T
from precision_nb.views.report.figure_base import new_figure, no_data

__all__ = ["KIND_COLORS", "draw_memory_breakdown", "memory_breakdown_figure", "op_dtype_figure"]

KIND_COLORS = {
    mem.PARAMS: "#1f77b4",
    mem.GRADS: "#aec7e8",
    mem.OPTIM: "#9467bd",
    mem.KAHAN: "#c5b0d5",
    mem.COPIES: "#ff7f0e",
    mem.ACTS: "#2ca02c",
    mem.INPUTS: "#98df8a",
    mem.SCALER: "#d62728",
}
_VERDICT_COLORS = {
    "ran in bf16": "#ff7f0e",
    "ran in fp16": "#2ca02c",
    T.KEPT_FP32: "#1f77b4",
    T.NOT_LISTED: "#aec7e8",
    T.NO_AUTOCAST: "#1f77b4",
    T.FP32_LISTED_LOW: "#d62728",
    T.BACKWARD_FP32: "#9467bd",
    T.CAST: "#8c564b",
    T.VIEW: "#c7c7c7",
    T.OTHER: "#bcbd22",
}
MIB = 2**20


def _data(item: Any) -> Any:
    return getattr(item, "data", item)


def _as_mapping(inspections: Any) -> dict[str, Any]:
    if isinstance(inspections, Mapping):
        return {str(k): _data(v) for k, v in inspections.items()}
    if isinstance(inspections, Sequence) and not isinstance(inspections, str):
        return {_data(v).label: _data(v) for v in inspections}
    data = _data(inspections)
    return {data.label: data}


def memory_breakdown_figure(inspections: Any) -> Figure:
    """One stacked bar per plan: counted memory kinds in MiB, allocator peak marked (black)."""
    fig = new_figure((7.0, 4.2))
    draw_memory_breakdown(fig.add_subplot(), inspections)
    return fig


def draw_memory_breakdown(ax: Axes, inspections: Any, *, legend_outside: bool = True) -> None:
    """The stacked bars of :func:`memory_breakdown_figure` on ``ax`` (legend beside the axes, or
    inside them when ``legend_outside`` is False)."""
    plans = _as_mapping(inspections)
    kinds_seen: list[str] = []
    peak_drawn = False
    for x, data in enumerate(plans.values()):
        bottom = 0.0
        key, hatch = ("expected_bytes", "//") if data.simulated else ("bytes", None)
        for kind in mem.KINDS:
            value = sum(r[key] or 0 for r in data.memory if r["kind"] == kind and r["counted"])
            if not value:
                continue
            if kind not in kinds_seen:
                kinds_seen.append(kind)
            ax.bar(
                x,
                value / MIB,
                bottom=bottom,
                color=KIND_COLORS[kind],
                edgecolor="white",
                hatch=hatch,
            )
            bottom += value / MIB
        peak = [r for r in data.memory if r["kind"] == mem.ALLOC_PEAK and r["bytes"] is not None]
        if peak:
            ax.hlines(peak[0]["bytes"] / MIB, x - 0.4, x + 0.4, colors="black", linewidth=2)
            peak_drawn = True
        ax.annotate(f"{bottom:.2f}", (x, bottom), ha="center", va="bottom", fontsize="small")
    ticks = [
        f"{n}\n{'(expected, simulated)' if d.simulated else d.device}" for n, d in plans.items()
    ]
    ax.set_xticks(range(len(plans)), ticks)
    handles = [Patch(color=KIND_COLORS[k], label=k) for k in reversed(kinds_seen)]
    if peak_drawn:
        handles.append(Patch(color="black", label=mem.ALLOC_PEAK))
    if legend_outside:
        ax.legend(handles=handles, fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    else:
        ax.legend(handles=handles, fontsize="x-small", loc="lower right", framealpha=0.85)
        ax.set_xlim(-0.6, len(plans) - 0.4 + 0.9)  # room on the right for the legend
    ax.set_ylabel("MiB (one training step)")
    ax.set_title("Memory by kind (measured from the tensors)", fontsize="medium")
    ax.margins(y=0.12)
    ax.grid(True, axis="y", alpha=0.3)


def op_dtype_figure(inspection: Any) -> Figure:
    """The step's counted FLOPs and its op calls, each as a 100% bar split by verdict."""
    data = _data(inspection)
    fig = new_figure((8.0, 2.8))
    ax = fig.add_subplot()
    if data.simulated or not data.summary:
        no_data(ax, "simulated device: nothing ran (see the autocast policy table)")
        ax.set_axis_off()
        return fig
    total_calls = sum(g["calls"] for g in data.summary) or 1
    lefts = [0.0, 0.0]
    for group in data.summary:
        color = _VERDICT_COLORS.get(group["verdict"], "#7f7f7f")
        values = [group["flops_share"] * 100, group["calls"] / total_calls * 100]
        ax.barh([1, 0], values, left=lefts, color=color, label=group["verdict"])
        lefts = [a + b for a, b in zip(lefts, values, strict=True)]
    ax.set_yticks([1, 0], ["FLOPs", "op calls"])
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of one forward + backward (FLOPs: torch.utils.flop_counter)")
    ax.set_title(f"Where the ops ran: {data.label} on {data.device}", fontsize="medium")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig
