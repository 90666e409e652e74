"""One colour per plan, the same in every figure, chart and table (no plotting import here)."""

from __future__ import annotations

from collections.abc import Iterable

# Fixed colours for the plain mode labels so "fp16" is the same green in every notebook.
MODE_COLORS = {"fp32": "#1f77b4", "bf16": "#ff7f0e", "fp16": "#2ca02c"}
EXTRA_COLORS = ("#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def colors_for_labels(labels: Iterable[str]) -> dict[str, str]:
    """Labels that are a plain mode (``fp32``, ``bf16``, ``fp16``) or start with one
    (``fp16 (loss-scale lab)``) take that mode's colour; the first label of each mode keeps the
    exact mode colour, later ones and other labels take the next free colour in order."""
    colors: dict[str, str] = {}
    used: set[str] = set()
    for label in labels:
        if label in colors:
            continue
        mode = str(label).split()[0].lower() if str(label).strip() else ""
        color = MODE_COLORS.get(mode)
        if color is None or color in used:
            free = [c for c in EXTRA_COLORS if c not in used]
            color = free[0] if free else EXTRA_COLORS[len(colors) % len(EXTRA_COLORS)]
        colors[label] = color
        used.add(color)
    return colors
