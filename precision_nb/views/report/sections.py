"""A report is made of sections: each part of it returns its title, its HTML and the files it
adds to the report folder, as frozen values; nothing here writes to disk.

:func:`section_html` renders one section into the page; :func:`files_of` collects the files of
several sections (a name used twice is a ``ValueError``: one part would overwrite another).
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from matplotlib.figure import Figure

from precision_nb.views.report.figure_base import figure_to_png
from precision_nb.views.report.markup import details

__all__ = ["ReportFile", "Section", "csv_file", "files_of", "png_file", "section_html"]


@dataclass(frozen=True)
class ReportFile:
    """One file of the report folder: its name and its bytes."""

    name: str
    data: bytes


@dataclass(frozen=True)
class Section:
    """One part of ``report.html``: ``key`` (its HTML id), ``title``, ``html`` (the body, without
    the title) and the ``files`` it adds to the folder. ``collapsed``: shown closed (details)."""

    key: str
    title: str
    html: str
    files: tuple[ReportFile, ...] = ()
    collapsed: bool = False


def csv_file(name: str, frame: Any) -> ReportFile:
    """A DataFrame as a CSV file (no index column)."""
    return ReportFile(name, frame.to_csv(index=False).encode("utf-8"))


def png_file(name: str, figure: Figure) -> ReportFile:
    return ReportFile(name, figure_to_png(figure))


def section_html(section: Section) -> str:
    """``<section id=key>`` with the title as h2; a collapsed one inside ``<details>``."""
    title = f"<h2>{html.escape(section.title)}</h2>"
    body = details(title, section.html) if section.collapsed else title + section.html
    return f'<section id="{html.escape(section.key)}">{body}</section>'


def files_of(sections: Iterable[Section]) -> tuple[ReportFile, ...]:
    """Every file of ``sections`` in order; ``ValueError`` when two carry the same name."""
    seen: dict[str, str] = {}
    out: list[ReportFile] = []
    for section in sections:
        for item in section.files:
            if item.name in seen:
                raise ValueError(
                    f"report file {item.name!r} comes from both the {seen[item.name]!r} and the "
                    f"{section.key!r} section"
                )
            seen[item.name] = section.key
            out.append(item)
    return tuple(out)
