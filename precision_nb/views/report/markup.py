"""The HTML every report part shares: the page and its style, numbers as text, tables, images.

Only the standard library: each report part (the answer cards, figures, inspection, numerics,
distributed) builds its HTML from these, and :func:`page` wraps the parts into one
self-contained document (no script, no external file).
"""

from __future__ import annotations

import base64
import html
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from precision_nb.core.text import fmt, size_text

__all__ = [
    "CSS",
    "cell_text",
    "details",
    "fmt",
    "img_html",
    "page",
    "size_text",
    "swatch",
    "table_html",
    "td",
]

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;
max-width:1100px;padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;
margin-top:1.6em}h3{margin-bottom:.3em}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em;max-width:100%}
th,td{border:1px solid #ddd;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
table.compact{font-size:.8em}table.compact td,table.compact th{padding:.15em .35em}
tr.group th{background:#eef3f8;font-weight:600}
img{max-width:100%;height:auto}.swatch{display:inline-block;width:.9em;height:.9em;
border-radius:2px;margin-right:.35em;vertical-align:-.1em}
.hint{margin:.3em 0}.measure{color:#666;font-size:.88em}.merged{background:#fff8e1;
padding:.5em .8em;border-left:4px solid #f0ad4e;margin:.6em 0}.scroll{overflow-x:auto}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:.5em}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(250px,1fr));gap:.8em;
margin:.8em 0}.card{border:1px solid #ddd;border-top:5px solid var(--plan,#999);
border-radius:6px;padding:.6em .8em;background:#fcfcfc}.card h3{margin:0 0 .3em}
.card .verdict{font-weight:600}.card dl{margin:.4em 0 0;display:grid;
grid-template-columns:max-content 1fr;gap:.15em .6em;font-size:.9em}.card dt{color:#555}
.card dd{margin:0}.saved{color:#1a7f37}.added{color:#b35900}
details{margin:.5em 0}summary{cursor:pointer;color:#245}summary h2{display:inline;border:0}
pre{background:#f7f7f7;padding:.6em;white-space:pre-wrap;font-size:.85em}
"""


def swatch(color: str) -> str:
    return f'<span class="swatch" style="background:{html.escape(color)}"></span>'


def img_html(stem: str, png: bytes) -> str:
    """A figure embedded as base64 PNG, tagged with its file stem (``data-figure``)."""
    data = base64.b64encode(png).decode("ascii")
    e = html.escape(stem)
    src = f"data:image/png;base64,{data}"
    return f'<figure><img alt="{e} figure" data-figure="{e}" src="{src}"></figure>'


def cell_text(column: str, value: Any) -> str:
    """The default cell text: :func:`fmt` of the value (the column is for callers' own rules)."""
    return fmt(value)


def table_html(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str],
    *,
    headers: Mapping[str, str] | None = None,
    cell: Callable[[str, Any], str] = cell_text,
    css_class: str = "",
    group_by: str | None = None,
) -> str:
    """A plain table: one header row (``headers`` renames columns), one row per mapping.

    Numbers are right-aligned. ``group_by``: a column whose value is shown once, as a full-width
    row above the rows that share it, instead of a column repeated on every row.
    """
    headers = headers or {}
    shown = [c for c in columns if c != group_by]
    head = "".join(f"<th>{html.escape(headers.get(c, c))}</th>" for c in shown)
    body: list[str] = []
    group: Any = object()
    for row in rows:
        if group_by is not None and row.get(group_by) != group:
            group = row.get(group_by)
            body.append(
                f'<tr class="group"><th colspan="{len(shown)}">{html.escape(fmt(group))}</th></tr>'
            )
        body.append(f"<tr>{''.join(td(row.get(c), cell(c, row.get(c))) for c in shown)}</tr>")
    klass = f' class="{html.escape(css_class)}"' if css_class else ""
    return f"<table{klass}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def td(value: Any, text: str) -> str:
    """A cell of ``text`` (escaped), right-aligned when ``value`` is a number."""
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    css = ' class="num"' if numeric else ""
    return f"<td{css}>{html.escape(text)}</td>"


def details(summary: str, body: str) -> str:
    """A collapsed block; ``summary`` is HTML (escape text before passing it)."""
    return f"<details><summary>{summary}</summary>{body}</details>"


def page(title: str, body: Sequence[str], *, stamp: str = "") -> str:
    """A whole self-contained HTML document: ``title`` as its h1, then the ``body`` parts."""
    e = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{e(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{e(title)}</h1>",
    ]
    if stamp:
        parts.append(f'<p class="measure">{e(stamp)}</p>')
    parts += [p for p in body if p]
    parts.append("</body></html>")
    return "\n".join(parts)
