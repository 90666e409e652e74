"""A small chart as an inline SVG string: one polyline per series, min/max labels, marks.

Plain strings, no plotting library: a few milliseconds for thousands of points, so the panel can
follow a run live and a :class:`~precision_nb.engine.results.RunResult` can draw its loss curve in
a notebook without importing matplotlib.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence

__all__ = ["MAX_POINTS", "Point", "chart_svg"]

MAX_POINTS = 200
WIDTH, HEIGHT, PAD_LEFT, PAD_TOP, PAD_BOTTOM = 240, 110, 46, 20, 16
SKIP_COLOR = "#d62728"
DASHES = ("none", "6 3", "2 2", "8 3 2 3")

Point = tuple[float, float]


def _thin(points: Sequence[Point]) -> list[Point]:
    """At most MAX_POINTS points, evenly spaced, always keeping the last one."""
    if len(points) <= MAX_POINTS:
        return list(points)
    step = len(points) / MAX_POINTS
    kept = [points[int(i * step)] for i in range(MAX_POINTS - 1)]
    return kept + [points[-1]]


def _number(value: float, log2: bool) -> str:
    if log2:
        return f"2^{value:.0f}" if float(value).is_integer() else f"2^{value:.1f}"
    magnitude = abs(value)
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e4, "k")):
        if magnitude >= size:  # 48.5k, not 4.85e+04
            scaled = value / (1e3 if suffix == "k" else size)
            return f"{scaled:.3g}{suffix}" if abs(scaled) < 1e3 else f"{value:.2e}"
    if 0 < magnitude < 1e-2:
        return f"{value:.2e}"
    return f"{value:.4g}"


def chart_svg(
    series: Mapping[str, Sequence[Point]],
    colors: Mapping[str, str],
    *,
    title: str,
    log2: bool = False,
    marks: Mapping[str, Sequence[Point]] | None = None,
    empty: str = "no data yet",
    band: tuple[float, float] | None = None,
    band_label: str = "",
    floor: float | None = None,
) -> str:
    """One small chart: a polyline per run, optional red crosses (``marks``), min/max labels.

    With ``log2`` the y values are drawn as log2 (non-positive values are left out). ``band``:
    a shaded y range (in drawn units, log2 for a log2 chart) labelled ``band_label``. ``floor``:
    a value the y axis always reaches (0 for a quantity read from zero, such as memory, so that
    a change of a few bytes is not drawn as a jump).
    """

    def ys(points: Sequence[Point]) -> list[Point]:
        if not log2:
            return [(x, y) for x, y in points if math.isfinite(y)]
        return [(x, math.log2(y)) for x, y in points if math.isfinite(y) and y > 0]

    lines = {label: _thin(ys(points)) for label, points in series.items()}
    crosses = {label: ys(points) for label, points in (marks or {}).items()}
    every = [p for pts in (*lines.values(), *crosses.values()) for p in pts]
    head = (
        f"<text x='{PAD_LEFT}' y='13' font-size='12' font-weight='bold'>{html.escape(title)}</text>"
    )
    frame = (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{HEIGHT}' "
        f"viewBox='0 0 {WIDTH} {HEIGHT}' "
        f"role='img' aria-label='{html.escape(title, quote=True)}' "
        "style='font-family:sans-serif;background:#fff;border:1px solid #ddd'>"
    )
    if not every:
        note = f"<text x='{PAD_LEFT}' y='60' font-size='11' fill='#888'>{html.escape(empty)}</text>"
        return f"{frame}{head}{note}</svg>"
    x0, x1 = min(p[0] for p in every), max(p[0] for p in every)
    y0, y1 = min(p[1] for p in every), max(p[1] for p in every)
    if band is not None:
        y0, y1 = min(y0, band[0]), max(y1, band[1])
    if floor is not None:
        y0, y1 = min(y0, floor), max(y1, floor)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:  # a flat line in the middle; a log2 axis keeps whole powers of two at its ends
        pad = 1.0 if log2 else 0.5
        y0, y1 = y0 - pad, y1 + pad
    plot_w, plot_h = WIDTH - PAD_LEFT - 8, HEIGHT - PAD_TOP - PAD_BOTTOM
    top, bottom = _number(y1, log2), _number(y0, log2)
    if top == bottom:  # a narrow range: enough digits to tell the ends apart
        top, bottom = f"{y1:.7g}", f"{y0:.7g}"

    def at(point: Point) -> str:
        x = PAD_LEFT + (point[0] - x0) / (x1 - x0) * plot_w
        y = PAD_TOP + (1 - (point[1] - y0) / (y1 - y0)) * plot_h
        return f"{x:.1f},{y:.1f}"

    parts = [
        frame,
        head,
        f"<rect x='{PAD_LEFT}' y='{PAD_TOP}' width='{plot_w}' height='{plot_h}' fill='none' "
        "stroke='#ccc'/>",
        f"<text x='{PAD_LEFT - 3}' y='{PAD_TOP + 9}' font-size='10' text-anchor='end'>{top}</text>",
        f"<text x='{PAD_LEFT - 3}' y='{PAD_TOP + plot_h}' font-size='10' text-anchor='end'>"
        f"{bottom}</text>",
        f"<text x='{WIDTH - 8}' y='{HEIGHT - 3}' font-size='10' text-anchor='end'>step "
        f"{x1:.0f}</text>",
    ]
    if band is not None:
        top_y = float(at((x0, band[1])).split(",")[1])
        low_y = float(at((x0, band[0])).split(",")[1])
        parts.append(
            f"<rect class='pnb-band' x='{PAD_LEFT}' y='{top_y:.1f}' width='{plot_w}' "
            f"height='{max(low_y - top_y, 1.0):.1f}' fill='#2ca02c' fill-opacity='0.15'>"
            f"<title>{html.escape(band_label)}</title></rect>"
        )
    for index, (label, points) in enumerate(lines.items()):
        if points:
            color = html.escape(colors.get(label, "#333"), quote=True)
            coords = " ".join(at(p) for p in points)
            dash = DASHES[index % len(DASHES)]  # coinciding curves stay visible, as in figures
            parts.append(
                f"<polyline fill='none' stroke='{color}' stroke-width='1.6' "
                f"stroke-dasharray='{dash}' points='{coords}'>"
                f"<title>{html.escape(label)}</title></polyline>"
            )
    for label, points in crosses.items():
        for point in points:
            x, y = at(point).split(",")
            parts.append(
                f"<text class='pnb-skip' x='{x}' y='{float(y) + 4:.1f}' font-size='12' "
                f"fill='{SKIP_COLOR}' text-anchor='middle'>&#215;<title>{html.escape(label)}: "
                f"skipped step</title></text>"
            )
    parts.append("</svg>")
    return "".join(parts)
