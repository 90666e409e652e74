"""The ipywidgets panel: ``Panel`` and the pieces it is built from.

``api`` (the ``Panel`` class), ``controls`` (the widgets and their validation), ``plan_resolver``
(the cached plan for the current selection), ``run`` (background runs and their live updates),
``code`` (the code a plan corresponds to) and ``live_charts`` (SVG charts during a run).
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "Panel":
        from precision_nb.views.panel.api import Panel

        return Panel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
