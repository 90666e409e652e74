"""What every matplotlib figure of run records shares: the figure class, plan colours, PNG bytes,
axis styling and small readers of the records (throughput column, memory kinds, scale histories).
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from precision_nb.engine.compare import Comparison
from precision_nb.views.colors import colors_for_labels
from precision_nb.views.report.source import as_comparison
from precision_nb.views.report.tables import RecordSource, scale_histories, to_frame

SINGLE_SIZE = (7.0, 4.0)
_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")
DASHBOARD_SIZE = (11.0, 7.5)


class PlanFigure(Figure):
    """A standalone Figure that also shows itself as PNG in Jupyter under any backend.

    The inline backend registers its own PNG formatter for figures; with the widget backend (or
    none) IPython falls back to :meth:`_repr_png_`, so a returned figure still displays.
    """

    def _repr_png_(self) -> bytes:
        return figure_to_png(self)


def plan_colors(labels: Sequence[str] | Any) -> dict[str, str]:
    """One colour per run label, stable across figures.

    Labels that are a plain mode (``fp32``, ``bf16``, ``fp16``) or start with one (``fp16 lab``)
    take that mode's colour; the first label of each mode keeps the exact mode colour, later ones
    and other labels take the next free colour in order of appearance. ``labels`` may also be any
    record source (records, DataFrame, RunResult, Comparison).
    """
    if not isinstance(labels, Sequence) or (labels and not isinstance(labels[0], str)):
        labels = _run_labels(to_frame(labels))
    return colors_for_labels(labels)


def figure_to_png(fig: Figure, *, dpi: int = 100) -> bytes:
    """Render ``fig`` to PNG bytes (for ``ipywidgets.Image`` or a report)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


# ----------------------------------------------------------------------------- helpers


def _run_labels(frame: Any) -> list[str]:
    if frame.empty or "run" not in frame:
        return []
    return [str(label) for label in dict.fromkeys(frame["run"].tolist())]


@dataclass(frozen=True)
class Prepared:
    """A figure's source, normalised once: the comparison, its records as a frame, the run
    labels in order and one colour per label."""

    comparison: Comparison
    frame: Any
    labels: list[str]
    colors: Mapping[str, str]

    def histories(
        self, given: Mapping[str, Sequence[Mapping[str, Any]]] | None = None
    ) -> Mapping[str, Sequence[Mapping[str, Any]]]:
        """``given`` when passed, else every run's ``scale_history`` that has entries."""
        return given if given is not None else scale_histories(self.comparison)


def prepare(source: RecordSource, colors: Mapping[str, str] | None) -> Prepared:
    comparison = as_comparison(source)
    frame = to_frame(source if hasattr(source, "columns") else comparison)
    labels = _run_labels(frame)
    return Prepared(
        comparison, frame, labels, colors if colors is not None else plan_colors(labels)
    )


def new_figure(size: tuple[float, float] = SINGLE_SIZE) -> Figure:
    return PlanFigure(figsize=size, layout="constrained")


def no_data(ax: Axes, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, wrap=True)


def numeric(series: Any) -> Any:
    import pandas as pd

    return pd.to_numeric(series, errors="coerce")


def style_axes(ax: Axes, title: str, xlabel: str, ylabel: str) -> None:
    if xlabel != "plan":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)


def legend(ax: Axes, drawn: bool, empty: str) -> None:
    """The legend of what was drawn (when it has labels), else the ``empty`` note."""
    if not drawn:
        no_data(ax, empty)
    elif ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small", loc="best")


#: Runs whose curves coincide (fp32 and bf16 often do) stay visible: one dash style each.
LINESTYLES = ("-", "--", "-.", ":")


# ----------------------------------------------------------------------------- small utilities


def throughput_column(frame: Any) -> str | None:
    """``tokens_per_s`` when every run recorded it, else ``samples_per_s`` when present."""
    if frame.empty:
        return None
    if "tokens_per_s" in frame and numeric(frame["tokens_per_s"]).notna().all():
        return "tokens_per_s"
    if "samples_per_s" in frame and numeric(frame["samples_per_s"]).notna().any():
        return "samples_per_s"
    return None


def memory_kinds(frame: Any) -> list[str]:
    """Memory kinds present in the records, in order of appearance."""
    if frame.empty or "memory_kind" not in frame:
        return []
    return [str(k) for k in dict.fromkeys(frame["memory_kind"].dropna().tolist())]


def to_float(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(out) else out


def pow2_label(value: float, _pos: int) -> str:
    if value <= 0:
        return ""
    exponent = math.log2(value)
    if abs(exponent - round(exponent)) < 1e-9:
        return "2" + str(int(round(exponent))).translate(_SUPERSCRIPT)
    return f"{value:g}"
